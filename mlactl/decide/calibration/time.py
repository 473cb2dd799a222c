"""The one time function: every time mlactl prints is asked of `path_times` (or `batch_time`).

With no calibration it is the roofline (mlactl.model.roofline); with one, each op takes its op class's
fitted time, and an op class the calibration lacks keeps its roofline time (listed by
`missing_ops`). A calibration with a whole-path fit (`path:<path>`, from `mlactl tune paths`)
times that path as one.

    times = path_times(cost, hw, calibration_or_None, batch, new, prefix)   # {path: PathTime}
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.calibration.model import (
    PROJECTIONS,
    added_seconds,
    busy_seconds,
    components,
    decode_like,
    memory_eta,
    near_factor,
    op_class,
    predict,
    tile_waves,
)
from mlactl.decide.calibration.sources import points_for
from mlactl.model import roofline
from mlactl.model.cost import MLA_PATHS, OPS, CostModel, Op
from mlactl.model.hardware import HardwareProfile
from mlactl.model.roofline import OpTime, PathTime, path_time, roofline_time


def scaled_ops(ops: list[Op], layers: int) -> list[Op]:
    if layers == 1:
        return ops
    return [Op(op.name, op.flops * layers, op.bytes * layers, op.weight_bytes * layers) for op in ops]


def fit_dtype(cost: CostModel, cls: str) -> str:
    return cost.kv_dtype if "attention" in cls or cls.startswith("path:") else cost.dtype


def fit_terms(fit: dict, cls: str) -> list[str]:
    """The terms a fit predicts with: its own, and `split` for an absorb attention fit with waves
    but no split (see below)."""
    terms = list(fit["terms"])
    if cls == "absorb_attention" and "waves" in terms and "split" not in terms:
        # a fit on prefill tables (prefix 0) never saw few CTAs over a long cache; there the
        # kernel splits the KV (the split term has no parameter to fit), so add it
        terms.append("split")
    return terms


def predict_fit(fit: dict, cls: str, pts, peak: float, bandwidth: float, sm_count, smooth: bool = False):
    """A fit's (or a member's: {"terms", "params"}) seconds at `pts` (Points of class `cls`)."""
    return predict(fit["params"], fit_terms(fit, cls), pts, peak, bandwidth, sm_count, smooth)


def calibrated_seconds(
    cost: CostModel,
    hw: HardwareProfile,
    peak: float,
    fit: dict,
    cls: str,
    batch,
    new,
    prefix,
    path: str | None = None,
    smooth: bool = False,
) -> np.ndarray:
    """One op class's calibrated seconds (one layer) at the given points, as `path` runs it;
    `peak` is the one the fit divided by (Calibration.peak). `fit` is a fit of the calibration
    file or one of its members ({"terms", "params"}); `smooth`: without its counts' steps."""

    pts = points_for(cost, cls, batch, new, prefix, None, path=path)
    return predict_fit(fit, cls, pts, peak, hw.bandwidth, hw.sm_count, smooth)


def op_seconds(cost: CostModel, hw: HardwareProfile, calibration, cls: str, batch, new, prefix, path=None):
    """Calibrated seconds of an op class, or None if the calibration has no fit for it. Where it
    has a decode and a prefill fit (aiconfigurator's two tables), a point with a cached prefix and
    at most DECODE_MAX_NEW new tokens takes decode's (the range the decode table measured), every
    other point prefill's: a decode table is memory-bound and says little about compute."""
    decode, prefill = calibration.phase_fits(cls, fit_dtype(cost, cls))
    if decode is None or prefill is None:
        return None
    t_prefill = calibrated_seconds(cost, hw, calibration.peak(hw), prefill, cls, batch, new, prefix, path)
    if decode is prefill:
        return t_prefill
    t_decode = calibrated_seconds(cost, hw, calibration.peak(hw), decode, cls, batch, new, prefix, path)
    return np.where(decode_like(new, prefix), t_decode, t_prefill)


def whole_path_fit(cost: CostModel, calibration, path: str) -> dict | None:
    """A whole-path fit for `path`; expand_chunked without its own takes expand's, applied to
    expand_chunked's own FLOPs and bytes (the same ops, chunk by chunk, plus the lse merges)."""
    fit = calibration.fit_for(f"path:{path}", fit_dtype(cost, f"path:{path}"))
    if fit is None and path == "expand_chunked":
        fit = calibration.fit_for("path:expand", fit_dtype(cost, "path:expand"))
    return fit


def missing_ops(calibration, paths=MLA_PATHS) -> list[str]:
    """Op classes of `paths` the calibration has no fit for (they keep roofline time); pass a
    DSA model's `cost.choices` for its paths."""
    if calibration is None:
        return []

    have = {f["op"] for f in calibration.fits}
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
        whole = whole_path_fit(cost, calibration, p)
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


def crossover_by_time(cost: CostModel, hw: HardwareProfile, calibration, prefixes, **kwargs) -> list[int | None]:
    """mlactl.model.roofline.crossover_by_time by the times of `path_times`: roofline, or
    calibrated with `calibration`. Keyword arguments as there (batch, path, max_new)."""
    if calibration is None:
        return roofline.crossover_by_time(cost, hw, prefixes, **kwargs)

    def times(batch, new, prefix, paths):
        return path_times(cost, hw, calibration, batch, new, prefix, paths=paths)

    return roofline.crossover_by_time(cost, hw, prefixes, times=times, **kwargs)


