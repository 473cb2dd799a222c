"""`batch_time` over many scheduler steps at once: what `mlactl replay` prices its steps with.

A step is a mixed batch of request rows (one request each: new tokens after a prefix), each row
on one path. As in `calibration.time.batch_time`, the rows of a step on one path run as one
launch per op: roofline, the op's summed FLOPs and bytes with the weights read once (the most
any row reads: expand_chunked reads them once per chunk); calibrated, one fixed cost, the rows'
compute, memory and serial seconds each summed, the weights' memory time counted once, the
decode fit where every row of the launch is decode-like, and a projection's `near` factor at
the launch's summed shape. tests/test_replay_steps.py checks this against `batch_time`.

Each row's part is worked out once (`PathLaunches`): quantities that add up over a launch's rows
and ones of which a launch takes the most. A launch is then a sum over rows, so any grouping of
rows into steps, any subset (a mask) and any rows gathered again (the threshold sweep prices a
step under several rules from the same rows) costs a `reduceat`, not cost.py again. Roofline
rows need only six numbers each (eight for a DSA model; mlactl.model.linear: cost.py's ops are
linear in them), shared by every path; calibrated rows keep each op class's terms.

    launches = PathLaunches(cost, hw, calibration, "absorb", new, prefix, layers=61)
    seconds = launches.seconds(starts, mask=rows_on_absorb)   # [steps]

`starts[g]` is the first row of group g; rows (or the gathered `rows`) are contiguous by group
and every group has at least one row. Arrays are [rows] unless said; parts are [parts, rows].
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlactl.decide.calibration.model import (
    PROJECTIONS,
    added_seconds,
    busy_seconds,
    components,
    decode_like,
    memory_eta,
    near_factor,
    op_class,
    tile_waves,
)
from mlactl.decide.calibration.sources import points_for
from mlactl.decide.calibration.time import fit_dtype, whole_path_fit
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.linear import linear_ops, row_features
from mlactl.model.roofline import roofline_time

# columns every calibrated launch needs besides its fits': rows, decode-like rows, new, prefix
COUNT, DECODE_LIKE, NEW, PREFIX = range(4)


def group_sums(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of x ([rows] or [columns, rows]) over each group of rows: [(columns,) groups]."""
    if not len(starts):
        return np.zeros(x.shape[:-1] + (0,))
    return np.add.reduceat(x, starts, axis=-1)


