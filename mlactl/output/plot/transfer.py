"""The transfer chart: a calibration's predicted time against the time measured on its GPU, per
op class (`mlactl plot transfer`), with each point's 80% interval and the roofline beside it.

Each panel is one op class: x the measured time, y the predicted one, log-log; the diagonal is
a perfect prediction, the dotted lines +-25%. Blue points are the calibration's (with their 80%
interval as a vertical bar), grey crosses the roofline at the same ceilings.
"""

from __future__ import annotations

import math

from mlactl.output.plot.common import new_figure
from mlactl.util import safe
from mlactl.util.errors import MlactlError

MAX_POINTS = 4000  # points drawn per panel (every n-th beyond; the figures use them all)


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


def transfer(panels: list[dict], title: str):
    """(figure, what it drew) of `score.panels`' output."""
    if not panels:
        raise MlactlError("no op class of these measurements has a fit of its dtype in the calibration")
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = new_figure(4.2 * cols, 3.6 * rows + 0.6, rows, cols)
    for k, ax in enumerate(axes.flat):
        if k >= len(panels):
            ax.set_visible(False)
            continue
        p = panels[k]
        step = max(1, p["n"] // MAX_POINTS)
        y, t = p["measured_s"][::step], p["predicted_s"][::step]
        lo, hi, roof = p["lo_s"][::step], p["hi_s"][::step], p["roofline_s"][::step]
        us = 1e6
        ax.scatter([v * us for v in y], [v * us for v in roof], s=6, marker="x", color="0.6", label="roofline")
        bars = [(a, b, c) for a, b, c in zip(y, lo, hi) if math.isfinite(b) and math.isfinite(c)]
        if bars:
            ax.vlines([a * us for a, _, _ in bars], [b * us for _, b, _ in bars], [c * us for _, _, c in bars],
                      color="tab:blue", alpha=0.15, linewidth=0.8, label="80% interval")  # fmt: skip
        ax.scatter([v * us for v in y], [v * us for v in t], s=5, color="tab:blue", label="calibrated")
        # the measured and predicted range (a roofline far below it, a launch's floor, is cut)
        low = min(min(y), min(t)) * us / 2
        high = max(max(y), max(t)) * us * 2
        ax.plot([low, high], [low, high], color="black", linewidth=0.8)
        for f in (0.75, 1.25):
            ax.plot([low, high], [low * f, high * f], color="black", linewidth=0.5, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel("measured (µs)")
        ax.set_ylabel("predicted (µs)")
        ax.set_title(
            f"{safe.mathtext(p['op'])}: {p['n']:,} points\nmedian {_pct(p['median'])}, p90 {_pct(p['p90'])}, "
            f"in 80% {_pct(p['coverage'])}; roofline {_pct(p['roofline_median'])}",
            fontsize=8,
        )
        if k == 0:
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("\n".join(safe.mathtext(line) for line in title.split("\n")), fontsize=9)
    drawn = {"title": title, "panels": panels}
    return fig, drawn
