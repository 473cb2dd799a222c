"""Closing tables of `mlactl tune`: what was measured, against the roofline and the baselines."""

from __future__ import annotations

import math

from rich.table import Table

from mlactl.output.render import seconds
from mlactl.output.tables import Col, stamp, table
from mlactl.tune import noise
from mlactl.util import safe


def _config_text(config) -> str:
    if config is None:
        return "—"
    short = {
        "BLOCK_H": "H",
        "BLOCK_N": "N",
        "BLOCK_M": "M",
        "num_warps": "w",
        "num_stages": "s",
        "num_splits": "splits",
    }
    return " ".join(f"{short.get(k, k)}{v}" for k, v in config.items()) or "default"


def _ratio(a, b) -> str:
    if not a or not b or math.isinf(a) or math.isinf(b):
        return "—"
    return f"{b / a:.2f}x"


def _roofline_share(e: dict, t: float) -> str:
    """Achieved share of the roofline; above 100% the ceilings are wrong (too low), marked '!'."""
    if not e.get("predicted_s"):
        return "—"
    share = e["predicted_s"] / t
    return f"{100 * share:.0f}%" + ("!" if share > 1 else "")


ABOVE_CEILING = "!: faster than the ceilings allow: they are too low (measure them again without --quick)"


def kernels_table(entries: list[dict], meaningful: bool, width: int | None = None, backend: str = "triton") -> Table:
    """One row per bucket. The torch backend has no launch configs (the twins run as they are):
    only its time and rates; the interpreter's times mean nothing: only configs and counts."""
    name, bucket = Col("kernel", "left", typed=True), Col("bucket", "left", typed=True)
    rates = [Col("time"), Col("TFLOP/s", drop=2), Col("GB/s", drop=3), Col("% roofline", drop=1)]
    counts_col = Col("ok/failed/wrong", drop=4)
    above = False
    rows = []
    if backend == "torch":
        title, cols = "Kernels: the plain-torch twins, one timing per bucket", [name, bucket, *rates]
    elif not meaningful:
        title = "Kernels: configs that ran under the interpreter (times not meaningful)"
        cols = [name, bucket, Col("best config", "left", fold=12), counts_col]
    else:
        title = "Kernels: best config per bucket"
        cols = [name, bucket, Col("best config", "left", fold=12), *rates]
        cols += [Col("vs default", drop=5), Col("vs twin", drop=6), counts_col]
    for e in entries:
        t = e.get("best_median_s")
        statuses = [c["status"] for c in e.get("configs", [])]
        counts = f"{statuses.count('ok')}/{statuses.count('failed')}/{statuses.count('wrong')}"
        # no config tried at all (the budget ran out first) is not "none passed" (all failed)
        missing = "none passed" if statuses else "none tried (budget)"
        if backend == "torch":
            row = [e["kernel"], e["bucket"]]
        elif not meaningful:
            rows.append([e["kernel"], e["bucket"], _config_text(e.get("best")) if t else missing, counts])
            continue
        else:
            row = [e["kernel"], e["bucket"], _config_text(e.get("best")) if t else missing]
        if t:
            share = _roofline_share(e, t)
            above = above or share.endswith("!")
            row += [seconds(t), f"{e['flops'] / t / 1e12:.3g}", f"{e['bytes'] / t / 1e9:.4g}", share]
        else:
            row += ["—"] * 4
        if backend != "torch":
            row += (
                [_ratio(t, e.get("default_median_s")), _ratio(t, e.get("twin_median_s")), counts]
                if t
                else [
                    "—",
                    "—",
                    counts,
                ]
            )
        rows.append(row)
    return table(
        title,
        cols,
        rows,
        width,
        caption=ABOVE_CEILING if above else None,
        elsewhere="a wider terminal or the results file",
    )


