"""The replay chart: from `mlactl replay -f json`, what each engine's rule loses over the trace's
time, and the path mix of each step type.

Top: attention time lost against the best, per second of trace, in the report's time bins, one
line per engine (each engine's own clock: engines that fall behind stretch the trace). Bottom:
for each step type and engine, the share of new tokens on each path.

`replay_data` works out what the chart shows (each engine's steps of loss, each bar of the path
mix) without matplotlib; `draw_replay` draws it; `replay` does both.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlactl.output.plot.common import PATH_COLOURS, ChartData, new_figure
from mlactl.output.render import seconds, seconds_span
from mlactl.util import safe
from mlactl.util import schema as S
from mlactl.util.errors import MlactlError

# not the paths' colours (PATH_COLOURS), which the bottom panel uses
ENGINE_COLOURS = ("black", "tab:purple", "tab:brown", "tab:red", "tab:pink", "tab:olive", "tab:cyan")
LINE_STYLES = ("-", "--", "-.", ":")
# the time axis's unit by the trace's length: (name, seconds, longest trace read in it)
UNITS = (("seconds", 1.0, 180.0), ("minutes", 60.0, 3 * 3600.0), ("hours", 3600.0, float("inf")))

REPORT = S.Obj(
    required={
        "schema": S.string,
        "schema_version": S.integer(1),
        "engines": S.ListOf(
            S.Obj(
                required={
                    "label": S.string,
                    # a report edited by hand or by another tool: what the chart reads is checked too
                    "timeline": S.Obj(
                        required={"edges_s": S.ListOf(S.number(-1e300)), "lost_s": S.ListOf(S.number(-1e300))}
                    ),
                    "by_step_type": S.ListOf(
                        S.Obj(
                            required={"type": S.string, "steps": S.integer(0), "paths": S.MapOf(S.number(0))},
                        )
                    ),
                },
                optional={
                    "lost_s": S.number(0),
                    "time_s": S.number(0),
                    "lost_interval_s": S.nullable(S.ListOf(S.number(0))),
                },
            )
        ),
    },
    optional={"trace": S.Obj(optional={"path": S.string, "requests": S.integer(0)})},
)


def check_report(data, where: str) -> None:
    """A replay report as `mlactl replay -f json` writes it, or one `Error:` line."""
    if not isinstance(data, dict) or data.get("schema") != "mlactl.replay":
        raise MlactlError(f"{where} is not a replay report (`mlactl replay TRACE -f json -o FILE` writes one)")
    try:
        S.validate(REPORT, data)
    except S.Invalid as exc:
        raise MlactlError(f"{where}: {exc}") from None
    if data["schema_version"] != 1:
        raise MlactlError(f"{where}: replay schema version {data['schema_version']}; this mlactl reads version 1")
    if not data["engines"]:
        raise MlactlError(f"{where}: the report holds no engines")
    for e in data["engines"]:
        t = e["timeline"]
        if len(t["edges_s"]) != len(t["lost_s"]) + 1:
            raise MlactlError(
                f"{where}: {e['label']}'s timeline has {len(t['edges_s'])} edges for {len(t['lost_s'])} bins"
            )


@dataclass(frozen=True)
class Bar:
    """One path's share of a step type's new tokens: a segment of a Column."""

    share: float
    bottom: float  # the shares of the paths below it
    path: str


@dataclass(frozen=True)
class Column:
    """One engine's path mix of one step type: a stacked bar at `x`, the engine's label above."""

    x: float
    label: str
    bars: tuple  # Bar, bottom up, the paths with a share > 0


@dataclass(frozen=True)
class ReplayChart(ChartData):
    DATA = ("title", "legend", "timeline", "mix", "time_unit")

    title: str
    legend: list  # each engine's line: its label and what it loses
    timeline: list  # [{engine, start_s, end_s, lost_per_s}]
    mix: list  # [{engine, type, steps, path, share}]
    time_unit: str  # seconds, minutes or hours, by the trace's length
    lines: tuple  # per engine, (xs, ys): its loss in ms per second of trace, a step per time bin
    types: list  # the step types along the bottom panel's x
    paths: list  # the paths of the mix, bottom up
    width: float  # of one engine's column
    columns: tuple  # Column, engine by engine, step type by step type


def replay(data: dict):
    """(fig, drawn): `replay_data`, drawn, and what it holds as a dict:
    {"title", "legend" (each engine's line, with its loss), "timeline": [{"engine", "start_s",
    "end_s", "lost_per_s"}], "mix": [{"engine", "type", "steps", "path", "share"}], "time_unit"}."""
    chart = replay_data(data)
    return draw_replay(chart), chart.as_dict()


def replay_data(data: dict) -> ReplayChart:
    """The two panels of a replay report (check_report): each engine's time lost per second of
    trace over its time bins, and each engine's path mix per step type."""
    engines = data["engines"]
    trace = data.get("trace", {})
    requests = trace.get("requests", "?")
    title = (
        f"Replay of {safe.mathtext(trace.get('path', 'a trace'))}: {requests} requests, "
        f"{safe.mathtext(data.get('time', 'roofline'))} times"
    )
    timeline, mix, legend, lines = [], [], [], []
    origin = min(e["timeline"]["edges_s"][0] for e in engines if e["timeline"]["edges_s"])
    end = max((e["timeline"]["edges_s"][-1] for e in engines if e["timeline"]["edges_s"]), default=origin)
    # the unit the trace's length reads in: a 25 s trace in seconds, not 0.4 minutes
    unit, scale = next(((u, f) for u, f, most in UNITS if end - origin <= most), UNITS[-1][:2])
    for e in engines:
        edges, lost = e["timeline"]["edges_s"], e["timeline"]["lost_s"]
        xs, ys = [], []
        for lo, hi, v in zip(edges[:-1], edges[1:], lost):
            rate = v / (hi - lo) if hi > lo else 0.0
            timeline.append({"engine": e["label"], "start_s": lo, "end_s": hi, "lost_per_s": rate})
            xs += [(lo - origin) / scale, (hi - origin) / scale]
            ys += [rate * 1e3, rate * 1e3]
        lines.append((xs, ys))
        legend.append(_legend(e))

    types = list(dict.fromkeys(r["type"] for e in engines for r in e["by_step_type"]))
    paths = list(dict.fromkeys(p for e in engines for r in e["by_step_type"] for p in r["paths"]))
    width = 0.8 / max(len(engines), 1)
    columns = []
    for j, e in enumerate(engines):
        rows = {r["type"]: r for r in e["by_step_type"]}
        for i, kind in enumerate(types):
            r = rows.get(kind)
            if r is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            bottom_at, bars = 0.0, []
            for p in paths:
                share = float(r["paths"].get(p, 0.0))
                mix.append({"engine": e["label"], "type": kind, "steps": r["steps"], "path": p, "share": share})
                if share > 0:
                    bars.append(Bar(share, bottom_at, p))
                bottom_at += share
            columns.append(Column(x, safe.mathtext(e["label"]), tuple(bars)))
    return ReplayChart(title, legend, timeline, mix, unit, tuple(lines), types, paths, width, tuple(columns))


