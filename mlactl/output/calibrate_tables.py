"""The table `mlactl calibrate` prints: each fit's op class, kernel, terms and error, fitted to
the terminal (mlactl.output.tables) without cutting an op name.

A fit's source reads FRAMEWORK-VERSION:KERNEL[:PHASE] (aiconfigurator) or a single word (tune
results, a CSV). The part all fits share goes in the title once and the phase gets its own short
column; the terms each fit kept, a list of up to a dozen names, are lines below the table, one a
fit, so no cell folds in mid-name at 100 columns and the table needs no more than 132 piped.
"""

from __future__ import annotations

import math

from mlactl.output.tables import Col, stamp, table
from mlactl.util import safe

PHASES = ("decode", "prefill")


def pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def signed(v) -> str:
    return "—" if v is None else f"{100 * v:+.1f}%"


def split_source(source: str) -> tuple[str, str, str]:
    """'sglang-0.5.14:flash_attention:decode' -> ('sglang-0.5.14', 'flash_attention', 'decode')."""
    parts = str(source).split(":")
    phase = parts.pop() if len(parts) > 1 and parts[-1] in PHASES else ""
    origin = parts.pop(0) if len(parts) > 1 else ""
    return origin, ":".join(parts), phase


def fits_table(name: str, hardware: str, fits, width: int | None):
    """Each fit's op class, kernel, phase, dtype, points, held-out (random folds and blocked
    split) and in-sample error, and the held-out share inside the 80% interval."""
    sources = [split_source(f.source) for f in fits]
    origins = {o for o, _, _ in sources}
    shared = origins.pop() if len(origins) == 1 and "" not in origins else ""
    cols = [
        Col("op", "left", typed=True),
        Col("kernel" if shared else "source", "left", typed=True),
        Col("phase", "left"),
        Col("dtype", "left", typed=True),
        Col("n", drop=4),
        Col("held-out"),
        Col("p90"),
        Col("blocked", drop=1),
        Col(" p90", drop=2),  # (repeated headers: rich needs none distinct, they are for our reading)
        Col("in 80%", drop=3),
        Col("in-sample", drop=5),
        Col("p90 ", drop=6),
    ]
    rows = []
    for f, (origin, kernel, phase) in zip(fits, sources):
        rows.append(
            [
                safe.markup(f.op),
                safe.markup(kernel if shared else ":".join(p for p in (origin, kernel) if p)),
                phase or "—",
                safe.markup(f.dtype),
                str(f.n),
                pct(f.held_out["median"]),
                pct(f.held_out["p90"]),
                pct((f.blocked or {}).get("median")),
                pct((f.blocked or {}).get("p90")),
                pct(((f.extra.get("interval") or {}).get("coverage") or {}).get("held_out")),
                pct(f.in_sample["median"]),
                pct(f.in_sample["p90"]),
            ]
        )
    where = f", {safe.markup(shared)}" if shared else ""
    title = (
        f"Calibration {safe.markup(name)} (hardware {safe.markup(hardware)}{where}): "
        "median and p90 of |predicted/measured - 1|, held out (5 random folds; blocked: fitted on context "
        "<= 8K or GEMM rows <= 1024, predicting above) and in-sample; in 80%: held-out measurements inside "
        "their 80% interval"
    )
    return table(title, cols, rows, width, elsewhere="a wider terminal or --format json")


def terms_lines(fits) -> list[str]:
    """`terms kept: absorb_attention (flash_attention, decode): fixed + split + kvpad`, one a fit."""
    out = []
    for f in fits:
        _, kernel, phase = split_source(f.source)
        what = ", ".join(safe.markup(x) for x in (kernel, phase, f.dtype) if x)
        out.append(f"terms kept: {safe.markup(f.op)} ({what}): {' + '.join(f.terms)}")
    return out


def score_table(title: str, scores, width: int | None):
    """A calibration's errors on measurements it never saw, per op class (mlactl calibrate score)."""
    cols = [
        Col("op", "left", typed=True),
        Col("source", "left", typed=True),
        Col("dtype", "left", typed=True),
        Col("n", drop=1),
        Col("median"),
        Col("p90"),
        Col("bias"),
        Col("in 80%"),
        Col("in range", drop=2),
    ]
    rows = [
        [
            safe.markup(s.op),
            safe.markup(s.source),
            safe.markup(s.dtype),
            str(s.n),
            pct(s.median),
            pct(s.p90),
            signed(s.bias),
            pct(s.coverage),
            "not covered" if s.fit is None else pct(s.measured),
        ]
        for s in scores
    ]
    title += (
        ": median and p90 of |predicted/measured - 1|; bias: median of predicted/measured - 1 (> 0: predicted "
        "slow); in 80%: measurements inside their 80% interval; in range: points inside the fit's measured range"
    )
    return table(title, cols, rows, width, elsewhere="a wider terminal or --format json")


