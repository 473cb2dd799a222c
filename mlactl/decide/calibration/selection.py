"""Which terms each op class's fit keeps: the candidate term sets (CANDIDATE_TERMS), the ones
an op class tries (op_tries), the kept fit by held-out error (select), and every group of a
calibration fitted (fit_groups, with the paths timed side by side fitted together)."""

from __future__ import annotations

from dataclasses import replace

from mlactl.decide.calibration.evidence import evidence
from mlactl.decide.calibration.fit import K_FOLDS, fit
from mlactl.decide.calibration.model import GEMM_OPS, sparse_blocks
from mlactl.decide.calibration.paired import fit_paired, paired_groups
from mlactl.decide.calibration.terms import (
    BASE_TERMS,
    PROJECTIONS,
    SPARSE_TERMS,
    WALKER_TERMS,
    WALKERS,
    Terms,
    relevant_terms,
)
from mlactl.decide.calibration.uncertainty import members_of
from mlactl.util import progress

# the candidate term sets a fit tries; the one with the least held-out error is kept, so a term
# stays only where it lowers the held-out error (docs/calibration.md)
CANDIDATE_TERMS: tuple[tuple[str, ...], ...] = (
    BASE_TERMS,
    ("fixed", "sum"),
    ("fixed", "pad", "waves"),
    ("fixed", "pad", "waves", "sum"),
    ("fixed", "quant"),
    ("fixed", "pad", "waves", "quant"),
    ("fixed", "pad", "waves", "sum", "quant"),
    ("fixed", "kvpad", "serial"),
    ("fixed", "kvpad", "serial", "request"),
    ("fixed", "split", "kvpad", "serial", "combine", "request"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "sum"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "combine", "request", "sum"),
    # 128 x 128 attention tiles (TRT-LLM's context FMHA, Blackwell kernels) and FA3's split count
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "sum", "tile128"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "combine", "request", "sum", "tile128"),
    ("fixed", "split", "kvpad", "serial", "combine", "request", "tile128"),
    ("fixed", "split", "kvpad", "serial", "combine", "request", "tile128", "fa3split"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "combine", "request", "sum", "fa3split"),
    # a pass over the cache keys before the kernel (SGLang's fp8-cache decode)
    ("fixed", "kvcast"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "combine", "request", "sum", "kvcast"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "combine", "request", "sum", "fa3split", "kvcast"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "sum", "tile128", "kvcast"),
    # a cost per query row (token x head) outside the kernel's overlap (TRT-LLM's fp8 decode)
    ("fixed", "split", "kvpad", "serial", "combine", "request", "tile128", "fa3split", "qrow"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial", "combine", "request", "sum", "fa3split", "kvcast", "qrow"),
    # a sparse attention as its kernel walks it: every top-k slot, rows shared by a request's
    # queries read once, and the GPU's kernel blocks (the heads padded to its head block, its key
    # block a step: `hblock`, no parameter of its own, tried first so that it stays where it
    # predicts the same); tried for sparse_attention only (SPARSE_TERMS)
    ("fixed", "pad", "waves", "slots", "reuse", "hblock"),
    ("fixed", "pad", "waves", "serial", "slots", "reuse", "hblock"),
    ("fixed", "pad", "waves", "serial", "slots", "hblock"),
    ("fixed", "pad", "waves", "slots", "reuse"),
    ("fixed", "pad", "waves", "serial", "slots", "reuse"),
    ("fixed", "pad", "waves", "serial", "slots"),
    ("fixed", "split", "kvpad", "serial", "combine", "request", "tile128", "fa3split", "qrow", "slots"),
    # DSA's indexer and top-k as their CTAs walk: a setup a wave of walking CTAs; the top-k's
    # selecting rows only, and what every row writes (tried for those two only: WALKER_TERMS)
    ("fixed", "pad", "waves", "serial", "ctawave"),
    ("fixed", "pad", "waves", "serial", "sum", "ctawave"),
    ("fixed", "serial", "rowsel", "ctawave", "rowwave"),
    # and the row chunks SGLang's indexer splits a launch into past its logits workspace
    ("fixed", "serial", "rowsel", "ctawave", "rowwave", "chunk"),
    # the top-k's setup and index writes apart from its walk, not under the walk's or memory's max
    ("fixed", "serial", "rowsel", "ctawave", "rowwave", "apart"),
    ("fixed", "serial", "rowsel", "ctawave", "rowwave", "chunk", "apart"),
    # and its logits as the walk meets them: a row past the SM's L1 read from memory twice, a
    # chunk's logits that fit in L2 read from it (aiconfigurator replays each chunk)
    ("fixed", "serial", "rowsel", "ctawave", "rowwave", "chunk", "apart", "l2", "reread"),
    # projections timed over and over on the same tensors: those that fit in L2 read from it
    ("fixed", "l2"),
    ("fixed", "sum", "l2"),
    ("fixed", "pad", "waves", "l2"),
    ("fixed", "pad", "waves", "sum", "l2"),
    # DeepGEMM's fp8 GEMM on a Hopper: the tiles its heuristic picks, and compute and memory
    # overlapped across the tiles each SM runs in turn (tried for DeepGEMM sources only)
    ("fixed", "pad", "waves", "dgtile", "sum"),
    ("fixed", "pad", "waves", "dgtile", "pipe"),
    # whole paths (`mlactl tune paths`): attention and the rest at their own efficiencies, and the
    # score matrix an unfused kernel writes and reads back
    ("fixed", "ops"),
    ("fixed", "sum", "ops"),
    ("fixed", "scores"),
    ("fixed", "ops", "scores"),
    ("fixed", "sum", "ops", "scores"),
)

