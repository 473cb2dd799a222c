"""A replay (mlactl.decide.replay.replay.Replay) as tables for eyes, the `mlactl.replay` JSON
schema, and its CSV flattening (one row per engine and step). Nothing here computes a figure.

JSON, schema `mlactl.replay` version 1: raw SI units (seconds, tokens, bytes); a figure that is
not finite (a step where no path fits) is null.

    requests, tokens {prefill_computed, prefill_cached, decode}   the first engine's split
    trace {path, format, requests, first_arrival_s, duration_s}
    model, weights, hardware, kv_dtype, dtype, chunk, time, clock, forward {attention, rest,
    collectives, ops (with --forward-tables: each op's basis)} (each part's basis), settings
    (mem_fraction null: each engine's own), kv_cache_tokens (the first engine's pool)
    engines[]: name, engine, version, label, source, backend, decode_backend (SGLang), threshold,
               options, options_set, why (the rule as resolved, as analyze's JSON gives it),
               steps, duration_s, step_time_s, time_s,
               gpu_time_s (the whole forward: attention as priced, the rest on the clock),
               best_time_s, lost_s, lost_pct (of attention), lost_gpu_pct (of the GPU's time),
               best_step_time_s, lost_vs_step_s,
               best_request_time_s, lost_vs_request_s, calibrated: time_interval_s,
               best_time_interval_s, lost_interval_s, lost_vs_step_interval_s,
               lost_vs_request_interval_s (each [lo, hi], the 80% interval), best_threshold, sweep,
               tokens, paths,
               by_step_type[], timeline, latency_s, latency_best_path_s (the same steps, each
               step's attention on its best), cache, scheduler {max_batch_tokens, max_running,
               page, schedule_policy (SGLang), mem_fraction, kv_cache_tokens, why[]}
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
from rich.table import Table

from mlactl import __version__
from mlactl.decide.loss import Span
from mlactl.decide.replay.pricing import STEP_TYPES
from mlactl.decide.replay.replay import EngineReplay, Latency, Replay
from mlactl.output.csvout import Labels
from mlactl.output.csvout import write_csv as write
from mlactl.output.render import SHORT, engine_lines, seconds, seconds_span
from mlactl.util import safe

SCHEMA = "mlactl.replay"
SCHEMA_VERSION = 1


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole and math.isfinite(part) else "—"


def _time(t: float | None) -> str:
    """Seconds for a table: a trace's totals run to thousands of seconds, printed in full."""
    if t is None or not math.isfinite(t):
        return "no fit"
    if t == 0:
        return "—"
    return f"{t:,.0f}s" if abs(t) >= 100 else seconds(t)


def _share(x: float) -> str:
    """A saving as a percentage; one that rounds to 0.0% says how small it is."""
    pct = 100.0 * x
    return f"{pct:.1f}%" if pct >= 0.05 else f"{pct:.2g}%"


def time_kind(result: Replay) -> str:
    return "roofline" if result.calibration is None else "calibrated"


# -- tables ---------------------------------------------------------------------------------------


def header(result: Replay) -> str:
    cfg, hw, t, s = result.cost.cfg, result.hw, result.trace, result.settings
    w = result.weights.weights
    pools = {e.engine.label: e.scheduler.kv_tokens for e in result.engines if e.scheduler is not None}
    if len(set(pools.values())) > 1:
        kv = "KV pool " + ", ".join(f"{safe.markup(k)} {v:,}" for k, v in pools.items()) + " tokens"
    else:
        kv = f"KV pool {result.capacity_tokens:,} tokens"
    cache = "off" if not s.prefix_cache else "on"
    return (
        f"[bold]{safe.markup(cfg.name)}[/] (tp {cfg.tp}, {w.dtype} weights, "
        f"{result.weights.model_bytes / 1e9:.1f} GB a GPU) on [bold]{safe.markup(hw.display)}[/], "
        f"kv cache {result.cost.kv_dtype}; trace {safe.markup(t.path)}: {len(t):,} requests over "
        f"{t.duration_s:,.0f} s ({t.format}); {_steps(result)}; "
        f"{kv}, prefix cache {cache}; "
        f"{time_kind(result)} attention times, every layer; {_rest(result)}"
    )


def _rest(result: Replay) -> str:
    """Where the clock's forward outside attention comes from, in words."""
    if result.tables is None:
        return f"the rest of the forward at the roofline (collectives: {result.comm_basis})"
    roof = sorted(op for op, b in result.tables.basis.items() if b.startswith("roofline"))
    return f"the rest of the forward from {safe.markup(result.tables.source)}'s tables" + (
        f" ({', '.join(roof)} at the roofline; collectives: {result.comm_basis})" if roof else ""
    )


