"""Where a calibrated time stands on the measurements behind it: each op's basis.

A fit knows the shapes it was measured at. Each of its op class's size axes (below) has a measured
range, and a prediction is

    measured       inside every axis's range (to EDGE octaves),
    extrapolated   outside one: by how many octaves (log2) beyond the nearest end, on which axis,
    roofline       (decided by the caller) the calibration has no fit for the op class at all.

The axes are those along which an op class's time varies:

    attention, whole paths   batch, heads, new (query tokens per request), context (keys per
                             request), keys_per_query = context / new. The last one tells a
                             prefill (every table point has context = new: 1) from a long
                             prefix: a prefill fit asked for 133 new tokens after 32K is
                             extrapolated 8 octaves on keys_per_query, though 133 and 32K each lie
                             inside its new and context ranges.
    projections, lse_merge   rows (the GEMM's M: tokens), heads.

The range is a box, axis by axis: a point inside it may still lie in a corner no shape sampled
(say, the largest batch at the longest context); the steps test below looks at the nearest
measured shapes.

Steps are claims: counts of tiles, waves, KV blocks and splits make the fitted time step where a
count changes (a third wave of CTAs for absorb's 128-head rows from 133 new tokens on an H200).
A step is *sampled* at a point when measured shapes lie within STEP_NEAR octaves of it on both
sides along the step axis (new tokens; rows for projections), within OTHER_NEAR on every other
axis; elsewhere the interval spans the time with and without the steps (mlactl.decide.calibration.
uncertainty).
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.calibration.model import PROJECTIONS, Points, rows_of

ATTENTION_AXES = ("batch", "heads", "new", "context", "keys_per_query")
ROW_AXES = ("rows", "heads")
EDGE = 0.05  # octaves beyond the measured range still counted as inside it (3.5%)
STEP_NEAR = 0.25  # octaves along the step axis: a measured shape that near on each side samples a step
OTHER_NEAR = 0.5  # octaves on every other axis (grids spaced by octaves: every point is within 0.5)
DECIMALS = 3  # log2 features as stored in a calibration file
MEASURED, EXTRAPOLATED, ROOFLINE = "measured", "extrapolated", "roofline"


def axes_of(op: str) -> tuple[str, ...]:
    """The size axes of an op class."""
    return ROW_AXES if op in PROJECTIONS or op == "lse_merge" else ATTENTION_AXES


def step_axis(op: str) -> str:
    """The axis along which a step is looked for (the crossover's axis, or a GEMM's rows)."""
    return "rows" if op in PROJECTIONS or op == "lse_merge" else "new"


def values(pts: Points) -> np.ndarray:
    """Each point's size on each axis of its op class: [n, axes], raw (not log)."""
    shape = np.shape(np.asarray(pts.flops))
    cols = []
    for axis in axes_of(pts.op):
        if axis == "rows":
            v = rows_of(pts)
        elif axis == "keys_per_query":
            v = np.asarray(pts.context, dtype=np.float64) / np.maximum(np.asarray(pts.new, dtype=np.float64), 1.0)
        else:
            v = getattr(pts, axis)
        cols.append(np.broadcast_to(np.asarray(v, dtype=np.float64), shape).reshape(-1))
    return np.stack(cols, axis=-1)


def log_features(pts: Points) -> np.ndarray:
    return np.log2(np.maximum(values(pts), 1.0))


def measured_range(pts: Points) -> dict[str, list[float]]:
    """{axis: [lowest, highest]} of the measured points."""
    v = values(pts)
    return {a: [float(v[:, i].min()), float(v[:, i].max())] for i, a in enumerate(axes_of(pts.op))}


def measured_shapes(pts: Points) -> list[list[float]]:
    """The distinct measured shapes as log2 features (rounded to DECIMALS), for the steps test."""
    return np.unique(np.round(log_features(pts), DECIMALS), axis=0).tolist()


def outside(rng: dict, pts: Points) -> tuple[np.ndarray, np.ndarray]:
    """(octaves beyond the range, index of the axis farthest out) of each point; 0 inside."""
    names = axes_of(pts.op)
    x = log_features(pts)
    lo = np.log2(np.maximum([rng[a][0] for a in names], 1.0))
    hi = np.log2(np.maximum([rng[a][1] for a in names], 1.0))
    beyond = np.maximum(np.maximum(lo - x, x - hi), 0.0)
    return beyond.max(axis=1), beyond.argmax(axis=1)


def basis(rng: dict | None, pts: Points) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(basis code per point: MEASURED or EXTRAPOLATED, octaves beyond the range, axis name);
    without a range (a calibration written before ranges were kept) every point is EXTRAPOLATED
    by an unknown distance (NaN octaves)."""
    n = len(log_features(pts))
    if not rng:
        return np.full(n, EXTRAPOLATED, dtype=object), np.full(n, np.nan), [""] * n
    octaves, axis = outside(rng, pts)
    octaves = np.where(octaves <= EDGE, 0.0, octaves)
    code = np.where(octaves > 0, EXTRAPOLATED, MEASURED).astype(object)
    names = axes_of(pts.op)
    return code, octaves, [names[i] if o > 0 else "" for i, o in zip(axis.tolist(), octaves.tolist())]


def steps_sampled(shapes, pts: Points) -> np.ndarray:
    """Whether measured shapes lie within STEP_NEAR octaves on both sides of each point along the
    step axis, and within OTHER_NEAR on the other axes (see the module docstring)."""
    x, back = np.unique(log_features(pts), axis=0, return_inverse=True)  # a grid repeats shapes
    back = np.reshape(back, -1)
    if shapes is None or len(shapes) == 0:
        return np.zeros(len(back), dtype=bool)
    m = np.asarray(shapes, dtype=np.float64)
    names = axes_of(pts.op)
    k = names.index(step_axis(pts.op))
    others = [i for i in range(len(names)) if i != k]
    out = np.zeros(len(x), dtype=bool)
    for start in range(0, len(x), 1024):
        part = x[start : start + 1024]
        close = np.all(np.abs(part[:, None, others] - m[None, :, others]) <= OTHER_NEAR + 1e-9, axis=2)
        d = m[None, :, k] - part[:, None, k]
        below = np.any(close & (d <= 0) & (d >= -STEP_NEAR - 1e-9), axis=1)
        above = np.any(close & (d >= 0) & (d <= STEP_NEAR + 1e-9), axis=1)
        out[start : start + 1024] = below & above
    return out[back]