SELECT_MARGIN = 0.002  # mean of held-out median and p90, absolute
# tried on top of a projection's best term sets: unaligned rows, then the nearest measured shapes.
# On the EXTRA_BASES best, not the best alone: `near` mends the random folds of a set that
# extrapolates well. SGLang's fp8 GEMM on an H100: the best parametric set plus near (pad, waves,
# sum, quant) held out 5.5% / 15.5% on random folds but 27% / 123% on the blocked split;
# fixed+sum+near, built on the third best, 5.4% / 15.6% and 9.5% / 23.7% (7 -> 4 of the 82 MLA
# tables missing a target)
PROJECTION_EXTRAS: tuple[tuple[str, ...], ...] = (("align",), ("near",), ("align", "near"))
EXTRA_BASES = 3


# the accuracy each table is held to (docs/calibration.md): held-out median and p90 over the
# random folds, and over the blocked split
RANDOM_TARGET = (0.10, 0.25)
BLOCKED_TARGET = (0.15, 0.35)


def selection_score(result) -> float:
    """The held-out error term selection weighs: the mean of the held-out median and p90 over the
    random folds, plus the same over the blocked split (fit the lower part of the size axis,
    predict the upper) where there is one. A term that wins the random folds but loses the
    blocked split by more is not kept."""
    ho, bl = result.held_out, result.blocked
    out = (ho["median"] + ho["p90"]) / 2 if ho["median"] is not None else 0.0
    if bl is not None and bl.get("median") is not None:
        out += (bl["median"] + bl["p90"]) / 2
    return out


def misses(result) -> tuple[bool, bool]:
    """(misses the random-fold target, misses the blocked target); an error not measured (too few
    points for folds, no blocked split) misses nothing."""

    def over(err, target) -> bool:
        return (
            err is not None and err.get("median") is not None and (err["median"] > target[0] or err["p90"] > target[1])
        )

    return over(result.held_out, RANDOM_TARGET), over(result.blocked, BLOCKED_TARGET)