def _steps(result: Replay) -> str:
    """Each engine's chunk, request cap and page, once per distinct setting."""
    seen: dict[tuple, list[str]] = {}
    for e in result.engines:
        sh = e.scheduler
        if sh is not None:
            seen.setdefault((sh.max_batch_tokens, sh.max_running, sh.page), []).append(e.engine.name)
    return "; ".join(
        f"{', '.join(safe.markup(n) for n in names)}: steps of at most {c:,} new tokens and {r:,} requests, page {p}"
        for (c, r, p), names in seen.items()
    )


def summary_table(result: Replay) -> Table:
    t = Table(title="What each engine's path rule costs on this trace (attention, every layer; and the GPU's time)")
    cols = ("engine", "steps", "attention", "best", "lost", "lost % attn / GPU", "vs best step", "vs best request")
    for col in cols:
        t.add_column(col, justify="left" if col == "engine" else "right", no_wrap=True)
    for e in result.engines:
        t.add_row(
            e.engine.label,
            f"{e.steps:,}",
            _spanned(e.loss.time_s, e.loss.time_span),
            _spanned(e.loss.best_s, e.loss.best_span),
            _spanned(e.loss.lost_s, e.loss.lost_span),
            f"{e.loss.lost_pct:.1f}% / {e.lost_gpu_pct:.1f}%",
            _time(e.loss.lost_step_s),
            _time(e.loss.lost_request_s),
        )
    t.caption = (
        "best: per step the faster of one path for the whole step and each request on its own best path; "
        "losses are paired, on each engine's own steps; lost %: of the attention's time and of the GPU's "
        "(every step's whole forward, the serving table's GPU time)"
    )
    if any(e.drawn for e in result.engines):
        t.caption += "; calibrated: (80% interval; --format json has each loss's)"
    return t


def _spanned(point: float, span: Span | None) -> str:
    """A total's cell, with its 80% interval where calibrated: `468s (412–530s)`."""
    if span is None or not math.isfinite(point) or point == 0:
        return _time(point)
    lo, hi = span
    return f"{_time(point)} ({seconds_span(lo, hi)})"


def paths_table(result: Replay) -> Table:
    paths = [p for p in result.engines[0].paths] if result.engines else []
    t = Table(title="Paths: share of steps that run each, and of new tokens")
    t.add_column("engine", no_wrap=True)
    for p in paths:
        t.add_column(f"{SHORT.get(p, p)} steps", justify="right", no_wrap=True)
        t.add_column(f"{SHORT.get(p, p)} tokens", justify="right", no_wrap=True)
    for e in result.engines:
        cells = []
        for p in paths:
            cells += [f"{100 * e.paths[p].steps:.1f}%", f"{100 * e.paths[p].tokens:.1f}%"]
        t.add_row(e.engine.label, *cells)
    return t


def types_table(result: Replay) -> Table:
    t = Table(title="Where each engine loses, by step type")
    for col in ("engine", "step type", "steps", "attention", "lost", "of its loss", "tokens by path"):
        t.add_column(col, justify="left" if col in ("engine", "step type", "tokens by path") else "right")
    for e in result.engines:
        for row in sorted(e.by_type, key=lambda r: -r.lost_s):
            mix = ", ".join(f"{SHORT.get(p, p)} {100 * v:.0f}%" for p, v in row.paths.items() if v >= 0.005)
            t.add_row(
                e.engine.label,
                row.type,
                f"{row.steps:,}",
                _time(row.time_s),
                _time(row.lost_s),
                _pct(row.lost_s, e.loss.lost_s),
                mix,
            )
    return t


def serving_table(result: Replay) -> Table:
    t = Table(
        title=f"The simulated serving (the clock: {'roofline' if result.tables is None else 'measured and roofline'} "
        "step times of the whole forward, overhead; GPU time: "
        "the attention as priced and the rest of the forward; preempted: vLLM's preemptions, SGLang's retractions)"
    )
    for col in ("engine", "trace time", "GPU time", "busy", "cache hit", "preempted") + LATENCY_COLUMNS:
        t.add_column(col, justify="left" if col == "engine" else "right", no_wrap=True)
    for e in result.engines:
        t.add_row(
            e.engine.label,
            _time(e.end_s - e.start_s),
            _time(e.gpu_time_s),
            _pct(e.step_time_s, e.end_s - e.start_s),
            f"{100 * e.cache.hit_rate:.1f}%",
            f"{e.cache.preempted:,}",
            *_latency_cells(e.latency),
        )
    return t


LATENCY_COLUMNS = ("first token p50", "p99", "end to end p50", "p99", "TPOT p50", "p99", "output tok/s")


