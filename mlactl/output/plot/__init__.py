"""Charts that put prediction and measurement on one picture, one module a chart: roofline.py,
crossover.py, pathmap.py, tune.py and replay.py; what they share is in common.py.

Each chart function returns `(fig, data)`: a matplotlib Figure and `data`, a plain dict (lists,
floats, strings) of exactly what was drawn -- ceilings, ridge, points, crossover markers,
boundaries -- so that tests check the figures, not pixels. `save` writes a Figure; the format
follows the file's extension.

Nothing here computes a FLOP, a byte or a time: analytic figures come from an Analysis
(analysis.py) and every measured point is placed with cost.py and roofline.py -- its FLOP/s is
the cost model's FLOPs of its shape over the measured median time, its intensity the cost
model's FLOPs over bytes. Measured data comes from results dicts (mlactl.results.store.load), checked
against the model and machine asked with `check_results`.

matplotlib is imported inside the functions, so importing mlactl never loads it, and figures are
made with matplotlib.figure.Figure rather than pyplot: no display, no global state, and a
notebook's own backend is left alone.
"""

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
from mlactl.output.plot.crossover import MAX_CROSSOVER_PANELS, crossover
from mlactl.output.plot.pathmap import WRONG_ABOVE, pathmap
from mlactl.output.plot.replay import check_report, replay
from mlactl.output.plot.roofline import MAX_LABELS, MAX_ROOFLINE_SHAPES, roofline
from mlactl.output.plot.transfer import transfer
from mlactl.output.plot.tune import config_label, tune

__all__ = [
    "FORMATS",
    "MAX_CROSSOVER_PANELS",
    "MAX_LABELS",
    "MAX_ROOFLINE_SHAPES",
    "MIN_DPI",
    "PATH_COLOURS",
    "WRONG_ABOVE",
    "ceilings",
    "check_pixels",
    "check_results",
    "config_label",
    "crossover",
    "transfer",
    "image_format",
    "measured_crossover_rows",
    "measured_label",
    "measured_points",
    "pathmap",
    "replay",
    "check_report",
    "roofline",
    "save",
    "shape_label",
    "title",
    "tokens",
    "tune",
]