def op_tries(op: str, terms, machine=None, source: str | None = None) -> bool:
    """Whether selection tries this candidate set on op class `op`: a set written for the sparse
    attention's own terms (SPARSE_TERMS) only there, where it differs from the sets without them
    (elsewhere it would only add its other terms as a set of their own); one with `l2` only where
    the machine's L2 size is known (without it the term does nothing), and `chunk` where its
    memory is; one with `dgtile` only on a DeepGEMM kernel's single GEMM (model.GEMM_OPS) on an
    SM90 machine, the one its tile heuristic describes; one with `hblock` only where the
    machine's architecture has known sparse kernel blocks; one with a walker's own terms
    (WALKER_TERMS) only on DSA's indexer and top-k."""
    on = Terms.of(terms)
    if on.l2 and machine is not None and not getattr(machine, "l2_bytes", None):
        return False
    if on.chunk and machine is not None and not getattr(machine, "memory_bytes", None):
        return False
    if on.dgtile and machine is not None:
        deepgemm = source is not None and "deepgemm" in source.lower()
        if not (deepgemm and op in GEMM_OPS and getattr(machine, "sm90", False)):
            return False
    if on.hblock and machine is not None and sparse_blocks(getattr(machine, "arch", None)) is None:
        return False
    if on & set(WALKER_TERMS) and op not in WALKERS:
        return False
    return op == "sparse_attention" or not on & set(SPARSE_TERMS)


def better(a, b) -> bool:
    """Whether FitResult `a` is to be kept over `b`, tried before it: a set meeting more of the
    targets first (the random folds' before the blocked split's), then the lower
    `selection_score`, by SELECT_MARGIN (a set tried later has more terms)."""
    if misses(a) != misses(b):
        return misses(a) < misses(b)
    return selection_score(a) < selection_score(b) - SELECT_MARGIN


def _leading(results: list, count: int) -> list[tuple[str, ...]]:
    """The term sets of the `count` best results, best first (by `better`)."""
    ranked: list = []
    for r in results:
        at = next((i for i, q in enumerate(ranked) if better(r, q)), len(ranked))
        ranked.insert(at, r)
    return [r.terms for r in ranked[:count]]


def select(
    op: str,
    source: str,
    dtype: str,
    pts,
    machine,
    candidates=CANDIDATE_TERMS,
    k: int | None = None,
    extras: bool = True,
):
    """Fit each candidate term set (the terms that act on this op class) and keep the `better`
    one: meeting the random-fold and blocked targets, then of least held-out error over both. The
    sets that score about as well become the kept fit's members, and its interval evidence is
    gathered (mlactl.decide.calibration.uncertainty). Returns (best FitResult, every FitResult
    tried, the first candidate first)."""

    tried: list = []
    best = None

    def consider(terms):
        nonlocal best
        result = fit(pts, machine, terms, source, dtype, k or K_FOLDS)
        tried.append(result)
        if best is None or better(result, best):
            best = result

    tries = [t for t in candidates if op_tries(op, t, machine, source)] or list(candidates)  # `--terms`: as given
    for terms in dict.fromkeys(relevant_terms(op, t) for t in tries):
        consider(terms)
    if extras and op in PROJECTIONS and len(candidates) > 1:  # extras on the best parametric sets
        for base in _leading(tried, EXTRA_BASES):
            for extra in PROJECTION_EXTRAS:
                consider(base + extra)
    assert best is not None  # `tries` is never empty
    members = members_of([(selection_score(r), r) for r in tried], best)
    return replace(best, extra=evidence(best, members, pts, machine)), tried


def fit_groups(groups: dict, machine, *, select_terms: bool = True, k: int | None = None, terms=None) -> list:
    """Fit every (op class, source, dtype) group: with `select_terms` the best candidate term set
    of each (see `select`), else the base model; with `terms`, those (the ones that act on each
    op class), no other. Whole paths timed side by side at the same shapes are fitted together,
    each shape's common drift taken out (mlactl.decide.calibration.paired)."""

    candidates = CANDIDATE_TERMS if select_terms else (BASE_TERMS,)
    if terms is not None:
        candidates = (tuple(terms),)

    with progress.task(f"fitting {len(groups)} op classes", total=len(groups)) as bar:

        def select_one(key, pts):
            op, src, dt = key
            best = select(op, src, dt, pts, machine, candidates, k, extras=terms is None)[0]
            bar.advance()
            return best

        fitted: dict = {}
        for keys in paired_groups(groups):
            results, _ = fit_paired(groups, keys, machine, select_one)
            fitted.update(zip(keys, results))
        return [fitted[key] if key in fitted else select_one(key, pts) for key, pts in sorted(groups.items())]