def _latency_cells(lat: Latency) -> list[str]:
    """The cells under LATENCY_COLUMNS: first token, end to end and TPOT (p50, p99), tokens a second."""
    ft, ee, tp = lat.first_token, lat.end_to_end, lat.per_output_token
    cells = [_time(v) if v is not None else "—" for v in (ft.p50, ft.p99, ee.p50, ee.p99, tp.p50, tp.p99)]
    rate = lat.output_tokens_per_s
    return cells + [f"{rate:,.0f}" if rate is not None else "—"]


def best_path_table(result: Replay) -> Table:
    t = Table(
        title="On the best path (the same steps, each step's attention on its best path, the rest of the "
        "forward unchanged; a step waits only for its requests' arrivals)"
    )
    for col in ("engine",) + LATENCY_COLUMNS:
        t.add_column(col, justify="left" if col == "engine" else "right", no_wrap=True)
    for e in result.engines:
        if e.latency_best is not None:
            t.add_row(e.engine.label, *_latency_cells(e.latency_best))
    return t


def sweep_sentence(result: Replay, e: EngineReplay) -> str:
    s = e.sweep
    if s is None:
        return f"{e.engine.name} on {e.engine.params.backend} reads no threshold: nothing to sweep"
    low, high = s.best_range
    span = f"{low} up" if high is None else f"{low} to {high}"
    if s.best_time_s >= s.current_time_s * (1 - 1e-12):
        verdict = f"already the best (any threshold from {span} does as well)"
    elif high == low:
        verdict = f"best threshold {s.best} (that value only), saves {_share(s.saves)}"
    else:
        verdict = f"best threshold {s.best} (any from {span}), saves {_share(s.saves)}"
    head = f"{e.engine.name}'s {s.option} ({s.compares})"
    return f"{head} {s.current} on {safe.markup(result.hw.name)} for this trace: {verdict}"


def tables(result: Replay) -> list:
    out: list = [header(result), summary_table(result), paths_table(result), types_table(result)]
    out += [sweep_sentence(result, e) for e in result.engines]
    first = result.engines[0] if result.engines else None
    if first is not None:
        tk = first.tokens
        out.append(
            f"tokens ({first.engine.label}): {tk.prefill_computed:,} prompt tokens computed, "
            f"{tk.prefill_cached:,} found cached, {tk.decode:,} decoded"
        )
    out.append(serving_table(result))
    out.append(best_path_table(result))
    out += engine_lines([e.engine for e in result.engines])
    out.append("Sources: " + "; ".join(sorted({e.engine.citation for e in result.engines})))
    if result.calibration is not None:
        out.append(
            f"times: calibrated with {result.calibration.name} ({result.calibration.path}); ops it lacks keep "
            "roofline time; the clock that orders the steps stays the roofline"
        )
        over = [e for e in result.engines if e.gpu_time_s > e.end_s - e.start_s > 0]
        if over:
            shown = ", ".join(
                f"{e.engine.label} {_time(e.gpu_time_s)} against {_time(e.end_s - e.start_s)}" for e in over
            )
            out.append(
                f"GPU time as priced passes the trace time ({shown}): the calibrated attention is slower than the "
                "roofline clock that served the trace, so its latencies and busy share are the roofline's"
            )
    return out


# -- JSON -----------------------------------------------------------------------------------------


# each total's interval key beside its point value's
INTERVAL_KEYS = {
    "time_span": "time_interval_s",
    "best_span": "best_time_interval_s",
    "lost_span": "lost_interval_s",
    "lost_step_span": "lost_vs_step_interval_s",
    "lost_request_span": "lost_vs_request_interval_s",
}


def _intervals(e: EngineReplay) -> dict:
    """Calibrated: each total's 80% interval ([lo, hi], null where not finite); roofline: none."""
    if not e.drawn:
        return {}
    spans = {name: getattr(e.loss, name) for name in INTERVAL_KEYS}
    return {key: None if spans[name] is None else list(spans[name]) for name, key in INTERVAL_KEYS.items()}