def paths_caption(rows: list[dict]) -> str | None:
    """What the measured column's forms mean, each explained once it is in the table, on the
    table's own values (a legend of `158 (140–175)` under a table without it explained nothing)."""
    notes = []
    fitted = next((r for r in rows if r.get("measured") is not None and r.get("estimator") == "local_root"), None)
    if fitted is not None:
        notes.append(
            f"{crossover_text(fitted)}: the root of a local fit of log(expand/absorb)"
            + (", and its 80% bootstrap interval" if fitted.get("measured_interval") else " (one timing a count)")
        )
    bracket = next(
        (r for r in rows if r.get("measured") is not None and r.get("estimator") != "local_root"), None
    )  # fmt: skip
    if bracket is not None:
        low, high = bracket.get("measured_low"), bracket.get("measured_high")
        noise_part = f"; noise leaves it anywhere above {low} and up to {high}" if low is not None and high else ""
        notes.append(
            f"{crossover_text(bracket)}: expand wins from {bracket['measured']} new tokens at every count measured"
            + noise_part
        )
    texts = [crossover_text(r) for r in rows]
    if any(t.endswith("↓") for t in texts):
        notes.append("↓: below the crossover of a shorter prefix (noise, or too few counts)")
    if any(t.startswith("never") for t in texts):
        notes.append("never ≤N: expand won at none of the counts measured, up to N")
    if "cut (budget)" in texts:
        notes.append("cut (budget): the time budget stopped the sweep first; the measured policy does not use it")
    return ". ".join(notes) + "." if notes else None


def paths_table(rows: list[dict], meaningful: bool, width: int | None = None) -> Table:
    cols = [
        Col("batch"),
        Col("prefix"),
        Col("measured (bracket)", "left"),
        Col("predicted (roofline)", drop=2),
        Col("predicted (FLOPs)", drop=1),
        Col("counts", drop=3),
    ]

    def show(v):
        return "never" if v is None else str(v)

    body = [
        [
            str(r["batch"]),
            str(r["prefix"]),
            crossover_text(r),
            show(r.get("predicted")) if "predicted" in r else "— (no profile)",
            show(r["predicted_by_flops"]),
            str(len(r.get("measured_new", []))),
        ]
        for r in rows
    ]
    title = "Paths: measured crossover (new tokens from which expand beats absorb)" + (
        "" if meaningful else " (interpreter: not meaningful)"
    )
    return table(
        title, cols, body, width, caption=paths_caption(rows), elsewhere="a wider terminal or the results file"
    )


def ceilings_table(ceilings: dict, hw, width: int | None = None) -> Table:
    """Measured ceilings beside the profile's: the datasheet's, or (a profile that already holds a
    measurement, as a CPU's does) the previous run's."""
    previous = hw is not None and getattr(hw, "using_measured", False)
    other = "previous run" if previous else "datasheet"
    cols = [Col("", "left"), Col("measured"), Col(other), Col("fraction")]
    rows = []
    for dtype, value in sorted(ceilings.get("peak_tflops", {}).items()):
        nominal = hw.peak_tflops.get(dtype) if hw is not None else None
        rows.append(
            [
                f"matmul {dtype} TFLOP/s",
                f"{value:.4g}",
                f"{nominal:g}" if nominal else "—",
                f"{value / nominal:.0%}" if nominal else "—",
            ]
        )
    bw = ceilings.get("bandwidth_tbs")
    if bw is not None:
        nominal = hw.bandwidth_tbs if hw is not None else None
        rows.append(
            ["copy TB/s", f"{bw:.4g}", f"{nominal:g}" if nominal else "—", f"{bw / nominal:.0%}" if nominal else "—"]
        )
    return table(f"Ceilings: measured against the {other}", cols, rows, width)


def crossover_text(row: dict) -> str:
    """The measured crossover as a table shows it: '64 (32-128)', 'never ≤256', 'cut (budget)'."""
    value, status = row.get("measured"), row.get("measured_status")
    if value is None:
        if status == noise.BUDGET:
            return "cut (budget)"
        largest = max(row.get("measured_new") or [0])
        return f"never ≤{largest}" if largest else "never"
    low, high = row.get("measured_low"), row.get("measured_high")
    text = str(value)
    if row.get("estimator") == "local_root":
        interval = row.get("measured_interval")
        text += " (no repeats)" if interval is None else f" ({interval[0]}–{interval[1]})"
    elif "measured_low" in row or "measured_high" in row:
        text += f" ({'?' if low is None else low}–{'?' if high is None else high})"
    if row.get("nonmonotone"):
        text += " ↓"
    return text


