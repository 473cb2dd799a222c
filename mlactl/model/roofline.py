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
from mlactl.util import progress


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


# The crossover search (crossover_by_time). Every n up to EXACT_UP_TO is evaluated; beyond it
# the range is searched by bounds, which is exact when each path's time does not fall as n grows
# (the roofline's never does: every op's FLOPs and bytes grow with n).
EXACT_UP_TO = 1024
# Evaluations per array call: 2^16 points x 2 paths is a few MB of float64 temporaries, where the
# old doubling blocks reached 8 GB on a 16M-token search.
BLOCK = 1 << 16
# An interval of at most LEAF counts that the bounds cannot rule out is evaluated point by point.
LEAF = 64
SPLIT = 16  # sub-intervals an undecided interval is cut into


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

    Roofline times are piecewise (a max per op), so there is no closed form. Every n from 1 to
    EXACT_UP_TO is evaluated, in blocks of at most BLOCK points. Beyond it, an interval [a, b]
    of counts holds no win when `path` at a is already no faster than absorb at b (each time
    grows with n), so whole intervals are ruled out at the cost of two evaluations, and only the
    intervals the bound cannot rule out are cut finer, down to LEAF counts evaluated one by one.
    Memory stays a few MB whatever max_new is, and a 2^31-token search takes milliseconds where
    the crossover is far or absent (tests/test_cost.py checks it against the plain scan).
    """

    timed = _timer(cost, hw, batch, times)
    prefixes = np.asarray(prefixes, dtype=np.float64).reshape(-1)
    found: list[int | None] = [None] * len(prefixes)
    with progress.task(f"crossover search ({path} against absorb)", total=len(prefixes)) as bar:
        # 1. every count up to EXACT_UP_TO, a block of counts for all open prefixes at a time
        todo = np.arange(len(prefixes))
        start, stop_at = 1, min(EXACT_UP_TO, max_new)
        while len(todo) and start <= stop_at:
            width = max(1, min(BLOCK // len(todo), stop_at - start + 1))
            n = np.arange(start, start + width, dtype=np.float64)[None, :]
            t = timed(n, prefixes[todo][:, None], (path, "absorb"))
            wins = t[path] < t["absorb"]  # [len(todo), width]
            hit = wins.any(axis=1)
            first = wins.argmax(axis=1)
            for i in np.flatnonzero(hit):
                found[todo[i]] = int(start + first[i])
            bar.advance(int(hit.sum()))
            todo = todo[~hit]
            start += width
        # 2. beyond it, by bounds: intervals (prefix index, a, b), the undecided ones cut finer
        if len(todo) and max_new > EXACT_UP_TO:
            _bounded_search(timed, prefixes, todo, EXACT_UP_TO + 1, max_new, path, found)
        bar.advance(len(todo))
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

    Every n up to EXACT_UP_TO is evaluated. Beyond it the range is cut into intervals [a, b]
    classified by their ends, exact under crossover_by_time's premise (no path's time falls as n
    grows) and with a path that runs at b running at a (applicability only ends as n grows):
    no win when `path` cannot run at a or path(a) >= against(b); all wins when it runs at b and
    path(b) < against(a); otherwise cut into SPLIT pieces, down to LEAF counts evaluated one by
    one. Only the intervals around a window's two ends are refined, so a 16M-token search costs
    about what a 16K one does (tests/test_dsa.py checks it against the plain scan)."""
    prefixes = np.asarray(prefixes, dtype=np.float64).reshape(-1)
    timed = _timer(cost, hw, batch, times)
    first = np.full(len(prefixes), max_new + 1, dtype=np.int64)
    last = np.zeros(len(prefixes), dtype=np.int64)
    count = np.zeros(len(prefixes), dtype=np.int64)

    def runs(n, p):
        return np.broadcast_to(cost.applicable(path, batch, n, p), np.broadcast_shapes(np.shape(n), np.shape(p)))

    def count_wins(k, a, b):
        """Evaluate every count of the intervals (prefix index k, a, b), each at most `width` long."""
        width = int((b - a).max()) + 1
        n = a[:, None] + np.arange(width)[None, :]
        valid = n <= b[:, None]
        n = np.minimum(n, b[:, None]).astype(np.float64)
        p = prefixes[k][:, None]
        t = timed(n, p, (path, against))
        wins = (t[path] < t[against]) & runs(n, p) & valid
        hit = wins.any(axis=1)
        lo = a + wins.argmax(axis=1)
        hi = a + (width - 1 - wins[:, ::-1].argmax(axis=1))
        np.minimum.at(first, k[hit], lo[hit])
        np.maximum.at(last, k[hit], hi[hit])
        np.add.at(count, k, wins.sum(axis=1))

    # 1. every count up to EXACT_UP_TO: a block of counts for all prefixes at a time
    stop_at = min(EXACT_UP_TO, max_new)
    width = max(1, min(BLOCK // max(1, len(prefixes)), stop_at))
    everyone = np.arange(len(prefixes))
    for start in range(1, stop_at + 1, width):
        end = min(start + width - 1, stop_at)
        count_wins(everyone, np.full(len(prefixes), start), np.full(len(prefixes), end))
    # 2. beyond it, by the ends of intervals (prefix index, a, b)
    k, a, b = everyone, np.full(len(prefixes), EXACT_UP_TO + 1), np.full(len(prefixes), max_new)
    keep = a <= b
    k, a, b = k[keep], a[keep], b[keep]
    while len(k):
        leaf = b - a + 1 <= LEAF
        for s in range(0, int(leaf.sum()), max(1, BLOCK // LEAF)):
            part = np.flatnonzero(leaf)[s : s + BLOCK // LEAF]
            count_wins(k[part], a[part], b[part])
        k, a, b = k[~leaf], a[~leaf], b[~leaf]
        if not len(k):
            break
        p = prefixes[k]
        fa, fb = a.astype(np.float64), b.astype(np.float64)
        ta, tb = timed(fa, p, (path, against)), timed(fb, p, (path, against))
        run_a, run_b = runs(fa, p), runs(fb, p)
        none = ~run_a | (ta[path] >= tb[against])
        every = ~none & run_b & (tb[path] < ta[against])
        np.minimum.at(first, k[every], a[every])
        np.maximum.at(last, k[every], b[every])
        np.add.at(count, k[every], (b - a + 1)[every])
        cut = ~none & ~every
        k, a, b = k[cut], a[cut], b[cut]
        size = -(-(b - a + 1) // SPLIT)
        ca = a[:, None] + np.arange(SPLIT)[None, :] * size[:, None]
        cb = np.minimum(ca + size[:, None] - 1, b[:, None])
        real = ca <= b[:, None]
        k = np.broadcast_to(k[:, None], ca.shape)[real]
        a, b = ca[real], cb[real]
    return [None if c == 0 else (int(f), int(l), int(c)) for f, l, c in zip(first, last, count)]


def _timer(cost: CostModel, hw: HardwareProfile, batch: int, times):
    """timed(n, p, paths) -> {path: time_s array of n's and p's broadcast shape}, by the roofline or
    by `times(batch, new, prefix, paths)`."""

    def timed(n, p, paths):
        n, p = np.asarray(n, dtype=np.float64), np.asarray(p, dtype=np.float64)
        out = path_times(cost, hw, paths, batch, n, p) if times is None else times(batch, n, p, paths)
        shape = np.broadcast_shapes(np.shape(n), np.shape(p))
        return {k: np.broadcast_to(np.asarray(out[k].time_s, dtype=np.float64), shape) for k in paths}

    return timed


def _bounded_search(timed, prefixes, todo, low: int, high: int, path: str, found: list) -> None:
    """The smallest winning count in [low, high] for each prefix index in `todo`, into `found`.

    Depth first, leftmost first: each round takes every open prefix's leftmost interval; a leaf
    is evaluated count by count (its first win is the prefix's answer, since every interval left
    of it was ruled out or held no win), a larger one is cut into SPLIT pieces whose bounds are
    evaluated together, and the pieces the bound cannot rule out go back on the prefix's stack,
    leftmost on top. All prefixes' intervals of a round are evaluated in one call."""
    stacks = {int(i): [(low, high)] for i in todo}  # each stack's last item is its leftmost interval
    while stacks:
        taken = [(i, *stacks[i].pop()) for i in list(stacks)]
        leaves = [t for t in taken if t[2] - t[1] + 1 <= LEAF]
        wide = [t for t in taken if t[2] - t[1] + 1 > LEAF]
        for s in range(0, len(leaves), max(1, BLOCK // LEAF)):
            part = np.asarray(leaves[s : s + BLOCK // LEAF], dtype=np.int64)
            k, a, b = part[:, 0], part[:, 1], part[:, 2]
            n = a[:, None] + np.arange(LEAF)[None, :]
            valid = n <= b[:, None]
            t = timed(np.minimum(n, b[:, None]), prefixes[k][:, None], (path, "absorb"))
            wins = (t[path] < t["absorb"]) & valid
            for j in np.flatnonzero(wins.any(axis=1)):
                found[k[j]] = int(n[j, wins[j].argmax()])
                stacks.pop(int(k[j]), None)  # its first win: nothing to its right can be smaller
        if wide:
            part = np.asarray(wide, dtype=np.int64)
            k, a, b = part[:, 0], part[:, 1], part[:, 2]
            size = -(-(b - a + 1) // SPLIT)
            ca = a[:, None] + np.arange(SPLIT)[None, :] * size[:, None]  # [len(wide), SPLIT]
            cb = np.minimum(ca + size[:, None] - 1, b[:, None])
            real = ca <= b[:, None]
            p = np.broadcast_to(prefixes[k][:, None], ca.shape)
            # no win in [a, b] when path(a) >= absorb(b): each time grows with n
            open_ = (timed(ca, p, (path,))[path] < timed(cb, p, ("absorb",))["absorb"]) & real
            for row, i in enumerate(k.tolist()):
                if i in stacks:
                    kept = zip(ca[row][open_[row]][::-1], cb[row][open_[row]][::-1])
                    stacks[i].extend((int(x), int(y)) for x, y in kept)
        for i in [i for i, stack in stacks.items() if not stack]:
            del stacks[i]  # every interval ruled out: no win up to `high`
