"""The transfer chart: a calibration's predicted time against the time measured on its GPU, per
op class (`mlactl plot transfer`), with each point's 80% interval and the roofline beside it.

Each panel is one op class: x the measured time, y the predicted one, log-log; the diagonal is
a perfect prediction, the dotted lines +-25%. Blue points are the calibration's (with their 80%
interval as a vertical bar), grey crosses the roofline at the same ceilings.

`transfer_data` works out what each panel shows (the points drawn, the intervals, the range,
the heading) without matplotlib; `draw_transfer` draws it; `transfer` does both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlactl.output.plot.common import ChartData, new_figure
from mlactl.util import safe
from mlactl.util.errors import MlactlError

MAX_POINTS = 4000  # points drawn per panel (every n-th beyond; the figures use them all)


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


@dataclass(frozen=True)
class TransferPanel:
    """One op class, in microseconds: every `step`-th point (at most MAX_POINTS)."""

    measured_us: list  # x
    predicted_us: list  # y: the calibration's
    roofline_us: list  # y: the roofline's
    bars: tuple  # (x, low, high) of each finite 80% interval
    range_us: tuple  # (low, high) of both axes: the measured and predicted range, widened 2x each way
    heading: str


@dataclass(frozen=True)
class TransferChart(ChartData):
    DATA = ("title", "panels")

    title: str
    panels: list  # score.panels' output, as given
    drawn: tuple  # TransferPanel, one per op class


def transfer(panels: list[dict], title: str):
    """(figure, what it drew) of `score.panels`' output."""
    chart = transfer_data(panels, title)
    return draw_transfer(chart), chart.as_dict()


def transfer_data(panels: list[dict], title: str) -> TransferChart:
    """Each op class of `score.panels`' output as drawn."""
    if not panels:
        raise MlactlError("no op class of these measurements has a fit of its dtype in the calibration")
    us = 1e6
    drawn = []
    for p in panels:
        step = max(1, p["n"] // MAX_POINTS)
        y, t = p["measured_s"][::step], p["predicted_s"][::step]
        lo, hi, roof = p["lo_s"][::step], p["hi_s"][::step], p["roofline_s"][::step]
        bars = [(a * us, b * us, c * us) for a, b, c in zip(y, lo, hi) if math.isfinite(b) and math.isfinite(c)]
        # the measured and predicted range (a roofline far below it, a launch's floor, is cut)
        low = min(min(y), min(t)) * us / 2
        high = max(max(y), max(t)) * us * 2
        heading = (
            f"{safe.mathtext(p['op'])}: {p['n']:,} points\nmedian {_pct(p['median'])}, p90 {_pct(p['p90'])}, "
            f"in 80% {_pct(p['coverage'])}; roofline {_pct(p['roofline_median'])}"
        )
        drawn.append(
            TransferPanel(
                [v * us for v in y], [v * us for v in t], [v * us for v in roof], tuple(bars), (low, high), heading
            )
        )
    return TransferChart(title, panels, tuple(drawn))


def draw_transfer(chart: TransferChart, fig=None):
    """Draw `chart` (transfer_data) on `fig`, a new Figure of up to three panels a row by default."""
    cols = min(3, len(chart.drawn))
    rows = math.ceil(len(chart.drawn) / cols)
    fig, axes = new_figure(4.2 * cols, 3.6 * rows + 0.6, rows, cols, fig=fig)
    for k, ax in enumerate(axes.flat):
        if k >= len(chart.drawn):
            ax.set_visible(False)
            continue
        p = chart.drawn[k]
        ax.scatter(p.measured_us, p.roofline_us, s=6, marker="x", color="0.6", label="roofline")
        if p.bars:
            ax.vlines([a for a, _, _ in p.bars], [b for _, b, _ in p.bars], [c for _, _, c in p.bars],
                      color="tab:blue", alpha=0.15, linewidth=0.8, label="80% interval")  # fmt: skip
        ax.scatter(p.measured_us, p.predicted_us, s=5, color="tab:blue", label="calibrated")
        low, high = p.range_us
        ax.plot([low, high], [low, high], color="black", linewidth=0.8)
        for f in (0.75, 1.25):
            ax.plot([low, high], [low * f, high * f], color="black", linewidth=0.5, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel("measured (µs)")
        ax.set_ylabel("predicted (µs)")
        ax.set_title(p.heading, fontsize=8)
        if k == 0:
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("\n".join(safe.mathtext(line) for line in chart.title.split("\n")), fontsize=9)
    return fig
