"""`mlactl replay` as a library call: a request trace through each engine's scheduler and prefix
cache, and what each engine's path rule costs on those steps.

    result = replay(trace, cfg, weights, hw, engines, settings)

For each engine: its scheduler forms the steps once (scheduler.py), the clock priced by the
engine's own rule (clock.py); then every step is priced again, exactly, under the rule, the best
path per step, the best path per request and the rule at every threshold that changes a path
(pricing.py). Losses are paired: every comparison is on the same steps. Calibrated, each
engine's totals then get their 80% intervals, the steps drawn again draw by draw (intervals.py).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlactl.decide.calibration import forward_tables
from mlactl.decide.engines import steps as rules
from mlactl.decide.loss import RuleLoss, lost_against
from mlactl.decide.replay.cache import TokenPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.intervals import Drawer, sample_size, step_weights
from mlactl.decide.replay.pricing import STEP_TYPES, Pricer, blocks, rows_of, step_types
from mlactl.decide.replay.scheduler import Schedule, scheduler_for
from mlactl.decide.replay.shipped import Shipped, shipped
from mlactl.decide.replay.traces import Trace
from mlactl.decide.sweep import Sweep, pick, tied
from mlactl.decide.workload import engine_cost
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel, ForwardCost, WeightCost
from mlactl.model.hardware import HardwareProfile
from mlactl.model.weights import ModelWeights
from mlactl.util import safe
from mlactl.util.defaults import (
    DEFAULT_CHUNK,
    REPLAY_BLOCK,
    REPLAY_TIMELINE_BINS,
)
from mlactl.util.errors import MlactlError, warn
from mlactl.util.limits import check_replay

CURVE_POINTS = 200  # thresholds of the sweep's curve kept for JSON and the chart


@dataclass(frozen=True)
class ReplaySettings:
    max_batch_tokens: int | None = None  # every engine's; None: each engine's own (shipped.py)
    max_running: int | None = None  # likewise
    # every engine's share of the GPU's memory for the weights and the KV cache; None: each
    # engine's own (SGLang's mem_fraction_static as it derives it, vLLM's gpu_memory_utilization)
    mem_fraction: float | None = None
    cache_tokens: int | None = None  # the KV pool in tokens; None: what the GPU holds after the weights
    prefix_cache: bool = True
    step_overhead_s: float = 0.0
    block: int = REPLAY_BLOCK
    bins: int = REPLAY_TIMELINE_BINS
    # the engines' own scheduler options, per engine name or family (`--engine-option`):
    # {"sglang": {"chunked_prefill_size": 16384}, "vllm@0.33.0": {...}}
    engine_settings: dict = field(default_factory=dict)
    # the ops outside attention from aiconfigurator-core's tables: "SYSTEM/FRAMEWORK[/VERSION]"
    # (mlactl.decide.calibration.forward_tables), from `tables_dir` (default: the installed data)
    forward_tables: str | None = None
    tables_dir: str | None = None


@dataclass(frozen=True)
class Tokens:
    """The trace's tokens as one engine ran it: prompt tokens computed, found cached, decoded."""

    prefill_computed: int
    prefill_cached: int
    decode: int


@dataclass(frozen=True)
class Percentiles:
    p50: float | None  # None: no request has the figure
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class Latency:
    """Seconds from each request's arrival: until admitted, to its first token, to its end; the
    seconds per output token after the first (TPOT: end less first token over output - 1, for
    requests of two or more output tokens); output tokens a second from the first arrival to
    the last finish."""

    queue: Percentiles
    first_token: Percentiles
    end_to_end: Percentiles
    per_output_token: Percentiles
    output_tokens_per_s: float | None  # None: no time passed


@dataclass(frozen=True)
class CacheUse:
    hit_rate: float  # share of prompt tokens found cached
    blocks_evicted: int
    preempted: int  # vLLM's preemptions, SGLang's retractions
    recomputed_tokens: int  # computed again after them
    page: int  # the engine's page (block) in tokens


