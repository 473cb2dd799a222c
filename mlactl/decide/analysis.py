"""`mlactl analyze` as a library call: every path timed on a grid, the choices, the crossover.

Everything here is arrays over the grid's points; report.py turns an Analysis into JSON, CSV or
rows for a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mlactl.decide.calibration.estimate import (
    Spans,
    batch_interval,
    crossover_intervals,
    estimates,
    loss_spans,
    window_intervals,
)
from mlactl.decide.calibration.estimate import spans as time_spans
from mlactl.decide.calibration.time import batch_time as timed_batch
from mlactl.decide.calibration.time import crossover_by_time, own_times, path_times, window_by_time
from mlactl.decide.engines import (
    EngineParams,
    chunk_sizes,
    context_for,
    default_params,
    grid_paths,
    is_engine,
    parse_engines,
    path_names,
    step_counts,
    time_lost,
)
from mlactl.decide.forward import Forward
from mlactl.decide.loss import RuleLoss
from mlactl.decide.policy import argmin_path, fitting_times, measured_covers, runnable_flops, select_paths
from mlactl.decide.workload import engine_cost, engine_times
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.roofline import PathTime
from mlactl.results import store as results
from mlactl.util import safe
from mlactl.util.arrays import unique
from mlactl.util.defaults import DEFAULT_CHUNK
from mlactl.util.errors import MlactlError

MAX_CROSSOVER_PREFIXES = 256  # per-prefix crossovers are solved for at most this many (batch, prefix)
DEFAULT_MAX_NEW = 1 << 17  # how far the roofline crossover search goes


@dataclass(frozen=True)
class CrossoverRow:
    batch: int
    prefix: int
    by_flops: int | None  # smallest new count where expand takes fewer FLOPs than absorb
    by_time: int | None  # ... where expand is faster by roofline (or calibrated) time
    by_time_chunked: int | None  # ... where expand_chunked is faster by roofline (or calibrated) time
    # calibrated only: the 80% intervals (hi None: past max_new; lo None too: none up to max_new in
    # nine draws of ten), each deciding op's basis at the
    # crossover ({path: {op: {"basis", ["octaves", "axis"]}}}), and a line when one is not measured
    by_time_interval: tuple[int | None, int | None] | None = None
    by_time_chunked_interval: tuple[int | None, int | None] | None = None
    basis: dict | None = None
    note: str = ""


@dataclass(frozen=True)
class Window:
    """New-token counts where an expand path of a DSA model beats sparse_absorb: (first, last)
    and how many counts in between win (count == last - first + 1: one unbroken run)."""

    first: int
    last: int
    count: int


@dataclass(frozen=True)
class WindowRow:
    """A DSA model's crossover at one (batch, prefix): masked MHA wins over sparse absorb for a
    window of new-token counts (by FLOPs, by time), or never; dense MHA, only where the context
    is at most topk, likewise by time."""

    batch: int
    prefix: int
    masked_by_flops: Window | None
    masked_by_time: Window | None
    dense_by_time: Window | None
    # calibrated: the 80% intervals of each window's first and last counts ((lo, hi), (lo, hi)),
    # None where the window is absent in the point value or in more than a tenth of the draws
    masked_interval: tuple[tuple[int, int], tuple[int, int]] | None = None
    dense_interval: tuple[tuple[int, int], tuple[int, int]] | None = None


@dataclass(frozen=True)
class Crossover:
    asymptotic_new: float | None
    rows: list[CrossoverRow]
    max_new: int
    note: str = ""
    time_kind: str = "roofline"  # or "calibrated": what by_time and by_time_chunked are solved by
    windows: list[WindowRow] = field(default_factory=list)  # a DSA model's, instead of rows


@dataclass
class Analysis:
    cost: CostModel
    hw: HardwareProfile
    layers: int
    engines: list[EngineParams]  # the engines whose rules are shown, with their parameters
    batch: np.ndarray
    new: np.ndarray
    prefix: np.ndarray
    paths: dict[str, PathTime]
    peak_expanded: dict[str, np.ndarray]
    fits_memory: dict[str, np.ndarray]  # expanded K/V within the GPU's memory (per layer)
    runs: dict[str, np.ndarray]  # where the path can run at all (a DSA model's dense_expand: context <= topk)
    kv_cache_bytes: np.ndarray
    mha_cache_bytes: np.ndarray
    best: np.ndarray  # where no path fits (best_fits False): the fastest that runs, which does not fit
    best_by_flops: np.ndarray
    engine_paths: dict[str, np.ndarray]  # engine name -> its path at each point
    engine_time_lost: dict[str, np.ndarray]  # ... and the time it loses (+inf: does not fit)
    crossover: Crossover
    notes: list[str] = field(default_factory=list)
    policy: str | None = None  # a policy shown beside the model's choice (--policy)
    policy_path: np.ndarray | None = None
    policy_time_lost: np.ndarray | None = None
    calibration: object | None = None  # mlactl.decide.calibration.Calibration the times came from
    spans: Spans | None = None  # calibrated: each time's 80% interval and each op's basis
    # calibrated: per engine, the 80% interval of the time it loses at each point (lo, hi)
    engine_lost_spans: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    best_fits: np.ndarray | None = None  # whether `best` fits the GPU's memory (None: everywhere)
    forward: Forward | None = None  # analyze --scope model: each row's whole forward pass

    @property
    def cfg(self) -> MLAConfig:
        return self.cost.cfg

    @property
    def context(self) -> np.ndarray:
        return self.prefix + self.new

    def __len__(self) -> int:
        return len(self.new)


def _policy_lost(policy: str, chosen: np.ndarray, engines, engine_lost, times: dict, ctx) -> np.ndarray:
    """What a policy's choice loses: an engine's rule at the engine's own chunk size."""
    if is_engine(policy):
        return engine_lost(next((e for e in engines if e.engine == policy), default_params(policy, ctx)), chosen)
    return time_lost(chosen, times)