def window_by_time(cost: CostModel, hw: HardwareProfile, calibration, prefixes, **kwargs):
    """mlactl.model.roofline.window_by_time by the times of `path_times`: roofline, or calibrated
    with `calibration`. Keyword arguments as there (batch, path, against, max_new)."""
    if calibration is None:
        return roofline.window_by_time(cost, hw, prefixes, **kwargs)

    def times(batch, new, prefix, paths):
        return path_times(cost, hw, calibration, batch, new, prefix, paths=paths)

    return roofline.window_by_time(cost, hw, prefixes, times=times, **kwargs)


def batch_time(cost: CostModel, hw: HardwareProfile, calibration, new, prefix, count, paths) -> float:
    """Time of a mixed batch whose request rows run `paths` (an array of names): requests on one
    path share one launch per op, so one read of the weights (roofline) and one fixed cost
    (calibrated: the rows' times less all but one t_fixed)."""
    total = 0.0
    for path in cost.choices:
        rows = paths == path
        if not rows.any():
            continue
        if calibration is None:
            for op in cost.ops(path, count[rows], new[rows], prefix[rows]):
                flops = op.flops.sum()
                nbytes = (op.bytes - op.weight_bytes).sum() + op.weight_bytes.max()
                total += float(roofline_time(flops, nbytes, hw.peak_flops(cost.dtype), hw.bandwidth))
            continue
        total += _launch_seconds(cost, hw, calibration, path, count[rows], new[rows], prefix[rows])
    return total


def _launch_seconds(cost: CostModel, hw: HardwareProfile, calibration, path: str, count, new, prefix) -> float:
    """Calibrated time of one launch per op over several request rows: one fixed cost, the rows'
    compute, memory and serial seconds each summed, the weights' read counted once."""
    return sum(launch_parts(cost, hw, calibration, path, count, new, prefix))


def launch_parts(cost: CostModel, hw: HardwareProfile, calibration, path: str, count, new, prefix) -> list[float]:
    """`_launch_seconds` op by op, in cost.ops's order (one entry for a whole-path fit)."""

    peak, bandwidth = calibration.peak(hw), hw.bandwidth
    whole = whole_path_fit(cost, calibration, path)
    classes = [f"path:{path}"] if whole else [op_class(path, op.name) for op in cost.ops(path, 1, 1, 0)]
    ops = cost.ops(path, count, new, prefix)
    parts = []
    for k, cls in enumerate(classes):
        decode, prefill = calibration.phase_fits(cls, fit_dtype(cost, cls))
        fit = whole or (decode if np.all(decode_like(new, prefix)) else prefill)
        if fit is None:  # no fit: the roofline of the summed op, weights once
            op = ops[k]
            nbytes = (op.bytes - op.weight_bytes).sum() + op.weight_bytes.max()
            parts.append(float(roofline_time(op.flops.sum(), nbytes, peak, bandwidth)))
            continue
        pts = points_for(cost, cls, count, new, prefix, None, path=path)
        t_fixed, t_c, t_m, serial = components(fit["params"], fit["terms"], pts, peak, bandwidth, hw.sm_count)
        weights = sum(op.weight_bytes for op in ops) if whole else ops[k].weight_bytes
        w = np.broadcast_to(weights, np.shape(t_m)) / (fit["params"]["eta_m"] * bandwidth)
        memory = np.sum(t_m) - np.sum(w) + (np.max(w) if len(w) else 0.0)
        if "l2" in fit["terms"] and cls in PROJECTIONS:  # the launch's whole working set decides L2 residency
            wb = np.broadcast_to(weights, np.shape(pts.bytes))
            launch_bytes = float(np.sum(pts.bytes) - np.sum(wb) + (np.max(wb) if len(wb) else 0.0))
            memory = launch_bytes / (float(memory_eta(fit["params"], fit["terms"], cls, launch_bytes)) * bandwidth)
        added = np.sum(added_seconds(fit["params"], fit["terms"], pts, bandwidth, hw.sm_count))
        # one GEMM over all the rows' tokens: its shape (bucket, tiles) is the summed one's
        whole_gemm = None
        if cls in PROJECTIONS and {"pipe", "near"} & set(fit["terms"]):
            whole_gemm = points_for(cost, cls, 1, [np.sum(count * new)], [np.sum(count * prefix)], None, path=path)
        waves = None
        if "pipe" in fit["terms"] and whole_gemm is not None and hw.sm_count:
            waves = float(np.asarray(tile_waves(whole_gemm, fit["terms"], hw.sm_count)).reshape(-1)[0])
        busy = busy_seconds(np.sum(t_c), memory, fit["terms"], waves)
        launch = float(t_fixed + added + max(busy, np.sum(serial)))
        if "near" in fit["terms"] and whole_gemm is not None and fit["params"].get("near"):
            launch *= float(np.asarray(near_factor(fit["params"]["near"], whole_gemm)).reshape(-1)[0])
        parts.append(launch)
    return parts


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
