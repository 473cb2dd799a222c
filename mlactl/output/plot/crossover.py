"""The crossover chart: time of each path against new tokens, one panel per prefix, with the
crossover by roofline, by FLOPs and as measured.

`crossover_data` works out what the chart shows (curves, markers, each panel's heading and axis
range) without matplotlib; `draw_crossover` draws it; `crossover` does both."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlactl.decide.analysis import Analysis
from mlactl.output.plot.common import (
    PATH_COLOURS,
    ChartData,
    measured_crossover_rows,
    measured_points,
    new_figure,
    power_ticks,
    roles,
    solved_interval,
    solved_rows,
    solved_win,
    title,
    tokens,
)
from mlactl.util.errors import MlactlError

MAX_CROSSOVER_PANELS = 12

# the words of a crossover's marker ("predicted 160, chunked 165"); a path not here is named
MARKER_WORDS = {"expand": "predicted", "expand_chunked": "chunked"}
HEADING_WIDTH = 70  # characters of a panel's heading line at this size, wrapped between values


@dataclass(frozen=True)
class Marker:
    """A vertical line at `new` tokens. kind: "predicted" (in `path`'s colour: a crossover, or
    one end of a window), "calibrated", "flops" (the asymptotic crossover) or "measured";
    `text` is its value as the panel's heading says it ("" for a window's ends, named together)."""

    new: float
    kind: str
    text: str = ""
    path: str | None = None


@dataclass(frozen=True)
class CrossoverPanel(ChartData):
    DATA = ("batch", "prefix", "new", "time_s", "solved", "predicted", "measured_crossovers", "measured")
    DATA += ("windows", "calibrated")
    OPTIONAL = frozenset({"windows", "calibrated"})

    batch: int
    prefix: int
    new: list  # new-token counts along x, sorted
    time_s: dict  # path -> roofline seconds at each count (None where it cannot run)
    solved: bool  # False when the analysis had too many prefixes to solve
    wins: dict  # expand path -> Win by time, or None (never faster)
    windowed: bool  # solved, and its wins are windows (two ends each), not crossovers
    measured_crossovers: list  # [{source, new}] (new None: expand never won)
    measured: list  # measured_points of this (batch, prefix) and of the paths drawn
    calibrated: dict | None  # {time_s, crossover, crossover_interval, name, interval_s, basis}
    markers: tuple  # Marker, in the order drawn
    heading: str
    xlim: tuple  # (left, right) new tokens, log axis
    xticks: list  # powers of two along x

    @property
    def predicted(self) -> dict:
        """Each expand path's first winning count by time, or None."""
        return {path: None if w is None else w.first for path, w in self.wins.items()}

    @property
    def windows(self) -> dict | None:
        """Both ends of each window (None: the path never wins); None where the wins are crossovers."""
        if not self.windowed:
            return None
        return {path: None if w is None else [w.first, w.last] for path, w in self.wins.items()}


@dataclass(frozen=True)
class CrossoverChart(ChartData):
    DATA = ("title", "asymptotic_new", "max_new", "analytic_only", "panels")

    title: str
    asymptotic_new: float | None
    max_new: int
    analytic_only: bool
    paths: tuple  # the curves, in the order drawn
    marked: str  # the path drawn dashed
    ylabel: str
    panels: tuple  # CrossoverPanel
    legend: tuple  # (kind, label) below the panels' curves: "predicted", "calibrated", "flops", "measured time",
    # "measured"


def crossover(analysis: Analysis, results: list[dict] = (), calibrated: Analysis | None = None):
    """(fig, data): `crossover_data`, drawn, and what it holds as a dict.

    data: {"title", "asymptotic_new", "max_new", "analytic_only", "panels": [{"batch", "prefix",
    "new": [...], "time_s": {path: [...]}, "solved", "predicted": {path: n|None},
    "measured_crossovers": [{source, new}], "measured": [...]}]} (and a window's "windows":
    {path: [first, last]|None}, a calibrated analysis's "calibrated")
    """
    chart = crossover_data(analysis, results, calibrated)
    return draw_crossover(chart), chart.as_dict()