def _cache_note(cost: CostModel, hw: HardwareProfile, batch, new, prefix) -> list[str]:
    """A line when at some point the latent cache alone overflows the GPU: no path runs there."""
    cache = cost.kv_cache_bytes(batch, new, prefix)
    over = cache > hw.memory_bytes
    if not np.any(over):
        return []
    return [
        f"[red]at {int(over.sum())} point(s) the latent cache alone (up to {float(cache.max()):.3g} bytes "
        f"per layer) exceeds the {hw.memory_gb:g} GB of {safe.markup(hw.name)}: no path fits there (✗); "
        "best there is the fastest path that would run with more memory, marked ✗ (JSON: best_fits_memory false)[/]"
    ]


def notes_for(cost: CostModel, layers: int) -> list[str]:
    cfg = cost.cfg
    attention = cfg.attention_note()
    notes = [attention] if attention else []
    if cfg.tp > 1:
        notes.append(
            f"tensor parallel {cfg.tp}: {cfg.H} heads per GPU; the latent cache "
            f"({cost.cache_row_bytes()} bytes per token and layer) is replicated on every GPU, "
            "so its bytes do not shrink with --tp"
        )
    if layers > 1:
        notes.append(f"figures cover {layers} layers; peak expanded K/V is per layer (freed between layers)")
    return notes


