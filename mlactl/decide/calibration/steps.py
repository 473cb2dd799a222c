"""THE launch pricer: one path's launches over rows of requests, grouped into steps, at once.

A launch is a mixed batch of request rows (`count` requests each, default one: new tokens after
a prefix) on one path, run as one launch per op: roofline, the op's summed FLOPs and bytes with
the weights read once (the most any row reads: expand_chunked reads them once per chunk);
calibrated, one fixed cost, the rows' compute, memory, serial and added seconds each summed, the
weights' memory time counted once, the decode fit where every row of the launch is decode-like,
a projection's `l2` residency, `pipe` waves and `near` factor at the launch's summed shape, and
a whole-path fit for the path where the calibration has one. `time.batch_time` and
`time.launch_parts` (one launch) and `mlactl replay` (many steps) all price with it.

Each row's part is worked out once: quantities that add up over a launch's rows and ones of
which a launch takes the most. A launch is then a sum over rows, so any grouping of rows into
steps, any subset (a mask) and any rows gathered again (the threshold sweep prices a step under
several rules from the same rows) costs a `reduceat`, not cost.py again. Roofline rows need only
six numbers each (eight for a DSA model; mlactl.model.linear: cost.py's ops are linear in them),
shared by every path; calibrated rows keep each op class's terms.

    launches = PathLaunches(cost, hw, calibration, "absorb", new, prefix, layers=61)
    seconds = launches.seconds(starts, mask=rows_on_absorb)   # [steps]

`starts[g]` is the first row of group g; rows (or the gathered `rows`) are contiguous by group
and every group has at least one row. Arrays are [rows] unless said; parts are [parts, rows].
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mlactl.decide.calibration.model import (
    PROJECTIONS,
    added_seconds,
    by_phase,
    combined,
    components,
    decode_like,
    memory_eta,
    near_applies,
    op_class,
    score_seconds,
    tile_waves,
)
from mlactl.decide.calibration.sources import points_for
from mlactl.decide.calibration.store import Fit
from mlactl.decide.calibration.terms import Terms
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.linear import linear_ops, row_features
from mlactl.model.roofline import roofline_time

# columns every calibrated launch needs besides its fits': rows, decode-like rows, new, prefix
# (the last two each row's requests' tokens: the launch's summed shape)
COUNT, DECODE_LIKE, NEW, PREFIX = range(4)
# a fit's parts per row: compute, memory (at eta_m), serial, added, weights' memory, scores
PARTS = 6


def group_sums(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of x ([rows] or [columns, rows]) over each group of rows: [(columns,) groups]."""
    if not len(starts):
        return np.zeros(x.shape[:-1] + (0,))
    return np.add.reduceat(x, starts, axis=-1)