def crossover_data(analysis: Analysis, results: list[dict] = (), calibrated: Analysis | None = None) -> CrossoverChart:
    """Time against new tokens, one panel per (batch, prefix) of the analysis: each path's
    predicted curve (expand, expand_chunked and absorb; a DSA model's sparse_absorb,
    masked_expand and dense_expand), measured path times, where each expand path starts to win
    (roofline, from the analysis's crossover table: a crossover, or a window's two ends), the
    asymptotic crossover by FLOPs, and the measured crossovers, each with its value."""
    results = list(results)
    if len(analysis) == 0:
        raise MlactlError("no shapes to plot")
    groups = list(dict.fromkeys(zip(analysis.batch.tolist(), analysis.prefix.tolist())))
    if len(np.unique(analysis.new)) < 2:
        raise MlactlError(
            "the crossover chart draws time against new tokens: give --new at least two values, "
            "e.g. 1:4096 (for one shape, `mlactl analyze` prints the times)"
        )
    if len(groups) > MAX_CROSSOVER_PANELS:
        raise MlactlError(
            f"the crossover chart draws at most {MAX_CROSSOVER_PANELS} (batch, prefix) panels, got {len(groups)}"
        )
    cost = analysis.cost
    choices, paths = cost.choices, roles(cost)
    windowed = bool(analysis.crossover.windows)  # wins between two ends, not from a crossover on
    solved = solved_rows(analysis)
    calibrated_rows = None if calibrated is None else solved_rows(calibrated)
    measured = measured_points(analysis, results)
    asymptotic = analysis.crossover.asymptotic_new
    max_new = analysis.crossover.max_new

    def curve(a: Analysis, path: str, idx) -> list:
        """A path's times; None where it cannot run (DSA's dense_expand past top-k)."""
        return [t if ok else None for t, ok in zip(a.paths[path].time_s[idx].tolist(), a.runs[path][idx].tolist())]

    panels = []
    for b, p in groups:
        idx = np.flatnonzero((analysis.batch == b) & (analysis.prefix == p))
        idx = idx[np.argsort(analysis.new[idx], kind="stable")]
        row = solved.get((b, p))
        new = analysis.new[idx].tolist()
        wins = {path: solved_win(row, path) for path in paths.expand}
        cal = None
        if calibrated is not None:  # same grid, calibrated time
            crow = calibrated_rows.get((b, p))
            first = solved_win(crow, paths.expand[0])
            spans = calibrated.spans  # each time's 80% interval, and the weakest basis of its ops
            cal = {
                "time_s": {path: curve(calibrated, path, idx) for path in choices},
                "crossover": None if first is None else first.first,
                "crossover_interval": solved_interval(crow, paths.expand[0]),
                "name": calibrated.calibration.name,
                "interval_s": {
                    q: None if spans.paths[q] is None else [v[idx].tolist() for v in spans.paths[q]] for q in choices
                },  # fmt: skip
                "basis": {q: spans.path_basis[q][idx].tolist() for q in choices},
            }
        crossovers = [
            {"source": m["source"], "new": m["new"]} for m in measured_crossover_rows(results, b) if m["prefix"] == p
        ]
        markers, windows = _markers(wins, cal, asymptotic, crossovers)
        values = windows + [m.text for m in markers if m.text]
        never = [path for path, w in wins.items() if row is not None and w is None]
        # a path that cannot run even for one new token here (a DSA model's dense MHA, only where
        # the whole context is at most top-k) is not "never faster"
        idle = [path for path in never if not cost.applicable(path, b, 1, p).all()]
        never = [path for path in never if path not in idle]
        if never:
            values.append(f"{' and '.join(never)} never faster up to {tokens(max_new)}")
        values += [f"{path} cannot run (context > top-k {tokens(analysis.cfg.topk)})" for path in idle]
        if any(m["new"] is None for m in crossovers):
            values.append("measured: expand never faster")
        heading = f"batch {b}, prefix {tokens(p)}"
        if values:
            heading += "\n" + _wrap(f"{'wins' if windowed else 'crossover'} (new tokens):", values)
        xs = new + [m.new for m in markers]
        xlim = (max(min(xs) / 1.5, 0.8), max(xs) * 1.5)
        panels.append(
            CrossoverPanel(
                batch=b,
                prefix=p,
                new=new,
                time_s={path: curve(analysis, path, idx) for path in choices},
                solved=row is not None,
                wins=wins,
                windowed=windowed and row is not None,
                measured_crossovers=crossovers,
                measured=[m for m in measured if (m["batch"], m["prefix"]) == (b, p) and m["path"] in choices],
                calibrated=cal,
                markers=tuple(markers),
                heading=heading,
                xlim=xlim,
                xticks=power_ticks(*xlim, most=7),
            )
        )
    what = "window's ends" if windowed else "crossover"
    legend = [("predicted", f"predicted {what} (colour of its path)")]
    if calibrated is not None:
        legend.append(("calibrated", "calibrated crossover"))
    if asymptotic is not None:
        legend.append(("flops", "by FLOPs, asymptotic"))
    if any(panel.measured for panel in panels):
        legend.append(("measured time", "measured time"))
    if any(m["new"] is not None for panel in panels for m in panel.measured_crossovers):
        legend.append(("measured", "measured crossover"))
    return CrossoverChart(
        title=title("Crossover", analysis, results, calibrated, how="dotted"),
        asymptotic_new=asymptotic,
        max_new=max_new,
        analytic_only=not results,
        paths=tuple(choices),
        marked=paths.marked,
        ylabel=f"time, {analysis.layers} layer{'s' if analysis.layers > 1 else ''} (µs)",
        panels=tuple(panels),
        legend=tuple(legend),
    )


