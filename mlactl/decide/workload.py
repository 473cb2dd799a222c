"""What each engine's rule loses on a workload, and the threshold that would lose least.

A workload is a list of shapes (batch, new, prefix), each a batch of alike requests, with a weight
(how often it runs). An engine's loss at a shape is the time its path takes beyond the best path
that fits, by the time model of `path_times_for` (roofline, or a calibration); the workload's loss is the
weighted sum. The sweeps are exact: a threshold only matters where it crosses a shape's summed
prefix (SGLang) or query length (vLLM), so every distinct value is tried.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from mlactl.decide.calibration.time import path_times
from mlactl.decide.engines import EngineParams, chunk_sizes, grid_paths, is_decode, time_lost, time_of
from mlactl.decide.policy import fitting_times
from mlactl.decide.requests import set_prefix
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.util.errors import MlactlError
from mlactl.util.io import read_text

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
    """`times` as engine `p` runs the paths: its `expand_chunked` at its own chunk size where it
    sets one (vLLM: the workspace over its prefills with context), else `times` unchanged."""
    chunks = chunk_sizes(p, batch)
    if chunks is None:
        return times
    batch, new, prefix = (
        np.broadcast_to(np.asarray(a, dtype=np.int64), np.shape(chunks)) for a in (batch, new, prefix)
    )
    chunked = np.array(np.broadcast_to(times["expand_chunked"], np.shape(chunks)), dtype=np.float64)
    for c in np.unique(chunks):
        at = chunks == c
        args = (batch[at], new[at], prefix[at], calibration, ("expand_chunked",), layers)
        chunked[at] = path_times_for(replace(cost, chunk=int(c)), hw, *args)["expand_chunked"]
    return dict(times, expand_chunked=chunked)


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
    """A CSV with a header naming `new` and `prefix` (or `context`); optionally `batch` (requests
    per batch, default 1) and `weight` (how often the shape runs, default 1; `count` is read as
    the weight too, so a requests CSV of `mlactl batch` works). Other columns are ignored."""

    path = Path(path)
    rows = list(csv.reader(read_text(path, "workload").splitlines()))
    if not rows:
        raise MlactlError(f"{path}: empty file; expected a header such as new,prefix,weight")
    header = [h.strip().lower() for h in rows[0]]
    if "new" not in header or ("prefix" not in header) == ("context" not in header):
        raise MlactlError(f"{path}: line 1: the header must name new and one of prefix or context")
    if "weight" in header and "count" in header:
        raise MlactlError(f"{path}: line 1: give weight or count, not both")
    col = {h: header.index(h) for h in ("batch", "new", "prefix", "context", "weight", "count") if h in header}
    out: dict[str, list] = {"batch": [], "new": [], "prefix": [], "weight": []}
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise MlactlError(f"{path}: line {line}: {len(row)} fields, the header has {len(header)}")
        values: dict[str, float] = {}
        for name, i in col.items():
            cell = row[i].strip()
            if name in ("weight", "count"):
                try:
                    w = float(cell)
                except ValueError:
                    w = float("nan")
                if not np.isfinite(w) or w <= 0:
                    raise MlactlError(f"{path}: line {line}: {name} {cell!r} must be a positive number")
                values["weight"] = w
            elif not cell.isdigit():
                raise MlactlError(f"{path}: line {line}: {name} {cell!r} is not a whole number")
            else:
                values[name] = int(cell)
        if values["new"] < 1 or values.get("batch", 1) < 1:
            raise MlactlError(f"{path}: line {line}: new and batch must be at least 1")
        set_prefix(values, path, line)
        out["batch"].append(values.get("batch", 1))
        out["new"].append(values["new"])
        out["prefix"].append(values["prefix"])
        out["weight"].append(values.get("weight", 1.0))
    if not out["new"]:
        raise MlactlError(f"{path}: no shapes after the header")
    ints = {k: np.asarray(out[k], dtype=np.int64) for k in ("batch", "new", "prefix")}
    return Workload(ints["batch"], ints["new"], ints["prefix"], np.asarray(out["weight"]), str(path))


@dataclass(frozen=True)
class Sweep:
    """A threshold swept over every value that changes a path. `best_range` is the span of
    thresholds that all reach the least loss (high None: unbounded)."""

    engine: str
    option: str
    current: int
    current_time_s: float  # the workload's weighted time under the current threshold
    best: int
    best_range: tuple[int, int | None]
    best_time_s: float
    values: list[tuple[int, float]]  # (threshold, weighted time) for every distinct choice

    @property
    def saves(self) -> float:
        """Fraction of the current time the best threshold saves."""
        if not np.isfinite(self.current_time_s):
            return 1.0
        return (self.current_time_s - self.best_time_s) / self.current_time_s if self.current_time_s else 0.0


@dataclass
class EngineLoss:
    params: EngineParams
    paths: np.ndarray
    lost: np.ndarray  # per shape, per run (+inf: does not fit)
    time_s: float  # weighted time under the rule
    lost_s: float  # weighted loss
    sweep: Sweep | None


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


def _pick(thresholds: np.ndarray, totals: np.ndarray, current: int, lows: np.ndarray, highs: list) -> int:
    """Index of the least total; among ties, the choice whose range holds `current`, else the
    one nearest to it in log2."""
    least = totals.min()
    tied = np.flatnonzero(totals <= least + 1e-12 * max(abs(least), 1e-30))
    for i in tied:
        if lows[i] <= current and (highs[i] is None or current <= highs[i]):
            return int(i)
    return int(tied[np.argmin(np.abs(np.log2(thresholds[tied]) - np.log2(current)))])


def sweep_sglang(p: EngineParams, wl: Workload, times: dict[str, np.ndarray]) -> Sweep:
    """SGLang's summed-prefix threshold t: an extend batch with summed prefix s > 0 runs MHA when
    s >= t, else MLA. Every t in (s_(k-1), s_k] gives the same paths, so t = s_k for each distinct
    s_k, and one past the largest (MHA only without a prefix), are all the choices there are."""
    s = wl.batch * wl.prefix
    movable = ~is_decode(wl.new, wl.prefix) & (s > 0)
    mha = time_of(grid_paths(replace(p, threshold=1), wl.batch, wl.new, wl.prefix), times) * wl.weight
    mla = time_of(np.full(len(wl), "absorb"), times) * wl.weight
    fixed = float(
        np.sum(np.where(movable, 0.0, time_of(grid_paths(p, wl.batch, wl.new, wl.prefix), times) * wl.weight))
    )
    values = np.unique(s[movable])
    candidates = np.append(values, values[-1] + 1 if len(values) else p.threshold)
    totals = np.array([fixed + np.sum(np.where(s[movable] >= t, mha[movable], mla[movable])) for t in candidates])
    lows = np.append([1], values + 1)[: len(candidates)]
    highs: list = list(values) + [None]
    now = float(fixed + np.sum(np.where(s[movable] >= p.threshold, mha[movable], mla[movable])))
    i = _pick(candidates.astype(np.float64), totals, p.threshold, lows, highs)
    table = [(int(t), float(v)) for t, v in zip(candidates, totals)]
    return Sweep(
        p.engine,
        "threshold",
        p.threshold,
        now,
        int(candidates[i]),
        (int(lows[i]), highs[i] and int(highs[i])),
        float(totals[i]),
        table,
    )


def sweep_vllm(p: EngineParams, wl: Workload, times: dict[str, np.ndarray]) -> Sweep:
    """vLLM's decode threshold t: a request of at most t new tokens runs the decode pathway. Every
    t in [n_k, n_(k+1)) gives the same paths, so t = 1 and each distinct query length are all the
    choices there are."""
    absorb = time_of(np.full(len(wl), "absorb"), times) * wl.weight
    prefill = time_of(np.where(wl.prefix > 0, "expand_chunked", "expand"), times) * wl.weight
    candidates = np.unique(np.append(wl.new, 1))
    totals = np.array([np.sum(np.where(wl.new <= t, absorb, prefill)) for t in candidates])
    lows = candidates
    highs: list = [int(x) - 1 for x in candidates[1:]] + [None]
    now = float(np.sum(np.where(wl.new <= p.threshold, absorb, prefill)))
    i = _pick(candidates.astype(np.float64), totals, p.threshold, lows, highs)
    table = [(int(t), float(v)) for t, v in zip(candidates, totals)]
    return Sweep(
        p.engine, "threshold", p.threshold, now, int(candidates[i]), (int(lows[i]), highs[i]), float(totals[i]), table
    )


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
    notes = []
    if cost.cfg.is_dsa and engines:  # the engines' MLA rules do not apply to a DSA model
        notes.append(
            f"engines ({', '.join(e.engine for e in engines)}): their DSA rules (SGLang's nsa backend, vLLM's "
            "sparse MLA backends) are not modelled yet, so no engine is judged on this DSA model; "
            "the best path's time is shown"
        )
        engines = []
    out = []
    for e in engines:
        paths = grid_paths(e, wl.batch, wl.new, wl.prefix)
        own = engine_times(cost, hw, calibration, e, wl.batch, wl.new, wl.prefix, times)
        lost = time_lost(paths, own, best_time)
        s = None
        if sweep and e.engine == "sglang":
            s = sweep_sglang(e, wl, own)
        elif sweep and e.engine == "vllm":
            s = sweep_vllm(e, wl, own)
        total = float(np.sum(time_of(paths, own) * wl.weight))
        out.append(EngineLoss(e, paths, lost, total, float(np.sum(lost * wl.weight)), s))
    return WorkloadReport(cost, hw, wl, best, best_time, float(np.sum(best_time * wl.weight)), out, calibration, notes)