def group_max(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if not len(starts):
        return np.zeros(x.shape[:-1] + (0,))
    return np.maximum.reduceat(x, starts, axis=-1)


@dataclass(frozen=True)
class Phase:
    """One fit's place in a PathLaunches: its fixed seconds, its first part's row in `add`, its
    weights' row in `most`, and its terms for the op class."""

    fit: Fit
    terms: tuple[str, ...]
    fixed: float
    at: int
    most_at: int


@dataclass(frozen=True)
class LaunchClass:
    """An op class of the path (or the whole path): its index among the path's ops, its name, and
    its decode and prefill fits (None: the calibration has none, the roofline of its summed op)."""

    k: int
    name: str
    decode: Phase | None
    prefill: Phase | None


class PathLaunches:
    """Per-row parts of one path's launches: `add` [A, rows] adds up over a launch, `most`
    [M, rows] takes the largest. `count` ([rows] or None: one each): the requests a row holds,
    all at its shape. `chunk` ([rows] or None): the prefix tokens per chunk each row's
    expand_chunked runs at (an engine's own, e.g. vLLM's workspace over its prefills); None:
    cost.chunk. `features`: row_features of these rows at that chunk, when already made."""

    def __init__(
        self,
        cost: CostModel,
        hw: HardwareProfile,
        calibration,
        path: str,
        new,
        prefix,
        layers: int = 1,
        chunk=None,
        features=None,
        count=None,
    ):
        self.path, self.layers, self.cal, self.cost = path, layers, calibration, cost
        self.new = np.asarray(new, dtype=np.float64)
        self.prefix = np.asarray(prefix, dtype=np.float64)
        self.count = None if count is None else np.asarray(count, dtype=np.float64)
        self.lin = linear_ops(cost, path)
        self.op_names = self.lin.names
        self.peak, self.bandwidth, self.sm_count = hw.peak_flops(cost.dtype), hw.bandwidth, hw.sm_count
        # [F + 1, rows]: the features and the partials (at each row's chunk): shared between paths
        self.x = row_features(cost, self.new, self.prefix, chunk) if features is None else features
        # the rows' summed features: each row's requests'
        self.summed = self.x[:-1] if self.count is None else self.x[:-1] * self.count
        self.classes: list[LaunchClass] = []
        if calibration is None:
            self.add, self.most = self.summed, self.x[-1:]
        else:
            self.cal_peak = calibration.peak(hw)
            self._calibrated(chunk)

    def own_seconds(self) -> np.ndarray:
        """Each row alone, the weights left out (as `own_times` times a request), roofline."""
        f = self.lin.flops @ self.summed  # [ops, rows]
        b = self.lin.bytes @ self.summed
        return roofline_time(f, b, self.peak, self.bandwidth).sum(axis=0) * self.layers

    def sums(self, starts, rows=None, mask=None) -> tuple[np.ndarray, np.ndarray]:
        """(added [A, groups], largest [M, groups]) over the rows of each group: all rows, or the
        gathered `rows`, zeroed outside `mask` (per row of the gathered ones)."""
        add, most = (self.add, self.most) if rows is None else (self.add[:, rows], self.most[:, rows])
        if mask is not None:
            m = np.asarray(mask, dtype=np.float64)
            add, most = add * m, most * m
        starts = np.asarray(starts, dtype=np.int64)
        return group_sums(add, starts), group_max(most, starts)

    def seconds(self, starts, rows=None, mask=None) -> np.ndarray:
        return self.seconds_of(*self.sums(starts, rows, mask))

    def seconds_of(self, add: np.ndarray, most: np.ndarray) -> np.ndarray:
        """[groups]: the launches' seconds (every layer) from their summed and largest parts."""
        if self.cal is not None:
            return self._calibrated_seconds(add, most).sum(axis=0) * self.layers
        lin = self.lin
        any_row = add[0] > 0  # every row has at least one new token
        w = (lin.weights[:, :1] + lin.weights[:, 1:] * most[0]) * any_row  # [ops, groups]
        t = roofline_time(lin.flops @ add, lin.bytes @ add + w, self.peak, self.bandwidth)
        return t.sum(axis=0) * self.layers

    # -- calibrated -------------------------------------------------------------------------

    def class_seconds(self, starts, rows=None, mask=None) -> np.ndarray:
        """[classes, groups]: calibrated, each op class's (or the whole path's) launch seconds,
        every layer, in the order of `class_names`; they add up to `seconds`."""
        return self._calibrated_seconds(*self.sums(starts, rows, mask)) * self.layers

    @property
    def class_names(self) -> list[str]:
        """Calibrated: the op class of each of this path's ops (cost.py's order), or the one
        whole-path class `path:<path>` where the calibration times the path end to end."""
        return [c.name for c in self.classes]

    def _calibrated(self, chunk) -> None:
        """Per op class (or the whole path) and phase: each row's PARTS; classes with no fit keep
        the roofline of their summed op."""
        cal, path, cost, n = self.cal, self.path, self.cost, len(self.new)
        count = np.ones(n) if self.count is None else self.count
        groups = [(cost, np.arange(n))]
        if chunk is not None:
            chunk = np.asarray(chunk, dtype=np.int64)
            groups = [(replace(cost, chunk=int(c)), np.flatnonzero(chunk == c)) for c in np.unique(chunk)]
        whole = cal.whole_path(cost, path)
        names = [f"path:{path}"] if whole else [op_class(path, op) for op in self.op_names]
        lin, x = self.lin, self.x
        weights = lin.weights[:, :1] + lin.weights[:, 1:] * x[-1]  # [ops, rows]
        add = [np.ones(n), decode_like(self.new, self.prefix) * 1.0, count * self.new, count * self.prefix]
        most: list = []

        def phase(fit: Fit, cls: str, k: int) -> Phase:
            terms = fit.terms_for(cls)
            # `l2` is decided by the launch's bytes: the rows' memory is kept at eta_m (HBM)
            hbm = tuple(t for t in terms if t != "l2")
            parts = np.zeros((PARTS, n))
            fixed = 0.0
            for c, at in groups:
                pts = points_for(c, cls, count[at], self.new[at], self.prefix[at], None, path=path)
                fixed, parts[0, at], parts[1, at], parts[2, at] = components(
                    fit.params, hbm, pts, self.cal_peak, self.bandwidth, self.sm_count
                )
                parts[3, at] = added_seconds(fit.params, terms, pts, self.bandwidth, self.sm_count)
                if fit.on.scores and cls.startswith("path:"):
                    parts[5, at] = score_seconds(fit.params, pts, self.bandwidth)
            parts[4] = (weights.sum(axis=0) if whole else weights[k]) / (fit.params["eta_m"] * self.bandwidth)
            found = Phase(fit, terms, float(fixed), len(add), len(most))
            add.extend(parts)
            most.append(parts[4])
            return found

        for k, cls in enumerate(names):
            fits = (whole, whole) if whole else cal.class_fits(cost, cls)
            if fits is None:
                self.classes.append(LaunchClass(k, cls, None, None))
                continue
            decode = phase(fits[0], cls, k)
            prefill = decode if fits[1] is fits[0] else phase(fits[1], cls, k)
            self.classes.append(LaunchClass(k, cls, decode, prefill))
        self.roof_at, self.roof_most = len(add), len(most)
        add += list(lin.flops @ self.summed) + list(lin.bytes @ self.summed)
        most += list(weights)
        self.add, self.most = np.stack(add), np.stack(most)

    def _launch(self, cls: str, p: Phase, add: np.ndarray, most: np.ndarray) -> np.ndarray:
        """[groups]: one layer's launch seconds of op class `cls` by fit phase `p`."""
        params, terms = p.fit.params, Terms.of(p.terms)
        t_c, t_m, serial, added, w, scores = add[p.at : p.at + PARTS]
        memory = t_m - w + most[p.most_at]  # seconds at eta_m, the weights read once
        if terms.l2 and cls in PROJECTIONS:  # the launch's whole working set decides L2
            launch_bytes = memory * params["eta_m"] * self.bandwidth
            memory = memory * params["eta_m"] / memory_eta(params, terms, cls, launch_bytes)
        # one GEMM over all the rows' tokens: its shape (bucket, tiles) is the summed one's
        near = near_applies(params, terms, cls)
        whole = None
        if cls in PROJECTIONS and (near or terms.pipe):
            whole = points_for(self.cost, cls, 1, add[NEW], add[PREFIX], None, path=self.path)
        waves = None
        if terms.pipe and whole is not None and self.sm_count:
            waves = np.reshape(tile_waves(whole, terms, self.sm_count), -1)
        return combined(params, terms, p.fixed, added, t_c, memory, serial, waves,
                        scores if terms.scores else None, whole if near else None)  # fmt: skip

    def _calibrated_seconds(self, add: np.ndarray, most: np.ndarray) -> np.ndarray:
        """[classes, groups]: one layer's launch seconds of each class."""
        any_row = add[COUNT] > 0
        all_decode = add[DECODE_LIKE] == add[COUNT]
        k_ops = len(self.op_names)
        total = np.zeros((len(self.classes), add.shape[1]))
        for c in self.classes:
            if c.decode is None or c.prefill is None:  # no fit: the roofline of the summed op, weights once
                f = add[self.roof_at + c.k]
                b = add[self.roof_at + k_ops + c.k] + most[self.roof_most + c.k]
                launch = roofline_time(f, b, self.cal_peak, self.bandwidth)
            else:
                launch = by_phase(
                    all_decode, (c.decode, c.prefill), lambda p, cls=c.name: self._launch(cls, p, add, most)
                )
            total[c.k] = np.where(any_row, launch, 0.0)
        return total
