"""The path map: which path is fastest over (prefix, new tokens), with the crossover line, an
engine's rule over it, and the measured crossovers.

`pathmap_data` works out what the map shows (its cells and their shades, the marks on them, the
engine's boundaries, the measured line, the axes' ticks) without matplotlib; `draw_pathmap`
draws it; `pathmap` does both."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlactl.decide.analysis import Analysis
from mlactl.output.plot.common import (
    ChartData,
    measured_crossover_rows,
    new_figure,
    power_ticks,
    roles,
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


@dataclass(frozen=True)
class Mark:
    """A measured crossover as drawn, in axis units (log2): kind "run" (a line through the
    crossovers of a row of prefixes), "point" (one crossover) or "never" (expand never won: a
    `>` at the grid's right edge); `xy` its (x, y) points."""

    kind: str
    xy: tuple


@dataclass(frozen=True)
class PathmapChart(ChartData):
    DATA = ("title", "batch", "new", "prefix", "best", "speedup", "wrong_above", "policy", "measured_boundary")
    DATA += ("analytic_only",)

    title: str
    batch: int
    new: list  # the grid's new-token counts (columns) ...
    prefix: list  # ... and prefixes (rows)
    best: list  # [prefix][new]: the fastest path
    speedup: list  # [prefix][new]: the best path's time against the best of the other kind
    wrong_above: float
    policy: dict | None  # {name, label, source, path, slowdown, wrong} of the engine's loss map
    measured_boundary: list  # [{source, batch, prefix, new}]
    analytic_only: bool
    # what is drawn, axes in log2 units: each cell from its own (new, prefix) up to the next ones
    x_edges: np.ndarray  # cell edges along new tokens
    y_edges: np.ndarray  # ... along the positive prefixes
    zero_row: tuple | None  # (bottom, top) of prefix 0's row, below the others (a log axis has no 0)
    shade: np.ndarray  # [prefix][new]: signed log2 speedup (+: expand's kind), or log2 slowdown; inf: unfit
    colours: dict  # {"cmap", "vmin", "vmax"} of the shade
    bar_ticks: np.ndarray  # the colour bar's ticks (log2) ...
    bar_labels: list  # ... as read ("×2")
    bar_label: str
    marked: str  # the path marked + where it is best
    marked_cells: tuple  # (x, y) centres of its cells
    wrong_cells: tuple  # (x, y) centres where the engine is over wrong_above slower
    unfit_cells: tuple  # (x, y) centres where the engine's path does not fit
    boundaries: tuple  # ((x0, x1), (y0, y1)) segments where the engine's path changes
    marks: tuple  # Mark: the measured crossovers, in the order drawn
    legend: tuple  # (kind, label): "boundary", "wrong", "unfit", "marked", "measured", "never"
    legend_title: str | None
    xticks: tuple  # (positions, labels)
    yticks: tuple
    xlim: tuple
    ylim: tuple
    heading: str  # the figure's title


def pathmap(analysis: Analysis, results: list[dict] = (), policy: str | None = None):
    """(fig, data): `pathmap_data`, drawn, and what it holds as a dict.

    data: {"title", "batch", "new": [...], "prefix": [...], "best": [[...]] (per prefix, per new),
    "speedup": [[...]], "measured_boundary": [{source, batch, prefix, new}], "analytic_only",
    "wrong_above", "policy": null or {"name", "label", "source", "path": [[...]],
    "slowdown": [[...]] (null: its path does not fit), "wrong": [[...]]}}
    """
    chart = pathmap_data(analysis, results, policy)
    return draw_pathmap(chart), chart.as_dict()


def pathmap_data(analysis: Analysis, results: list[dict] = (), policy: str | None = None) -> PathmapChart:
    """Over the analysis's (new, prefix) grid, one batch size: which path is fastest by roofline
    time, and by how much -- the speedup of the best path over the best of the other kind (the
    absorbing path against the faster of the expanding ones: absorb against expand and
    expand_chunked, a DSA model's sparse_absorb against masked_expand and dense_expand; the last
    expand path marked + where best), with the measured crossovers on top. With `policy` (an
    engine the analysis holds), a loss map instead: how many times slower that engine's rule is
    than the best path that fits, its path boundaries, and dots where it is more than WRONG_ABOVE
    times slower."""
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

    choices, paths = analysis.cost.choices, roles(analysis.cost)
    # a path that cannot run somewhere (DSA's dense_expand past top-k) is never the best there
    times = {path: on_grid(np.where(analysis.runs[path], analysis.paths[path].time_s, np.inf)) for path in choices}
    best = on_grid(analysis.best)
    best_time = np.minimum.reduce([times[p] for p in choices])
    expand_kind = np.minimum.reduce([times[p] for p in paths.expand])
    other = np.where(best == paths.absorb, expand_kind, times[paths.absorb])
    speedup = other / best_time
    engine = slowdown = engine_path = loss = None
    if policy is not None:
        if policy not in analysis.engine_paths:
            raise MlactlError(f"the analysis holds no {policy} rule; analyse with that engine")
        engine = next(e for e in analysis.engines if e.engine == policy)
        slowdown = (best_time + on_grid(analysis.engine_time_lost[policy])) / best_time
        engine_path = on_grid(analysis.engine_paths[policy])
        loss = {
            "name": engine.engine,
            "label": engine.label,
            "source": engine.citation,
            "path": engine_path.tolist(),
            "slowdown": [[x if math.isfinite(x) else None for x in row] for row in slowdown.tolist()],
            "wrong": (slowdown > WRONG_ABOVE).tolist(),
        }
    batch = int(batches[0])
    measured = measured_crossover_rows(results, batch)

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

    if slowdown is None:
        shade = np.where(best == paths.absorb, -1.0, 1.0) * np.log2(speedup)
        vmax = max(1.0, float(np.ceil(np.abs(shade).max())))
        colours = {"cmap": "RdBu_r", "vmin": -vmax, "vmax": vmax}
    else:  # the loss map: log2 of the slowdown, white where the engine picks the best
        shade = np.log2(slowdown)
        finite = shade[np.isfinite(shade)]
        vmax = max(1.0, float(np.ceil(finite.max()))) if finite.size else 1.0
        colours = {"cmap": "Reds", "vmin": 0.0, "vmax": vmax}
    step = max(1, int(vmax) // 4)
    bar_ticks = np.arange(-int(vmax) // step * step if engine is None else 0, int(vmax) + 1, step)
    if engine is None:
        absorbs, expands = paths.kind_words()
        bar_label = f"speedup of the best path:  ← {absorbs} faster  |  {expands} faster →"
    else:
        bar_label = f"{engine.engine}'s rule: times slower than the best path that fits"

    x_mid = (x_edges[:-1] + x_edges[1:]) / 2
    y_mid = np.concatenate([[sum(zero_row) / 2] if zero_row else [], (y_edges[:-1] + y_edges[1:]) / 2])

    def centres(cells) -> tuple:
        wy, wx = np.nonzero(cells)
        return x_mid[wx], y_mid[wy]

    chunked = best == paths.marked
    boundaries = []
    if engine_path is not None:  # the engine's boundaries: a cell edge wherever its path differs from the neighbour's
        y_lo = ([zero_row[0]] if zero_row else []) + list(y_edges[:-1])
        y_hi = ([zero_row[1]] if zero_row else []) + list(y_edges[1:])
        for r in range(engine_path.shape[0]):
            for c in range(engine_path.shape[1]):
                if c + 1 < engine_path.shape[1] and engine_path[r, c] != engine_path[r, c + 1]:
                    boundaries.append(([x_edges[c + 1]] * 2, [y_lo[r], y_hi[r]]))
                if r + 1 < engine_path.shape[0] and engine_path[r, c] != engine_path[r + 1, c]:
                    boundaries.append(([x_edges[c], x_edges[c + 1]], [y_hi[r]] * 2))
    bottom = zero_row[0] if zero_row else y_edges[0]
    marks = _measured_marks(measured, ypos, bottom, x_edges, y_edges[-1])

    legend = []
    if engine is not None:
        legend += [
            ("boundary", f"{engine.engine} path boundary"),
            ("wrong", f"over {WRONG_ABOVE - 1:.0%} slower than the best"),
        ]
        if not np.isfinite(slowdown).all():
            legend.append(("unfit", "its path does not fit"))
    if chunked.any():
        legend.append(("marked", f"{paths.marked} best"))
    if measured:
        legend.append(("measured", "measured crossover"))
        if any(m["new"] is None for m in measured):
            legend.append(("never", "expand never won (measured)"))
    ticks_x = power_ticks(news[0], news[-1])
    ticks_y = ([0] if zero_row else []) + power_ticks(prefixes[positive][0], prefixes[-1])
    heading = title("Path map", analysis, results)
    return PathmapChart(
        title=heading,
        batch=batch,
        new=news.tolist(),
        prefix=prefixes.tolist(),
        best=best.tolist(),
        speedup=speedup.tolist(),
        wrong_above=WRONG_ABOVE,
        policy=loss,
        measured_boundary=measured,
        analytic_only=not results,
        x_edges=x_edges,
        y_edges=y_edges,
        zero_row=zero_row,
        shade=shade,
        colours=colours,
        bar_ticks=bar_ticks,
        bar_labels=[f"×{2.0 ** abs(t):g}" for t in bar_ticks],
        bar_label=bar_label,
        marked=paths.marked,
        marked_cells=centres(chunked),
        wrong_cells=centres(slowdown > WRONG_ABOVE) if slowdown is not None else (),
        unfit_cells=centres(~np.isfinite(slowdown)) if slowdown is not None else (),
        boundaries=tuple(boundaries),
        marks=marks,
        legend=tuple(legend),
        legend_title=None if engine is None else f"{engine.label}: {engine.citation}",
        xticks=(np.log2(ticks_x), [tokens(v) for v in ticks_x]),
        yticks=(ypos(ticks_y), [tokens(v) for v in ticks_y]),
        xlim=(x_edges[0], x_edges[-1]),
        ylim=(zero_row[0] if zero_row else y_edges[0], y_edges[-1]),
        heading=heading + f"\nbatch {batch}",
    )


def _measured_marks(measured: list[dict], ypos, bottom, x_edges, top) -> tuple:
    """The measured crossovers of each results file, bottom to top: a line joins only crossovers
    found in a row of prefixes; where expand never won, a `>` at the grid's right edge says the
    boundary lies past it (it was drawn half an octave outside, joined by a diagonal, and widened
    the chart by a blank strip). A prefix measured beyond the grid is not drawn."""
    marks = []
    for source in sorted({m["source"] for m in measured}):
        mine = sorted((m for m in measured if m["source"] == source), key=lambda m: m["prefix"])
        my = ypos([m["prefix"] for m in mine])
        run: list[tuple[float, float]] = []
        for m, y in zip(mine, my):
            inside = bottom <= y <= top
            if not inside or m["new"] is None:
                if len(run) > 1:
                    marks.append(Mark("run", tuple(run)))
                run = []
                if inside:
                    marks.append(Mark("never", ((x_edges[-1] - 0.12, y),)))
                continue
            x = min(max(math.log2(m["new"]), x_edges[0]), x_edges[-1])
            run.append((x, y))
            marks.append(Mark("point", ((x, y),)))
        if len(run) > 1:
            marks.append(Mark("run", tuple(run)))
    return tuple(marks)


def _outline():
    from matplotlib import patheffects

    return [patheffects.Stroke(linewidth=3.5, foreground="black"), patheffects.Normal()]


def draw_pathmap(chart: PathmapChart, fig=None):
    """Draw `chart` (pathmap_data) on `fig`, a new 9.5 x 6.5 inch Figure by default."""
    from matplotlib.lines import Line2D

    fig, axes = new_figure(9.5, 6.5, fig=fig)
    ax = axes[0, 0]
    positive = np.asarray(chart.prefix) > 0
    shown = np.ma.masked_invalid(chart.shade)  # a path that does not fit: left blank, hatched below
    mesh = ax.pcolormesh(chart.x_edges, chart.y_edges, shown[positive], **chart.colours)
    if chart.zero_row is not None:
        ax.pcolormesh(chart.x_edges, chart.zero_row, shown[~positive], **chart.colours)
        # a log axis has no place for 0: its row sits below the others, across a break in the axis
        ax.axhline(chart.zero_row[1], color="black", lw=0.8)
    bar = fig.colorbar(mesh, ax=ax, pad=0.01)
    bar.set_ticks(chart.bar_ticks, labels=chart.bar_labels)
    bar.set_label(chart.bar_label, fontsize=8)
    ax.plot(*chart.marked_cells, "+", ms=4, color="black")
    if chart.policy is not None:
        ax.plot(*chart.wrong_cells, "o", ms=2.2, color="black", mec="white", mew=0.4)
        ax.plot(*chart.unfit_cells, "x", ms=4, color="black")
        for xs, ys in chart.boundaries:
            ax.plot(xs, ys, color="black", lw=1.6)
    for mark in chart.marks:
        if mark.kind == "run":
            ax.plot(*zip(*mark.xy), "-", color="yellow", lw=2.2, path_effects=_outline())
        elif mark.kind == "never":
            ax.plot(*mark.xy[0], ">", color="yellow", mec="black", ms=7, clip_on=False)
        else:
            ax.plot(*mark.xy[0], "o", color="yellow", mec="black", ms=6)
    looks = {
        "boundary": {"color": "black", "lw": 1.6},
        "wrong": {"ls": "", "marker": "o", "ms": 4, "color": "black", "mec": "white"},
        "unfit": {"ls": "", "marker": "x", "color": "black"},
        "marked": {"ls": "", "marker": "+", "color": "black"},
        "measured": {"color": "yellow", "marker": "o", "mec": "black", "lw": 2.2},
        "never": {"ls": "", "marker": ">", "color": "yellow", "mec": "black"},
    }
    legend = [Line2D([], [], label=label, **looks[kind]) for kind, label in chart.legend]
    if legend:
        fig.legend(
            handles=legend,
            loc="outside lower center",
            ncols=len(legend),
            fontsize=7,
            title=chart.legend_title,
            title_fontsize=7,
        )
    ax.set_xticks(chart.xticks[0], labels=chart.xticks[1])
    ax.set_yticks(chart.yticks[0], labels=chart.yticks[1])
    ax.set_xlim(*chart.xlim)
    ax.set_ylim(*chart.ylim)
    ax.set_xlabel("new tokens per request (a cell holds the shape at its lower left corner)")
    ax.set_ylabel("prefix (cached tokens)")
    fig.suptitle(chart.heading, fontsize=9)
    return fig