def left_out_lines(source: dict) -> list[str]:
    """`left out: kv_expand (vllm-0.24.0:DeepGemmFp8BlockScaledMMKernel, fp8_block), 1,083 rows,
    the shortest 78.3µs: ...`, one a group of tables whose rows are not kernel times."""
    return [
        f"left out: {safe.markup(g['op'])} ({safe.markup(g['source'])}, {safe.markup(g['dtype'])}), "
        f"{g['rows']:,} rows, the shortest {g['shortest_s'] * 1e6:.1f}µs: {safe.markup(g['why'])}"
        for g in source.get("left_out") or []
    ]


def uncovered_lines(scores) -> list[str]:
    """`not covered: kv_expand (sglang_flashinfer_cutedsl_nvfp4, nvfp4): no nvfp4 fit of ...`, one a
    group the calibration has no fit of its op class and dtype for."""
    return [
        f"not covered: {safe.markup(s.op)} ({safe.markup(s.source)}, {safe.markup(s.dtype)}): {safe.markup(s.note)}"
        for s in scores
        if s.fit is None and s.note
    ]


def transfer_table(name: str, source: str, target: str, fits, width: int | None):
    """A transferred calibration's fits: op, kernel measured and kernel the target runs (`same`:
    the measured one), what the fit rests on (that kernel, or another's: its member without the
    dropped terms, or its own parameters less them), the terms dropped, what was adapted to the
    target (the sparse kernel's blocks and reads, a step at its FLOP rate) and the transfer error
    its interval was widened by."""
    cols = [
        Col("op", "left", typed=True),
        Col("phase", "left", drop=1),
        Col("dtype", "left", typed=True),
        Col("measured", "left", typed=True),
        Col("on target", "left"),
        Col("rests on", "left"),
        Col("dropped", "left", drop=2),
        Col("adapted", "left", drop=3),
        Col("transfer p90", drop=4),
        Col("factor", drop=5),
    ]
    rows = []
    for f in fits:
        t = f.get("transfer") or {}
        kernel = t.get("kernel") or {}
        same = kernel.get("measured") == kernel.get("target")
        q = ((f.get("interval") or {}).get("transfer") or {}).get("quantiles")
        p90 = None if not q else max(abs(q[2]), abs(q[-3]))  # the 5% and 95% levels: 90% of |log error|
        rows.append(
            [
                safe.markup(f["op"]),
                split_source(f.get("source", ""))[2] or "—",
                safe.markup(f.get("dtype", "")),
                safe.markup(kernel.get("measured", "")),
                "same" if same else safe.markup(kernel.get("target", "")),
                ("its kernel's fit" if same else "another kernel's fit")
                + {"member": ": a member", "terms dropped": ": terms dropped", "bf16 fit": ": the bf16 fit"}.get(
                    t.get("fallback") or "", ""
                ),
                safe.markup(", ".join(t.get("dropped") or [])) or "—",
                safe.markup("; ".join(t.get("adapted") or [])) or "—",
                "—" if p90 is None else f"{100 * (math.exp(p90) - 1):.0f}%",
                f"{t.get('factor', 1.0):.2f}",
            ]
        )
    title = (
        f"Calibration {safe.markup(name)}: fitted on {safe.markup(source)}, transferred to {safe.markup(target)}'s "
        "ceilings, SMs and L2; on target: the kernel the engine runs there; transfer p90: the 90th percentile of "
        "the transfer error its interval was widened to; factor: its median taken out of the times "
        "(leave-one-GPU-out model); adapted: what of the kernel is the target's"
    )
    return table(title, cols, rows, width, elsewhere="a wider terminal or --format json")


def stored_table(folder, entries, width: int | None):
    """The calibrations of a folder that can be used: the name --calibration takes, the GPU it is
    for, what it was fitted on, its fits and when it was made."""
    cols = [
        Col("name", "left", typed=True),
        Col("hardware", "left", typed=True),
        Col("made from", "left", fold=30),
        Col("fits", drop=2),
        Col("created", "left", drop=1),
    ]
    rows = [
        [
            safe.markup(e.name),
            safe.markup(e.calibration.hardware),
            safe.markup(e.calibration.made_from()),
            str(len(e.calibration.fits)),
            safe.markup(stamp(e.calibration.data.get("created"))),
        ]
        for e in entries
        if e.calibration is not None
    ]
    return table(f"Calibrations in {safe.markup(folder)} (use: --calibration NAME)", cols, rows, width)


def unusable_lines(entries) -> list[str]:
    """`cannot use NAME: why`, one a file of the folder that does not validate."""
    return [f"cannot use {safe.markup(e.name)}: {safe.markup(e.problem)}" for e in entries if e.problem is not None]