def _markers(wins: dict, cal: dict | None, asymptotic, crossovers: list) -> tuple[list[Marker], list[str]]:
    """A panel's vertical lines, their values named in its heading, never on a curve: predicted
    160, chunked 165, calibrated 133 (128-181), ...; a window's two ends, "masked_expand 12-812"
    (the second list)."""
    markers, windows = [], []
    for path, w in wins.items():
        if w is None:
            continue
        if w.last is not None:
            markers += [Marker(w.first, "predicted", path=path), Marker(w.last, "predicted", path=path)]
            windows.append(f"{path} {w.first}-{w.last}")
        else:
            markers.append(Marker(w.first, "predicted", f"{MARKER_WORDS.get(path, path)} {w.first}", path))
    if cal is not None and cal["crossover"] is not None:
        span = cal["crossover_interval"]
        if span is None:
            where = ""
        elif span[0] is None:  # nine draws of ten find none up to max_new
            where = " (80%: none in range)"
        else:
            where = f" ({span[0]}–{'?' if span[1] is None else span[1]})"
        markers.append(Marker(cal["crossover"], "calibrated", f"calibrated {cal['crossover']}{where}"))
    if asymptotic is not None:
        markers.append(Marker(asymptotic, "flops", f"by FLOPs {asymptotic:.1f}"))
    for m in crossovers:
        if m["new"] is not None:
            markers.append(Marker(m["new"], "measured", f"measured {m['new']}"))
    return markers, windows


def _wrap(head: str, values: list[str]) -> str:
    """`head` and the values, comma-separated, wrapped between values to the panel's width."""
    lines = [head]
    for i, value in enumerate(values):
        joined = f"{lines[-1]}{',' if i else ''} {value}"
        if len(joined) <= HEADING_WIDTH or i == 0 and len(lines) == 1:
            lines[-1] = joined
        else:
            lines[-1] += ","
            lines.append(value)
    return "\n".join(lines)