def crossover_table(
    cost: CostModel,
    hw: HardwareProfile,
    batch_prefix,
    max_new: int = DEFAULT_MAX_NEW,
    calibration=None,
    spans: bool = True,
) -> Crossover:
    """Crossovers for each (batch, prefix) pair given; by calibrated time with `calibration`, and
    then (with `spans`) their intervals and the basis of the ops that decide them."""
    pairs = sorted(set((int(b), int(p)) for b, p in batch_prefix))
    note = ""
    if len(pairs) > MAX_CROSSOVER_PREFIXES:
        note = (
            f"{len(pairs)} (batch, prefix) pairs: per-prefix crossovers solved for none; "
            f"use `mlactl crossover` on at most {MAX_CROSSOVER_PREFIXES}"
        )
        pairs = []
    kind = "roofline" if calibration is None else "calibrated"
    if cost.windows:
        windows = _windows(cost, hw, pairs, max_new, calibration, spans and calibration is not None)
        return Crossover(None, [], max_new, note, kind, windows)
    rows = []
    for b in sorted(set(b for b, _ in pairs)):
        prefixes = [p for bb, p in pairs if bb == b]
        by_time = crossover_by_time(cost, hw, calibration, prefixes, batch=b, path="expand", max_new=max_new)
        chunked = crossover_by_time(cost, hw, calibration, prefixes, batch=b, path="expand_chunked", max_new=max_new)
        if calibration is None or not spans:
            rows += [
                CrossoverRow(b, p, cost.crossover_by_flops(p), t, c) for p, t, c in zip(prefixes, by_time, chunked)
            ]
            continue
        found_spans = {
            path: crossover_intervals(cost, hw, calibration, prefixes, batch=b, path=path, max_new=max_new)
            for path in ("expand", "expand_chunked")
        }
        for i, (p, t, c) in enumerate(zip(prefixes, by_time, chunked)):
            found = deciding_basis(cost, hw, calibration, b, p, t if t is not None else max_new)
            rows.append(
                CrossoverRow(
                    b,
                    p,
                    cost.crossover_by_flops(p),
                    t,
                    c,
                    _holding(found_spans["expand"][i], t),
                    _holding(found_spans["expand_chunked"][i], c),
                    found,
                    basis_note(found, b, p),
                )  # fmt: skip
            )
    return Crossover(cost.asymptotic_crossover(), rows, max_new, note, kind)


def _holding(span: tuple[int | None, int | None], value: int | None) -> tuple[int | None, int | None]:
    """A crossover's interval widened to hold its point value (an end None: past max_new)."""
    lo, hi = span
    if value is None:
        return lo, None
    return (value if lo is None else min(lo, value)), None if hi is None else max(hi, value)


DECIDING_SHARE = 0.05  # an op taking less of its path's time than this does not decide a crossover


def deciding_basis(cost: CostModel, hw: HardwareProfile, calibration, batch: int, prefix: int, new: int) -> dict:
    """{path: {op: basis}} of expand's and absorb's ops at a crossover (batch, new, prefix), the
    ops that take at least DECIDING_SHARE of their path's time (they decide where it lies)."""
    est = estimates(cost, hw, calibration, batch, np.array([new]), np.array([prefix]), ("expand", "absorb"))
    out = {}
    for path, e in est.items():
        total = float(np.asarray(e.time).reshape(-1)[0])
        out[path] = {
            name: op.basis_json(0)
            for name, op in e.ops.items()
            if float(np.asarray(op.time).reshape(-1)[0]) >= DECIDING_SHARE * total
        }
    return out


def basis_note(found: dict, batch: int, prefix: int) -> str:
    """One line naming the deciding ops whose time was not measured there; "" if all were."""
    parts = []
    for path, ops in found.items():
        for name, b in ops.items():
            label = path if name == path else f"{path}'s {name}"
            if b["basis"] == "roofline":
                parts.append(f"{label} at roofline (no measurements)")
            elif b["basis"] == "extrapolated":
                octaves = b.get("octaves")
                far = "by an unknown distance" if octaves is None else f"{octaves:.1f} octaves ({b['axis']})"
                parts.append(f"{label} extrapolated {far}")
    if not parts:
        return ""
    return f"batch {batch}, prefix {prefix}: the crossover rests on " + ", ".join(parts)


def _window(found) -> Window | None:
    return None if found is None else Window(*found)


