"""The roofline chart: each path of each shape at its arithmetic intensity and attainable FLOP/s,
under the ceilings of the profile (and those `mlactl tune ceilings` measured), measured points
beside the predicted ones.

`roofline_data` works out what the chart shows (roofs, ridge, points, labels, axis range) without
matplotlib; `draw_roofline` draws it; `roofline` does both."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlactl.decide.analysis import Analysis
from mlactl.output.plot.common import (
    PATH_COLOURS,
    ChartData,
    ceilings,
    measured_points,
    new_figure,
    percent,
    shape_label,
    title,
)
from mlactl.util.errors import MlactlError

MAX_LABELS = 12  # beyond this many measured points, label only each path's best and worst


MAX_ROOFLINE_SHAPES = 24  # more would bury the chart in labels
PEAKS_APART = 1.6  # peaks' labels closer than this factor are stacked, 9 points apart


def _labelled(measured: list[dict]) -> set[int]:
    """Indices of the measured points that get a text label."""
    if len(measured) <= MAX_LABELS:
        return set(range(len(measured)))
    keep = set()
    for path in {m["path"] for m in measured}:
        mine = [i for i, m in enumerate(measured) if m["path"] == path]
        keep.add(min(mine, key=lambda i: measured[i]["fraction"]))
        keep.add(max(mine, key=lambda i: measured[i]["fraction"]))
    return keep


# A 7-point character is about 0.055 inch wide; the axes about 8.4 of the figure's 10 inches.
CHAR_INCHES, AXES_INCHES = 0.055, 8.4


def _free_spot(lo: float, hi: float, ridge: float, taken: list[float], chars: int) -> float:
    """Where on the memory roof (between the left edge and the ridge) a label of `chars`
    characters, reaching left from that point, lies in the widest gap between the points drawn:
    centred in it, or at the gap's right end with a small margin when it is narrower."""
    decades_per_inch = math.log10(hi / lo) / AXES_INCHES
    need = (chars * CHAR_INCHES + 0.15) * decades_per_inch  # the text and a margin each side
    edges = sorted([math.log10(lo), math.log10(ridge)] + [math.log10(x) for x in taken if lo < x < ridge])
    a, b = max(zip(edges, edges[1:]), key=lambda e: e[1] - e[0])
    margin = 0.1 * decades_per_inch
    return 10 ** max(a + need - margin, b - margin - max(0.0, (b - a - need) / 2))


def _calibrated_points(calibrated: Analysis | None, paths) -> list[dict]:
    """Each path's achieved FLOP/s by calibrated time, at its (unchanged) intensity."""
    if calibrated is None:
        return []
    out = []
    for i in range(len(calibrated)):
        for path in paths:
            if not calibrated.runs[path][i]:
                continue
            timed = calibrated.paths[path]
            flops, nbytes, t = (float(x[i]) for x in (timed.flops, timed.bytes, timed.time_s))
            basis = str(calibrated.spans.path_basis[path][i]) if calibrated.spans is not None else "measured"
            point = {"path": path, "intensity": flops / nbytes, "flops_per_s": flops / t, "time_s": t}
            out.append(dict(point, basis=basis))
    return out


@dataclass(frozen=True)
class Ceiling:
    """The roofs of one source of ceilings (the datasheet's, or a measurement's): one line per
    distinct peak (dtypes that share it, bf16 and fp16, share the line), each min(peak,
    bandwidth * intensity) across the axis, and the memory roof's label."""

    label: str
    rank: int  # 0: the first source (drawn black), then the others (red), each its own dash
    lines: tuple  # (xs, ys) per distinct peak: the axis's left end, the ridge when inside, its right end
    bandwidth_text: str  # "4.8 TB/s (nominal)"
    bandwidth_at: tuple  # (x, y) on the memory roof, the right end of the label


@dataclass(frozen=True)
class PeakLabel:
    """A compute roof's label at the right edge, `offset` points above its line."""

    text: str  # "bf16/fp16 989 TFLOP/s, nominal"
    peak: float
    offset: float
    rank: int  # the Ceiling's