def group_max(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if not len(starts):
        return np.zeros(x.shape[:-1] + (0,))
    return np.maximum.reduceat(x, starts, axis=-1)


class PathLaunches:
    """Per-row parts of one path's launches: `add` [A, rows] adds up over a launch, `most`
    [M, rows] takes the largest. `chunk` ([rows] or None): the prefix tokens per chunk each
    row's expand_chunked runs at (an engine's own, e.g. vLLM's workspace over its prefills);
    None: cost.chunk. `features`: row_features of these rows at that chunk, when already made."""

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
    ):
        self.path, self.layers, self.cal, self.cost = path, layers, calibration, cost
        self.new = np.asarray(new, dtype=np.float64)
        self.prefix = np.asarray(prefix, dtype=np.float64)
        self.lin = linear_ops(cost, path)
        self.op_names = self.lin.names
        self.peak, self.bandwidth, self.sm_count = hw.peak_flops(cost.dtype), hw.bandwidth, hw.sm_count
        # [F + 1, rows]: the features and the partials (at each row's chunk): shared between paths
        self.x = row_features(cost, self.new, self.prefix, chunk) if features is None else features
        if calibration is None:
            self.add, self.most = self.x[:-1], self.x[-1:]
        else:
            self.cal_peak = calibration.peak(hw)
            self._calibrated(hw, chunk)

    def own_seconds(self) -> np.ndarray:
        """Each row alone, the weights left out (as `own_times` times a request), roofline."""
        f = self.lin.flops @ self.x[:-1]  # [ops, rows]
        b = self.lin.bytes @ self.x[:-1]
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
        return [cls for _, cls, _ in self.classes]

    def _calibrated(self, hw: HardwareProfile, chunk) -> None:
        """Per op class (or the whole path) and phase: each row's compute, memory, serial and
        added seconds and its weights' memory seconds, as `_launch_seconds` sums them; classes
        with no fit keep the roofline of their summed op."""
        cal, path, cost = self.cal, self.path, self.cost
        bandwidth = hw.bandwidth
        groups = [(cost, np.arange(len(self.new)))]
        if chunk is not None:
            chunk = np.asarray(chunk, dtype=np.int64)
            groups = [(replace(cost, chunk=int(c)), np.flatnonzero(chunk == c)) for c in np.unique(chunk)]
        whole = whole_path_fit(cost, cal, path)
        names = [f"path:{path}"] if whole else [op_class(path, op) for op in self.op_names]
        on_decode = decode_like(self.new, self.prefix)
        lin, x = self.lin, self.x
        weights = lin.weights[:, :1] + lin.weights[:, 1:] * x[-1]  # [ops, rows]
        add = [np.ones(len(self.new)), on_decode * 1.0, self.new, self.prefix]
        most: list = []
        self.classes = []
        for k, cls in enumerate(names):
            phases: dict[str, tuple | None] = {}
            for phase in ("decode", "prefill"):
                fit = whole or cal.fit_for(cls, fit_dtype(cost, cls), phase)
                if fit is None:
                    phases[phase] = None
                    continue
                parts = np.zeros((5, len(self.new)))  # compute, memory, serial, added, weights
                fixed = 0.0
                # `l2` is decided by the launch's bytes: the rows' memory is kept at eta_m (HBM)
                hbm = [t for t in fit["terms"] if t != "l2"]
                for c, at in groups:
                    pts = points_for(c, cls, 1, self.new[at], self.prefix[at], None, path=path)
                    fixed, parts[0, at], parts[1, at], parts[2, at] = components(
                        fit["params"], hbm, pts, self.cal_peak, bandwidth, hw.sm_count
                    )
                    parts[3, at] = added_seconds(fit["params"], fit["terms"], pts, bandwidth, hw.sm_count)
                w = weights.sum(axis=0) if whole else weights[k]
                parts[4] = w / (fit["params"]["eta_m"] * bandwidth)
                near = None
                if "near" in fit["terms"] and cls in PROJECTIONS and fit["params"].get("near"):
                    near = fit["params"]["near"]
                phases[phase] = (float(fixed), len(add), len(most), near, fit)
                add += list(parts)
                most.append(parts[4])
            self.classes.append((k, cls, phases))
        self.roof_at, self.roof_most = len(add), len(most)
        add += list(lin.flops @ x[:-1]) + list(lin.bytes @ x[:-1])
        most += list(weights)
        self.add, self.most = np.stack(add), np.stack(most)

    def _calibrated_seconds(self, add: np.ndarray, most: np.ndarray) -> np.ndarray:
        """[classes, groups]: one layer's launch seconds of each class."""
        any_row = add[COUNT] > 0
        all_decode = add[DECODE_LIKE] == add[COUNT]
        k_ops = len(self.op_names)
        total = np.zeros((len(self.classes), add.shape[1]))
        for k, cls, phases in self.classes:
            out: dict[str, np.ndarray | None] = {}
            for phase, found in phases.items():
                if found is None:
                    out[phase] = None
                    continue
                fixed, a, m, near, fit = found
                params, terms = fit["params"], fit["terms"]
                t_c, t_m, serial, added, w = add[a : a + 5]
                memory = t_m - w + most[m]  # seconds at eta_m
                if "l2" in terms and cls in PROJECTIONS:  # the launch's whole working set decides L2
                    launch_bytes = memory * params["eta_m"] * self.bandwidth
                    memory = memory * params["eta_m"] / memory_eta(params, terms, cls, launch_bytes)
                # one GEMM over all the rows' tokens: its shape (bucket, tiles) is the summed one's
                whole = None
                if cls in PROJECTIONS and (near is not None or "pipe" in terms):
                    whole = points_for(self.cost, cls, 1, add[NEW], add[PREFIX], None, path=self.path)
                waves = None
                if "pipe" in terms and whole is not None and self.sm_count:
                    waves = np.maximum(np.reshape(tile_waves(whole, terms, self.sm_count), -1), 1.0)
                launch = fixed + added + np.maximum(busy_seconds(t_c, memory, terms, waves), serial)
                if near is not None and whole is not None:
                    launch = launch * np.asarray(near_factor(near, whole), dtype=np.float64).reshape(-1)
                out[phase] = launch
            decode, prefill = out["decode"], out["prefill"]
            if decode is None or prefill is None:  # no fit: the roofline of the summed op, weights once
                f = add[self.roof_at + k]
                b = add[self.roof_at + k_ops + k] + most[self.roof_most + k]
                launch = roofline_time(f, b, self.cal_peak, self.bandwidth)
            else:
                launch = np.where(all_decode, decode, prefill)
            total[k] = np.where(any_row, launch, 0.0)
        return total