def compile_table(results: list[dict], width: int | None = None):
    """A rich table of compile results, one row per config, fitted to `width` (None: full values):
    the kernel and bucket are never cut, the config and warnings fold. `out` is the dtype the
    kernel writes and its split count as launched; `mma x` is issued_mma_over_needed."""
    cols = [Col("kernel", "left", typed=True), Col("shape", "left", typed=True), Col("config", "left", fold=24)]
    cols += [Col("arch", "left"), Col("out", "left"), Col("smem KiB"), Col("regs"), Col("spill B"), Col("stack B")]
    cols += [Col("mma/loop", drop=1), Col("mma x", drop=2), Col("warnings", "left", fold=20)]
    rows = []
    for r in results:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        config = " ".join(f"{k}={v}" for k, v in r["config"].items())
        if r.get("variant"):
            config += f" [{r['variant']}]"
        config = safe.markup(config)  # "[split]" is a variant's name, not a rich style
        out = r.get("out_dtype") or "-"
        if r.get("num_splits"):
            out += f" x{r['num_splits']}"
        if r.get("error"):
            error = f"[red]{safe.markup(r['error'], 400)}[/]"
            rows.append([r["kernel"], shape, config, r["arch"], out, "-", "-", "-", "-", "-", "-", error])
            continue
        loop = r["wgmma_per_loop"] or r["mma_per_loop"]
        ratio = r.get("issued_mma_over_needed")
        spill = str(r["spill_bytes"]) if not r["spill_bytes"] else f"[red]{r['spill_bytes']}[/]"
        dropped = "[red]" + safe.markup(r["dropped"], 400) + "[/]" if r.get("dropped") else ""
        warn = safe.markup("; ".join(r["warnings"]), 400) or dropped
        rows.append([
            r["kernel"], shape, config, r["arch"], out, f"{r['smem_bytes'] / 1024:.1f}", str(r["registers"]), spill,
            str(r["stack_bytes"]), str(loop), "-" if ratio is None else f"{ratio:.2f}", warn,
        ])  # fmt: skip
    title = (
        "compile report (no GPU: Triton + ptxas for the target; mma/loop: wgmma, else mma.sync; "
        "mma x: tensor-core work issued / needed)"
    )
    return table(title, cols, rows, width, elsewhere="-f json")


def runs_table(folder, found, width: int | None = None) -> Table:
    """The results files `mlactl tune` left: when, on what device and profile, with which backend,
    model and dtypes, and how much of each section (kernel buckets, path points, measured
    crossovers of those swept, ceilings)."""
    cols = [
        Col("file", "left", typed=True),
        Col("created", "left", drop=3),
        Col("device", "left", fold=20),
        Col("hardware", "left", typed=True, drop=2),
        Col("backend", "left", drop=4),
        Col("model", "left", typed=True),
        Col("kv / dtype", "left", drop=5),
        Col("kernels", drop=1),
        Col("paths", drop=1),
        Col("crossovers"),
        Col("ceilings", drop=6),
    ]
    rows = []
    for r in found:
        if r.data is None:  # listed below the table (unreadable_lines)
            continue
        s = r.summary()
        model = f"{s['model']}" + (f" tp{s['tp']}" if s["tp"] != 1 else "")
        rows.append(
            [
                safe.markup(_relative(r.path, folder)),
                safe.markup(stamp(s["created"])),
                safe.markup(str(s["device"] or "—")),
                safe.markup(str(s["hardware"] or "—")),
                safe.markup(str(s["backend"] or "—")),
                safe.markup(model),
                safe.markup(f"{s['kv_dtype']} / {s['dtype']}"),
                str(s["kernels"]),
                str(s["paths"]),
                f"{s['crossovers_measured']} of {s['crossovers']}" if s["crossovers"] else "0",
                "yes" if s["ceilings"] else "",
            ]
        )
    title = (
        f"Results in {safe.markup(folder)}, newest first (kernels: shape buckets tuned; paths: points timed; "
        "crossovers: measured of those swept)"
    )
    return table(title, cols, rows, width)


def _relative(path, folder) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


def unreadable_lines(found) -> list[str]:
    """`cannot read PATH: why`, one a results file that fails the schema."""
    return [f"cannot read {safe.markup(r.path)}: {safe.markup(r.problem)}" for r in found if r.data is None]
