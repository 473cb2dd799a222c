"""Roofline time of ops and paths on a hardware profile, and solving for the crossover.

time(op) = max(FLOPs / peak, bytes / bandwidth); a path's time is the sum over its ops. An op is
compute-bound when its FLOP term is the larger one; a path is compute-bound when its summed
FLOPs / peak exceed its summed bytes / bandwidth (its intensity is above the ridge).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.model.cost import CostModel, Op
from mlactl.model.hardware import HardwareProfile


@dataclass(frozen=True)
class OpTime:
    name: str
    flops: np.ndarray
    bytes: np.ndarray
    weight_bytes: np.ndarray
    time_s: np.ndarray
    compute_bound: np.ndarray  # bool


@dataclass(frozen=True)
class PathTime:
    name: str
    ops: list[OpTime]
    flops: np.ndarray
    bytes: np.ndarray
    time_s: np.ndarray
    compute_bound: np.ndarray  # bool

    @property
    def intensity(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.flops / self.bytes


def roofline_time(flops, nbytes, peak, bandwidth):
    """max(FLOPs / peak, bytes / bandwidth): the one place this formula is written. Calibrated
    time (mlactl.decide.calibration) calls it with fitted ceilings."""
    return np.maximum(np.divide(flops, peak), np.divide(nbytes, bandwidth))


def op_time(op: Op, peak: float, bandwidth: float) -> OpTime:
    t_compute = op.flops / peak
    t_memory = op.bytes / bandwidth
    return OpTime(
        op.name,
        op.flops,
        op.bytes,
        op.weight_bytes,
        roofline_time(op.flops, op.bytes, peak, bandwidth),
        t_compute > t_memory,
    )


def path_time(ops: list[Op], hw: HardwareProfile, dtype: str, name: str = "") -> PathTime:
    peak, bandwidth = hw.peak_flops(dtype), hw.bandwidth
    timed = [op_time(op, peak, bandwidth) for op in ops]
    flops = sum(o.flops for o in timed)
    nbytes = sum(o.bytes for o in timed)
    return PathTime(name, timed, flops, nbytes, sum(o.time_s for o in timed), flops / peak > nbytes / bandwidth)


def path_times(cost: CostModel, hw: HardwareProfile, paths, batch, new, prefix) -> dict[str, PathTime]:
    return {p: path_time(cost.ops(p, batch, new, prefix), hw, cost.dtype, p) for p in paths}


def crossover_by_time(
    cost: CostModel,
    hw: HardwareProfile,
    prefixes,
    batch: int = 1,
    path: str = "expand",
    max_new: int = 1 << 17,
    times=None,
) -> list[int | None]:
    """For each prefix, the smallest new-token count (up to max_new) at which `path` is strictly
    faster than absorb by roofline time; None where it never is within max_new. `times(batch, new,
    prefix, paths) -> {path: PathTime}` replaces the roofline (mlactl.decide.calibration.time
    passes the calibrated one).

    Roofline times are piecewise (a max per op), so there is no closed form: every n from 1 up
    is evaluated, in blocks, until each prefix has its answer.
    """
    prefixes = np.asarray(prefixes, dtype=np.float64).reshape(-1)
    found: list[int | None] = [None] * len(prefixes)
    todo = np.arange(len(prefixes))
    start, block = 1, 256  # most crossovers lie in the hundreds: start small, double
    while len(todo) and start <= max_new:
        stop = min(start + block, max_new + 1)
        n = np.arange(start, stop, dtype=np.float64)[None, :]
        p = prefixes[todo][:, None]
        if times is None:
            timed = path_times(cost, hw, (path, "absorb"), batch, n, p)
        else:
            timed = times(batch, n, p, (path, "absorb"))
        wins = timed[path].time_s < timed["absorb"].time_s  # [len(todo), block]
        hit = wins.any(axis=1)
        first = wins.argmax(axis=1)
        for i in np.flatnonzero(hit):
            found[todo[i]] = int(start + first[i])
        todo = todo[~hit]
        start, block = stop, block * 2
    return found


def window_by_time(
    cost: CostModel,
    hw: HardwareProfile,
    prefixes,
    batch: int = 1,
    path: str = "masked_expand",
    against: str = "sparse_absorb",
    max_new: int = 1 << 17,
    times=None,
) -> list[tuple[int, int, int] | None]:
    """For each prefix, where `path` is strictly faster than `against` over new-token counts 1 to
    max_new: (first, last, count) -- the first and last such count and how many there are (count
    == last - first + 1 when the wins form one run) -- or None where it never is. A point where
    `path` cannot run (cost.applicable) is never a win. `times(batch, new, prefix, paths)` replaces
    the roofline as in crossover_by_time.

    Every n is evaluated, in blocks of rows of prefixes; a DSA model's windows close within a
    few thousand new tokens, but the whole range is searched so that nothing is assumed."""
    prefixes = np.asarray(prefixes, dtype=np.float64).reshape(-1)
    first = np.full(len(prefixes), -1, dtype=np.int64)
    last = np.full(len(prefixes), -1, dtype=np.int64)
    count = np.zeros(len(prefixes), dtype=np.int64)
    start, block = 1, 4096
    while start <= max_new:
        stop = min(start + block, max_new + 1)
        n = np.arange(start, stop, dtype=np.float64)[None, :]
        p = prefixes[:, None]
        if times is None:
            timed = path_times(cost, hw, (path, against), batch, n, p)
        else:
            timed = times(batch, n, p, (path, against))
        wins = (timed[path].time_s < timed[against].time_s) & cost.applicable(path, batch, n, p)
        hit = wins.any(axis=1)
        lo = start + wins.argmax(axis=1)
        hi = start + (wins.shape[1] - 1 - wins[:, ::-1].argmax(axis=1))
        first = np.where(hit & (first < 0), lo, first)
        last = np.where(hit, hi, last)
        count += wins.sum(axis=1)
        start = stop
    return [None if f < 0 else (int(f), int(l), int(c)) for f, l, c in zip(first, last, count)]