@dataclass(frozen=True)
class RooflineChart(ChartData):
    DATA = (
        "title",
        "dtype",
        "ridge",
        "ceilings",
        "points",
        "measured",
        "analytic_only",
        "calibrated",
        "labelled",
        "note",
    )
    OPTIONAL = frozenset({"note"})

    title: str
    dtype: str  # the compute dtype
    ridge: dict  # {"intensity", "flops_per_s"}: where its memory and compute roofs meet
    ceilings: list  # [{label, dtype, peak_flops, bandwidth, ridge}], as common.ceilings reads them
    points: list  # [{path, op, batch, new, prefix, label, flops, bytes, intensity, flops_per_s}]
    measured: list  # measured_points(...)
    analytic_only: bool
    calibrated: list  # [{path, intensity, flops_per_s, time_s, basis}]
    paths: tuple  # the paths drawn, in the legend's order
    roofs: tuple  # Ceiling, in the order drawn
    peak_labels: tuple  # PeakLabel, lowest peak first
    shapes: tuple  # the shapes' labels, one marker each, in order
    numbers: dict  # measured point's index -> the number beside it ("1")
    keys: tuple  # (text, path): what each number is, in the legend
    note: str | None  # measured points above the roofline
    xlim: tuple
    ylim: tuple

    @property
    def labelled(self) -> list:
        """The numbered measured points: "b=1 n=1 p=4K absorb"."""
        return [self.measured[i]["label"] + " " + self.measured[i]["path"] for i in self.numbers]


def roofline(analysis: Analysis, results: list[dict] = (), paths=None, calibrated: Analysis | None = None):
    """(fig, data): `roofline_data`, drawn, and what it holds as a dict.

    data: {"title", "dtype", "ridge": {"intensity", "flops_per_s"}, "ceilings": [{label, dtype,
    peak_flops, bandwidth, ridge}], "points": [{path, op, batch, new, prefix, label, flops,
    bytes, intensity, flops_per_s}], "measured": measured_points(...), "analytic_only",
    "calibrated", "labelled"} (and "note" when a measured point is above the roofline)
    """
    chart = roofline_data(analysis, results, paths, calibrated)
    return draw_roofline(chart), chart.as_dict()