@dataclass(frozen=True)
class PathShare:
    steps: float  # share of the steps that run the path
    tokens: float  # share of the new tokens on it


@dataclass(frozen=True)
class StepType:
    """One type of step (decode, prefill, mixed, ...): its steps, tokens, attention under the rule
    and the best, and each path's share of its new tokens."""

    type: str
    steps: int
    tokens: int
    time_s: float
    best_s: float
    lost_s: float
    paths: dict[str, float]


@dataclass(frozen=True)
class Timeline:
    """Bins of trace time (`edges_s`, one more than bins): attention, best and lost per bin."""

    edges_s: list[float]
    time_s: list[float]
    best_s: list[float]
    lost_s: list[float]


@dataclass
class EngineReplay:
    engine: rules.Engine
    steps: int
    start_s: float
    end_s: float
    step_time_s: float  # every step's clock time, attention, weights and overhead
    # attention under the rule and the best (per step the least of the best one path, each
    # request on its own best path, and the rule's); the loss against each, >= 0 step by step;
    # calibrated, each with its 80% interval
    loss: RuleLoss
    drawn: bool  # whether the totals' intervals were drawn (calibrated, every op with evidence)
    best_step_s: float  # attention, the best one path per step (inf where nothing fits a step)
    best_request_s: float  # attention, each request on its own best path
    tokens: Tokens
    paths: dict[str, PathShare]
    by_type: list[StepType]
    sweep: Sweep | None
    timeline: Timeline
    latency: Latency
    cache: CacheUse
    per_step: dict | None = field(repr=False)  # [steps] arrays, for the CSV (replay(keep_steps=True))
    scheduler: Shipped | None = None  # the chunk, running requests and page it ran with
    # the GPU's time, the whole forward of every step: the attention as priced (loss.time_s) plus
    # the clock's roofline for the rest of the forward, the collectives and the step overhead
    gpu_time_s: float = 0.0
    # the same steps with each one's attention on the best path (`retimed`): what the rule's
    # choices cost in latency and throughput; None with no steps
    latency_best: Latency | None = None

    @property
    def lost_gpu_pct(self) -> float:
        """The loss as a share of the GPU's time (the whole forward): what a user pays for."""
        return 100.0 * self.loss.lost_s / self.gpu_time_s if self.gpu_time_s else 0.0


@dataclass
class Replay:
    trace: Trace
    cost: CostModel
    weights: WeightCost
    hw: HardwareProfile
    settings: ReplaySettings
    capacity_tokens: int
    engines: list[EngineReplay]
    calibration: Any = None  # mlactl.decide.calibration.Calibration the times came from
    comm_basis: str = ""  # how the clock priced the collectives (Clock.comm_basis)
    tables: Any = None  # forward_tables.ForwardTables the clock's other ops came from, or None

    @property
    def requests(self) -> int:
        return len(self.trace)


