"""What each engine's rule loses on a workload, and the threshold that would lose least.

A workload is a list of shapes (batch, new, prefix), each a batch of alike requests, with a weight
(how often it runs). An engine's loss at a shape is the time its path takes beyond the best path
that fits, by the time model of `path_times_for` (roofline, or a calibration); the workload's loss is the
weighted sum. The sweeps are exact: a threshold only matters where it crosses a shape's summed
prefix (SGLang) or query length (vLLM), so every distinct value is tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from mlactl.decide.calibration import uncertainty
from mlactl.decide.calibration.estimate import has_evidence, rule_draws
from mlactl.decide.calibration.time import path_times
from mlactl.decide.engines import EngineParams, chunk_sizes, grid_paths, time_lost, time_of
from mlactl.decide.engines.sweeps import sweeps as engine_sweeps
from mlactl.decide.loss import RuleLoss
from mlactl.decide.policy import fitting_times
from mlactl.decide.requests import read_rows
from mlactl.decide.sweep import Sweep
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.util import progress
from mlactl.util.arrays import unique
from mlactl.util.errors import MlactlError

WORST = 5  # shapes listed per engine


def path_times_for(
    cost: CostModel, hw: HardwareProfile, batch, new, prefix, calibration=None, paths=None, layers: int = 1
) -> dict[str, np.ndarray]:
    """Seconds of each path the model chooses between (default: cost.choices) at each shape,
    +inf where it does not fit or cannot run: roofline time, or calibrated with `calibration`
    (the one time function analyze and batch use too)."""
    paths = cost.choices if paths is None else paths
    times = path_times(cost, hw, calibration, batch, new, prefix, paths, layers)
    return fitting_times(cost, hw, {p: t.time_s for p, t in times.items()}, batch, new, prefix)


def engine_cost(cost: CostModel, p: EngineParams) -> CostModel:
    """The cost model of the paths as engine `p` runs them: a DSA rule's dense MHA runs the
    indexer its engine runs with it (vLLM: all of it; SGLang: each new token's key)."""
    if cost.dense_indexer != p.dense_indexer:
        return replace(cost, dense_indexer=p.dense_indexer)
    return cost


def engine_times(
    cost: CostModel,
    hw: HardwareProfile,
    calibration,
    p: EngineParams,
    batch,
    new,
    prefix,
    times: dict[str, np.ndarray],
    layers: int = 1,
) -> dict[str, np.ndarray]:
    """`times` as engine `p` runs the paths: its chunked path (expand_chunked; a DSA model's
    masked_expand) at its own chunk size where it sets one (vLLM: the workspace over its
    prefills with context), a DSA model's dense_expand with the indexer the engine runs with it
    (engine_cost), else `times` unchanged."""
    out = dict(times)
    own = engine_cost(cost, p)
    if own is not cost and "dense_expand" in times:
        args = (batch, new, prefix, calibration, ("dense_expand",), layers)
        out["dense_expand"] = path_times_for(own, hw, *args)["dense_expand"]
    chunks = chunk_sizes(p, batch)
    name = p.chunked_path
    if chunks is None or name not in times:
        return out
    batch, new, prefix = (
        np.broadcast_to(np.asarray(a, dtype=np.int64), np.shape(chunks)) for a in (batch, new, prefix)
    )
    chunked = np.array(np.broadcast_to(times[name], np.shape(chunks)), dtype=np.float64)
    with_context = prefix > 0  # only these are chunked
    for c in unique(chunks[with_context]):
        at = with_context & (chunks == c)
        args = (batch[at], new[at], prefix[at], calibration, (name,), layers)
        chunked[at] = path_times_for(replace(own, chunk=int(c)), hw, *args)[name]
    out[name] = chunked
    return out


@dataclass(frozen=True)
class Workload:
    batch: np.ndarray
    new: np.ndarray
    prefix: np.ndarray
    weight: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.new)


