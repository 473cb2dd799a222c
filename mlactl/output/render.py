"""Rich tables for eyes. Nothing here computes a figure: it only formats what analysis made."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from mlactl.decide.analysis import Analysis, BatchAnalysis, Crossover, Window
from mlactl.decide.engines import arch_of
from mlactl.output.tables import KEY, Col, Column, fit, table
from mlactl.util import safe

SHORT = {
    "expand": "expand",
    "expand_chunked": "chunked",
    "absorb": "absorb",
    "mha": "mha",
    "sparse_absorb": "sparse",
    "masked_expand": "masked",
    "dense_expand": "dense",
}


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """1.23e12 -> '1.23 T' + unit (decimal prefixes)."""
    x = float(x)
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.{digits}g} {prefix}{unit}"
    return f"{x:.{digits}g} {unit}".rstrip()


def seconds(t: float) -> str:
    t = float(t)
    if t >= 1000:  # 26,219s, not 2.62e+04s
        return f"{t:,.0f}s"
    if t >= 1:
        return f"{t:.3g}s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g}ms"
    if t >= 1e-6 or t == 0:
        return f"{t * 1e6:.3g}µs"
    return f"{t * 1e9:.3g}ns"


def header(analysis: Analysis) -> str:
    """The settings (settings_line), then the model's dimensions and the GPU's ceilings."""
    cfg, hw, cost = analysis.cfg, analysis.hw, analysis.cost
    index = f" topk={cfg.topk} Hi={cfg.index_heads} di={cfg.index_dim}" if cfg.index_dims() else ""
    return (
        settings_line(cfg, hw, cost.kv_dtype, cost.dtype, analysis.layers) + "\n"
        f"H={cfg.H} a GPU r={cfg.r} dC={cfg.dC} dR={cfg.dR} dV={cfg.dV}{index}; "
        f"{hw.peak_tflops[cost.dtype]:g} TFLOP/s {cost.dtype}, "
        f"{hw.bandwidth_tbs:g} TB/s, ridge {hw.ridge(cost.dtype):.1f} FLOP/byte"
    )


def engine_lines(engines) -> list[str]:
    """Why each engine rule runs what it runs: the resolved backend first, then what it does."""
    out = []
    for e in engines:
        out.append(f"[bold]{e.label}[/]: " + "; ".join(e.why).replace("[", "\\["))
    return out


def _time_cell(time_s: float, compute_bound: bool, best: bool, fits: bool = True, runs: bool = True) -> Text:
    if not runs:  # a DSA model's dense_expand past topk tokens: the path does not exist there
        return Text("n/a", style="dim")
    if not fits:  # its expanded K/V alone would overflow the GPU's memory
        return Text(f"{seconds(time_s)} ✗", style="dim")
    text = Text(f"{seconds(time_s)} {'C' if compute_bound else 'M'}")
    if best:
        text.stylize("bold green")
    return text


MARKS = {"extrapolated": "†", "roofline": "‡"}
SPAN_LEGEND = (
    "calibrated: (80% interval); † an op's time extrapolated beyond the shapes measured, "
    "‡ an op at roofline (nothing measured for it); --format json gives each op's basis"
)


def seconds_span(lo: float, hi: float) -> str:
    """`1.70–2.20ms`: an interval in the unit of its top."""
    unit, scale = next(((u, f) for u, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)) if hi >= f), ("ns", 1e-9))
    if unit == "s" and hi >= 1000:
        return f"{lo:,.0f}–{hi:,.0f}s"
    return f"{lo / scale:.3g}–{hi / scale:.3g}{unit}"


def _with_span(cell: Text, spans, path: str, i: int) -> Text:
    """A calibrated time cell with its interval and the mark of its weakest op basis."""
    span = spans.paths[path]
    if span is not None:
        cell.append(f" ({seconds_span(span[0][i], span[1][i])})")
    cell.append(MARKS.get(str(spans.path_basis[path][i]), ""))
    return cell


def _engine_cell(path: str, lost: float) -> Text:
    """An engine's path and what it loses: `absorb`, `chunked +1.73ms`, `expand ✗` (does not fit)."""
    if lost == float("inf"):
        return Text(f"{SHORT[path]} ✗", style="red")
    text = Text(SHORT[path])
    if lost > 0:
        text.append(f" +{seconds(lost)}", style="red")
    return text


