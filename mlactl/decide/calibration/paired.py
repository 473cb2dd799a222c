"""Whole paths timed side by side, fitted together: each shape's common drift taken out first.

`mlactl tune paths` times the paths at one shape in turns (mlactl.tune.timing.time_interleaved),
so a machine that slows down while one shape is measured slows every path of that shape alike:
the ratio of two paths at a shape is measured well, the level of the shape less so (on the
project's shared 2-core CPU, neighbouring shapes' absolute times jumped 20-30% while their
expand/absorb ratios mostly moved 2-7%). A fit to the absolute times takes that drift as noise and the
crossover, which depends only on the ratios, inherits it.

So the path classes of one (source, dtype) are fitted together, alternating:

1. fit each path class (term selection as everywhere, `select`);
2. each shape's drift d = the mean over its paths of log(measured / fitted); d less its median
   over shapes (the level stays the measurements');
3. divide every path's time at that shape by exp(d) and fit again.

After ITERATIONS rounds the fits describe the drift-free times, whose ratios are the measured
ones. The drift removed is recorded with each fit (`drift`: the median and largest |d|), and the
errors quoted are against the drift-free times.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

ITERATIONS = 4


def _shape_keys(pts) -> list[tuple[float, float, float]]:
    return list(zip(np.asarray(pts.batch).tolist(), np.asarray(pts.new).tolist(), np.asarray(pts.context).tolist()))


def paired_groups(groups: dict) -> list[list]:
    """Keys of path groups measured at shared shapes: one list per (source, dtype) with two or
    more path classes that have at least half their shapes in common."""
    by_source: dict = {}
    for key in groups:
        op, source, dtype = key
        if op.startswith("path:"):
            by_source.setdefault((source, dtype), []).append(key)
    out = []
    for keys in by_source.values():
        if len(keys) < 2:
            continue
        shapes = [set(_shape_keys(groups[k])) for k in keys]
        if len(shapes[0] & shapes[1]) * 2 >= min(len(shapes[0]), len(shapes[1])):
            out.append(sorted(keys))
    return out


def fit_paired(groups: dict, keys: list, machine, select_one) -> tuple[list, dict]:
    """Fit the path groups `keys` together (see the module docstring). `select_one(key, pts)`
    fits one group and returns its FitResult. Returns (FitResults, drift summary)."""

    raw = {k: np.asarray(groups[k].time_s, dtype=np.float64) for k in keys}
    shape_of = {k: _shape_keys(groups[k]) for k in keys}
    shapes = sorted(set().union(*shape_of.values()))
    index = {s: i for i, s in enumerate(shapes)}
    drift = np.zeros(len(shapes))
    results: dict = {}
    for _ in range(ITERATIONS + 1):
        logs: list[list[float]] = [[] for _ in shapes]
        for k in keys:
            rows = np.array([index[s] for s in shape_of[k]])
            pts = replace(groups[k], time_s=raw[k] / np.exp(drift[rows]))
            results[k] = select_one(k, pts)
            r = results[k]
            fitted = machine.predict(r.params, r.terms, groups[k])
            for i, v in zip(rows, np.log(raw[k] / fitted)):
                logs[i].append(v)
        # a shape measured on one path only has no pair to tell drift from misfit: left alone
        new = np.array([np.mean(v) if len(v) > 1 else np.nan for v in logs])
        paired = np.isfinite(new)
        drift = np.where(paired, new - np.median(new[paired]), 0.0) if paired.any() else np.zeros(len(shapes))
    summary = {
        "paired_with": [k[0] for k in keys],
        "shapes": len(shapes),
        "median_abs": float(np.median(np.abs(drift))),
        "max_abs": float(np.max(np.abs(drift))),
    }
    return [replace(results[k], drift=summary) for k in keys], summary