def _windows(
    cost: CostModel, hw: HardwareProfile, pairs, max_new: int, calibration, spans: bool = False
) -> list[WindowRow]:
    """A DSA model's windows per (batch, prefix): masked_expand against sparse_absorb by FLOPs
    (exact, one unbroken run: CostModel.masked_window_by_flops) and by time; dense_expand
    against sparse_absorb by time, where it can run. With `spans` (calibrated), each window's
    ends with their 80% intervals."""
    out = []
    for b in sorted(set(b for b, _ in pairs)):
        prefixes = [p for bb, p in pairs if bb == b]
        masked = window_by_time(
            cost, hw, calibration, prefixes, batch=b, path="masked_expand", against="sparse_absorb", max_new=max_new
        )
        # dense_expand runs only where prefix + new <= topk: search no further
        dense_max = max(1, min(max_new, cost.cfg.index().topk))
        dense = window_by_time(
            cost, hw, calibration, prefixes, batch=b, path="dense_expand", against="sparse_absorb", max_new=dense_max
        )
        intervals: dict[str, list] = {"masked": [None] * len(prefixes), "dense": [None] * len(prefixes)}
        if spans:
            for key, path, most in (("masked", "masked_expand", max_new), ("dense", "dense_expand", dense_max)):
                intervals[key] = window_intervals(
                    cost, hw, calibration, prefixes, batch=b, path=path, against="sparse_absorb", max_new=most
                )
        for i, (p, m, d) in enumerate(zip(prefixes, masked, dense)):
            flops = cost.masked_window_by_flops(p, max_new)
            by_flops = None if flops is None else Window(flops[0], flops[1], flops[1] - flops[0] + 1)
            out.append(
                WindowRow(
                    b,
                    p,
                    by_flops,
                    _window(m),
                    _window(d),
                    _window_holding(intervals["masked"][i], m),
                    _window_holding(intervals["dense"][i], d),
                )  # fmt: skip
            )
    return out


def _window_holding(span, found) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """A window's end intervals widened to hold its point values; None without a window."""
    if span is None or found is None:
        return None
    (f_lo, f_hi), (l_lo, l_hi) = span
    first, last = found[0], found[1]
    return (min(f_lo, first), max(f_hi, first)), (min(l_lo, last), max(l_hi, last))