def engine_json(e: EngineReplay) -> dict:
    s = e.sweep
    return {
        **e.engine.to_json(),
        "steps": e.steps,
        "duration_s": e.end_s - e.start_s,
        "step_time_s": e.step_time_s,
        "gpu_time_s": e.gpu_time_s,
        "time_s": e.loss.time_s,
        "best_time_s": e.loss.best_s,
        "lost_s": e.loss.lost_s,
        "lost_pct": e.loss.lost_pct,
        "lost_gpu_pct": e.lost_gpu_pct,
        "best_step_time_s": _num(e.best_step_s),
        "lost_vs_step_s": e.loss.lost_step_s,
        "best_request_time_s": e.best_request_s,
        "lost_vs_request_s": e.loss.lost_request_s,
        **_intervals(e),
        "best_threshold": None if s is None else s.best,
        "sweep": None
        if s is None
        else {
            "option": s.option,
            "compares": s.compares,
            "current": s.current,
            "current_time_s": s.current_time_s,
            "best": s.best,
            "best_range": list(s.best_range),
            "best_time_s": s.best_time_s,
            "saves": s.saves,
            "curve": [{"threshold": t, "time_s": v} for t, v in s.curve],
        },
        "tokens": asdict(e.tokens),
        "paths": {p: asdict(share) for p, share in e.paths.items()},
        "by_step_type": [asdict(row) for row in e.by_type],
        "timeline": asdict(e.timeline),
        "latency_s": asdict(e.latency),
        "latency_best_path_s": None if e.latency_best is None else asdict(e.latency_best),
        "cache": asdict(e.cache),
        "scheduler": None if e.scheduler is None else e.scheduler.to_json(),
    }


def to_json(result: Replay) -> dict:
    t, s = result.trace, result.settings
    first = result.engines[0] if result.engines else None
    cfg = result.cost.cfg
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "mlactl_version": __version__,
        "requests": len(t),
        "tokens": None if first is None else asdict(first.tokens),
        "tokens_engine": None if first is None else first.engine.label,
        "trace": {
            "path": t.path,
            "format": t.format,
            "requests": len(t),
            "first_arrival_s": float(t.arrival[0] + t.origin_s),  # arrivals count from the first
            "duration_s": t.duration_s,
            "continued": t.continued,
        },
        "model": dict(cfg.to_dict(), softmax_scale=cfg.softmax_scale),
        "weights": dict(
            result.weights.weights.to_dict(),
            params=result.weights.total_params,
            bytes_per_gpu=result.weights.model_bytes,
        ),
        "hardware": result.hw.to_dict(),
        "kv_dtype": result.cost.kv_dtype,
        "dtype": result.cost.dtype,
        "chunk": result.cost.chunk,
        "time": time_kind(result),
        **({} if result.calibration is None else {"calibration": result.calibration.describe()}),
        "clock": "roofline" if result.tables is None else "roofline attention, measured tables for the rest",
        "forward": {
            "attention": time_kind(result),
            "rest": "roofline (calibrations hold the attention paths' ops only)"
            if result.tables is None
            else f"{result.tables.source} tables where they measured the op, else roofline",
            "collectives": result.comm_basis,
            **({} if result.tables is None else {"ops": dict(result.tables.basis)}),
        },
        "settings": {
            "max_batch_tokens": s.max_batch_tokens,
            "max_running": s.max_running,
            "mem_fraction": s.mem_fraction,
            "cache_tokens": s.cache_tokens,
            "prefix_cache": s.prefix_cache,
            "step_overhead_s": s.step_overhead_s,
            "block": s.block,
            **({} if s.forward_tables is None else {"forward_tables": s.forward_tables}),
        },
        "kv_cache_tokens": result.capacity_tokens,
        "engines": [engine_json(e) for e in result.engines],
    }


# -- CSV ------------------------------------------------------------------------------------------


def write_csv(fh, result: Replay) -> None:
    """One row per engine and step: when it started, its clock time, its type, rows and tokens,
    the attention under the rule and each reference, and the new tokens on each path."""
    if not result.engines:
        return
    if any(e.per_step is None for e in result.engines):
        raise ValueError("the per-step CSV needs replay(..., keep_steps=True)")
    paths = list(result.engines[0].paths)
    names, cols = ["engine", "step", "start_s", "step_time_s", "type", "rows", "tokens"], []
    names += ["attention_s", "best_step_s", "best_request_s", "best_s", "lost_s"]
    names += [f"{p}.tokens" for p in paths]
    engines = [e.engine.name for e in result.engines]  # names: labels can hold commas
    per = [e.per_step or {} for e in result.engines]
    n = [e.steps for e in result.engines]

    def cat(key):
        return np.concatenate([p[key] for p in per])

    cols = [
        Labels(np.repeat(np.arange(len(engines)), n), engines),
        np.concatenate([np.arange(k) for k in n]),
        cat("start_s"),
        cat("step_time_s"),
        Labels(cat("type").astype(np.int64), list(STEP_TYPES)),
        cat("rows"),
        cat("tokens"),
        cat("attention_s"),
        cat("best_step_s"),
        cat("best_request_s"),
        cat("best_s"),
        cat("attention_s") - cat("best_s"),
    ] + [cat(f"{p}_tokens") for p in paths]
    write(fh, names, cols)
