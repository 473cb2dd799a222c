"""Charts that put prediction and measurement on one picture, one module a chart: roofline.py,
crossover.py, pathmap.py, tune.py and replay.py; what they share is in common.py.

Each chart is two functions and their sum. `X_data` (roofline_data, crossover_data, ...) works
out what the chart shows -- ceilings, ridge, points, curves, crossover markers, cells,
boundaries, labels, axis ranges -- as a frozen dataclass, without matplotlib, so that tests check
the figures, not pixels; `draw_X(chart, fig=None)` draws that value on a matplotlib Figure (a new
one by default) and returns it. `X(...)` does both and returns `(fig, data)`: the Figure and
`data`, the value's plain dict (lists, floats, strings: chart.as_dict()), which `--data` writes.
`save` writes a Figure; the format follows the file's extension.

Nothing here computes a FLOP, a byte or a time: analytic figures come from an Analysis
(analysis.py) and every measured point is placed with cost.py and roofline.py -- its FLOP/s is
the cost model's FLOPs of its shape over the measured median time, its intensity the cost
model's FLOPs over bytes. Measured data comes from results dicts (mlactl.results.store.load), checked
against the model and machine asked with `check_results`.

matplotlib is imported inside the drawing functions, so importing mlactl never loads it, and figures are
made with matplotlib.figure.Figure rather than pyplot: no display, no global state, and a
notebook's own backend is left alone.
"""

from collections.abc import Callable
from typing import Any

from mlactl.output.plot.common import (
    FORMATS,
    MIN_DPI,
    PATH_COLOURS,
    ceilings,
    check_pixels,
    check_results,
    image_format,
    measured_crossover_rows,
    measured_label,
    measured_points,
    save,
    shape_label,
    title,
    tokens,
)
from mlactl.output.plot.crossover import MAX_CROSSOVER_PANELS, CrossoverChart, crossover, crossover_data, draw_crossover
from mlactl.output.plot.pathmap import WRONG_ABOVE, PathmapChart, draw_pathmap, pathmap, pathmap_data
from mlactl.output.plot.replay import ReplayChart, check_report, draw_replay, replay, replay_data
from mlactl.output.plot.roofline import (
    MAX_LABELS,
    MAX_ROOFLINE_SHAPES,
    RooflineChart,
    draw_roofline,
    roofline,
    roofline_data,
)
from mlactl.output.plot.transfer import TransferChart, draw_transfer, transfer, transfer_data
from mlactl.output.plot.tune import TuneChart, config_label, draw_tune, tune, tune_data

# chart name -> (its data function, its drawing function), as `mlactl plot CHART` calls them
CHARTS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "roofline": (roofline_data, draw_roofline),
    "crossover": (crossover_data, draw_crossover),
    "pathmap": (pathmap_data, draw_pathmap),
    "tune": (tune_data, draw_tune),
    "replay": (replay_data, draw_replay),
    "transfer": (transfer_data, draw_transfer),
}

__all__ = [
    "CHARTS",
    "CrossoverChart",
    "FORMATS",
    "MAX_CROSSOVER_PANELS",
    "MAX_LABELS",
    "MAX_ROOFLINE_SHAPES",
    "MIN_DPI",
    "PATH_COLOURS",
    "PathmapChart",
    "ReplayChart",
    "RooflineChart",
    "TransferChart",
    "TuneChart",
    "WRONG_ABOVE",
    "ceilings",
    "check_pixels",
    "check_results",
    "config_label",
    "crossover",
    "crossover_data",
    "draw_crossover",
    "draw_pathmap",
    "draw_replay",
    "draw_roofline",
    "draw_transfer",
    "draw_tune",
    "transfer",
    "transfer_data",
    "image_format",
    "measured_crossover_rows",
    "measured_label",
    "measured_points",
    "pathmap",
    "pathmap_data",
    "replay",
    "replay_data",
    "check_report",
    "roofline",
    "roofline_data",
    "save",
    "shape_label",
    "title",
    "tokens",
    "tune",
    "tune_data",
]