def roofline_data(
    analysis: Analysis, results: list[dict] = (), paths=None, calibrated: Analysis | None = None
) -> RooflineChart:
    """Log-log FLOP/s against FLOP/byte: the ceilings, the ridge of the compute dtype, each
    path's analytic point (filled) and its attention op's (hollow) at every shape of the
    analysis, and each measured path joined to its predicted point with its fraction of it."""
    results = list(results)
    if len(analysis) == 0:
        raise MlactlError("no shapes to plot")
    if len(analysis) > MAX_ROOFLINE_SHAPES:
        raise MlactlError(
            f"the roofline marks at most {MAX_ROOFLINE_SHAPES} shapes, got {len(analysis)}; "
            "give fewer --new/--prefix values"
        )
    hw, dtype = analysis.hw, analysis.cost.dtype
    paths = analysis.cost.choices if paths is None else paths
    lines = ceilings(hw, dtype, results)
    points = []
    for i in range(len(analysis)):
        b, n, p = int(analysis.batch[i]), int(analysis.new[i]), int(analysis.prefix[i])
        for path in paths:
            if not analysis.runs[path][i]:  # DSA's dense_expand past top-k: no such point
                continue
            timed = analysis.paths[path]
            attention = next(op for op in timed.ops if op.name == "attention")
            for op, figures in ((None, timed), ("attention", attention)):
                flops, nbytes, t = (float(x[i]) for x in (figures.flops, figures.bytes, figures.time_s))
                points.append(
                    {
                        "path": path,
                        "op": op,
                        "batch": b,
                        "new": n,
                        "prefix": p,
                        "label": shape_label(b, n, p),
                        "flops": flops,
                        "bytes": nbytes,
                        "intensity": flops / nbytes,
                        "flops_per_s": flops / t,
                    }
                )
    measured = measured_points(analysis, results)
    xs = [pt["intensity"] for pt in points + measured] + [c["ridge"] for c in lines]
    lo, hi = min(xs) / 4, max(xs) * 12  # room on the right for the peaks' labels, clear of the points
    roofs, peak_labels = [], []  # (peak, text, rank) of each compute roof, placed after the lines
    for k, label in enumerate(dict.fromkeys(c["label"] for c in lines)):
        by_peak: dict[float, list[dict]] = {}
        for c in lines:
            if c["label"] == label:
                by_peak.setdefault(c["peak_flops"], []).append(c)
        drawn = []
        for peak, same in by_peak.items():
            bw, ridge = same[0]["bandwidth"], same[0]["ridge"]
            x = [lo, ridge, hi] if lo < ridge < hi else [lo, hi]
            drawn.append((x, [min(peak, bw * v) for v in x]))
            names = "/".join(c["dtype"] for c in same)
            peak_labels.append((peak, f"{names} {peak / 1e12:.4g} TFLOP/s, {label}", k))
        text = f"{bw / 1e12:.3g} TB/s ({label})"
        # above and left of a point of the slope, in a gap between the points: nothing is drawn above
        # the memory roof (no time beats it), and the roof falls to the left, so the label never
        # crosses it; measured roofs' labels stack above the nominal's
        on_slope = _free_spot(lo, hi, hw.ridge(dtype), [pt["intensity"] for pt in points + measured], len(text))
        roofs.append(Ceiling(label, k, tuple(drawn), text, (on_slope, bw * on_slope)))
    labelled = sorted(set(_labelled(measured)) | {i for i, m in enumerate(measured) if m["above_ceiling"]})
    numbers = {i: str(number) for number, i in enumerate(labelled, 1)}
    keys = tuple(
        (
            f"{numbers[i]}: {measured[i]['label']} {measured[i]['path']}, {percent(measured[i]['fraction'])} of the "
            "roofline" + (" (above the roofline!)" if measured[i]["above_ceiling"] else ""),
            measured[i]["path"],
        )
        for i in labelled
    )
    ys = [pt["flops_per_s"] for pt in points + measured] + [c["peak_flops"] for c in lines]
    note = None
    if any(m["above_ceiling"] for m in measured):
        note = (
            "measured points above the roofline: the ceilings they are placed against are too low "
            "(measure them again: mlactl tune ceilings, without --quick)"
        )
    return RooflineChart(
        title=title("Roofline", analysis, results, calibrated, how="x marks"),
        dtype=dtype,
        ridge={"intensity": hw.ridge(dtype), "flops_per_s": hw.peak_flops(dtype)},
        ceilings=lines,
        points=points,
        measured=measured,
        analytic_only=not results,
        calibrated=_calibrated_points(calibrated, paths),
        paths=tuple(paths),
        roofs=tuple(roofs),
        peak_labels=_stacked(peak_labels),
        shapes=tuple(dict.fromkeys(pt["label"] for pt in points)),
        numbers=numbers,
        keys=keys,
        note=note,
        xlim=(lo, hi),
        ylim=(min(ys) / 3, max(ys) * 2),
    )


def _stacked(peak_labels: list[tuple]) -> tuple:
    """Each distinct text once (a profile's measurement and a results file's, alike to 4 digits),
    lowest peak first, upwards from 6 points above its roof (clear of the markers on it); labels
    of peaks within PEAKS_APART of each other would overlap: stacked 9 points apart."""
    unique = {text: (peak, rank) for peak, text, rank in peak_labels}
    placed: list[tuple[float, float]] = []
    out = []
    for text, (peak, rank) in sorted(unique.items(), key=lambda x: x[1][0]):
        near = [y for p, y in placed if peak / p < PEAKS_APART]
        offset = max(near) + 9 if near else 6
        placed.append((peak, offset))
        out.append(PeakLabel(text, peak, offset, rank))
    return tuple(out)


SHAPE_MARKERS = "osv^<>pPXh*8dH+x1234"
ROOF_STYLES = ("-", "--", "-.", ":")


def _rank_colour(rank: int) -> str:
    return "black" if rank == 0 else "tab:red"


