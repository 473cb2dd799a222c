"""Closing tables of `mlactl tune`: what was measured, against the roofline and the baselines."""

from __future__ import annotations

import math

from rich.table import Table

from mlactl.render import seconds


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


def kernels_table(entries: list[dict], meaningful: bool) -> Table:
    table = Table(
        title="Kernels: best config per bucket" + ("" if meaningful else " (interpreter: times not meaningful)")
    )
    for col in (
        "kernel",
        "bucket",
        "best config",
        "time",
        "TFLOP/s",
        "GB/s",
        "% roofline",
        "vs default",
        "vs twin",
        "tried (ok/failed/wrong)",
    ):
        table.add_column(col, justify="left" if col in ("kernel", "bucket", "best config") else "right")
    for e in entries:
        t = e.get("best_median_s")
        statuses = [c["status"] for c in e.get("configs", [])]
        counts = f"{statuses.count('ok')}/{statuses.count('failed')}/{statuses.count('wrong')}"
        if not t:
            table.add_row(e["kernel"], e["bucket"], "none passed", "—", "—", "—", "—", "—", "—", counts)
            continue
        frac = f"{100 * e['predicted_s'] / t:.0f}%" if e.get("predicted_s") else "—"
        table.add_row(
            e["kernel"],
            e["bucket"],
            _config_text(e.get("best")),
            seconds(t),
            f"{e['flops'] / t / 1e12:.3g}",
            f"{e['bytes'] / t / 1e9:.4g}",
            frac,
            _ratio(t, e.get("default_median_s")),
            _ratio(t, e.get("twin_median_s")),
            counts,
        )
    return table


def paths_table(rows: list[dict], meaningful: bool) -> Table:
    table = Table(
        title="Paths: measured crossover (new tokens from which expand beats absorb)"
        + ("" if meaningful else " (interpreter: not meaningful)")
    )
    for col in ("batch", "prefix", "measured", "predicted (roofline)", "predicted (FLOPs)", "new counts measured"):
        table.add_column(col, justify="right")

    def show(v):
        return "never" if v is None else str(v)

    for r in rows:
        table.add_row(
            str(r["batch"]),
            str(r["prefix"]),
            show(r["measured"]),
            show(r.get("predicted")) if "predicted" in r else "— (no profile)",
            show(r["predicted_by_flops"]),
            str(len(r.get("measured_new", []))),
        )
    return table


def ceilings_table(ceilings: dict, hw) -> Table:
    table = Table(title="Ceilings: measured against the datasheet")
    for col in ("", "measured", "nominal", "fraction"):
        table.add_column(col, justify="right")
    for dtype, value in sorted(ceilings.get("peak_tflops", {}).items()):
        nominal = hw.peak_tflops.get(dtype) if hw is not None else None
        table.add_row(
            f"matmul {dtype} TFLOP/s",
            f"{value:.4g}",
            f"{nominal:g}" if nominal else "—",
            f"{value / nominal:.0%}" if nominal else "—",
        )
    bw = ceilings.get("bandwidth_tbs")
    if bw is not None:
        nominal = hw.bandwidth_tbs if hw is not None else None
        table.add_row(
            "copy TB/s", f"{bw:.4g}", f"{nominal:g}" if nominal else "—", f"{bw / nominal:.0%}" if nominal else "—"
        )
    return table
