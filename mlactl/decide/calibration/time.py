"""The one time function: every time mlactl prints is asked of `path_times` (or `batch_time`).

With no calibration it is the roofline (mlactl.model.roofline); with one, each op takes its op class's
fitted time, and an op class the calibration lacks keeps its roofline time (listed by
`missing_ops`). A calibration with a whole-path fit (`path:<path>`, from `mlactl tune paths`)
times that path as one.

    times = path_times(cost, hw, calibration_or_None, batch, new, prefix)   # {path: PathTime}
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.calibration.model import by_phase, decode_like, op_class, predict
from mlactl.decide.calibration.sources import points_for
from mlactl.decide.calibration.steps import PathLaunches
from mlactl.decide.calibration.store import Fit, Model, fit_dtype  # noqa: F401  (fit_dtype: re-exported)
from mlactl.model import roofline
from mlactl.model.cost import MLA_PATHS, OPS, CostModel, Op
from mlactl.model.hardware import HardwareProfile
from mlactl.model.roofline import OpTime, PathTime, path_time, roofline_time


def scaled_ops(ops: list[Op], layers: int) -> list[Op]:
    if layers == 1:
        return ops
    return [Op(op.name, op.flops * layers, op.bytes * layers, op.weight_bytes * layers) for op in ops]


def predict_fit(fit: Model, cls: str, pts, peak: float, bandwidth: float, sm_count, smooth: bool = False):
    """A fit's (or a member's) seconds at `pts` (Points of class `cls`), by its terms for `cls`."""
    return predict(fit.params, fit.terms_for(cls), pts, peak, bandwidth, sm_count, smooth)


def calibrated_seconds(
    cost: CostModel,
    hw: HardwareProfile,
    peak: float,
    fit: Model,
    cls: str,
    batch,
    new,
    prefix,
    path: str | None = None,
) -> np.ndarray:
    """One op class's calibrated seconds (one layer) at the given points, as `path` runs it;
    `peak` is the one the fit divided by (Calibration.peak). `fit` is a fit of the calibration
    file or one of its members."""

    pts = points_for(cost, cls, batch, new, prefix, None, path=path)
    return predict_fit(fit, cls, pts, peak, hw.bandwidth, hw.sm_count)


def op_seconds(cost: CostModel, hw: HardwareProfile, calibration, cls: str, batch, new, prefix, path=None):
    """Calibrated seconds of an op class, or None if the calibration has no fit for it. Where it
    has a decode and a prefill fit (aiconfigurator's two tables), a decode-like point
    (model.decode_like) takes decode's, every other point prefill's."""
    fits = calibration.class_fits(cost, cls)
    if fits is None:
        return None
    peak = calibration.peak(hw)
    return by_phase(
        decode_like(new, prefix), fits, lambda f: calibrated_seconds(cost, hw, peak, f, cls, batch, new, prefix, path)
    )


def missing_ops(calibration, paths=MLA_PATHS) -> list[str]:
    """Op classes of `paths` the calibration has no fit for (they keep roofline time); pass a
    DSA model's `cost.choices` for its paths."""
    if calibration is None:
        return []
    have = calibration.classes
    out = []
    for p in paths:
        if f"path:{p}" in have:
            continue
        out += [c for c in (op_class(p, o) for o in OPS[p]) if c not in have and c not in out]
    return out


def path_times(
    cost: CostModel,
    hw: HardwareProfile,
    calibration,
    batch,
    new,
    prefix,
    paths=None,
    layers: int = 1,
) -> dict[str, PathTime]:
    """{path: PathTime} at every point, roofline or calibrated; `layers` multiplies (each layer
    launches its own kernels, so a fixed cost counts once per layer). `paths` defaults to every
    path of the model (cost.paths)."""
    out = {}
    for p in cost.paths if paths is None else paths:
        ops = scaled_ops(cost.ops(p, batch, new, prefix), layers)
        roof = path_time(ops, hw, cost.dtype, p)
        if calibration is None:
            out[p] = roof
            continue
        whole = calibration.whole_path(cost, p)
        timed = []
        for op in roof.ops:
            cls = op_class(p, op.name)
            t = None if whole else op_seconds(cost, hw, calibration, cls, batch, new, prefix, p)
            t = op.time_s if t is None else t * layers
            timed.append(OpTime(op.name, op.flops, op.bytes, op.weight_bytes, t, op.compute_bound))
        total = sum(o.time_s for o in timed)
        if whole:
            peak = calibration.peak(hw)
            total = calibrated_seconds(cost, hw, peak, whole, f"path:{p}", batch, new, prefix) * layers
        out[p] = PathTime(
            p, timed, roof.flops, roof.bytes, np.broadcast_to(total, np.shape(roof.flops)), roof.compute_bound
        )
    return out


def _by_time(search, cost: CostModel, hw: HardwareProfile, calibration, prefixes, **kwargs):
    """A mlactl.model.roofline search by the times of `path_times`: roofline, or calibrated."""
    if calibration is None:
        return search(cost, hw, prefixes, **kwargs)

    def times(batch, new, prefix, paths):
        return path_times(cost, hw, calibration, batch, new, prefix, paths=paths)

    return search(cost, hw, prefixes, times=times, **kwargs)


def crossover_by_time(cost: CostModel, hw: HardwareProfile, calibration, prefixes, **kwargs) -> list[int | None]:
    """mlactl.model.roofline.crossover_by_time by the times of `path_times`: roofline, or
    calibrated with `calibration`. Keyword arguments as there (batch, path, max_new)."""
    return _by_time(roofline.crossover_by_time, cost, hw, calibration, prefixes, **kwargs)


def window_by_time(cost: CostModel, hw: HardwareProfile, calibration, prefixes, **kwargs):
    """mlactl.model.roofline.window_by_time by the times of `path_times`: roofline, or calibrated
    with `calibration`. Keyword arguments as there (batch, path, against, max_new)."""
    return _by_time(roofline.window_by_time, cost, hw, calibration, prefixes, **kwargs)


def batch_time(cost: CostModel, hw: HardwareProfile, calibration, new, prefix, count, paths) -> float:
    """Time of a mixed batch whose request rows (`count` requests each) run `paths` (an array of
    names): the rows on one path share one launch per op (steps.PathLaunches over one group):
    one read of the weights, one fixed cost."""
    total = 0.0
    for path in cost.choices:
        rows = np.asarray(paths) == path
        if rows.any():
            launch = PathLaunches(cost, hw, calibration, path, new[rows], prefix[rows], count=count[rows])
            total += float(launch.seconds([0])[0])
    return total


def launch_parts(cost: CostModel, hw: HardwareProfile, calibration, path: str, count, new, prefix) -> list[float]:
    """Calibrated seconds of one launch per op over request rows (`count` requests each), op by
    op in cost.ops's order (one entry for a whole-path fit): steps.PathLaunches over one group."""
    launch = PathLaunches(cost, hw, calibration, path, new, prefix, count=count)
    return launch.class_seconds([0])[:, 0].tolist()


def own_times(cost: CostModel, hw: HardwareProfile, calibration, new, prefix, count) -> dict[str, np.ndarray]:
    """Each request row's time on each path, weights left out (the batch shares their read)."""
    if calibration is None:
        peak, bandwidth = hw.peak_flops(cost.dtype), hw.bandwidth
        return {
            p: sum(
                roofline_time(op.flops, op.bytes - op.weight_bytes, peak, bandwidth)
                for op in cost.ops(p, count, new, prefix)
            )
            for p in cost.choices
        }
    return {p: t.time_s for p, t in path_times(cost, hw, calibration, count, new, prefix, paths=cost.choices).items()}
