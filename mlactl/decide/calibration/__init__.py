"""Calibrated time: cost.py's FLOPs and bytes mapped to measured time, per op class.

model.py    the time of one op class: t_fixed + roofline with fitted efficiencies + the terms
            the data earns (tile padding, waves, split-KV as FA3 picks it, serial KV-block latency,
            a pass over the cache)
fit.py      robust fit in relative error; k-fold held-out error
sources     aiconfigurator.py (NVIDIA's measured tables), sources.py (tune results, CSV)
paired.py   whole paths timed side by side, fitted together without each shape's drift
store.py    calibration files under $MLACTL_HOME/calibrations/
time.py     THE time function every printed time goes through (roofline or calibrated)

Importing this package does not import scipy (only fitting does) nor torch.
"""

from __future__ import annotations

from mlactl.decide.calibration.fit import K_FOLDS, fit
from mlactl.decide.calibration.model import BASE_TERMS, PROJECTIONS, TERMS, relevant_terms
from mlactl.decide.calibration.paired import fit_paired, paired_groups
from mlactl.decide.calibration.store import Calibration, check_hardware, load, resolve
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
    # whole paths (`mlactl tune paths`): attention and the rest at their own efficiencies, and the
    # score matrix an unfused kernel writes and reads back
    ("fixed", "ops"),
    ("fixed", "sum", "ops"),
    ("fixed", "scores"),
    ("fixed", "ops", "scores"),
    ("fixed", "sum", "ops", "scores"),
)

SELECT_MARGIN = 0.002  # mean of held-out median and p90, absolute
# tried on top of a projection's best term set: unaligned rows, then the nearest measured shapes
PROJECTION_EXTRAS: tuple[tuple[str, ...], ...] = (("align",), ("near",), ("align", "near"))

__all__ = ["CANDIDATE_TERMS", "TERMS", "Calibration", "check_hardware", "fit_groups", "load", "resolve", "select"]


def select(op: str, source: str, dtype: str, pts, machine, candidates=CANDIDATE_TERMS, k: int | None = None):
    """Fit each candidate term set (the terms that act on this op class) and keep the one with the
    least held-out error (mean of median and p90); a set with more terms must beat the best so
    far by SELECT_MARGIN. Returns (best FitResult, every FitResult tried, base first)."""

    tried, best = [], None

    def consider(terms):
        nonlocal best
        result = fit(pts, machine, terms, source, dtype, k or K_FOLDS)
        tried.append(result)
        ho = result.held_out
        score = (ho["median"] + ho["p90"]) / 2 if ho["median"] is not None else 0.0
        if best is None or score < best[0] - SELECT_MARGIN:
            best = (score, result)

    for terms in dict.fromkeys(relevant_terms(op, t) for t in candidates):
        consider(terms)
    if op in PROJECTIONS and len(candidates) > 1:  # extras on the best parametric set
        base = best[1].terms
        for extra in PROJECTION_EXTRAS:
            consider(base + extra)
    return best[1], tried


def fit_groups(groups: dict, machine, *, select_terms: bool = True, k: int | None = None) -> list:
    """Fit every (op class, source, dtype) group: with `select_terms` the best candidate term set
    of each (see `select`), else the base model. Whole paths timed side by side at the same
    shapes are fitted together, each shape's common drift taken out (mlactl.decide.calibration.paired)."""

    candidates = CANDIDATE_TERMS if select_terms else (BASE_TERMS,)

    with progress.task(f"fitting {len(groups)} op classes", total=len(groups)) as bar:

        def select_one(key, pts):
            op, src, dt = key
            best = select(op, src, dt, pts, machine, candidates, k)[0]
            bar.advance()
            return best

        fitted: dict = {}
        for keys in paired_groups(groups):
            results, _ = fit_paired(groups, keys, machine, select_one)
            fitted.update(zip(keys, results))
        return [fitted[key] if key in fitted else select_one(key, pts) for key, pts in sorted(groups.items())]