def analysis_table(analysis: Analysis, max_rows: int = 200, width: int | None = None, drop: bool = False):
    """The per-point table, as one or more tables (a rich Group) that fit `width` without cutting
    a value: with `drop` (a terminal), `by FLOPs` and `mha*` may be left out; what still does
    not fit is stacked into a second table that repeats batch, new and prefix."""

    shown = range(min(len(analysis), max_rows))
    kind = "Roofline" if getattr(analysis, "calibration", None) is None else "Calibrated"
    paths = analysis.paths
    columns = [
        Column(c, [str(getattr(analysis, c)[i]) for i in shown], priority=KEY) for c in ("batch", "new", "prefix")
    ]
    for p in analysis.cost.paths:
        cells = [
            _time_cell(
                paths[p].time_s[i],
                paths[p].compute_bound[i],
                p == analysis.best[i],
                analysis.fits_memory[p][i],
                analysis.runs[p][i],
            )
            for i in shown
        ]
        if analysis.spans is not None:  # a path that does not run at a point has no interval there
            cells = [_with_span(c, analysis.spans, p, i) if analysis.runs[p][i] else c for c, i in zip(cells, shown)]
        columns.append(Column(SHORT[p] + ("*" if p == "mha" else ""), cells, priority=2 if p == "mha" else 0))
    fits = analysis.best_fits
    best = [SHORT[analysis.best[i]] + ("" if fits is None or fits[i] else " ✗") for i in shown]
    columns.append(Column("best", best, justify="left"))
    columns.append(Column("by FLOPs", [SHORT[analysis.best_by_flops[i]] for i in shown], justify="left", priority=1))
    for e in analysis.engines:
        path, lost = analysis.engine_paths[e.engine], analysis.engine_time_lost[e.engine]
        columns.append(Column(e.engine, [_engine_cell(path[i], lost[i]) for i in shown], justify="left"))
    if analysis.policy is not None and analysis.policy not in analysis.engine_paths:
        cells = [_engine_cell(analysis.policy_path[i], analysis.policy_time_lost[i]) for i in shown]
        columns.append(Column(analysis.policy, cells, justify="left"))
    if analysis.forward is not None:  # --scope model: the whole forward, and attention's share of it
        f = analysis.forward
        cells = [f"{seconds(f.time_s[i])} ({f.attention_s[i] / f.time_s[i]:.0%} attn)" for i in shown]
        columns.append(Column("forward", cells))
    caption = ""
    if len(analysis) > max_rows:
        caption = f"first {max_rows} of {len(analysis)} rows; use --format csv or json for all"
    if analysis.spans is not None:
        caption = "\n".join(filter(None, [SPAN_LEGEND, caption]))
    fitted = fit(
        columns,
        width,
        drop=drop,
        title=f"{kind} time per path (C compute-bound, M memory-bound, ✗ expanded K/V exceeds the "
        "GPU's memory; best in green; "
        + (
            "n/a: dense MHA runs only where the context is at most top-k)"
            if analysis.cost.restricted
            else "mha* is the reference with an expanded cache). Engines: their path, + the time it loses "
            "against the best path that fits"
        ),
        caption=caption,
    )
    return Group(*fitted.tables)


def ops_table(analysis: Analysis, max_rows: int = 200) -> Table:
    table = Table(title="Ops per path")
    for col, justify in (
        ("batch", "right"),
        ("new", "right"),
        ("prefix", "right"),
        ("path", "left"),
        ("op", "left"),
        ("FLOPs", "right"),
        ("bytes", "right"),
        ("FLOP/byte", "right"),
        ("time", "right"),
        ("bound", "left"),
    ):
        table.add_column(col, justify=justify)
    shown = min(len(analysis), max_rows)
    for i in range(shown):
        for p in analysis.cost.choices:
            pt = analysis.paths[p]
            for op in pt.ops:
                ai = op.flops[i] / op.bytes[i] if op.bytes[i] else float("nan")
                table.add_row(
                    str(analysis.batch[i]),
                    str(analysis.new[i]),
                    str(analysis.prefix[i]),
                    SHORT[p],
                    op.name,
                    si(op.flops[i]),
                    si(op.bytes[i], "B"),
                    f"{ai:.1f}",
                    seconds(op.time_s[i]),
                    "compute" if op.compute_bound[i] else "memory",
                )
        if i + 1 < shown:
            table.add_section()
    return table


def _window_cell(w: Window | None, limit: int, interval=None, calibrated: bool = False) -> str:
    """`146–11847`; calibrated, each end with its 80% interval: `146 (140–152)–11847 (11200–12500)`,
    or `(none in over 10% of draws)` where the draws too often find no window."""
    if w is None:
        return "none"
    if calibrated and interval is None:
        return _window_cell(w, limit) + " (none in over 10% of draws)"

    def end(value: int, span) -> str:
        return str(value) if span is None else f"{value} ({span[0]}–{span[1]})"

    first, last = (None, None) if interval is None else interval
    span = f"{end(w.first, first)}–{end(w.last, last)}" if w.last < limit else f"{end(w.first, first)}–(> {limit})"
    gaps = w.last - w.first + 1 - w.count
    return span + (f" ({gaps} gaps)" if gaps else "")


