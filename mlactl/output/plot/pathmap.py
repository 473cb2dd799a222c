"""The path map: which path is fastest over (prefix, new tokens), with the crossover line, an
engine's rule over it, and the measured crossovers."""

from __future__ import annotations

import math

import numpy as np

from mlactl.decide.analysis import Analysis
from mlactl.output.plot.common import (
    measured_crossover_rows,
    new_figure,
    power_ticks,
    title,
    tokens,
)
from mlactl.util.errors import MlactlError

# expand_chunked gives up 1-3% of expand's time to bound its memory; an engine's choice is marked
# wrong only when it costs more than that trade.
WRONG_ABOVE = 1.05


def _cell_edges(lower: np.ndarray) -> np.ndarray:
    """Edges of cells that start at `lower` (sorted); the last is as wide as the one before it,
    or one unit when it is alone."""
    last = lower[-1] - lower[-2] if len(lower) > 1 else 1.0
    return np.append(lower, lower[-1] + last)


def _outline():
    from matplotlib import patheffects

    return [patheffects.Stroke(linewidth=3.5, foreground="black"), patheffects.Normal()]


def pathmap(analysis: Analysis, results: list[dict] = (), policy: str | None = None):
    """Over the analysis's (new, prefix) grid, one batch size: which path is fastest by roofline
    time, and by how much -- the speedup of the best path over the best of the other kind
    (absorb against the faster of expand and expand_chunked; for a DSA model, sparse_absorb
    against the faster of masked_expand and dense_expand, a + where dense_expand is best), with
    the measured crossovers on top. With `policy` (an engine the analysis holds), a loss map
    instead: how many times slower
    that engine's rule is than the best path that fits, its path boundaries, and dots where it
    is more than WRONG_ABOVE times slower.

    data: {"title", "batch", "new": [...], "prefix": [...], "best": [[...]] (per prefix, per new),
    "speedup": [[...]], "measured_boundary": [{source, batch, prefix, new}], "analytic_only",
    "wrong_above", "policy": null or {"name", "label", "source", "path": [[...]],
    "slowdown": [[...]] (null: its path does not fit), "wrong": [[...]]}}
    """
    results = list(results)
    batches = np.unique(analysis.batch)
    if len(analysis) == 0:
        raise MlactlError("no shapes to plot")
    if len(batches) != 1:
        raise MlactlError(f"the path map draws one batch size, got {', '.join(map(str, batches))}")
    news, prefixes = np.unique(analysis.new), np.unique(analysis.prefix)
    if len(news) < 2 or len(prefixes) < 2:
        raise MlactlError(
            "the path map is a (new tokens, prefix) grid: give --new and --prefix at least two values each "
            "(for one prefix, `mlactl plot crossover --prefix P` draws time against new tokens)"
        )
    if len(analysis) != len(news) * len(prefixes):
        raise MlactlError("the path map needs a full grid: every --new with every --prefix")
    rows, cols = np.searchsorted(prefixes, analysis.prefix), np.searchsorted(news, analysis.new)

    def on_grid(values):
        out = np.empty((len(prefixes), len(news)), dtype=np.asarray(values).dtype)
        out[rows, cols] = values
        return out

    dsa = analysis.cfg.is_dsa
    choices = analysis.cost.choices
    # a path that cannot run somewhere (DSA's dense_expand past top-k) is never the best there
    times = {path: on_grid(np.where(analysis.runs[path], analysis.paths[path].time_s, np.inf)) for path in choices}
    best = on_grid(analysis.best)
    best_time = np.minimum.reduce([times[p] for p in choices])
    absorb_kind = "sparse_absorb" if dsa else "absorb"
    marked = "dense_expand" if dsa else "expand_chunked"  # the expand path marked with a + where best
    expand_kind = np.minimum.reduce([times[p] for p in choices if p != absorb_kind])
    other = np.where(best == absorb_kind, expand_kind, times[absorb_kind])
    speedup = other / best_time
    engine = None
    if policy is not None:
        if policy not in analysis.engine_paths:
            raise MlactlError(f"the analysis holds no {policy} rule; analyse with that engine")
        engine = next(e for e in analysis.engines if e.engine == policy)
        slowdown = (best_time + on_grid(analysis.engine_time_lost[policy])) / best_time
        engine_path = on_grid(analysis.engine_paths[policy])
    batch = int(batches[0])
    measured = measured_crossover_rows(results, batch)
    data = {
        "title": title("Path map", analysis, results),
        "batch": batch,
        "new": news.tolist(),
        "prefix": prefixes.tolist(),
        "best": best.tolist(),
        "speedup": speedup.tolist(),
        "wrong_above": WRONG_ABOVE,
        "policy": None,
        "measured_boundary": measured,
        "analytic_only": not results,
    }

    if engine is not None:
        data["policy"] = {
            "name": engine.engine,
            "label": engine.label,
            "source": engine.citation,
            "path": engine_path.tolist(),
            "slowdown": [[x if math.isfinite(x) else None for x in row] for row in slowdown.tolist()],
            "wrong": (slowdown > WRONG_ABOVE).tolist(),
        }
    # Each cell covers the shapes from its own (new, prefix) up to the next ones: a boundary on a
    # grid value, like an engine's threshold, falls on a cell edge. Axes are in log2 units.
    x_edges = _cell_edges(np.log2(news.astype(np.float64)))
    positive = prefixes > 0
    y_edges = _cell_edges(np.log2(prefixes[positive].astype(np.float64)))
    zero_row = None  # (bottom, top) of prefix 0's row, right below the others, one row high
    if not positive.all():
        height = max(y_edges[1] - y_edges[0], 0.5)  # at least half an octave, to be seen
        zero_row = (y_edges[0] - height, y_edges[0])

    def ypos(prefix):
        """log2(prefix); prefix 0, which a log axis has no place for, in a row of its own below."""
        p = np.asarray(prefix, dtype=np.float64)
        zero = y_edges[0] if zero_row is None else sum(zero_row) / 2
        return np.where(p > 0, np.log2(np.maximum(p, 1.0)), zero)

    fig, axes = new_figure(9.5, 6.5)
    ax = axes[0, 0]
    if engine is None:
        signed = np.where(best == absorb_kind, -1.0, 1.0) * np.log2(speedup)
        vmax = max(1.0, float(np.ceil(np.abs(signed).max())))
        colours = {"cmap": "RdBu_r", "vmin": -vmax, "vmax": vmax}
    else:  # the loss map: log2 of the slowdown, white where the engine picks the best
        signed = np.log2(slowdown)
        finite = signed[np.isfinite(signed)]
        vmax = max(1.0, float(np.ceil(finite.max()))) if finite.size else 1.0
        colours = {"cmap": "Reds", "vmin": 0.0, "vmax": vmax}
    shown = np.ma.masked_invalid(signed)  # a path that does not fit: left blank, hatched below
    mesh = ax.pcolormesh(x_edges, y_edges, shown[positive], **colours)
    if zero_row is not None:
        ax.pcolormesh(x_edges, zero_row, shown[~positive], **colours)
        # a log axis has no place for 0: its row sits below the others, across a break in the axis
        ax.axhline(zero_row[1], color="black", lw=0.8)
    bar = fig.colorbar(mesh, ax=ax, pad=0.01)
    step = max(1, int(vmax) // 4)
    ticks = np.arange(-int(vmax) // step * step if engine is None else 0, int(vmax) + 1, step)
    bar.set_ticks(ticks, labels=[f"×{2.0 ** abs(t):g}" for t in ticks])
    if engine is None:
        kinds = "sparse absorb faster  |  masked or dense MHA faster" if dsa else "absorb faster  |  expand faster"
        bar.set_label(f"speedup of the best path:  ← {kinds} →", fontsize=8)
    else:
        bar.set_label(f"{engine.engine}'s rule: times slower than the best path that fits", fontsize=8)
    x_mid = (x_edges[:-1] + x_edges[1:]) / 2
    y_mid = np.concatenate([[sum(zero_row) / 2] if zero_row else [], (y_edges[:-1] + y_edges[1:]) / 2])
    chunked = best == marked
    wy, wx = np.nonzero(chunked)
    ax.plot(x_mid[wx], y_mid[wy], "+", ms=4, color="black")
    if engine is not None:
        wy, wx = np.nonzero(slowdown > WRONG_ABOVE)
        ax.plot(x_mid[wx], y_mid[wy], "o", ms=2.2, color="black", mec="white", mew=0.4)
        wy, wx = np.nonzero(~np.isfinite(slowdown))
        ax.plot(x_mid[wx], y_mid[wy], "x", ms=4, color="black")
        # the engine's boundaries: a cell edge wherever its path differs from the neighbour's
        y_lo = ([zero_row[0]] if zero_row else []) + list(y_edges[:-1])
        y_hi = ([zero_row[1]] if zero_row else []) + list(y_edges[1:])
        for r in range(engine_path.shape[0]):
            for c in range(engine_path.shape[1]):
                if c + 1 < engine_path.shape[1] and engine_path[r, c] != engine_path[r, c + 1]:
                    ax.plot([x_edges[c + 1]] * 2, [y_lo[r], y_hi[r]], color="black", lw=1.6)
                if r + 1 < engine_path.shape[0] and engine_path[r, c] != engine_path[r + 1, c]:
                    ax.plot([x_edges[c], x_edges[c + 1]], [y_hi[r]] * 2, color="black", lw=1.6)
    right = x_edges[-1]
    bottom = zero_row[0] if zero_row else y_edges[0]
    for source in sorted({m["source"] for m in measured}):
        mine = sorted((m for m in measured if m["source"] == source), key=lambda m: m["prefix"])
        my = ypos([m["prefix"] for m in mine])
        inside = [bottom <= y <= y_edges[-1] for y in my]  # a prefix measured beyond the grid is not drawn
        # a line joins only crossovers found in a row of prefixes; where expand never won, a `>`
        # at the grid's right edge says the boundary lies past it (it was drawn half an octave
        # outside, joined by a diagonal, and widened the chart by a blank strip)
        run: list[tuple[float, float]] = []
        for m, y, shown_here in zip(mine, my, inside):
            if not shown_here or m["new"] is None:
                if len(run) > 1:
                    ax.plot(*zip(*run), "-", color="yellow", lw=2.2, path_effects=_outline())
                run = []
                if shown_here:
                    ax.plot(x_edges[-1] - 0.12, y, ">", color="yellow", mec="black", ms=7, clip_on=False)
                continue
            x = min(max(math.log2(m["new"]), x_edges[0]), x_edges[-1])
            run.append((x, y))
            ax.plot(x, y, "o", color="yellow", mec="black", ms=6)
        if len(run) > 1:
            ax.plot(*zip(*run), "-", color="yellow", lw=2.2, path_effects=_outline())

    from matplotlib.lines import Line2D

    legend = []
    if engine is not None:
        legend += [
            Line2D([], [], color="black", lw=1.6, label=f"{engine.engine} path boundary"),
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                ms=4,
                color="black",
                mec="white",
                label=f"over {WRONG_ABOVE - 1:.0%} slower than the best",
            ),
        ]
        if not np.isfinite(slowdown).all():
            legend.append(Line2D([], [], ls="", marker="x", color="black", label="its path does not fit"))
    if chunked.any():
        legend.append(Line2D([], [], ls="", marker="+", color="black", label=f"{marked} best"))
    if measured:
        legend.append(Line2D([], [], color="yellow", marker="o", mec="black", lw=2.2, label="measured crossover"))
        if any(m["new"] is None for m in measured):
            legend.append(
                Line2D([], [], ls="", marker=">", color="yellow", mec="black", label="expand never won (measured)")
            )
    if legend:
        fig.legend(
            handles=legend,
            loc="outside lower center",
            ncols=len(legend),
            fontsize=7,
            title=None if engine is None else f"{engine.label}: {engine.citation}",
            title_fontsize=7,
        )
    ticks_x = power_ticks(news[0], news[-1])
    ax.set_xticks(np.log2(ticks_x), labels=[tokens(v) for v in ticks_x])
    ticks_y = ([0] if zero_row else []) + power_ticks(prefixes[positive][0], prefixes[-1])
    ax.set_yticks(ypos(ticks_y), labels=[tokens(v) for v in ticks_y])
    ax.set_xlim(x_edges[0], right)
    ax.set_ylim(zero_row[0] if zero_row else y_edges[0], y_edges[-1])
    ax.set_xlabel("new tokens per request (a cell holds the shape at its lower left corner)")
    ax.set_ylabel("prefix (cached tokens)")
    fig.suptitle(data["title"] + f"\nbatch {batch}", fontsize=9)
    return fig, data