def grid_workload(batch, new, prefix) -> Workload:
    b, n, p = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (batch, new, prefix))
    return Workload(b, n, p, np.ones(len(n)), "grid, every shape weight 1")


def read_workload(path: str | Path) -> Workload:
    """A CSV of shapes (`mlactl engines`), read by the one reader of `mlactl batch` too
    (mlactl.decide.requests): `new` and `prefix` (or `context`); optionally `batch` (requests
    per batch, default 1) and `weight` (how often the shape runs, default 1; `count` is read as
    the weight, so a requests CSV of `mlactl batch` works). Other columns are ignored."""
    rows = read_rows(path, "workload", rows_are="shapes")
    if rows.weight is not None and rows.count is not None:
        raise MlactlError(f"{path}: line 1: give weight or count, not both")
    weight = rows.weight if rows.weight is not None else rows.count
    batch = rows.batch if rows.batch is not None else np.ones(len(rows), dtype=np.int64)
    weight = np.ones(len(rows)) if weight is None else np.asarray(weight, dtype=np.float64)
    return Workload(batch, rows.new, rows.prefix, weight, rows.source)


@dataclass
class EngineLoss:
    params: EngineParams
    paths: np.ndarray
    lost: np.ndarray  # per shape, per run (+inf: does not fit)
    loss: RuleLoss  # the weighted totals over the workload, calibrated with their 80% intervals
    sweeps: list[Sweep] = field(default_factory=list)  # every threshold of the rule that moves a shape

    @property
    def sweep(self) -> Sweep | None:
        """The rule's first threshold swept (SGLang's summed prefix or dense threshold, vLLM's
        decode threshold), or None."""
        return self.sweeps[0] if self.sweeps else None


@dataclass
class WorkloadReport:
    cost: CostModel
    hw: HardwareProfile
    workload: Workload
    best: np.ndarray
    best_time: np.ndarray  # per shape, per run
    total_best_s: float
    engines: list[EngineLoss]
    calibration: object | None = None  # mlactl.decide.calibration.Calibration the times came from
    notes: list[str] = field(default_factory=list)

    def worst(self, e: EngineLoss, most: int = WORST) -> list[int]:
        """Indices of the shapes where the engine loses most (weighted), largest first."""
        weighted = e.lost * self.workload.weight
        order = np.argsort(-weighted, kind="stable")
        return [int(i) for i in order[:most] if weighted[i] > 0]


def report(
    cost: CostModel,
    hw: HardwareProfile,
    wl: Workload,
    engines: list[EngineParams],
    *,
    sweep: bool = True,
    calibration=None,
) -> WorkloadReport:
    if len(wl) == 0:
        raise MlactlError("the workload has no shapes")
    hw.peak_flops(cost.dtype)  # fail early, with the profile's name, if it lacks this dtype
    times = path_times_for(cost, hw, wl.batch, wl.new, wl.prefix, calibration)
    choices = cost.choices
    best_time = np.min(np.stack([times[p] for p in choices]), axis=0)  # (sparse) absorb always fits
    best = np.asarray(choices)[np.stack([times[p] for p in choices]).argmin(axis=0)]
    total_best = float(np.sum(best_time * wl.weight))
    notes: list[str] = []
    out = []
    own_times = []
    for e in engines:
        paths = grid_paths(e, wl.batch, wl.new, wl.prefix)
        own = engine_times(cost, hw, calibration, e, wl.batch, wl.new, wl.prefix, times)
        own_times.append(own)
        lost = time_lost(paths, own, best_time)
        found = engine_sweeps(e, wl.batch, wl.new, wl.prefix, wl.weight, own) if sweep else []
        total = float(np.sum(time_of(paths, own) * wl.weight))
        loss = RuleLoss(total, total_best, float(np.sum(lost * wl.weight)))
        out.append(EngineLoss(e, paths, lost, loss, found))
    if calibration is not None:
        rules = [(el.paths, own) for el, own in zip(out, own_times)]
        spans = engine_intervals(cost, hw, calibration, wl, times, rules)
        out = [replace(el, loss=el.loss.with_spans(time=t, lost=lo)) for el, (t, lo) in zip(out, spans)]
    return WorkloadReport(cost, hw, wl, best, best_time, total_best, out, calibration, notes)