def window_table(crossover: Crossover) -> Table:
    """A DSA model's crossovers: the new-token counts where masked (or dense) MHA beats sparse
    absorb, per (batch, prefix)."""
    kind = crossover.time_kind
    table = Table(
        title="Windows: new tokens where an expand path beats sparse absorb (masked MHA: any context; "
        "dense MHA: context <= top-k)"
    )
    for col in ("batch", "prefix", "masked, by FLOPs", f"masked, by {kind}", f"dense, by {kind}"):
        table.add_column(col, justify="right")
    for r in crossover.windows:
        table.add_row(
            str(r.batch),
            str(r.prefix),
            _window_cell(r.masked_by_flops, crossover.max_new),
            _window_cell(r.masked_by_time, crossover.max_new, r.masked_interval, kind == "calibrated"),
            _window_cell(r.dense_by_time, crossover.max_new, r.dense_interval, kind == "calibrated"),
        )
    lines = [crossover.note] if crossover.note else []
    if kind == "calibrated":
        lines.append("calibrated: each end with its 80% interval")
    if lines:
        table.caption = "\n".join(lines)
        table.caption_justify = "left"
    return table


def crossover_cell(value: int | None, interval, max_new: int, mark: str = "") -> str:
    """`133`, or calibrated `133 (128–181)`: the 80% interval; `(≥ 128)` when its top lies past
    max_new, `(none up to 4096)` when both ends do; `mark` flags a crossover whose deciding ops
    were not all measured."""
    text = f"> {max_new}" if value is None else str(value)
    if interval is not None:
        lo, hi = interval
        if lo is None:
            text += f" (none up to {max_new})"
        else:
            text += f" (≥ {lo})" if hi is None else f" ({lo}–{hi})"
    return text + mark


BASIS_MARK = "†"


def crossover_table(crossover: Crossover) -> Table:
    if crossover.windows:
        return window_table(crossover)
    asym = "none" if crossover.asymptotic_new is None else f"{crossover.asymptotic_new:.1f}"
    table = Table(title=f"Crossover: new tokens from which expand beats absorb (asymptotic, by FLOPs: {asym})")
    kind = crossover.time_kind
    for col in ("batch", "prefix", "by FLOPs", f"by {kind}", f"chunked, by {kind}"):
        table.add_column(col, justify="right")
    limit = f"> {crossover.max_new}"
    for r in crossover.rows:
        mark = BASIS_MARK if r.note else ""
        table.add_row(
            str(r.batch),
            str(r.prefix),
            limit if r.by_flops is None else str(r.by_flops),
            crossover_cell(r.by_time, r.by_time_interval, crossover.max_new, mark),
            crossover_cell(r.by_time_chunked, r.by_time_chunked_interval, crossover.max_new),
        )
    lines = [crossover.note] if crossover.note else []
    if kind == "calibrated":
        lines.append("calibrated: (80% interval)")
    lines += [f"{BASIS_MARK} {r.note}" for r in crossover.rows if r.note]
    if lines:
        table.caption = "\n".join(lines)
        table.caption_justify = "left"
    return table


def batch_tables(ba: BatchAnalysis, max_rows: int = 200) -> list:
    per = ba.assignments["per_request"]
    names = [e.engine for e in ba.engines]
    choices = ba.cost.choices
    rows = Table(title="Requests (own time leaves out the weights the batch shares)")
    for col in ("row", "count", "new", "prefix", *(SHORT[p] for p in choices), "per request", *names):
        rows.add_column(col, justify="right" if col not in ("per request", *names) else "left", no_wrap=True)
    for i in range(min(len(ba.new), max_rows)):
        rows.add_row(
            str(i + 1),
            str(ba.count[i]),
            str(ba.new[i]),
            str(ba.prefix[i]),
            *(_own(ba, p, i) for p in choices),
            SHORT[per[i]],
            *(SHORT[ba.assignments[e][i]] for e in names),
        )
    if len(ba.new) > max_rows:
        rows.caption = f"first {max_rows} of {len(ba.new)} rows"
    totals = Table(title="Batch total by strategy, and by each engine's rule")
    totals.add_column("strategy", no_wrap=True)
    totals.add_column("time", justify="right")
    totals.add_column("vs best", justify="right")
    best = ba.best_strategy
    for s, t in ba.totals.items():
        if t == float("inf"):  # a path some request cannot run (DSA's dense MHA past top-k)
            totals.add_row(Text(s, style="dim"), "n/a", "—")
            continue
        ratio = t / ba.totals[best] if ba.totals[best] else 1.0
        style = "bold green" if s == best else ""
        label = next((e.label for e in ba.engines if e.engine == s), s)
        span = ba.intervals.get(s) if ba.intervals else None
        shown = seconds(t) if span is None else f"{seconds(t)} ({seconds_span(*span)})"
        totals.add_row(Text(label, style=style), shown, f"{ratio:.2f}x")
    sources = "Engine rules: " + "; ".join(sorted({e.citation for e in ba.engines})) if ba.engines else ""
    return [rows, totals, *engine_lines(ba.engines), sources]


