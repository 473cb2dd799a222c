"""Fitting an op class's parameters to measured times: robust, in relative error, k-fold held out.

The residual of a point is log(predicted / measured): relative, symmetric in over- and
under-prediction, and the same for a 10 us decode and a 10 ms prefill. A soft-L1 loss
(scipy's least_squares) keeps a few noisy points from pulling the fit. The error quoted is
|predicted / measured - 1|, its median and 90th percentile, in-sample and held out: k folds
(5), each point predicted by a fit that never saw it (nor any point of its group).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mlactl.decide.calibration.model import Points, n_params, near_table, pack, param_names, predict, unpack
from mlactl.decide.calibration.store import ITER_SECONDS_MAX, SECONDS_MAX, eta_limit
from mlactl.util.errors import MlactlError

K_FOLDS = 5
SEED = 0  # folds are random but fixed: the same data gives the same figures
# starting points: efficiencies between a third and nine tenths of the datasheet, 1-20 us fixed
# Efficiencies are bounded by their physical range (store.eta_limit: 1.2 of the ceiling divided
# by, twice that for fp8 since fits divide by the bf16 peak and count bf16 operands); without the
# bound a memory-bound table (decode) leaves eta_c free and it runs off to 50x, which a prediction
# at prefill sizes would use, and a calibration file with it would be refused as unphysical.
ETA_MAX = eta_limit("bf16")
# (the max makes the loss non-convex: one start lands in a worse minimum on 1 table in 10)
STARTS = [
    {
        "t_fixed_s": 1e-5,
        "eta_c": 0.5,
        "eta_m": 0.7,
        "t_iter_s": 3e-7,
        "eta_q": 0.3,
        "eta_x": 0.3,
        "t_row_s": 1e-9,
        "t_combine_s": 3e-6,
        "t_request_s": 3e-8,
    },
    {
        "t_fixed_s": 2e-6,
        "eta_c": 0.3,
        "eta_m": 0.4,
        "t_iter_s": 2e-6,
        "eta_q": 0.1,
        "eta_x": 0.1,
        "t_row_s": 3e-10,
        "t_combine_s": 1e-6,
        "t_request_s": 1e-8,
    },
    {
        "t_fixed_s": 3e-5,
        "eta_c": 0.9,
        "eta_m": 0.9,
        "t_iter_s": 5e-8,
        "eta_q": 0.8,
        "eta_x": 0.8,
        "t_row_s": 3e-9,
        "t_combine_s": 5e-6,
        "t_request_s": 5e-8,
    },
]


@dataclass(frozen=True)
class Machine:
    """The nominal ceilings a fit divides by: peak FLOP/s, bytes/s and SM count."""

    peak: float
    bandwidth: float
    sm_count: int | None
    eta_max: float = ETA_MAX  # the largest efficiency a fit may reach (fit() sets it per dtype)


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
        if self.drift is not None:
            out["drift"] = self.drift
        return out


def rel_errors(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(measured) - 1.0)


def summary(errors: np.ndarray) -> dict:
    if len(errors) == 0:
        return {"median": None, "p90": None}
    return {"median": float(np.median(errors)), "p90": float(np.percentile(errors, 90))}


def fit_params(pts: Points, machine: Machine, terms) -> dict:
    """Least-squares fit of one op class; returns named parameters. With `near`, the parametric
    part is fitted first and its residuals at these points become params["near"]."""
    if "near" in terms:
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
        params = unpack(theta, terms)
        return np.log(predict(params, terms, pts, machine.peak, machine.bandwidth, machine.sm_count) / measured)

    best = None
    for start in STARTS:
        theta0 = pack(start, terms)
        if "fixed" not in terms:
            theta0[0] = np.log(1e-12)
        mask = np.ones_like(theta0, dtype=bool)
        if "fixed" not in terms:
            mask[0] = False

        def free_res(x, theta0=theta0, mask=mask):
            theta = theta0.copy()
            theta[mask] = x
            return residuals(theta)

        upper = np.full(len(theta0), np.inf)
        for i, name in enumerate(param_names(terms)):
            if name.startswith("eta_"):
                upper[i] = np.log(machine.eta_max)
            else:  # a time: the same bounds the file's reader holds it to
                upper[i] = np.log(ITER_SECONDS_MAX if name == "t_iter_s" else SECONDS_MAX)
        x0 = np.minimum(theta0[mask], upper[mask] - 1e-9)
        sol = least_squares(
            free_res, x0, bounds=(-np.inf, upper[mask]), loss="soft_l1", f_scale=0.05, method="trf", max_nfev=200
        )
        theta = theta0.copy()
        theta[mask] = sol.x
        if best is None or sol.cost < best[0]:
            best = (sol.cost, theta)
    params = unpack(best[1], terms)
    if "fixed" not in terms:
        params["t_fixed_s"] = 0.0
    return params


def folds(pts: Points, k: int = K_FOLDS) -> list[np.ndarray]:
    """Indices of k test folds; points of one group (e.g. one measured shape) stay together."""
    groups = np.arange(len(pts)) if pts.group is None else np.asarray(pts.group)
    uniq = np.unique(groups)
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(uniq))
    fold_of_group = dict(zip(uniq[order].tolist(), (np.arange(len(uniq)) % k).tolist()))
    fold = np.array([fold_of_group[g] for g in groups.tolist()])
    return [np.flatnonzero(fold == i) for i in range(k) if np.any(fold == i)]


def held_out_errors(pts: Points, machine: Machine, terms, k: int = K_FOLDS) -> np.ndarray:
    """Each point's relative error when predicted by a fit on the other folds."""
    errors = np.full(len(pts), np.nan)
    for test in folds(pts, k):
        train = np.setdiff1d(np.arange(len(pts)), test)
        params = fit_params(pts.take(train), machine, terms)
        sub = pts.take(test)
        errors[test] = rel_errors(
            predict(params, terms, sub, machine.peak, machine.bandwidth, machine.sm_count), sub.time_s
        )
    return errors


def fit(pts: Points, machine: Machine, terms, source: str, dtype: str, k: int = K_FOLDS) -> FitResult:
    machine = replace(machine, eta_max=eta_limit(dtype))
    params = fit_params(pts, machine, terms)
    pred = predict(params, terms, pts, machine.peak, machine.bandwidth, machine.sm_count)
    held = held_out_errors(pts, machine, terms, k) if len(pts) >= 2 * k else np.array([])
    return FitResult(
        op=pts.op,
        source=source,
        dtype=dtype,
        terms=tuple(terms),
        params=params,
        n=len(pts),
        in_sample=summary(rel_errors(pred, pts.time_s)),
        held_out=summary(held),
    )