def engine_intervals(
    cost: CostModel, hw: HardwareProfile, calibration, wl: Workload, times: dict[str, np.ndarray], rules: list
) -> list[tuple[tuple[float, float] | None, tuple[float, float] | None]]:
    """For each rule (its path per shape, its own times per path): the 80% intervals of its
    weighted time over the workload and of what it loses against the best path. Within each draw
    (estimate.rule_draws) the rule's path and the best are compared and the workload summed; the
    interval is taken over the draws. (None, None) for every rule where an op has no evidence;
    None for a total that is infinite (a path that does not fit). report() widens each interval
    to hold its point value."""
    if not has_evidence(cost, hw, calibration, tuple(times)):
        return [(None, None)] * len(rules)
    keep, weights = _interval_sample(wl, times, rules)
    named = {str(k): (paths[keep], {p: t[keep] for p, t in own.items()}) for k, (paths, own) in enumerate(rules)}
    shared = {p: t[keep] for p, t in times.items()}
    time_draws = np.zeros((len(rules), uncertainty.SCENARIOS))
    lost_draws = np.zeros((len(rules), uncertainty.SCENARIOS))
    shapes = (wl.batch[keep], wl.new[keep], wl.prefix[keep])
    with progress.task("intervals of the engines' losses", total=len(keep)) as bar:
        for part, taken, best in rule_draws(cost, hw, calibration, *shapes, shared, named):
            weight = weights[part]
            for k in range(len(rules)):
                mine = taken[str(k)]
                with np.errstate(invalid="ignore"):
                    time_draws[k] += (mine * weight).sum(axis=1)
                    lost_draws[k] += (np.maximum(mine - best, 0.0) * weight).sum(axis=1)
            bar.advance(len(weight))
    return [(_holding(time_draws[k]), _holding(lost_draws[k])) for k in range(len(rules))]


# Above this many shapes, the intervals of a workload's totals are drawn on a sample of about
# this many (estimates cost about 1 ms a shape: 100,000 shapes took 100 s, the point values 19 s).
INTERVAL_SHAPES = 16384
SAMPLE_SEED = 22


def _interval_sample(wl: Workload, times: dict[str, np.ndarray], rules: list) -> tuple[np.ndarray, np.ndarray]:
    """The shapes whose draws the intervals are summed over, and their weights: every shape, or
    above INTERVAL_SHAPES a Poisson sample with each shape's probability proportional to its
    weighted time under the slowest rule (capped at 1), weighted by weight / probability, so each
    draw's total is estimated without bias (Horvitz-Thompson). The totals' spread across draws
    comes from the op classes' draws, which every shape shares, so a sample of this size moves an
    interval's ends by about a percent. Seeded: the same workload draws the same sample."""
    n = len(wl)
    if n <= INTERVAL_SHAPES:
        return np.arange(n), wl.weight
    slowest = np.zeros(n)
    for paths, own in rules:
        t = time_of(paths, own)
        slowest = np.maximum(slowest, np.where(np.isfinite(t), t, 0.0))
    positive = slowest[slowest > 0]
    size = wl.weight * np.where(slowest > 0, slowest, positive.min() if len(positive) else 1.0)
    drawn, prob = uncertainty.poisson_sample(size, INTERVAL_SHAPES, SAMPLE_SEED)
    keep = np.flatnonzero(drawn)
    return keep, wl.weight[keep] / prob[keep]


def _holding(draws: np.ndarray) -> tuple[float, float] | None:
    """The 80% interval over the draws of a total, or None where it is not finite."""
    if not np.all(np.isfinite(draws)):
        return None
    lo, hi = uncertainty.percentiles(draws)
    return float(lo), float(hi)