def analyze(
    cfg: MLAConfig,
    hw: HardwareProfile,
    batch,
    new,
    prefix,
    *,
    kv_dtype: str = "bf16",
    dtype: str = "bf16",
    chunk: int = DEFAULT_CHUNK,
    layers: int = 1,
    engines: list[EngineParams] | None = None,
    max_new: int = DEFAULT_MAX_NEW,
    policy: str | EngineParams | None = None,
    results_data: dict | None = None,
    calibration=None,
    crossover_spans: bool = True,
) -> Analysis:
    """Cost, roofline time, choice and crossover of every path at every (batch, new, prefix).

    `engines` (default: sglang and vllm with their defaults) adds each engine's path and the
    time it loses against the best path that fits. `policy` (roofline, flops, measured or an
    engine's rule, resolved with its options by `parse_policy`; a bare engine name takes that
    rule among `engines`, else its defaults) adds that policy's path and the time it loses;
    measured takes its crossovers from
    `results_data` (a loaded results file), per batch size. Calibrated, each time's interval and
    each op's basis are computed (`spans`), and with `crossover_spans` (the slow part: a search
    per draw) each crossover's interval and the basis of the ops that decide it.
    """
    engines = parse_engines(None, ctx=context_for(cfg, hw, kv_dtype)) if engines is None else list(engines)
    if isinstance(policy, EngineParams):  # reported under its name, computed as resolved
        engines_for_policy, policy = [policy, *engines], policy.engine
    else:
        engines_for_policy = engines
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise MlactlError(f"--layers must be a positive integer or 'all', got {layers!r}")
    cost = CostModel(cfg, kv_dtype=kv_dtype, dtype=dtype, chunk=chunk)
    hw.peak_flops(dtype)  # fail early, with the profile's name, if it lacks this dtype
    batch, new, prefix = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (batch, new, prefix))
    batch, new, prefix = np.broadcast_arrays(batch, new, prefix)
    paths = path_times(cost, hw, calibration, batch, new, prefix, cost.paths, layers)
    fitting = fitting_times(cost, hw, {p: paths[p].time_s for p in cost.paths}, batch, new, prefix)
    # where no path fits the GPU's memory, the fastest of those that run, marked so (best_fits)
    fits_any = np.any(np.isfinite(np.stack([fitting[p] for p in cost.choices])), axis=0)
    runnable = {p: np.where(cost.applicable(p, batch, new, prefix), paths[p].time_s, np.inf) for p in cost.choices}
    best = np.where(fits_any, argmin_path(fitting, cost.choices), argmin_path(runnable, cost.choices))
    # +inf where a path's expanded K/V would not fit, or where it cannot run
    mla_times = {p: fitting[p] for p in cost.choices}
    best_time = np.min(np.stack(list(mla_times.values())), axis=0)
    engine_paths = {e.engine: grid_paths(e, batch, new, prefix) for e in engines}

    own_times = {
        e.engine: engine_times(cost, hw, calibration, e, batch, new, prefix, mla_times, layers) for e in engines
    }

    def engine_lost(e: EngineParams, chosen: np.ndarray) -> np.ndarray:  # at the engine's own chunk size
        own = own_times.get(e.engine)
        if own is None:
            own = engine_times(cost, hw, calibration, e, batch, new, prefix, mla_times, layers)
        return time_lost(chosen, own, best_time)

    by_name = {e.engine: e for e in engines}
    engine_time_lost = {name: engine_lost(by_name[name], path) for name, path in engine_paths.items()}
    lost_spans = None
    if calibration is not None and engines:
        rules = {name: (chosen, own_times[name]) for name, chosen in engine_paths.items()}
        found = loss_spans(cost, hw, calibration, batch, new, prefix, mla_times, rules, layers)
        if found is not None:  # each widened to hold its point value; NaN where the path does not fit
            lost_spans = {}
            for name, (lo, hi) in found.items():
                point = engine_time_lost[name]
                ok = np.isfinite(point)
                lost_spans[name] = (
                    np.where(ok, np.minimum(lo, point), np.nan),
                    np.where(ok, np.maximum(hi, point), np.nan),
                )

    policy_path = None
    if policy is not None:
        policy_path = _policy_paths(cost, hw, batch, new, prefix, policy, engines_for_policy, results_data)
    policy_lost = None
    if policy is not None and policy_path is not None:
        ctx = context_for(cfg, hw, kv_dtype)
        policy_lost = _policy_lost(policy, policy_path, engines_for_policy, engine_lost, mla_times, ctx)
    span = int(prefix.max()) + 1 if len(prefix) else 1
    keys = unique(batch * span + prefix)  # distinct (batch, prefix) pairs, one int each
    batch_prefix = list(zip((keys // span).tolist(), (keys % span).tolist()))
    return Analysis(
        cost=cost,
        hw=hw,
        layers=layers,
        engines=engines,
        batch=batch,
        new=new,
        prefix=prefix,
        paths=paths,
        peak_expanded={p: cost.peak_expanded_bytes(p, batch, new, prefix) for p in cost.paths},
        fits_memory={p: np.isfinite(fitting[p]) | ~cost.applicable(p, batch, new, prefix) for p in cost.paths},
        runs={p: cost.applicable(p, batch, new, prefix) for p in cost.paths},
        kv_cache_bytes=cost.kv_cache_bytes(batch, new, prefix) * layers,
        mha_cache_bytes=cost.mha_cache_bytes(batch, new, prefix) * layers,
        best=best,
        best_fits=fits_any,
        best_by_flops=argmin_path(runnable_flops(cost, batch, new, prefix), cost.choices),
        engine_paths=engine_paths,
        engine_time_lost=engine_time_lost,
        crossover=crossover_table(cost, hw, batch_prefix, max_new, calibration, crossover_spans),
        notes=notes_for(cost, layers)
        + _cache_note(cost, hw, batch, new, prefix)
        + (_measured_note(batch, prefix, results_data) if policy == "measured" and results_data else []),
        policy=policy,
        policy_path=policy_path,
        policy_time_lost=policy_lost,
        calibration=calibration,
        spans=None
        if calibration is None
        else time_spans(cost, hw, calibration, batch, new, prefix, cost.paths, layers),
        engine_lost_spans=lost_spans,
    )


def _policy_paths(cost, hw, batch, new, prefix, policy, engines, results_data):

    if policy != "measured":
        engine = next((e for e in engines if e.engine == policy), None)
        return select_paths(cost, hw, new, prefix, batch=batch, policy=policy, engine=engine)
    if results_data is None:
        raise MlactlError(
            "--policy measured needs measured crossovers: pass --results FILE from "
            "`mlactl tune paths`, or run it for this model and hardware"
        )
    out = np.empty(len(new), dtype=object)
    for b in unique(batch):
        rows = batch == b
        out[rows] = select_paths(
            cost,
            hw,
            new[rows],
            prefix[rows],
            policy="measured",
            crossovers=results.measured_crossovers(results_data, int(b)),
        )
    return out.astype(str)


def _measured_note(batch, prefix, results_data) -> list[str]:
    """One line when --policy measured met prefixes outside what was measured (roofline there)."""
    outside, measured = 0, set[int]()
    for b in unique(batch):
        crossovers = results.measured_crossovers(results_data, int(b))
        if crossovers:
            rows = batch == b
            outside += int((~measured_covers(crossovers, prefix[rows])).sum())
            measured.update(crossovers)
    if not outside:
        return []
    shown = ", ".join(str(p) for p in sorted(measured))
    return [
        f"measured policy: {outside:,} point(s) lie outside the prefixes measured ({shown}): the roofline "
        "chooses there (run `mlactl tune paths` over those prefixes to measure them)"
    ]


# -- mixed batches --------------------------------------------------------------------------------


@dataclass
class BatchAnalysis:
    """A mixed batch of requests: the path of each, and the batch's time under each strategy.

    Requests on the same path run as one launch per op, so they share one read of the weights;
    everything else adds up. `per_request` gives each request the path with the least time of
    its own (weights left out, since the batch shares them); the model's choice is the strategy
    with the least total. Each engine's rule is applied to the whole batch the engine's way
    (mlactl.decide.engines.batch_paths) and timed the same way, under the engine's name.
    """

    cost: CostModel
    hw: HardwareProfile
    new: np.ndarray
    prefix: np.ndarray
    count: np.ndarray
    own_time: dict[str, np.ndarray]  # per request row, weights left out
    assignments: dict[str, np.ndarray]  # strategy or engine -> path of each request row
    totals: dict[str, float]  # strategy or engine -> batch time in seconds
    engines: list[EngineParams]
    calibration: object | None = None  # mlactl.decide.calibration.Calibration the times came from
    # engine -> [R, 3] requests of each row on each of the engine's paths (path_names: absorb,
    # expand, expand_chunked, or a DSA model's sparse_absorb, dense_expand, masked_expand; vLLM's
    # split can fall inside a row of alike requests: `assignments` holds the path of most of them)
    engine_counts: dict[str, np.ndarray] = field(default_factory=dict)
    # calibrated: each strategy's and engine's total's 80% interval (None: an op without evidence)
    intervals: dict[str, tuple[float, float] | None] | None = None
    layers: int = 1  # the layers every time counts
    # per engine, its rule's total against the best strategy's (never below 0: vLLM's own chunk
    # size can beat the best assignment at --chunk), calibrated with the total's 80% interval
    losses: dict[str, RuleLoss] = field(default_factory=dict)

    @property
    def strategies(self) -> tuple[str, ...]:
        """Every request on one path, or each on its own best (the model's: CostModel.strategies)."""
        return self.cost.strategies

    @property
    def best_strategy(self) -> str:
        """The strategy of least total, the first listed on a tie: what each engine's loss is
        measured against (analyze_batch builds `losses` from it)."""
        names = self.strategies
        return min(names, key=lambda s: (self.totals[s], names.index(s)))


def batch_time(cost: CostModel, hw: HardwareProfile, new, prefix, count, paths, calibration=None) -> float:
    """Time of a batch whose request rows run `paths` (an array of names): roofline, or
    calibrated with `calibration` (mlactl.decide.calibration.time.batch_time)."""
    return timed_batch(cost, hw, calibration, new, prefix, count, paths)


def analyze_batch(
    cfg: MLAConfig,
    hw: HardwareProfile,
    new,
    prefix,
    count=None,
    *,
    kv_dtype: str = "bf16",
    dtype: str = "bf16",
    chunk: int = DEFAULT_CHUNK,
    engines: list[EngineParams] | None = None,
    calibration=None,
    layers: int = 1,
) -> BatchAnalysis:
    """Each request's path and the batch's time under each strategy and engine rule, for
    `layers` layers (every time is one layer's times that many: each layer reads its own
    weights and cache)."""
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise MlactlError(f"--layers must be a positive integer or 'all', got {layers!r}")
    cost = CostModel(cfg, kv_dtype=kv_dtype, dtype=dtype, chunk=chunk)
    new = np.asarray(new, dtype=np.int64)
    prefix = np.asarray(prefix, dtype=np.int64)
    count = np.ones_like(new) if count is None else np.asarray(count, dtype=np.int64)
    if len(new) == 0:
        raise MlactlError("the batch has no requests")
    hw.peak_flops(dtype)  # fail early, with the profile's name, if it lacks this dtype
    own = own_times(cost, hw, calibration, new, prefix, count)
    assignments = {
        # a path whose expanded K/V would not fit, or that cannot run, is never chosen (as in analyze)
        "per_request": argmin_path(fitting_times(cost, hw, own, count, new, prefix), cost.choices),
    }
    for path in cost.choices:
        assignments[f"all_{path}"] = np.full(len(new), path)
    engines = parse_engines(None, ctx=context_for(cfg, hw, kv_dtype)) if engines is None else list(engines)
    totals = {s: batch_time(cost, hw, new, prefix, count, a, calibration) for s, a in assignments.items()}
    for path in cost.choices:  # a batch some of whose requests the path cannot run
        if not cost.applicable(path, count, new, prefix).all():
            totals[f"all_{path}"] = float("inf")
    intervals = {}
    if calibration is not None:
        intervals = {
            s: None if totals[s] == float("inf") else batch_interval(cost, hw, calibration, new, prefix, count, a)
            for s, a in assignments.items()
        }
    counts = {}
    for e in engines:
        names = path_names(e)  # absorb, expand, expand_chunked; DSA: sparse_absorb, dense_expand, masked_expand
        counts[e.engine] = c = step_counts(e, new, prefix, count)
        assignments[e.engine] = np.asarray(names)[np.argmax(c, axis=1)]
        # the rows split by path (a row of alike requests can straddle vLLM's split)
        rows = [(j, np.flatnonzero(c[:, j])) for j in range(len(names))]
        idx = np.concatenate([r for _, r in rows])
        paths = np.concatenate([np.full(len(r), names[j]) for j, r in rows])
        n_req = np.concatenate([c[r, j] for j, r in rows])
        with_context = int(c[prefix > 0, 2].sum())  # the chunked path's requests with context
        chunks = chunk_sizes(e, [with_context])  # an engine that sizes its own chunks (vLLM)
        own_cost = engine_cost(cost, e)
        own_cost = replace(own_cost, chunk=int(chunks[0])) if chunks is not None and with_context else own_cost
        totals[e.engine] = batch_time(own_cost, hw, new[idx], prefix[idx], n_req, paths, calibration)
        if calibration is not None:
            intervals[e.engine] = batch_interval(own_cost, hw, calibration, new[idx], prefix[idx], n_req, paths)
    if layers != 1:
        own = {p: t * layers for p, t in own.items()}
        totals = {k: t * layers for k, t in totals.items()}
        intervals = {k: None if v is None else (v[0] * layers, v[1] * layers) for k, v in intervals.items()}
    out = BatchAnalysis(
        cost, hw, new, prefix, count, own, assignments, totals, engines, calibration, counts,
        intervals if calibration is not None else None, layers,
    )  # fmt: skip
    best = totals[out.best_strategy]
    out.losses = {
        e.engine: RuleLoss(totals[e.engine], best, max(0.0, totals[e.engine] - best), time_span=intervals.get(e.engine))
        for e in engines
    }
    return out
