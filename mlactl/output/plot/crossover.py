"""The crossover chart: time of each path against new tokens, one panel per prefix, with the
crossover by roofline, by FLOPs and as measured."""

from __future__ import annotations

import math

import numpy as np

from mlactl.decide.analysis import Analysis
from mlactl.model.cost import MLA_PATHS
from mlactl.output.plot.common import (
    PATH_COLOURS,
    measured_crossover_rows,
    measured_points,
    new_figure,
    power_ticks,
    title,
    tokens,
)
from mlactl.util.errors import MlactlError

MAX_CROSSOVER_PANELS = 12


def crossover(analysis: Analysis, results: list[dict] = (), calibrated: Analysis | None = None):
    """Time against new tokens, one panel per (batch, prefix) of the analysis: the predicted
    expand, expand_chunked and absorb curves, measured path times, the predicted crossovers
    (roofline, from the analysis's crossover table), the asymptotic crossover by FLOPs, and the
    measured crossovers, each marked with its value.

    data: {"title", "asymptotic_new", "max_new", "analytic_only", "panels": [{"batch", "prefix",
    "new": [...], "time_s": {path: [...]}, "solved", "predicted": {"expand": n|None,
    "expand_chunked": n|None}, "measured_crossovers": [{source, new}], "measured": [...]}]}
    """
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
    solved = {(r.batch, r.prefix): r for r in analysis.crossover.rows}
    measured = measured_points(analysis, results)
    asymptotic = analysis.crossover.asymptotic_new
    panels = []
    for b, p in groups:
        idx = np.flatnonzero((analysis.batch == b) & (analysis.prefix == p))
        idx = idx[np.argsort(analysis.new[idx], kind="stable")]
        row = solved.get((b, p))
        panels.append(
            {
                "batch": b,
                "prefix": p,
                "new": analysis.new[idx].tolist(),
                "time_s": {path: analysis.paths[path].time_s[idx].tolist() for path in MLA_PATHS},
                "solved": row is not None,  # False when the analysis had too many prefixes to solve
                "predicted": {
                    "expand": None if row is None else row.by_time,
                    "expand_chunked": None if row is None else row.by_time_chunked,
                },
                "measured_crossovers": [
                    {"source": m["source"], "new": m["new"]}
                    for m in measured_crossover_rows(results, b)
                    if m["prefix"] == p
                ],
                "measured": [m for m in measured if (m["batch"], m["prefix"]) == (b, p) and m["path"] in MLA_PATHS],
            }
        )
        if calibrated is not None:  # same grid, calibrated time
            crow = {(r.batch, r.prefix): r for r in calibrated.crossover.rows}.get((b, p))
            spans = calibrated.spans  # each time's 80% interval, and the weakest basis of its ops
            panels[-1]["calibrated"] = {
                "time_s": {path: calibrated.paths[path].time_s[idx].tolist() for path in MLA_PATHS},
                "crossover": None if crow is None else crow.by_time,
                "crossover_interval": None if crow is None else crow.by_time_interval,
                "name": calibrated.calibration.name,
                "interval_s": {
                    p: None if spans.paths[p] is None else [v[idx].tolist() for v in spans.paths[p]] for p in MLA_PATHS
                },  # fmt: skip
                "basis": {p: spans.path_basis[p][idx].tolist() for p in MLA_PATHS},
            }
    data = {
        "title": title("Crossover", analysis, results, calibrated, how="dotted"),
        "asymptotic_new": asymptotic,
        "max_new": analysis.crossover.max_new,
        "analytic_only": not results,
        "panels": panels,
    }

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = new_figure(4.6 * ncols + 0.6, 4.2 * nrows + 1.1, nrows, ncols)
    for k, panel in enumerate(panels):
        ax = axes.flat[k]
        for path in MLA_PATHS:
            ax.plot(
                panel["new"],
                np.asarray(panel["time_s"][path]) * 1e6,
                color=PATH_COLOURS[path],
                lw=1.6,
                ls="--" if path == "expand_chunked" else "-",
                label=path,
            )
        cal = panel.get("calibrated")
        if cal is not None:
            for path in MLA_PATHS:
                ax.plot(
                    panel["new"],
                    np.asarray(cal["time_s"][path]) * 1e6,
                    color=PATH_COLOURS[path],
                    lw=1.4,
                    ls=":",
                    label=f"{path} (calibrated)",
                )
                band, basis = cal["interval_s"][path], np.asarray(cal["basis"][path])
                if band is not None:  # the 80% interval, and dots where an op was not measured
                    ax.fill_between(panel["new"], *(np.asarray(b) * 1e6 for b in band), color=PATH_COLOURS[path],
                                    alpha=0.12, lw=0)  # fmt: skip
                far = basis != "measured"
                ax.plot(np.asarray(panel["new"])[far], np.asarray(cal["time_s"][path])[far] * 1e6, ".", ms=3,
                        color=PATH_COLOURS[path])  # fmt: skip
        for m in panel["measured"]:
            ax.plot(m["new"], m["median_s"] * 1e6, "o", color=PATH_COLOURS[m["path"]], mec="black", ms=6)
        # (new, text, colour, style): vertical lines, their values in the panel's title, never on a
        # curve: predicted 160, chunked 165, calibrated 133 (128-181), ...
        markers = []
        for path in ("expand", "expand_chunked"):
            n = panel["predicted"][path]
            if n is not None:
                markers.append((n, f"{'predicted' if path == 'expand' else 'chunked'} {n}", PATH_COLOURS[path], "-"))
        if cal is not None and cal["crossover"] is not None:
            span = cal["crossover_interval"]
            where = "" if span is None else f" ({span[0]}–{'?' if span[1] is None else span[1]})"
            markers.append((cal["crossover"], f"calibrated {cal['crossover']}{where}", "tab:purple", "--"))
        if asymptotic is not None:
            markers.append((asymptotic, f"by FLOPs {asymptotic:.1f}", "gray", ":"))
        for m in panel["measured_crossovers"]:
            if m["new"] is not None:
                markers.append((m["new"], f"measured {m['new']}", "black", "-."))
        for n, _, colour, style in markers:
            ax.axvline(n, color=colour, ls=style, lw=1.1)
        values = [text for _, text, _, _ in markers]
        never = [path for path in ("expand", "expand_chunked") if panel["solved"] and panel["predicted"][path] is None]
        if never:
            values.append(f"{' and '.join(never)} never faster up to {tokens(data['max_new'])}")
        if any(m["new"] is None for m in panel["measured_crossovers"]):
            values.append("measured: expand never faster")
        heading = f"batch {panel['batch']}, prefix {tokens(panel['prefix'])}"
        if values:
            heading += "\ncrossover (new tokens): " + ", ".join(values[:2])
            heading += "\n" + ", ".join(values[2:]) if values[2:] else ""
        xs = panel["new"] + [m[0] for m in markers]
        ax.set_xlim(max(min(xs) / 1.5, 0.8), max(xs) * 1.5)
        ax.set_xscale("log", base=2)
        ticks = power_ticks(*ax.get_xlim(), most=7)
        ax.set_xticks(ticks, labels=[tokens(v) for v in ticks])
        ax.set_yscale("log")
        ax.set_xlabel("new tokens")
        ax.set_ylabel(f"time, {analysis.layers} layer{'s' if analysis.layers > 1 else ''} (µs)")
        ax.set_title(heading, fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        if k == 0:
            handles, _ = ax.get_legend_handles_labels()
    from matplotlib.lines import Line2D

    # the legend below the panels: inside one it would sit on the curves
    extra = [Line2D([], [], color="black", ls="-", lw=1.1, label="predicted crossover (colour of its path)")]
    if any(p.get("calibrated") for p in panels):
        extra.append(Line2D([], [], color="tab:purple", ls="--", lw=1.1, label="calibrated crossover"))
    if asymptotic is not None:
        extra.append(Line2D([], [], color="gray", ls=":", lw=1.1, label="by FLOPs, asymptotic"))
    if any(p["measured"] for p in panels):
        extra.append(Line2D([], [], ls="", marker="o", color="gray", mec="black", label="measured time"))
    if any(m["new"] is not None for p in panels for m in p["measured_crossovers"]):
        extra.append(Line2D([], [], color="black", ls="-.", lw=1.1, label="measured crossover"))
    fig.legend(handles=handles + extra, fontsize=7, loc="outside lower center", ncols=min(4, len(handles + extra)))
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(data["title"], fontsize=9)
    return fig, data
