"""The crossover chart: time of each path against new tokens, one panel per prefix, with the
crossover by roofline, by FLOPs and as measured."""

from __future__ import annotations

import math

import numpy as np

from mlactl.decide.analysis import Analysis
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
    expand, expand_chunked and absorb curves (a DSA model's sparse_absorb, masked_expand and
    dense_expand, with the edges of the windows where an expand path wins), measured path times,
    the predicted crossovers
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
    dsa = analysis.cfg.is_dsa
    choices = analysis.cost.choices
    expand_paths = ("masked_expand", "dense_expand") if dsa else ("expand", "expand_chunked")
    topk = analysis.cfg.index().topk if dsa else 0
    solved = {(r.batch, r.prefix): r for r in (analysis.crossover.windows if dsa else analysis.crossover.rows)}
    measured = measured_points(analysis, results)
    asymptotic = analysis.crossover.asymptotic_new
    panels = []

    def curve(a: Analysis, path: str, idx) -> list:
        """A path's times; None where it cannot run (DSA's dense_expand past top-k)."""
        return [t if ok else None for t, ok in zip(a.paths[path].time_s[idx].tolist(), a.runs[path][idx].tolist())]

    def predicted(row):
        if row is None:
            return {path: None for path in expand_paths}
        if dsa:  # the first new-token count of each window (its last is in the data)
            return {
                "masked_expand": None if row.masked_by_time is None else row.masked_by_time.first,
                "dense_expand": None if row.dense_by_time is None else row.dense_by_time.first,
            }
        return {"expand": row.by_time, "expand_chunked": row.by_time_chunked}

    for b, p in groups:
        idx = np.flatnonzero((analysis.batch == b) & (analysis.prefix == p))
        idx = idx[np.argsort(analysis.new[idx], kind="stable")]
        row = solved.get((b, p))
        panels.append(
            {
                "batch": b,
                "prefix": p,
                "new": analysis.new[idx].tolist(),
                "time_s": {path: curve(analysis, path, idx) for path in choices},
                "solved": row is not None,  # False when the analysis had too many prefixes to solve
                "predicted": predicted(row),
                "measured_crossovers": [
                    {"source": m["source"], "new": m["new"]}
                    for m in measured_crossover_rows(results, b)
                    if m["prefix"] == p
                ],
                "measured": [m for m in measured if (m["batch"], m["prefix"]) == (b, p) and m["path"] in choices],
            }
        )
        if dsa and row is not None:
            panels[-1]["windows"] = {
                "masked_expand": None
                if row.masked_by_time is None
                else [row.masked_by_time.first, row.masked_by_time.last],
                "dense_expand": None
                if row.dense_by_time is None
                else [row.dense_by_time.first, row.dense_by_time.last],
            }
        if calibrated is not None:  # same grid, calibrated time
            rows = calibrated.crossover.windows if dsa else calibrated.crossover.rows
            crow = {(r.batch, r.prefix): r for r in rows}.get((b, p))
            first = None
            if crow is not None:
                first = (None if crow.masked_by_time is None else crow.masked_by_time.first) if dsa else crow.by_time
            spans = calibrated.spans  # each time's 80% interval, and the weakest basis of its ops
            panels[-1]["calibrated"] = {
                "time_s": {path: curve(calibrated, path, idx) for path in choices},
                "crossover": first,
                "crossover_interval": None if crow is None or dsa else crow.by_time_interval,
                "name": calibrated.calibration.name,
                "interval_s": {
                    q: None if spans.paths[q] is None else [v[idx].tolist() for v in spans.paths[q]] for q in choices
                },  # fmt: skip
                "basis": {q: spans.path_basis[q][idx].tolist() for q in choices},
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
        for path in choices:
            ax.plot(
                panel["new"],
                np.asarray(panel["time_s"][path], dtype=np.float64) * 1e6,
                color=PATH_COLOURS[path],
                lw=1.6,
                ls="--" if path in ("expand_chunked", "dense_expand") else "-",
                label=path,
            )
        cal = panel.get("calibrated")
        if cal is not None:
            for path in choices:
                ax.plot(
                    panel["new"],
                    np.asarray(cal["time_s"][path], dtype=np.float64) * 1e6,
                    color=PATH_COLOURS[path],
                    lw=1.4,
                    ls=":",
                    label=f"{path} (calibrated)",
                )
                band, basis = cal["interval_s"][path], np.asarray(cal["basis"][path])
                timed = np.asarray(cal["time_s"][path], dtype=np.float64)  # NaN: the path cannot run there
                if band is not None:  # the 80% interval, and dots where an op was not measured
                    ax.fill_between(panel["new"], *(np.asarray(b) * 1e6 for b in band), color=PATH_COLOURS[path],
                                    alpha=0.12, lw=0, where=np.isfinite(timed))  # fmt: skip
                far = basis != "measured"
                ax.plot(np.asarray(panel["new"])[far], timed[far] * 1e6, ".", ms=3, color=PATH_COLOURS[path])
        for m in panel["measured"]:
            ax.plot(m["new"], m["median_s"] * 1e6, "o", color=PATH_COLOURS[m["path"]], mec="black", ms=6)
        # (new, text, colour, style): vertical lines, their values in the panel's title, never on a
        # curve: predicted 160, chunked 165, calibrated 133 (128-181), ...; a DSA model's windows:
        # both ends marked, "masked_expand 12-812" in the title
        markers = []
        windows = []
        for path in expand_paths:
            n = panel["predicted"][path]
            if n is not None and dsa:
                last = panel["windows"][path][1]
                markers += [(n, "", PATH_COLOURS[path], "-"), (last, "", PATH_COLOURS[path], "-")]
                windows.append(f"{path} {n}-{last}")
            elif n is not None:
                markers.append((n, f"{'predicted' if path == 'expand' else 'chunked'} {n}", PATH_COLOURS[path], "-"))
        if cal is not None and cal["crossover"] is not None:
            span = cal["crossover_interval"]
            if span is None:
                where = ""
            elif span[0] is None:  # nine draws of ten find none up to max_new
                where = " (80%: none in range)"
            else:
                where = f" ({span[0]}–{'?' if span[1] is None else span[1]})"
            markers.append((cal["crossover"], f"calibrated {cal['crossover']}{where}", "tab:purple", "--"))
        if asymptotic is not None:
            markers.append((asymptotic, f"by FLOPs {asymptotic:.1f}", "gray", ":"))
        for m in panel["measured_crossovers"]:
            if m["new"] is not None:
                markers.append((m["new"], f"measured {m['new']}", "black", "-."))
        for n, _, colour, style in markers:
            ax.axvline(n, color=colour, ls=style, lw=1.1)
        values = windows + [text for _, text, _, _ in markers if text]
        never = [path for path in expand_paths if panel["solved"] and panel["predicted"][path] is None]
        # a DSA model's dense MHA runs only where the whole context is at most top-k
        idle = [p for p in never if p == "dense_expand" and panel["prefix"] + 1 > topk]
        never = [p for p in never if p not in idle]
        if never:
            values.append(f"{' and '.join(never)} never faster up to {tokens(data['max_new'])}")
        if idle:
            values.append(f"dense_expand cannot run (context > top-k {tokens(topk)})")
        if any(m["new"] is None for m in panel["measured_crossovers"]):
            values.append("measured: expand never faster")
        heading = f"batch {panel['batch']}, prefix {tokens(panel['prefix'])}"
        if values:  # wrapped to the panel's width (about 70 characters at this size), between values
            lines = [f"{'wins' if dsa else 'crossover'} (new tokens):"]
            for i, value in enumerate(values):
                joined = f"{lines[-1]}{',' if i else ''} {value}"
                if len(joined) <= 70 or i == 0 and len(lines) == 1:
                    lines[-1] = joined
                else:
                    lines[-1] += ","
                    lines.append(value)
            heading += "\n" + "\n".join(lines)
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
    what = "window's ends" if dsa else "crossover"
    extra = [Line2D([], [], color="black", ls="-", lw=1.1, label=f"predicted {what} (colour of its path)")]
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