def _own(ba: BatchAnalysis, path: str, i: int) -> str:
    """A request's own time on a path, or n/a where the path cannot run for it."""
    if not ba.cost.applicable(path, ba.count[i], ba.new[i], ba.prefix[i]):
        return "n/a"
    return seconds(ba.own_time[path][i])


def models_table(models, width: int | None = None) -> Table:

    cols = (
        [Col("name", "left", typed=True)]
        + [
            Col(c, drop={"hidden": 2, "layers": 1}.get(c, 0))
            for c in ("hidden", "H", "q_lora_rank", "r", "dC", "dR", "dV", "layers")
        ]
        + [Col("DSA topk/Hi/di", drop=1)]
    )
    rows = [
        [
            name,
            *(str(v) for v in (cfg.hidden, cfg.H, cfg.q_lora_rank or "—", cfg.r, cfg.dC, cfg.dR, cfg.dV, cfg.layers)),
            cfg.index_dims() or "—",
        ]
        for name, cfg in models
    ]
    aliases = [f"{name} = {cfg.name}" for name, cfg in models if name != cfg.name]
    caption = f"aliases: {', '.join(aliases)}" if aliases else None
    return table("Models (presets; or --model path/to/config.json)", cols, rows, width, caption=caption)


def hardware_table(profiles, width: int | None = None) -> Table:

    cols = [
        Col("name", "left", typed=True),
        Col("device", "left", drop=1, fold=21),  # "NVIDIA H800 SXM5 80GB" on one line
        Col("bf16 TFLOP/s"),
        Col("fp8 TFLOP/s"),
        Col("TB/s"),
        Col("GB"),
        Col("SMs", drop=2),
        Col("arch", "left", drop=2),
        Col("measured", drop=3),
    ]
    rows = [
        [
            safe.markup(hw.name),
            safe.markup(hw.display),
            f"{hw.peak_tflops.get('bf16', float('nan')):g}",
            f"{hw.peak_tflops['fp8']:g}" if "fp8" in hw.peak_tflops else "—",
            f"{hw.bandwidth_tbs:g}",
            f"{hw.memory_gb:g}",
            str(hw.sm_count or "—"),
            arch_of(hw) or "—",  # the architecture the engines' rules resolve for
            "yes" if hw.measured else "",
        ]
        for hw in profiles
    ]
    return table("Hardware (profiles; or --hardware path/to/profile.toml)", cols, rows, width)


def settings_line(cfg, hw, kv_dtype: str, dtype: str, layers: int | str | None = None) -> str:
    """The first line of a command's tables: the settings they were made under, defaults
    included (analyze, crossover, batch and engines default to h800, TP 1 and one layer; replay to
    h200, TP 8 and every layer: a table says which it is)."""
    if isinstance(layers, str):  # "one layer's figures", "every layer"
        layer = f", {layers}"
    else:
        layer = "" if layers is None else f", {layers} layer{'' if layers == 1 else 's'}"
    return (
        f"[bold]{safe.markup(cfg.name)}[/] at TP {cfg.tp}{layer}, on [bold]{safe.markup(hw.display)}[/] "
        f"({safe.markup(hw.name)}, {'measured' if hw.using_measured else 'nominal'} ceilings); "
        f"kv cache {kv_dtype}, {dtype} compute"
    )


def crossover_lines(cost, hw, cal) -> list[str]:
    """The lines above `mlactl crossover`'s table: the settings; the calibration used."""
    head = settings_line(cost.cfg, hw, cost.kv_dtype, cost.dtype, "per layer")
    return [head] if cal is None else [head, calibration_line(cal)]


def calibration_line(cal) -> str:
    """The line under a table whose times are calibrated (rich markup, names escaped)."""
    return f"times: calibrated with {safe.markup(cal.name)} ({safe.markup(cal.path)}); ops it lacks keep roofline time"
