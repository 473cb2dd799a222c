"""The roofline chart: each path of each shape at its arithmetic intensity and attainable FLOP/s,
under the ceilings of the profile (and those `mlactl tune ceilings` measured), measured points
beside the predicted ones."""

from __future__ import annotations

import math

from mlactl.decide.analysis import Analysis
from mlactl.output.plot.common import (
    PATH_COLOURS,
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


def roofline(analysis: Analysis, results: list[dict] = (), paths=None, calibrated: Analysis | None = None):
    """Log-log FLOP/s against FLOP/byte: the ceilings, the ridge of the compute dtype, each
    path's analytic point (filled) and its attention op's (hollow) at every shape of the
    analysis, and each measured path joined to its predicted point with its fraction of it.

    data: {"title", "dtype", "ridge": {"intensity", "flops_per_s"}, "ceilings": [{label, dtype,
    peak_flops, bandwidth, ridge}], "points": [{path, op, batch, new, prefix, label, flops,
    bytes, intensity, flops_per_s}], "measured": measured_points(...), "analytic_only"}
    """
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
    data = {
        "title": title("Roofline", analysis, results, calibrated, how="x marks"),
        "dtype": dtype,
        "ridge": {"intensity": hw.ridge(dtype), "flops_per_s": hw.peak_flops(dtype)},
        "ceilings": lines,
        "points": points,
        "measured": measured,
        "analytic_only": not results,
        "calibrated": _calibrated_points(calibrated, paths),
    }

    fig, axes = new_figure(10, 7.5)
    ax = axes[0, 0]
    xs = [pt["intensity"] for pt in points + measured] + [c["ridge"] for c in lines]
    lo, hi = min(xs) / 4, max(xs) * 12  # room on the right for the peaks' labels, clear of the points
    styles = ["-", "--", "-.", ":"]
    peak_labels = []  # (peak, text, colour), placed after the lines so that none overlaps another
    for k, label in enumerate(dict.fromkeys(c["label"] for c in lines)):
        # one line per distinct peak; dtypes that share it (bf16 and fp16) share the line
        by_peak: dict[float, list[dict]] = {}
        for c in lines:
            if c["label"] == label:
                by_peak.setdefault(c["peak_flops"], []).append(c)
        colour = "black" if k == 0 else "tab:red"
        for peak, same in by_peak.items():
            bw, ridge = same[0]["bandwidth"], same[0]["ridge"]
            x = [lo, ridge, hi] if lo < ridge < hi else [lo, hi]
            ax.plot(x, [min(peak, bw * v) for v in x], styles[k % len(styles)], color=colour, lw=1.2, alpha=0.8)
            names = "/".join(c["dtype"] for c in same)
            peak_labels.append((peak, f"{names} {peak / 1e12:.4g} TFLOP/s, {label}", colour))
        text = f"{bw / 1e12:.3g} TB/s ({label})"
        on_slope = _free_spot(lo, hi, hw.ridge(dtype), [pt["intensity"] for pt in points + measured], len(text))
        # above and left of a point of the slope, in a gap between the points: nothing is drawn above
        # the memory roof (no time beats it), and the roof falls to the left, so the label never
        # crosses it; measured roofs' labels stack above the nominal's
        ax.annotate(
            text,
            (on_slope, bw * on_slope),
            xytext=(-6, 4 + 10 * k),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color=colour,
        )
    # labels of peaks within a factor 1.6 of each other would overlap: stack them 9 points apart
    placed: list[tuple[float, float]] = []
    # the same text (a profile's measurement and a results file's, alike to 4 digits) once
    unique = {text: (peak, colour) for peak, text, colour in peak_labels}
    for text, (peak, colour) in sorted(unique.items(), key=lambda x: x[1][0]):
        # upwards from 6 points above the roof: clear of the markers that sit on it
        near = [y for p, y in placed if peak / p < 1.6]
        offset = max(near) + 9 if near else 6
        placed.append((peak, offset))
        ax.annotate(
            text,
            (hi, peak),
            xytext=(-4, offset),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color=colour,
            bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.75},
        )
    ridge = data["ridge"]
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

    shape_markers = "osv^<>pPXh*8dH+x1234"
    shapes = list(dict.fromkeys(pt["label"] for pt in points))
    for pt in points:
        marker = shape_markers[shapes.index(pt["label"]) % len(shape_markers)]
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
    labelled = sorted(set(_labelled(measured)) | {i for i, m in enumerate(measured) if m["above_ceiling"]})
    keys: list[tuple[str, str]] = []  # the labelled points' numbers, next to the point; what they are, in the legend
    for i, m in enumerate(measured):
        colour = PATH_COLOURS.get(m["path"], "black")
        ax.plot([m["intensity"]] * 2, [m["predicted_flops_per_s"], m["flops_per_s"]], color=colour, lw=0.8)
        above = m["above_ceiling"]
        ax.plot(m["intensity"], m["flops_per_s"], "*", ms=11, color=colour, mec="red" if above else "black", mew=0.6)
        if i in labelled:
            number = str(len(keys) + 1)
            ax.annotate(
                number,
                (m["intensity"], m["flops_per_s"]),
                xytext=(5, 4),
                textcoords="offset points",
                fontsize=7,
                color=colour,
                fontweight="bold",
            )
            keys.append(
                (
                    f"{number}: {m['label']} {m['path']}, {percent(m['fraction'])} of the roofline"
                    + (" (above the roofline!)" if above else ""),
                    colour,
                )
            )
    data["labelled"] = [measured[i]["label"] + " " + measured[i]["path"] for i in labelled]

    for pt in data["calibrated"]:
        marker = "x" if pt["basis"] == "measured" else "1"  # an op extrapolated or at roofline: a tripod
        ax.plot(pt["intensity"], pt["flops_per_s"], marker, ms=8, mew=1.6, color=PATH_COLOURS.get(pt["path"], "black"))

    from matplotlib.lines import Line2D

    legend = [Line2D([], [], ls="", marker="s", color=PATH_COLOURS[p], label=p) for p in paths]
    legend += [
        Line2D([], [], ls="", marker="o", color="gray", mfc="gray", label="whole path"),
        Line2D([], [], ls="", marker="o", color="gray", mfc="none", label="attention op"),
        # the black diamond: where the memory roof meets the compute roof of the compute dtype
        Line2D([], [], ls="", marker="D", ms=6, color="black", label=f"ridge ({dtype}): memory and compute bound meet"),
    ]
    legend += [
        Line2D([], [], ls="", marker=shape_markers[k % len(shape_markers)], color="black", mfc="none", label=s)
        for k, s in enumerate(shapes)
    ]
    if measured:
        legend.append(
            Line2D([], [], marker="*", ms=10, color="gray", mec="black", lw=0.8, label="measured, joined to predicted")
        )
    if any(m["above_ceiling"] for m in measured):
        legend.append(
            Line2D(
                [], [], ls="", marker="*", ms=10, color="gray", mec="red", label="above the roofline: ceilings too low"
            )
        )
        data["note"] = (
            "measured points above the roofline: the ceilings they are placed against are too low "
            "(measure them again: mlactl tune ceilings, without --quick)"
        )
    if data["calibrated"]:
        legend.append(Line2D([], [], ls="", marker="x", color="gray", label="calibrated (whole path)"))
        if any(pt["basis"] != "measured" for pt in data["calibrated"]):
            legend.append(Line2D([], [], ls="", marker="1", color="gray", label="calibrated, an op not measured"))
    legend += [Line2D([], [], ls="", color=colour, label=text) for text, colour in keys]
    # below the axes, where no point or curve is: inside, it would sit on the measured points
    fig.legend(handles=legend, loc="outside lower center", fontsize=7, ncols=3 if len(legend) > 8 else 2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ys = [pt["flops_per_s"] for pt in points + measured] + [c["peak_flops"] for c in lines]
    ax.set_ylim(min(ys) / 3, max(ys) * 2)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(data["title"], fontsize=9)
    return fig, data
