"""Fitting an op class's parameters to measured times: robust, in relative error, k-fold held out.

The residual of a point is log(predicted / measured): relative, symmetric in over- and
under-prediction, and the same for a 10 us decode and a 10 ms prefill. A soft-L1 loss
(scipy's least_squares) keeps a few noisy points from pulling the fit. The error quoted is
|predicted / measured - 1|, its median and 90th percentile, in-sample and held out: k folds
(5), each point predicted by a fit that never saw it (nor any point of its group).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mlactl.decide.calibration.model import (
    PROJECTIONS,
    Points,
    logits_budget,
    near_table,
    predict,
    rows_of,
    sparse_blocks,
)
from mlactl.decide.calibration.terms import (  # noqa: F401  (bounds, ETA_PASS_MIN: re-exported)
    ETA_PASS_MIN,
    SIZES,
    STARTS,
    Terms,
    bounds,
    eta_limit,
    n_params,
    pack,
    param_names,
    unpack,
)
from mlactl.util.errors import MlactlError

K_FOLDS = 5
SEED = 0  # folds are random but fixed: the same data gives the same figures
# Parameters are bounded where the physics bounds them (terms.py: each parameter's range), the
# same bounds the file's reader holds them to (store.py). Efficiencies by eta_limit: 1.2 of the
# ceiling divided by, twice that for fp8 since fits divide by the bf16 peak and count bf16 operands; without the bound a
# memory-bound table (decode) leaves eta_c free and it runs off to 50x, which a prediction at
# prefill sizes would use. A pass over the activations (`quant`) cannot beat the bandwidth:
# eta_q <= 1. Its floor, ETA_PASS_MIN, only keeps the fit finite: vLLM 0.24's Cutlass fp8 GEMM
# really spends ~7.4 ns per token quantising (247 us for 32K rows of one head on an H200, where
# the bytes need 10 us): eta_q 0.027, which predicts the rows above 1024 within 12% / 28%
# (blocked median / p90). A floor of 0.3 there gave 30% / 64%. Where a small eta_q is a fixed
# cost in disguise (SGLang's fp8 GEMM on an H200 fitted 0.028 on small GEMMs and predicted
# 1-head shapes 3-9x too slow above 1024 rows), the blocked split in term selection
# drops the term instead. Times: at most a second, a serial iteration at most 1 ms.
ETA_MAX = eta_limit("bf16")
# (the max makes the loss non-convex: each of terms.STARTS is fitted, the best kept)


@dataclass(frozen=True)
class Machine:
    """The nominal ceilings a fit divides by: peak FLOP/s, bytes/s and SM count."""

    peak: float
    bandwidth: float
    sm_count: int | None
    eta_max: float = ETA_MAX  # the largest efficiency a fit may reach (fit() sets it per dtype)
    l2_bytes: float | None = None  # the GPU's L2, for `l2` (hardware profile's l2_mib)
    memory_bytes: float | None = None  # the GPU's memory, for `chunk` (hardware profile's memory_gb)
    arch: str | None = None  # sm90, sm100, ... (engines.arch_of): `dgtile`'s Hopper, `hblock`'s blocks

    @property
    def sm90(self) -> bool:
        """A Hopper GPU (H100/H200/H800): DeepGEMM's SM90 tile heuristic, for `dgtile`."""
        return self.arch == "sm90"

    def predict(self, params: dict, terms, pts: Points, smooth: bool = False) -> np.ndarray:
        """model.predict at these ceilings: the seconds of `pts` by a fit's params and terms."""
        return predict(params, terms, pts, self.peak, self.bandwidth, self.sm_count, smooth)


@dataclass(frozen=True)
class Evidence:
    """What a fit's held-out scores were computed from, kept for its interval (not written)."""

    held_out_pred: np.ndarray  # each point predicted by the fit on the other random folds (NaN: none)
    folds: list  # [(test indices, params of the fit on the rest)]
    split: object | None  # the blocked Split, or None
    blocked_pred: np.ndarray | None  # the split's test points predicted from its train points
    blocked_params: dict | None


