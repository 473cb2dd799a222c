"""The terms a fit may switch on, each held once: its parameters (names, start values, bounds),
the op classes it acts on and what it means. model.py's docstring tells each term's physics and
the figures behind it; everything else is derived from TERM_LIST here: `TERMS` (the names, in the
order a parameter vector lays them out), `param_names`, `pack`/`unpack`, the fit's `bounds` and
start values, `relevant_terms` (which terms act on an op class) and the calibration file's check
of a fit's parameters (store.py: `check_params`).

    terms = Terms.of(["fixed", "pad", "waves"])    # typed: terms.pad, terms.near (bool)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# op classes of cost.py's ops, keyed by path: each path's attention is its own class
OP_CLASSES = (
    "kv_expand",
    "q_absorb",
    "out_absorb",
    "absorb_attention",
    "expand_attention",
    "lse_merge",
    # a DSA model's (DeepSeek-V3.2): the sparse MQA, the masked MHA, the lightning indexer, its
    # top-k, its projections and the key-only projection of the dense path
    "sparse_attention",
    "masked_attention",
    "indexer",
    "topk",
    "indexer_proj",
    "indexer_key",
)
# the attention op classes, and of them those whose heads share one latent cache (MQA)
ATTENTION_CLASSES = ("absorb_attention", "expand_attention", "sparse_attention", "masked_attention")
MQA_CLASSES = ("absorb_attention", "sparse_attention")
PROJECTIONS = ("kv_expand", "q_absorb", "out_absorb", "indexer_proj", "indexer_key")
# whole paths, for measurements that time a path end to end (`mlactl tune paths`)
PATH_CLASSES = ("path:expand", "path:expand_chunked", "path:absorb")
# the op classes whose CTAs walk their keys one block after another besides attention's
WALKERS = ("indexer", "topk")

# -- physical ranges: what a calibration file may hold (store.py) and what a fit may reach -------

# An efficiency is achieved / datasheet ceiling: above 0 (1e-4, a kernel at 0.01% of the
# datasheet, is already far below anything measured: aiconfigurator's lowest is 0.02) and at
# most ETA_PHYSICAL of the ceiling the fit divided by. Fits divide by the peak of the runs'
# compute dtype (bf16 for aiconfigurator) and count bf16 operands, so an fp8 kernel may reach
# twice that and an fp4 one four times (ETA_DTYPE).
ETA_LOWEST = 1e-4
ETA_PHYSICAL = 1.2
ETA_DTYPE = (("fp4", 4.0), ("fp8", 2.0), ("int8", 2.0))
# A fitted time (a launch's fixed cost, a request's or a row's cost): no term of one kernel
# launch takes a second; the largest fitted is 0.2 ms (t_fixed, aiconfigurator). A serial
# iteration (t_iter_s, one tile of a kernel's loop) is multiplied by waves x iterations, tens of
# thousands at long contexts, so it has its own bound: 1 ms, 500x the largest fitted (2 us).
SECONDS_MAX = 1.0
ITER_SECONDS_MAX = 1e-3
# `l2`: L2 reads are no slower than HBM's and at most 4x faster (Hopper's and Blackwell's L2s
# read at roughly 2.5-3.5x their HBM); an L2 is at most 1 GiB
L2_GAIN_MAX = 4.0
L2_BYTES_MAX = float(1 << 30)
# `chunk`: a workspace budget is a share of a GPU's memory, at most 10 TB
BUDGET_BYTES_MAX = 1e13
# `hblock`: a kernel's head or key block is a whole number of at most 1024 (a CTA's threads)
BLOCK_MAX = 1024
# A pass over the activations (`quant`) cannot beat the bandwidth: eta_q <= 1 in a fit. Its floor,
# ETA_PASS_MIN, only keeps the fit finite (fit.py tells the figures).
ETA_PASS_MIN = 0.01


def eta_limit(dtype) -> float:
    """The largest efficiency a fit of this dtype may have (ETA_PHYSICAL, times 2 for fp8)."""
    name = str(dtype or "").lower()
    return ETA_PHYSICAL * next((factor for key, factor in ETA_DTYPE if key in name), 1.0)


@dataclass(frozen=True)
class Param:
    """A fitted parameter: its three start values (the loss is not convex: each start is fitted
    and the best kept), its physical range (None: the dtype's eta_limit) and, where a fit is held
    tighter than a file may be, its fit range."""

    name: str
    starts: tuple[float, float, float]
    physical: tuple[float, float | None]
    fitted: tuple[float, float] | None = None

    def physical_range(self, eta_max: float) -> tuple[float, float]:
        lo, hi = self.physical
        return lo, eta_max if hi is None else hi

    def fit_range(self, eta_max: float) -> tuple[float, float]:
        return self.fitted or self.physical_range(eta_max)


def _seconds(name: str, starts, top: float = SECONDS_MAX) -> Param:
    return Param(name, starts, (0.0, top))


def _eta(name: str, starts, fitted=None) -> Param:
    return Param(name, starts, (ETA_LOWEST, None), fitted)


@dataclass(frozen=True)
class Term:
    """One term: the parameters it fits, the op classes it acts on (`scope`; `needs`: a term that
    must be on too), and a one-line meaning (model.py tells the physics)."""

    name: str
    meaning: str
    scope: tuple[str, ...]
    params: tuple[Param, ...] = ()
    needs: str | None = None


EVERY = OP_CLASSES + PATH_CLASSES
TILED = OP_CLASSES  # a tile model: every op class, no whole path
# t_fixed_s is fixed's, eta_c and eta_m the roofline's: all three always lead the vector (t_fixed
# is held at 0 without `fixed`)
T_FIXED = _seconds("t_fixed_s", (1e-5, 2e-6, 3e-5))
BASE_PARAMS = (T_FIXED, _eta("eta_c", (0.5, 0.3, 0.9)), _eta("eta_m", (0.7, 0.4, 0.9)))
TERM_LIST = (
    Term("fixed", "t_fixed: launch and setup, once per launch", EVERY),
    Term("pad", "the kernel computes whole tiles of query rows", TILED),
    Term("waves", "CTAs run in waves over the SMs; a last partial wave leaves SMs idle", TILED),
    Term("split", "split-KV: few CTAs split the context to fill the SMs, and merge fp32 partials", ATTENTION_CLASSES),
    Term("serial", "a CTA walks its KV blocks one after another: t_iter a block, per wave",
         ATTENTION_CLASSES + WALKERS, (_seconds("t_iter_s", (3e-7, 2e-6, 5e-8), ITER_SECONDS_MAX),)),
    Term("kvpad", "the cache is read in whole KV-block pages", ATTENTION_CLASSES),
    Term("sum", "compute and memory time added instead of overlapped", EVERY),
    Term("quant", "a pass over the activations before the GEMM, at eta_q of the bandwidth", PROJECTIONS,
         (_eta("eta_q", (0.3, 0.1, 0.8), (ETA_PASS_MIN, 1.0)),)),
    Term("combine", "t_combine: the kernel that merges a split launch's pieces", ATTENTION_CLASSES,
         (_seconds("t_combine_s", (3e-6, 1e-6, 5e-6)),)),
    Term("request", "t_request per request (page table, scheduling), not overlapped", ATTENTION_CLASSES,
         (_seconds("t_request_s", (3e-8, 1e-8, 5e-8)),)),
    Term("tile128", "attention tiles of 128 query rows by 128 keys, not 64 by 64", ATTENTION_CLASSES),
    Term("fa3split", "the split count FA3's heuristic picks", MQA_CLASSES, needs="split"),
    Term("kvcast", "a pass over the cache keys before the kernel, at eta_x of the bandwidth", ATTENTION_CLASSES,
         (_eta("eta_x", (0.3, 0.1, 0.8)),)),
    Term("qrow", "t_row per query row (token x head), not overlapped", ATTENTION_CLASSES,
         (_seconds("t_row_s", (1e-9, 3e-10, 3e-9)),)),
    Term("align", "t_align where the rows are not a multiple of 4", PROJECTIONS,
         (_seconds("t_align_s", (1e-6, 1e-6, 1e-6)),)),
    Term("near", "times the median residual of the nearest measured shapes", PROJECTIONS),
    Term("ops", "a whole path's attention at eta_c, its other ops at eta_p, added", PATH_CLASSES,
         (_eta("eta_p", (0.5, 0.5, 0.5)),)),
    Term("scores", "an unfused attention's fp32 scores written and read, at eta_s", PATH_CLASSES,
         (_eta("eta_s", (0.3, 0.3, 0.3)),)),
    Term("slots", "a sparse attention walks all top-k index slots of a query", ("sparse_attention",)),
    Term("reuse", "a sparse attention's rows selected by several queries are read once", ("sparse_attention",)),
    Term("hblock", "a sparse attention's kernel computes whole head blocks and walks a key block a step, the GPU's",
         ("sparse_attention",)),
    Term("l2", "a projection's memory (a top-k's walk and memory) at l2_gain where the launch fits in L2",
         PROJECTIONS + ("topk",),
         (Param("l2_gain", (1.5, 1.5, 1.5), (1.0, L2_GAIN_MAX)),)),
    Term("pipe", "compute and memory overlapped across the tiles each SM runs in turn", PROJECTIONS),
    Term("dgtile", "the tiles DeepGEMM's SM90 heuristic picks", PROJECTIONS),
    Term("rowsel", "a top-k selects only for rows that see more keys than it keeps; each walks its own", ("topk",)),
    Term("ctawave", "t_cta per wave of walking CTAs (a CTA's setup before its walk)", WALKERS,
         (_seconds("t_cta_s", (1e-6, 3e-7, 3e-6)),), needs="serial"),
    Term("rowwave", "t_rowwave per wave of all a top-k's query rows (each writes its top-k indices)", ("topk",),
         (_seconds("t_rowwave_s", (1e-6, 3e-7, 3e-6)),), needs="serial"),
    Term("chunk", "a top-k whose fp32 logits pass the indexer's workspace runs in row chunks: t_seq a row and sequence",
         ("topk",), (_seconds("t_seq_s", (1e-10, 3e-11, 3e-10)),)),
    Term("reread", "a top-k row that passes the SM's L1 is read from memory twice (histogram and threshold passes)",
         ("topk",)),
    Term("apart", "a top-k CTA's setup and its rows' index writes added to its walk, not overlapped with it",
         ("topk",), needs="serial"),
)  # fmt: skip
REGISTRY = {t.name: t for t in TERM_LIST}
TERMS = tuple(REGISTRY)
PARAMS = {p.name: p for p in BASE_PARAMS + tuple(p for t in TERM_LIST for p in t.params)}
BASE_TERMS = ("fixed",)


@dataclass(frozen=True)
class Size:
    """A size of the GPU a term divides the shapes by, kept in a fit's params under `name` (not
    fitted): null where not known (the term does nothing), else in [1, maximum], whole where `whole`."""

    term: str
    name: str
    maximum: float
    whole: bool = False


# every such size, in the order a fit's params keep them: the GPU's L2 in bytes, its indexer's
# logits budget in bytes, its sparse attention kernel's head and key blocks
SIZES = (
    Size("l2", "l2_bytes", L2_BYTES_MAX),
    Size("chunk", "logits_budget_bytes", BUDGET_BYTES_MAX),
    Size("hblock", "head_block", BLOCK_MAX, whole=True),
    Size("hblock", "key_block", BLOCK_MAX, whole=True),
)


def scoped(*classes: str) -> tuple[str, ...]:
    """The terms that act on these op classes only (on no other)."""
    return tuple(t.name for t in TERM_LIST if set(t.scope) <= set(classes))


# terms that only act on a sparse attention (DSA's): the top-k slots it walks, the rows it reuses,
# its kernel's head and key blocks on the GPU
SPARSE_TERMS = scoped("sparse_attention")
# terms that only act on the indexer's or the top-k's walk (DSA's): which rows select, what each
# CTA sets up, what every row writes, and whether those two overlap the walk
WALKER_TERMS = scoped(*WALKERS)


class Terms(frozenset[str]):
    """A fit's terms as a set with typed flags: `terms.pad` is whether `pad` is on. A name not in
    TERMS is an AttributeError, not a silent False."""

    @staticmethod
    @lru_cache(maxsize=1024)
    def _of(names: tuple[str, ...]) -> Terms:
        return Terms(names)

    @classmethod
    def of(cls, names) -> Terms:
        return names if isinstance(names, Terms) else Terms._of(tuple(names))

    def __getattr__(self, name: str) -> bool:
        if name not in REGISTRY:
            raise AttributeError(name)
        return name in self

    def without(self, *names: str) -> Terms:
        return Terms.of(t for t in self if t not in names)


def relevant_terms(op: str, terms) -> tuple[str, ...]:
    """The terms that change this op class's time (each term's scope, and what it needs): the
    others are dropped, not fitted."""
    have = set(terms)
    return tuple(
        t for t in terms if op in REGISTRY[t].scope and (REGISTRY[t].needs is None or REGISTRY[t].needs in have)
    )


def param_names(terms) -> list[str]:
    """The log-space parameter vector's layout for these terms (t_fixed always first; it is held
    at 0 when `fixed` is off), in TERMS' order."""
    on = set(terms)
    return [p.name for p in BASE_PARAMS] + [p.name for t in TERM_LIST if t.name in on for p in t.params]


def n_params(terms) -> int:
    """Free parameters of a fit with these terms."""
    return len(param_names(terms)) - ("fixed" not in terms)


def starts(k: int) -> dict[str, float]:
    """The k-th start (of three) of every parameter."""
    return {name: p.starts[k] for name, p in PARAMS.items()}


STARTS = [starts(k) for k in range(3)]


def unpack(theta: np.ndarray, terms) -> dict:
    """Log-space parameter vector -> named parameters."""
    e = np.exp(np.asarray(theta, dtype=np.float64))
    out = {k: float(v) for k, v in zip(param_names(terms), e)}
    if "fixed" not in terms:
        out["t_fixed_s"] = 0.0
    return out


def pack(params: dict, terms) -> np.ndarray:
    """Named parameters -> log-space vector (a parameter not given: its first start)."""
    v = [max(params.get(k, PARAMS[k].starts[0]), 1e-12) for k in param_names(terms)]
    return np.log(np.asarray(v, dtype=np.float64))


def bounds(name: str, eta_max: float) -> tuple[float, float]:
    """(lowest, highest) a parameter may take in a fit whose efficiencies reach eta_max."""
    return PARAMS[name].fit_range(eta_max)