def kv_pool(
    weights: WeightCost, cost: CostModel, hw: HardwareProfile, s: ReplaySettings
) -> Callable[[float | None], int]:
    """KV tokens the pool holds, as a function of the share of the GPU's memory the engine
    gives the weights and the KV cache together: --cache-tokens whatever the share, or what the
    share leaves after the GPU's share of the weights (model weights / TP; a DSA model's indexer
    whole), at a cache row's bytes for every layer (the latent; a DSA model's index row too). A
    --cache-tokens that no GPU of this kind could hold is replayed as asked (the pool is never
    allocated), with one warning."""
    per_token = cost.cache_row_bytes() * cost.cfg.layers
    if s.cache_tokens is not None:
        need = s.cache_tokens * per_token
        if need > hw.memory_bytes:
            warn(
                f"--cache-tokens {s.cache_tokens:,}: a KV cache of {need / 1e9:,.0f} GB ({per_token:,} bytes a "
                f"token, every layer), more than {safe.text(hw.name)}'s {hw.memory_gb:g} GB: no such GPU holds it; "
                "replayed as asked"
            )
        fixed = int(s.cache_tokens)
        return lambda fraction: fixed

    def tokens(fraction: float | None) -> int:
        assert fraction is not None
        free = hw.memory_bytes * fraction - weights.model_bytes
        out = int(free // per_token)
        if out < s.block:
            raise MlactlError(
                f"{cost.cfg.name}'s weights take {weights.model_bytes / 1e9:.1f} GB per GPU at tp {cost.cfg.tp} "
                f"({weights.weights.dtype}): {hw.name}'s {hw.memory_gb:g} GB at a memory fraction of {fraction:g} "
                "leave no room for the KV cache; raise --tp or --mem-fraction, or give --cache-tokens"
            )
        return out

    return tokens


def replay(
    trace: Trace,
    cfg: MLAConfig,
    weights: ModelWeights,
    hw: HardwareProfile,
    engines: list[rules.Engine],
    settings: ReplaySettings | None = None,
    *,
    kv_dtype: str = "bf16",
    dtype: str = "bf16",
    chunk: int = DEFAULT_CHUNK,
    calibration=None,
    keep_steps: bool = False,
    jobs: int | None = None,
) -> Replay:
    """Replay `trace` through each engine (see the module docstring); `keep_steps` keeps what
    every step took (EngineReplay.per_step), which the per-step CSV needs. The engines are
    independent: `jobs` processes (default one per CPU, at most one per engine) replay them side
    by side where the platform forks, each engine's figures the same as alone."""
    s = settings or ReplaySettings()
    _check_settings(s)
    workers = max(1, min(len(engines), jobs or os.cpu_count() or 1))
    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    check_replay(len(trace), workers)
    cost = CostModel(cfg, kv_dtype=kv_dtype, dtype=dtype, chunk=chunk)
    wc = WeightCost(cfg, weights)
    hw.peak_flops(dtype)  # fail early, naming the profile, if it lacks a dtype
    if weights.dtype not in hw.peak_tflops:
        have = ", ".join(sorted(hw.peak_tflops))
        raise MlactlError(
            f"{cfg.name}'s weights are {weights.dtype} and hardware {hw.name} has no {weights.dtype} peak "
            f"(it has: {have}); give --weight-dtype with one it has (engines there run them dequantised)"
        )
    kv = kv_pool(wc, cost, hw, s)
    schedulers = [shipped_for(e, s, hw, kv, cfg) for e in engines]
    need = trace.input + trace.output - 1
    for e, sh in zip(engines, schedulers, strict=True):
        pages = -(-need // sh.page) * sh.page
        over = np.flatnonzero(pages > sh.pool_tokens)
        if len(over):
            i = int(over[0])
            raise MlactlError(
                f"{trace.path}: line {int(trace.line[i])}: a request of {int(need[i]):,} tokens does not fit "
                f"{e.label}'s KV cache of {sh.kv_tokens:,} tokens ({len(over)} request(s) do not); raise --tp, "
                "--mem-fraction or --cache-tokens"
            )
    tables = None
    if s.forward_tables is not None:
        fc = ForwardCost(cfg, weights, act_dtype=dtype)
        tables = forward_tables.load(fc, hw, s.forward_tables, s.tables_dir)
    # one clock per cost the engines run (a DSA model's dense_expand: the indexer vLLM runs in full)
    found: dict[str, Clock] = {}
    clocks = []
    for e in engines:
        own = engine_cost(cost, e.params)
        if own.dense_indexer not in found:
            found[own.dense_indexer] = Clock(own, hw, wc, rules.paths(e), s.step_overhead_s, tables)
        clocks.append(found[own.dense_indexer])
    job = _Job(trace, cost, hw, calibration, tuple(clocks), s, keep_steps, tuple(engines), tuple(schedulers))
    if workers == 1:
        out = [job.run(k) for k in range(len(engines))]
    else:
        global _FORKED
        _FORKED = job  # the workers are forked: they find it here, nothing is pickled on the way in
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                out = list(pool.map(_run_forked, range(len(engines))))
        except BrokenProcessPool:
            raise MlactlError(
                "a replay process died (out of memory?); give --jobs 1 to replay one engine at a time"
            ) from None
        finally:
            _FORKED = None
    tokens = schedulers[0].kv_tokens if schedulers else 0
    return Replay(trace, cost, wc, hw, s, tokens, out, calibration, clocks[0].comm_basis if clocks else "", tables)


@dataclass(frozen=True)
class _Job:
    """One replay's inputs; `run(k)` replays engine k (in this process or a forked one)."""

    trace: Trace
    cost: CostModel
    hw: HardwareProfile
    calibration: Any
    clocks: tuple  # each engine's Clock
    settings: ReplaySettings
    keep_steps: bool
    engines: tuple
    schedulers: tuple  # each engine's Shipped

    def run(self, k: int) -> EngineReplay:
        e, s, sh = self.engines[k], self.settings, self.schedulers[k]
        pool = TokenPool(sh.pool_tokens, caching=s.prefix_cache)
        sched = scheduler_for(e)(self.trace, e, pool, self.clocks[k], sh).run()
        out = _price(self.trace, self.cost, self.hw, self.calibration, e, sched, s, self.keep_steps, sh.page)
        out.scheduler = sh
        return out


_FORKED: _Job | None = None


def _run_forked(k: int) -> EngineReplay:
    assert _FORKED is not None
    return _FORKED.run(k)


def shipped_for(
    e: rules.Engine, s: ReplaySettings, hw: HardwareProfile, pool: Callable[[float | None], int], cfg: MLAConfig
) -> Shipped:
    """The engine's scheduler and KV pool on this GPU: its own options where given (by its name,
    then its family), the shared --max-batch-tokens, --max-running and --mem-fraction, else its
    defaults as it ships. `pool`: kv_pool's tokens for a memory fraction."""
    given = dict(s.engine_settings.get(e.family, {}))
    given.update(s.engine_settings.get(e.name, {}))
    p = e.params
    if e.family == rules.VLLM and "max_num_seqs" in p.given:  # the rule's own option, read here too
        given["max_num_seqs"] = p.values["max_num_seqs"]
    return shipped(
        e.family,
        p,
        hw.memory_gb,
        hw.name,
        pool,
        cfg.name,
        given,
        s.max_batch_tokens,
        s.max_running,
        tp=cfg.tp,
        mem_fraction=s.mem_fraction,
        fixed_pool=s.cache_tokens is not None,
    )


def _check_settings(s: ReplaySettings) -> None:
    if (s.max_batch_tokens is not None and s.max_batch_tokens < 1) or (s.max_running is not None and s.max_running < 1):
        raise MlactlError("--max-batch-tokens and --max-running must be at least 1")
    if s.mem_fraction is not None and not 0 < s.mem_fraction <= 1:
        raise MlactlError(f"--mem-fraction must be above 0 and at most 1, got {s.mem_fraction:g}")
    if s.mem_fraction is not None and s.cache_tokens is not None:
        raise MlactlError("--mem-fraction and --cache-tokens both size the KV pool: give one")
    if s.step_overhead_s < 0 or not np.isfinite(s.step_overhead_s):
        raise MlactlError("--step-overhead-ms must be a number of at least 0")


@dataclass
class _Totals:
    """What pricing an engine's schedule adds up, block by block: attention seconds under the
    rule, the best path per step and per request, and the best of all; the losses against each;
    steps and new tokens per path; seconds, steps and tokens per step type; the timeline's bins;
    and the sweep's constant part (steps whose path no threshold changes)."""

    time: float
    step: float
    request: float
    best: float
    lost_step: float
    lost_request: float
    path_steps: np.ndarray  # [paths]
    path_tokens: np.ndarray  # [paths]
    type_steps: np.ndarray  # [types]
    type_time: np.ndarray  # [types]
    type_best: np.ndarray  # [types]
    type_tokens: np.ndarray  # [types, paths]
    bin_time: np.ndarray  # [bins]
    bin_best: np.ndarray  # [bins]
    sweep_base: float

    @classmethod
    def zero(cls, paths: int, types: int, bins: int) -> _Totals:
        return cls(
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, np.zeros(paths), np.zeros(paths), np.zeros(types), np.zeros(types),
            np.zeros(types), np.zeros((types, paths)), np.zeros(bins), np.zeros(bins), 0.0,
        )  # fmt: skip


def _price(
    trace: Trace,
    cost,
    hw,
    calibration,
    e: rules.Engine,
    sched: Schedule,
    s: ReplaySettings,
    keep_steps: bool,
    page: int,
) -> EngineReplay:
    """Price an engine's schedule a block of steps at a time, adding up as it goes: what every
    step took is kept only with `keep_steps` (for the per-step CSV)."""
    pricer = Pricer(cost, hw, calibration, e)
    n = len(sched)
    paths, types = pricer.paths, len(STEP_TYPES)
    start_s = float(sched.start[0]) if n else 0.0
    end_s = float(sched.start[-1] + sched.time[-1]) if n else 0.0
    edges = np.linspace(start_s, end_s if end_s > start_s else start_s + 1.0, s.bins + 1)
    acc = _Totals.zero(len(paths), types, s.bins)
    sweep_parts, kept = [], []
    step_engine, step_lost = np.zeros(n), np.zeros(n)  # the intervals' sample is drawn on them
    for first, last in blocks(sched):
        rows = rows_of(sched, first, last)
        figs = pricer.figures(rows)
        codes = pricer.engine_codes(rows)
        engine_t = pricer.engine_seconds(rows, codes)
        step_best, request_best = pricer.references(figs, rows)
        best = np.minimum(np.minimum(step_best, request_best), engine_t)
        kind = step_types(rows)
        tokens = np.stack(
            [
                np.bincount(rows.step[codes == k], weights=rows.new[codes == k], minlength=rows.steps)
                for k in range(len(paths))
            ]
        )  # [paths, steps]
        acc.time += engine_t.sum()
        acc.step += step_best.sum()
        acc.request += request_best.sum()
        acc.best += best.sum()
        acc.lost_step += lost_against(engine_t, step_best).sum()
        acc.lost_request += lost_against(engine_t, request_best).sum()
        acc.path_steps += (tokens > 0).sum(axis=1)
        acc.path_tokens += tokens.sum(axis=1)
        acc.type_steps += np.bincount(kind, minlength=types)
        acc.type_time += np.bincount(kind, weights=engine_t, minlength=types)
        acc.type_best += np.bincount(kind, weights=best, minlength=types)
        for k in range(len(paths)):
            acc.type_tokens[:, k] += np.bincount(kind, weights=tokens[k], minlength=types)
        where = np.clip(np.searchsorted(edges, sched.start[first:last], side="right") - 1, 0, s.bins - 1)
        acc.bin_time += np.bincount(where, weights=engine_t, minlength=s.bins)
        acc.bin_best += np.bincount(where, weights=best, minlength=s.bins)
        if e.threshold is not None:
            st, val, sec = pricer.sweep(rows)
            varying = np.zeros(rows.steps, dtype=bool)
            varying[st] = True
            acc.sweep_base += engine_t[~varying].sum()
            sweep_parts.append((st + first, val, sec))
        if keep_steps:
            kept.append((engine_t, step_best, request_best, best, kind, rows.counts, tokens))
        step_engine[first:last], step_lost[first:last] = engine_t, engine_t - best
    drawer = None
    if Drawer.possible(pricer):  # the drawn steps priced again, draw by draw
        drawer = Drawer(pricer, step_weights(sample_size(step_engine, step_lost)))
        for first, last in blocks(sched):
            drawer.add(rows_of(sched, first, last))
    total_tokens = float(acc.path_tokens.sum())
    loss = RuleLoss(
        float(acc.time),
        float(acc.best),
        float(lost_against(acc.time, acc.best)),
        float(acc.lost_step),
        float(acc.lost_request),
    )
    per_step = None
    if keep_steps:
        cat = [np.concatenate([k[j] for k in kept]) if kept else np.zeros(0) for j in range(6)]
        tok = np.concatenate([k[6] for k in kept], axis=1) if kept else np.zeros((len(paths), 0))
        per_step = {
            "start_s": sched.start,
            "step_time_s": sched.time,
            "attention_s": cat[0],
            "clock_attention_s": sched.attention,
            "best_step_s": cat[1],
            "best_request_s": cat[2],
            "best_s": cat[3],
            "type": cat[4].astype(np.int8),
            "rows": cat[5].astype(np.int64),
            "tokens": sched.tokens,
            **{f"{p}_tokens": tok[k] for k, p in enumerate(paths)},
        }
    return EngineReplay(
        engine=e,
        steps=n,
        start_s=start_s,
        end_s=end_s,
        step_time_s=float(sched.time.sum()),
        loss=loss if drawer is None else drawer.totals.spans(loss),
        drawn=drawer is not None,
        gpu_time_s=float(sched.time.sum() - sched.attention.sum() + acc.time),
        best_step_s=float(acc.step),
        best_request_s=float(acc.request),
        tokens=_tokens(trace, sched),
        paths={
            p: PathShare(
                float(acc.path_steps[k] / n) if n else 0.0,
                float(acc.path_tokens[k] / total_tokens) if total_tokens else 0.0,
            )
            for k, p in enumerate(paths)
        },
        by_type=_by_type(acc, paths),
        sweep=_sweep(e, acc.sweep_base, sweep_parts) if e.threshold is not None else None,
        timeline=Timeline(
            edges.tolist() if n else [],
            acc.bin_time.tolist() if n else [],
            acc.bin_best.tolist() if n else [],
            (acc.bin_time - acc.bin_best).tolist() if n else [],
        ),
        latency=_latency(trace, sched.admitted, sched.first_token, sched.finished),
        cache=_cache(trace, sched, page),
        per_step=per_step,
        latency_best=_latency_best(trace, sched, step_engine, step_engine - step_lost),
    )


def _tokens(trace: Trace, sched: Schedule) -> Tokens:
    cached = int(sched.cached.sum())
    return Tokens(int(trace.input.sum()) - cached, cached, int((trace.output - 1).sum()))


def _by_type(acc: _Totals, paths) -> list[StepType]:
    out = []
    for k, name in enumerate(STEP_TYPES):
        steps = int(acc.type_steps[k])
        if not steps:
            continue
        toks = float(acc.type_tokens[k].sum())
        out.append(
            StepType(
                name,
                steps,
                int(toks),
                float(acc.type_time[k]),
                float(acc.type_best[k]),
                float(acc.type_time[k] - acc.type_best[k]),
                {p: float(acc.type_tokens[k, j] / toks) if toks else 0.0 for j, p in enumerate(paths)},
            )
        )
    return out


def _sweep(e: rules.Engine, constant: float, parts) -> Sweep:
    """The trace's attention time at every threshold, from each varying step's time at each of
    its own thresholds (a step runs at t what it runs at its largest value not above t), and
    `constant`, the time of the steps that run the same at any threshold."""
    parts = parts or [(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))]
    steps, values, seconds = (np.concatenate(p) for p in zip(*parts))
    base = constant + float(seconds[values == 1].sum())
    order = np.lexsort((values, steps))
    steps, values, seconds = steps[order], values[order], seconds[order]
    same_step = np.zeros(len(steps), dtype=bool)
    same_step[1:] = steps[1:] == steps[:-1]
    delta = np.zeros(len(steps))
    delta[1:] = seconds[1:] - seconds[:-1]  # at each value above 1 (same_step)
    thresholds, where = np.unique(values[same_step], return_inverse=True)
    jumps = np.bincount(where, weights=delta[same_step], minlength=len(thresholds))
    candidates = np.concatenate([[1], thresholds]).astype(np.int64)
    totals = base + np.concatenate([[0.0], np.cumsum(jumps)])
    current = int(e.threshold or 1)
    now = float(totals[np.searchsorted(candidates, current, side="right") - 1])
    # the last range ends where the option does (SGLang's dense threshold: index_topk), else has no bound
    highs: list[int | None] = [int(c) - 1 for c in candidates[1:]]
    highs.append(e.threshold_max)

    best = pick(candidates, totals, current, candidates, highs)
    # the range: every neighbouring candidate as good (a value where nothing changed splits none)
    is_tied = np.zeros(len(candidates), dtype=bool)
    is_tied[tied(totals)] = True
    low, high = best, best
    while low > 0 and is_tied[low - 1]:
        low -= 1
    while high + 1 < len(candidates) and is_tied[high + 1]:
        high += 1
    keep = np.unique(
        np.concatenate([np.linspace(0, len(candidates) - 1, min(len(candidates), CURVE_POINTS)).astype(int), [best]])
    )
    return Sweep(
        engine=e.params.engine,
        option=e.sweep_option,
        compares=e.compares,
        current=current,
        current_time_s=now,
        best=int(candidates[best]),
        best_range=(int(candidates[low]), highs[high]),
        best_time_s=float(totals[best]),
        curve=[(int(candidates[i]), float(totals[i])) for i in keep],
    )


def _percentiles(x: np.ndarray) -> Percentiles:
    x = x[np.isfinite(x)]
    if not len(x):
        return Percentiles(None, None, None)
    p = np.percentile(x, [50, 90, 99])
    return Percentiles(float(p[0]), float(p[1]), float(p[2]))


def _latency(trace: Trace, admitted: np.ndarray, first_token: np.ndarray, finished: np.ndarray) -> Latency:
    """Each request's latencies from the clock times it was admitted, sampled its first token
    and finished at."""
    out = trace.output.astype(np.float64)
    more = out > 1
    tpot = (finished[more] - first_token[more]) / (out[more] - 1)
    span = float(np.max(finished) - np.min(trace.arrival)) if len(out) else 0.0
    return Latency(
        _percentiles(admitted - trace.arrival),
        _percentiles(first_token - trace.arrival),
        _percentiles(finished - trace.arrival),
        _percentiles(tpot),
        float(out.sum()) / span if span > 0 else None,
    )


def retimed(sched: Schedule, arrival: np.ndarray, attention: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[steps] (start, end) of the schedule's own steps, each taking `attention` in place of the
    clock's attention (the rest of its forward unchanged): a step starts when the one before it
    ends or, if later, when the last request it admits arrives (the only waits the schedulers
    make). With the clock's own attention this gives back the schedule's starts. The steps stay
    the ones the rule formed: which requests share a step does not change with the times."""
    n = len(sched)
    t = sched.time - sched.attention + attention
    gate = np.full(n, -np.inf)
    if n:
        gate[0] = sched.start[0]
    joined = sched.admitted_step >= 0
    np.maximum.at(gate, sched.admitted_step[joined], arrival[joined])
    # end_k = max(end_k-1, gate_k) + t_k, unrolled: cumsum(t)_k + max over j <= k of (gate_j - sum of t before j)
    done = np.cumsum(t)
    end = done + np.maximum.accumulate(gate - (done - t))
    return end - t, end


def _latency_best(trace: Trace, sched: Schedule, engine_t: np.ndarray, best: np.ndarray) -> Latency | None:
    """The latencies of the same steps with each step's attention on its best (the least of the
    best one path, each request on its own best path and the rule: pricing's `best`). The clock's
    attention is scaled by best / rule as priced, so a calibrated replay keeps the roofline
    clock the rule's latencies come from."""
    if not len(sched):
        return None
    scale = np.divide(best, engine_t, out=np.ones_like(best), where=engine_t > 0)
    start, end = retimed(sched, trace.arrival, sched.attention * scale)
    return _latency(trace, start[sched.admitted_step], end[sched.first_token_step], end[sched.finished_step])


def _cache(trace: Trace, sched: Schedule, page: int) -> CacheUse:
    total = float(trace.input.sum())
    hit_rate = float(sched.cached.sum() / total) if total else 0.0
    return CacheUse(hit_rate, int(sched.evicted), int(sched.preempted), int(sched.recomputed), page)