def draw_roofline(chart: RooflineChart, fig=None):
    """Draw `chart` (roofline_data) on `fig`, a new 10 x 7.5 inch Figure by default."""
    from matplotlib.lines import Line2D

    fig, axes = new_figure(10, 7.5, fig=fig)
    ax = axes[0, 0]
    for roof in chart.roofs:
        colour = _rank_colour(roof.rank)
        for x, y in roof.lines:
            ax.plot(x, y, ROOF_STYLES[roof.rank % len(ROOF_STYLES)], color=colour, lw=1.2, alpha=0.8)
        ax.annotate(
            roof.bandwidth_text,
            roof.bandwidth_at,
            xytext=(-6, 4 + 10 * roof.rank),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color=colour,
        )
    for label in chart.peak_labels:
        ax.annotate(
            label.text,
            (chart.xlim[1], label.peak),
            xytext=(-4, label.offset),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color=_rank_colour(label.rank),
            bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.75},
        )
    ridge, dtype = chart.ridge, chart.dtype
    ax.plot([ridge["intensity"]], [ridge["flops_per_s"]], "D", color="black", ms=7)
    ax.axvline(ridge["intensity"], color="gray", lw=0.6, ls=":")
    ax.annotate(
        f"ridge {ridge['intensity']:.1f} FLOP/byte ({dtype})",
        (ridge["intensity"], 0.99),
        xycoords=("data", "axes fraction"),
        xytext=(-4, 0),
        textcoords="offset points",
        ha="right",
        va="top",
        fontsize=8,
    )
    for pt in chart.points:
        marker = SHAPE_MARKERS[chart.shapes.index(pt["label"]) % len(SHAPE_MARKERS)]
        colour = PATH_COLOURS[pt["path"]]
        small = pt["path"] == "expand_chunked"  # drawn inside expand's marker, which it nearly equals
        ax.plot(
            pt["intensity"],
            pt["flops_per_s"],
            marker,
            ms=5 if small else 9,
            color=colour,
            mfc=colour if pt["op"] is None else "none",
            mew=1.2 if small else 1.6,
        )
    for i, m in enumerate(chart.measured):
        colour = PATH_COLOURS.get(m["path"], "black")
        ax.plot([m["intensity"]] * 2, [m["predicted_flops_per_s"], m["flops_per_s"]], color=colour, lw=0.8)
        above = m["above_ceiling"]
        ax.plot(m["intensity"], m["flops_per_s"], "*", ms=11, color=colour, mec="red" if above else "black", mew=0.6)
        if i in chart.numbers:
            ax.annotate(
                chart.numbers[i],
                (m["intensity"], m["flops_per_s"]),
                xytext=(5, 4),
                textcoords="offset points",
                fontsize=7,
                color=colour,
                fontweight="bold",
            )
    for pt in chart.calibrated:
        marker = "x" if pt["basis"] == "measured" else "1"  # an op extrapolated or at roofline: a tripod
        ax.plot(pt["intensity"], pt["flops_per_s"], marker, ms=8, mew=1.6, color=PATH_COLOURS.get(pt["path"], "black"))

    legend = [Line2D([], [], ls="", marker="s", color=PATH_COLOURS[p], label=p) for p in chart.paths]
    legend += [
        Line2D([], [], ls="", marker="o", color="gray", mfc="gray", label="whole path"),
        Line2D([], [], ls="", marker="o", color="gray", mfc="none", label="attention op"),
        # the black diamond: where the memory roof meets the compute roof of the compute dtype
        Line2D([], [], ls="", marker="D", ms=6, color="black", label=f"ridge ({dtype}): memory and compute bound meet"),
    ]
    legend += [
        Line2D([], [], ls="", marker=SHAPE_MARKERS[k % len(SHAPE_MARKERS)], color="black", mfc="none", label=s)
        for k, s in enumerate(chart.shapes)
    ]
    if chart.measured:
        legend.append(
            Line2D([], [], marker="*", ms=10, color="gray", mec="black", lw=0.8, label="measured, joined to predicted")
        )
    if chart.note is not None:
        legend.append(
            Line2D(
                [], [], ls="", marker="*", ms=10, color="gray", mec="red", label="above the roofline: ceilings too low"
            )
        )
    if chart.calibrated:
        legend.append(Line2D([], [], ls="", marker="x", color="gray", label="calibrated (whole path)"))
        if any(pt["basis"] != "measured" for pt in chart.calibrated):
            legend.append(Line2D([], [], ls="", marker="1", color="gray", label="calibrated, an op not measured"))
    legend += [Line2D([], [], ls="", color=PATH_COLOURS.get(path, "black"), label=text) for text, path in chart.keys]
    # below the axes, where no point or curve is: inside, it would sit on the measured points
    fig.legend(handles=legend, loc="outside lower center", fontsize=7, ncols=3 if len(legend) > 8 else 2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*chart.xlim)
    ax.set_ylim(*chart.ylim)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(chart.title, fontsize=9)
    return fig