# (colour, line style) of each kind of marker; a predicted one is in its path's colour
MARKER_LOOK = {"calibrated": ("tab:purple", "--"), "flops": ("gray", ":"), "measured": ("black", "-.")}


def _path_curves(ax, new, times: dict, paths, style, width: float, label: str = "{}") -> None:
    for path in paths:
        seconds = np.asarray(times[path], dtype=np.float64)
        ax.plot(new, seconds * 1e6, color=PATH_COLOURS[path], lw=width, ls=style(path), label=label.format(path))


def draw_crossover(chart: CrossoverChart, fig=None):
    """Draw `chart` (crossover_data) on `fig`, a new Figure sized for its panels by default."""
    from matplotlib.lines import Line2D

    ncols = min(3, len(chart.panels))
    nrows = math.ceil(len(chart.panels) / ncols)
    fig, axes = new_figure(4.6 * ncols + 0.6, 4.2 * nrows + 1.1, nrows, ncols, fig=fig)
    handles: list = []
    for k, panel in enumerate(chart.panels):
        ax = axes.flat[k]
        _path_curves(ax, panel.new, panel.time_s, chart.paths, lambda p: "--" if p == chart.marked else "-", 1.6)
        cal = panel.calibrated
        if cal is not None:
            for path in chart.paths:
                _path_curves(ax, panel.new, cal["time_s"], [path], lambda p: ":", 1.4, "{} (calibrated)")
                band, basis = cal["interval_s"][path], np.asarray(cal["basis"][path])
                timed = np.asarray(cal["time_s"][path], dtype=np.float64)  # NaN: the path cannot run there
                if band is not None:  # the 80% interval, and dots where an op was not measured
                    ax.fill_between(panel.new, *(np.asarray(b) * 1e6 for b in band), color=PATH_COLOURS[path],
                                    alpha=0.12, lw=0, where=np.isfinite(timed))  # fmt: skip
                far = basis != "measured"
                ax.plot(np.asarray(panel.new)[far], timed[far] * 1e6, ".", ms=3, color=PATH_COLOURS[path])
        for m in panel.measured:
            ax.plot(m["new"], m["median_s"] * 1e6, "o", color=PATH_COLOURS[m["path"]], mec="black", ms=6)
        for marker in panel.markers:
            colour, style = MARKER_LOOK.get(marker.kind, (PATH_COLOURS.get(marker.path, "black"), "-"))
            ax.axvline(marker.new, color=colour, ls=style, lw=1.1)
        ax.set_xlim(*panel.xlim)
        ax.set_xscale("log", base=2)
        ax.set_xticks(panel.xticks, labels=[tokens(v) for v in panel.xticks])
        ax.set_yscale("log")
        ax.set_xlabel("new tokens")
        ax.set_ylabel(chart.ylabel)
        ax.set_title(panel.heading, fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        if k == 0:
            handles, _ = ax.get_legend_handles_labels()
    # the legend below the panels: inside one it would sit on the curves
    looks = {
        "predicted": {"color": "black", "ls": "-", "lw": 1.1},
        "calibrated": {"color": "tab:purple", "ls": "--", "lw": 1.1},
        "flops": {"color": "gray", "ls": ":", "lw": 1.1},
        "measured time": {"ls": "", "marker": "o", "color": "gray", "mec": "black"},
        "measured": {"color": "black", "ls": "-.", "lw": 1.1},
    }
    extra = [Line2D([], [], label=label, **looks[kind]) for kind, label in chart.legend]
    fig.legend(handles=handles + extra, fontsize=7, loc="outside lower center", ncols=min(4, len(handles + extra)))
    for ax in list(axes.flat)[len(chart.panels) :]:
        ax.set_visible(False)
    fig.suptitle(chart.title, fontsize=9)
    return fig