@dataclass(frozen=True)
class FitResult:
    op: str
    source: str
    dtype: str
    terms: tuple[str, ...]
    params: dict
    n: int
    in_sample: dict  # {"median", "p90"}
    held_out: dict
    drift: dict | None = None  # whole paths fitted together: the shapes' common drift removed
    blocked: dict | None = None  # {"axis", "at", "n_train", "n_test", "median", "p90"}
    # what the calibration file keeps for intervals and each op's basis (selection adds them):
    # {"range", "shapes", "interval", "members"} (mlactl.decide.calibration.uncertainty)
    extra: dict = field(default_factory=dict)
    evidence: Evidence | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, entry: dict) -> FitResult:
        """A calibration file's fit as it was fitted (`to_json` read back); a file written by hand
        may lack the counts and errors: 0 points, errors not known (None)."""
        unknown = {"median": None, "p90": None}
        own = ("op", "source", "dtype", "terms", "params", "n", "in_sample", "held_out", "drift", "blocked")
        return cls(
            entry["op"], entry.get("source") or "", entry.get("dtype") or "", tuple(entry["terms"]), entry["params"],
            int(entry.get("n") or 0), entry.get("in_sample") or unknown, entry.get("held_out") or unknown,
            entry.get("drift"), entry.get("blocked"), {k: v for k, v in entry.items() if k not in own},
        )  # fmt: skip

    def summary_json(self) -> dict:
        """What `mlactl calibrate -f json` (and `calibrate show`) say of a fit: the file's entry
        without the evidence behind its intervals; `near`'s residual table as its count."""
        return {
            "op": self.op,
            "source": self.source,
            "dtype": self.dtype,
            "terms": list(self.terms),
            "n": self.n,
            "params": {k: ({"points": len(v["log_residual"])} if k == "near" else v) for k, v in self.params.items()},
            "in_sample": self.in_sample,
            "held_out": self.held_out,
            "blocked": self.blocked,
            "interval_coverage": ((self.extra.get("interval") or {}).get("coverage") or {}).get("held_out"),
            "members": [m["terms"] for m in self.extra.get("members", [])],
            **({"drift": self.drift} if self.drift else {}),
        }

    def to_json(self) -> dict:
        out = {
            "op": self.op,
            "source": self.source,
            "dtype": self.dtype,
            "terms": list(self.terms),
            "n": self.n,
            "params": self.params,
            "in_sample": self.in_sample,
            "held_out": self.held_out,
        }
        if self.blocked is not None:
            out["blocked"] = self.blocked
        if self.drift is not None:
            out["drift"] = self.drift
        out.update(self.extra)
        return out


def rel_errors(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(measured) - 1.0)


def summary(errors: np.ndarray) -> dict:
    if len(errors) == 0:
        return {"median": None, "p90": None}
    return {"median": float(np.median(errors)), "p90": float(np.percentile(errors, 90))}


def gpu_sizes(terms, l2_bytes: float | None, memory_bytes: float | None, arch: str | None) -> dict:
    """{name: value} of the GPU's sizes (terms.SIZES) these terms use, from its L2, memory and
    architecture: its L2 (`l2`), its indexer's logits budget (`chunk`) and its sparse attention
    kernel's head and key blocks (`hblock`); None where not known."""
    head, key = sparse_blocks(arch) or (None, None)
    every = dict(l2_bytes=l2_bytes, logits_budget_bytes=logits_budget(memory_bytes), head_block=head, key_block=key)
    return {size.name: every[size.name] for size in SIZES if size.term in terms}


def with_sizes(params: dict, terms, machine: Machine) -> dict:
    """The GPU's sizes a fit's terms divide the shapes by, kept in the params (not fitted): its
    L2 (`l2`), its indexer's logits budget (`chunk`) and its sparse attention kernel's head and
    key blocks (`hblock`)."""
    params.update(gpu_sizes(terms, machine.l2_bytes, machine.memory_bytes, machine.arch))
    return params


def fit_params(pts: Points, machine: Machine, terms) -> dict:
    """Least-squares fit of one op class; returns named parameters. With `near`, the parametric
    part is fitted first and its residuals at these points become params["near"]."""
    if Terms.of(terms).near:
        plain = tuple(t for t in terms if t != "near")
        params = fit_params(pts, machine, plain)
        params["near"] = near_table(params, plain, pts, machine.peak, machine.bandwidth, machine.sm_count)
        return params
    try:
        from scipy.optimize import least_squares
    except ImportError:
        raise MlactlError("fitting a calibration needs scipy: `pip install 'mlactl[calibrate]'`") from None

    k = n_params(terms)
    if len(pts) < k + 1:
        raise MlactlError(
            f"{pts.op}: {len(pts)} measured points for {k} parameters; need at least {k + 1} (more is better)"
        )
    measured = np.asarray(pts.time_s, dtype=np.float64)
    if not np.all(np.isfinite(measured)) or np.any(measured <= 0):
        raise MlactlError(f"{pts.op}: measured times must be positive and finite")

    def residuals(theta):
        params = with_sizes(unpack(theta, terms), terms, machine)
        return np.log(machine.predict(params, terms, pts) / measured)

    best = None
    fixed = Terms.of(terms).fixed
    for start in STARTS:
        theta0 = pack(start, terms)
        mask = np.ones_like(theta0, dtype=bool)
        if not fixed:  # t_fixed (first) held at 0
            theta0[0], mask[0] = np.log(1e-12), False

        def free_res(x, theta0=theta0, mask=mask):
            theta = theta0.copy()
            theta[mask] = x
            return residuals(theta)

        lower, upper = np.full(len(theta0), -np.inf), np.full(len(theta0), np.inf)
        for i, name in enumerate(param_names(terms)):
            lo, hi = bounds(name, machine.eta_max)
            lower[i] = -np.inf if lo <= 0 else np.log(lo)
            upper[i] = np.log(hi)
        x0 = np.clip(theta0[mask], lower[mask] + 1e-9, upper[mask] - 1e-9)
        sol = least_squares(
            free_res, x0, bounds=(lower[mask], upper[mask]), loss="soft_l1", f_scale=0.05, method="trf", max_nfev=200
        )
        theta = theta0.copy()
        theta[mask] = sol.x
        if best is None or sol.cost < best[0]:
            best = (sol.cost, theta)
    assert best is not None, "least_squares ran at least once"
    return with_sizes(unpack(best[1], terms), terms, machine)  # t_fixed 0 without `fixed`