def draw_replay(chart: ReplayChart, fig=None):
    """Draw `chart` (replay_data) on `fig`, a new 10 x 7.5 inch Figure by default."""
    from matplotlib.patches import Patch

    fig, axes = new_figure(10.0, 7.5, nrows=2, fig=fig)
    top, bottom = axes[0, 0], axes[1, 0]
    for k, ((xs, ys), label) in enumerate(zip(chart.lines, chart.legend)):
        # lines that coincide (two rules that never lose) stay visible: each its own dash and width,
        # the first drawn widest, underneath
        top.plot(xs, ys, lw=2.6 - 0.5 * min(k, 3), ls=LINE_STYLES[k % len(LINE_STYLES)], label=safe.mathtext(label),
                 color=ENGINE_COLOURS[k % len(ENGINE_COLOURS)], zorder=2 + k)  # fmt: skip
    top.set_xlabel(f"trace time ({chart.time_unit}, each engine's own clock)", fontsize=9)
    top.set_ylabel("attention lost against the best\n(ms per second of trace)", fontsize=9)
    # the legend above the panel, not over a line
    top.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.02), ncols=2, frameon=False)
    top.grid(alpha=0.3)

    for column in chart.columns:
        for bar in column.bars:
            colour = PATH_COLOURS.get(bar.path, "tab:gray")
            bottom.bar(column.x, bar.share, chart.width * 0.9, bar.bottom, color=colour, edgecolor="white", lw=0.3)
        bottom.text(column.x, 1.01, column.label, rotation=90, fontsize=7, ha="center", va="bottom")
    bottom.set_xticks(range(len(chart.types)), labels=chart.types, fontsize=8)
    bottom.set_ylim(0, 1.35)
    bottom.set_yticks([0, 0.25, 0.5, 0.75, 1.0], labels=["0", "25%", "50%", "75%", "100%"])
    bottom.set_ylabel("new tokens on each path")
    bottom.legend(
        handles=[Patch(color=PATH_COLOURS.get(p, "tab:gray"), label=p) for p in chart.paths],
        fontsize=7,
        loc="upper right",
        ncols=len(chart.paths),
    )
    fig.suptitle(chart.title, fontsize=10)
    return fig


def _legend(e: dict) -> str:
    """An engine's line: its label and what it loses over the trace, with the 80% interval where
    the report is calibrated: `sglang: lost 468s (280–468s)`."""
    if "lost_s" not in e:
        return e["label"]
    out = f"{e['label']}: lost {seconds(e['lost_s'])}"
    span = e.get("lost_interval_s")
    if span is not None and len(span) == 2:
        out += f" ({seconds_span(*span)})"
    return out