def folds(pts: Points, k: int = K_FOLDS) -> list[np.ndarray]:
    """Indices of k test folds; points of one group (e.g. one measured shape) stay together."""
    groups = np.arange(len(pts)) if pts.group is None else np.asarray(pts.group)
    uniq = np.unique(groups)
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(uniq))
    fold_of_group = dict(zip(uniq[order].tolist(), (np.arange(len(uniq)) % k).tolist()))
    fold = np.array([fold_of_group[g] for g in groups.tolist()])
    return [np.flatnonzero(fold == i) for i in range(k) if np.any(fold == i)]


def held_out_predictions(pts: Points, machine: Machine, terms, k: int = K_FOLDS) -> tuple[np.ndarray, list]:
    """Each point predicted by a fit on the other folds, and [(test indices, that fit's params)]."""
    pred = np.full(len(pts), np.nan)
    fitted = []
    for test in folds(pts, k):
        train = np.setdiff1d(np.arange(len(pts)), test)
        params = fit_params(pts.take(train), machine, terms)
        pred[test] = machine.predict(params, terms, pts.take(test))
        fitted.append((test, params))
    return pred, fitted


# Blocked split: fit the lower part of a size axis, predict the upper part. Attention and whole
# paths split on the context (keys per request) at 8K, projections on the GEMM's rows at 1024
# (the held-out targets); where that leaves fewer than BLOCKED_MIN_TEST points above or too few
# to fit below, at the median of the axis's distinct values instead.
BLOCKED_SPLITS = {"context": 8192.0, "rows": 1024.0}
BLOCKED_MIN_TEST = 10


@dataclass(frozen=True)
class Split:
    axis: str
    at: float  # train: axis <= at; test: axis > at
    train: np.ndarray
    test: np.ndarray

    def describe(self) -> dict:
        return {"axis": self.axis, "at": self.at, "n_train": int(len(self.train)), "n_test": int(len(self.test))}


def blocked_split(pts: Points, terms=("fixed",)) -> Split | None:
    """The blocked split of these points (see BLOCKED_SPLITS), or None where the axis has too few
    distinct sizes to leave enough points on each side for a fit."""
    axis = "rows" if pts.op in PROJECTIONS or pts.op == "lse_merge" else "context"
    v = rows_of(pts) if axis == "rows" else np.asarray(pts.context, dtype=np.float64)
    need = n_params(terms) + 1

    def split_at(at: float) -> Split | None:
        train, test = np.flatnonzero(v <= at), np.flatnonzero(v > at)
        if len(train) < need or len(test) < max(need, BLOCKED_MIN_TEST):
            return None
        return Split(axis, float(at), train, test)

    found = split_at(BLOCKED_SPLITS[axis])
    if found is None:
        sizes = np.unique(v)
        if len(sizes) >= 2:
            found = split_at(float(sizes[(len(sizes) - 1) // 2]))
    return found


def blocked_predictions(pts: Points, machine: Machine, terms, split: Split) -> tuple[np.ndarray, dict]:
    """The upper part's points predicted by a fit on the lower part; and that fit's params."""
    params = fit_params(pts.take(split.train), machine, terms)
    return machine.predict(params, terms, pts.take(split.test)), params


def fit(
    pts: Points, machine: Machine, terms, source: str, dtype: str, k: int = K_FOLDS, blocked: bool = True
) -> FitResult:
    """Fit `terms` to all the points; held-out error over k random folds and, with `blocked`,
    over the blocked split (fit the lower part of the size axis, predict the upper)."""
    measured = pts.time_s
    assert measured is not None, "fitted points are measured"
    machine = replace(machine, eta_max=eta_limit(dtype))
    params = fit_params(pts, machine, terms)
    pred = machine.predict(params, terms, pts)
    if len(pts) >= 2 * k:
        held, fitted = held_out_predictions(pts, machine, terms, k)
    else:
        held, fitted = np.full(len(pts), np.nan), []
    split = blocked_split(pts, terms) if blocked else None
    block = None
    if split is not None:
        bpred, bparams = blocked_predictions(pts, machine, terms, split)
        block = dict(split.describe(), **summary(rel_errors(bpred, measured[split.test])))
    return FitResult(
        op=pts.op,
        source=source,
        dtype=dtype,
        terms=tuple(terms),
        params=params,
        n=len(pts),
        in_sample=summary(rel_errors(pred, measured)),
        held_out=summary(rel_errors(held, measured)[np.isfinite(held)]),
        blocked=block,
        evidence=Evidence(held, fitted, split, bpred if split is not None else None, bparams if split else None),
    )
