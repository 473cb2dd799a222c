"""Every step of a schedule priced at once: the engine's rule, the best path per step and per
request, and the rule at every threshold that changes a path, all on the same rows.

A schedule (scheduler.Schedule) is expanded into rows, a block of steps at a time (each
request's span of decode steps becomes one row a step), grouped by step. Each path's per-row
parts are worked out once (calibration.steps.PathLaunches); every comparison is then a sum over
those rows:

* the engine: each row on the path its rule gives (rules.step_paths), its own expand_chunked at
  its own chunk where it sets one (vLLM: the workspace over the step's prefills with context);
* the best path per step: the one path for all rows of the step that takes least (a path whose
  step's latent cache and expanded K/V exceed the GPU's memory, per layer, is never the best);
* the best path per request: each row on the path that takes least for it alone (weights left
  out, as `mlactl batch` does), the step then priced as launches;
* the sweep: for each step, the thresholds at which its paths change (rules.breakpoints), the
  step priced under the rule at each; the trace's time at any threshold is then a sum of steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.decide.calibration.steps import PathLaunches, group_max, group_sums
from mlactl.decide.calibration.time import path_times
from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.scheduler import Schedule
from mlactl.decide.workload import engine_cost
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.linear import linear_ops, row_features
from mlactl.util.defaults import REPLAY_LONG_PREFIX

ROWS_PER_BLOCK = 1 << 19  # rows priced at once: ~100 MB of arrays at the peak, whatever the trace
STEP_TYPES = ("decode", "prefill", "extend", "extend_long", "mixed_prefill", "mixed_extend", "mixed_extend_long")


@dataclass
class Rows:
    """A block of steps [first, first + steps) as rows grouped by step (decodes first in each).
    step: [rows] index within the block; starts: [steps] each step's first row."""

    first: int
    steps: int
    step: np.ndarray
    starts: np.ndarray
    new: np.ndarray
    prefix: np.ndarray
    decode: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """[steps] rows in each step."""
        return np.diff(self.starts, append=len(self.step))

    def gather(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, group): the rows of `steps` (the block's steps, in that order, a step named
        twice gathered twice), and for each row its step's place in `steps`."""
        n = self.counts[steps]
        return ranges(self.starts[steps], n), np.repeat(np.arange(len(steps)), n)


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """arange(start, start + count) for each (start, count), one after the other."""
    return np.repeat(starts, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))


def _bincounts(x: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """[F, groups]: each row of x [F, n] summed by `group` [n]."""
    return np.stack([np.bincount(group, weights=f, minlength=groups) for f in x])


def _decoders(s: Schedule) -> np.ndarray:
    """[decode counts]: how many requests decode at each decode count D."""
    d = int(s.decode.max()) + 1 if len(s.decode) else 0
    count = np.zeros(d + 1, dtype=np.int64)
    np.add.at(count, s.span_start, 1)
    np.add.at(count, s.span_end, -1)
    return np.cumsum(count)[:d]


def step_rows(s: Schedule) -> np.ndarray:
    """[steps]: rows in each step (the decodes of its decode count, and its chunks)."""
    n = len(s)
    rows = np.bincount(s.chunk_step, minlength=n)[:n].astype(np.int64)
    at = s.decode >= 0
    rows[at] += _decoders(s)[s.decode[at]]
    return rows


def blocks(s: Schedule, per_block: int = ROWS_PER_BLOCK):
    """[(first, last)) step ranges of at most `per_block` rows each (a step is never split)."""
    counts = np.cumsum(step_rows(s))
    first = 0
    while first < len(s):
        base = counts[first - 1] if first else 0
        last = int(np.searchsorted(counts, base + per_block, side="right"))
        last = max(last, first + 1)
        yield first, min(last, len(s))
        first = last


def rows_of(s: Schedule, first: int, last: int) -> Rows:
    """The rows of steps [first, last): in each step its decodes, then its chunks."""
    steps = last - first
    dec = s.decode[first:last]
    on = np.flatnonzero(dec >= 0)
    if len(on):
        lo_d, hi_d = int(dec[on[0]]), int(dec[on[-1]]) + 1  # decode counts rise with the steps
        step_of = np.full(hi_d - lo_d, -1, dtype=np.int64)
        step_of[dec[on] - lo_d] = on
        sp = np.flatnonzero((s.span_start < hi_d) & (s.span_end > lo_d))
        a = np.maximum(s.span_start[sp], lo_d)
        b = np.minimum(s.span_end[sp], hi_d)
        count = b - a
        total = int(count.sum())
        span = np.repeat(np.arange(len(sp)), count)
        d = ranges(a, count)
        d_prefix = s.span_c0[sp][span] + d - s.span_d0[sp][span]
        d_step = step_of[d - lo_d]
        # grouped by step (a radix sort where the block's steps fit 16 bits); within a step the
        # decodes keep their spans' order: no rule here depends on the order of decodes
        key = d_step.astype(np.uint16) if steps < 1 << 16 else d_step
        order = np.argsort(key, kind="stable")
        d_step, d_prefix = d_step[order], d_prefix[order]
    else:
        total = 0
        d_step = d_prefix = np.zeros(0, dtype=np.int64)
    a, b = np.searchsorted(s.chunk_step, [first, last])
    c_step = s.chunk_step[a:b] - first
    decodes = np.bincount(d_step, minlength=steps)
    chunks = np.bincount(c_step, minlength=steps)
    starts = np.cumsum(decodes + chunks) - (decodes + chunks)
    rows = total + (b - a)
    c_rank = np.arange(b - a) - np.searchsorted(c_step, c_step)
    d_at = np.arange(total) - (np.cumsum(decodes) - decodes)[d_step] + starts[d_step]
    c_at = starts[c_step] + decodes[c_step] + c_rank

    def place(d, c, dtype):
        out = np.empty(rows, dtype=dtype)
        out[d_at] = d
        out[c_at] = c
        return out

    step = place(d_step, c_step, np.int64)
    new = place(1, s.chunk_new[a:b], np.int64)
    prefix = place(d_prefix, s.chunk_prefix[a:b], np.int64)
    decode = place(True, False, bool)
    return Rows(first, steps, step, starts, new, prefix, decode)


def step_types(rows: Rows) -> np.ndarray:
    """[steps] an index into STEP_TYPES: decodes only; chunks only, with no prefix, some prefix
    or a long one (REPLAY_LONG_PREFIX tokens before a chunk); or both (mixed)."""
    n = rows.steps
    dec = np.bincount(rows.step, weights=rows.decode, minlength=n) > 0
    chunk = ~rows.decode
    has_chunk = np.bincount(rows.step, weights=chunk, minlength=n) > 0
    most = np.zeros(n)
    np.maximum.at(most, rows.step[chunk], rows.prefix[chunk])
    kind = np.where(most >= REPLAY_LONG_PREFIX, 2, np.where(most > 0, 1, 0))  # prefill, extend, extend_long
    return np.where(~has_chunk, 0, np.where(dec, 4, 1) + kind).astype(np.int8)


class Pricer:
    """Prices blocks of rows for one engine: the model, hardware and time model, and the paths.
    Paths are indices into rules.paths() ([rows] int8 "codes")."""

    def __init__(self, cost: CostModel, hw: HardwareProfile, calibration, engine: rules.Engine):
        self.cost, self.hw, self.cal, self.engine = cost, hw, calibration, engine
        self.layers = cost.cfg.layers
        self.paths = rules.paths(engine)
        # the path an engine runs at its own chunk (vLLM's workspace): expand_chunked; DSA's masked_expand
        self.chunked = rules.chunked_path(engine)
        # where a path cannot run at all (a DSA model's dense_expand past topk tokens)
        self.limited = [p for p in self.paths if p == "dense_expand"]
        # the cost model the engine's paths run with (vLLM's dense MHA with the whole indexer)
        self.engine_cost = engine_cost(cost, engine.params)
        self.memory = hw.memory_bytes
        self.decode_table = np.zeros(0, dtype=np.int8)  # own_choice of one token after p, by p
        self.chunked_code = self.paths.index(self.chunked) if self.chunked in self.paths else -1

    def figures(self, rows: Rows) -> list[PathLaunches]:
        """Each path's launches of the block's rows (the model's paths, the references'); the
        engine's own (engine_figs) differ where the engine runs a path otherwise (vLLM's dense
        MHA with the whole indexer)."""
        x = row_features(self.cost, rows.new, rows.prefix)  # shared by every path
        self.x = x
        self.every = (group_sums(x[:-1], rows.starts), group_max(x[-1:], rows.starts))
        figs = [
            PathLaunches(self.cost, self.hw, self.cal, p, rows.new, rows.prefix, self.layers, features=x)
            for p in self.paths
        ]
        self.engine_figs = list(figs)
        if self.engine_cost is not self.cost:
            for k, p in enumerate(self.paths):
                if linear_ops(self.engine_cost, p).names != figs[k].lin.names:
                    self.engine_figs[k] = PathLaunches(
                        self.engine_cost, self.hw, self.cal, p, rows.new, rows.prefix, self.layers, features=x
                    )
        return figs

    def engine_codes(self, rows: Rows) -> np.ndarray:
        return rules.step_codes(self.engine, rows.new, rows.prefix, rows.step, rows.decode, rows.steps)

    def engine_seconds(self, rows: Rows, codes, sel=None, group=None, groups=None, of=None):
        """[groups]: the engine's time per group of rows, after `figures(rows)`: the block's steps
        (sel None), or `groups` groups of the gathered rows `sel` ([k] row indices, contiguous by
        `group`; every group all the rows of the step `of` names)."""
        if sel is None:
            sel = np.arange(len(rows.new))
            group, groups, of = rows.step, rows.steps, np.arange(rows.steps)
        chunk = rules.own_chunk(self.engine, codes, rows.prefix[sel], group, groups)
        own = self.engine_figs  # the engine's paths as it runs them (figures() made them with figs)
        return self.launches(own, rows, codes, sel, group, groups, of, own_chunk=chunk, cost=self.engine_cost)

    def engine_class_launches(self, rows: Rows, codes) -> list:
        """Calibrated: `class_launches` of the engine's rule on the block's steps (as
        `engine_seconds` prices them), after `figures(rows)`."""
        chunk = rules.own_chunk(self.engine, codes, rows.prefix, rows.step, rows.steps)
        every = np.arange(len(rows.new))
        return self.class_launches(self.engine_figs, rows, codes, every, rows.step, rows.steps, chunk, self.engine_cost)

    def launches(self, figs, rows: Rows, codes, sel, group, groups, of, own_chunk=None, cost=None) -> np.ndarray:
        """[groups]: the launches of each group's rows, row sel[i] on path codes[i]; expand_chunked
        at `own_chunk` ([len(sel)]) where given, by `cost` (the engine's; default the model's).
        Roofline: every row has the same parts on every path (whole numbers: sums are exact), so
        the path most rows take is priced from the group's total less the others', and only the
        others' rows are gathered."""
        cost = self.cost if cost is None else cost
        if self.cal is not None:
            parts = self.class_launches(figs, rows, codes, sel, group, groups, own_chunk, cost)
            return sum((c.sum(axis=0) for c in parts if c is not None), np.zeros(groups))
        k_paths = len(self.paths)
        own_code = self.chunked_code if own_chunk is not None else -1  # the path priced at own_chunk
        counts = np.bincount(codes, minlength=k_paths)
        free = [k for k in range(k_paths) if k != own_code]
        dom = max(free, key=lambda k: counts[k]) if free else -1
        add_dom = self.every[0][:, of].copy()
        t = np.zeros(groups)
        for k in range(k_paths):
            if k == dom or not counts[k]:
                continue
            idx = np.flatnonzero(codes == k)
            rows_k = sel[idx]
            if k == own_code:
                x = row_features(cost, rows.new[rows_k], rows.prefix[rows_k], own_chunk[idx])
            else:
                x = self.x[:, rows_k]
            g = group[idx]
            add = _bincounts(x[:-1], g, groups)
            most = np.zeros(groups)
            np.maximum.at(most, g, x[-1])
            t += figs[k].seconds_of(add, most[None])
            # the group's total holds these rows' shared (mlactl --chunk) parts
            add_dom -= _bincounts(self.x[:-1, rows_k], g, groups) if k == own_code else add
        if dom >= 0 and counts[dom]:
            most = np.zeros((1, groups))
            if figs[dom].lin.uses_partials:
                idx = np.flatnonzero(codes == dom)
                np.maximum.at(most[0], group[idx], self.x[-1, sel[idx]])
            t += figs[dom].seconds_of(add_dom, most)
        return t

    def class_launches(self, figs, rows: Rows, codes, sel, group, groups, own_chunk=None, cost=None) -> list:
        """Calibrated, per path: [classes, groups] each op class's launch seconds of the rows on
        it (as `launches`), or None where no row takes the path."""
        cost = self.cost if cost is None else cost
        own_code = self.chunked_code if own_chunk is not None else -1
        starts = np.searchsorted(group, np.arange(groups))
        out: list = []
        for k, p in enumerate(self.paths):
            on = codes == k
            if not on.any():
                out.append(None)
            elif k == own_code:
                sub = np.flatnonzero(on)
                n_, p_ = rows.new[sel[sub]], rows.prefix[sel[sub]]
                own = PathLaunches(cost, self.hw, self.cal, p, n_, p_, self.layers, chunk=own_chunk[sub])
                present, first = np.unique(group[sub], return_index=True)
                t = np.zeros((len(own.classes), groups))
                t[:, present] = own.class_seconds(first)
                out.append(t)
            else:
                out.append(figs[k].class_seconds(starts, rows=sel, mask=on))
        return out

    def references(self, figs, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
        """([steps] best one path per step, [steps] each request on its own best path)."""
        step_best = np.full(rows.steps, np.inf)
        for k, ok in enumerate(self.step_fits(rows)):
            t = figs[k].seconds_of(*self.every) if self.cal is None else figs[k].seconds(rows.starts)
            step_best = np.minimum(step_best, np.where(ok, t, np.inf))
        choice = self.own_choice(rows)
        every_row = np.arange(len(rows.new))
        request_best = self.launches(figs, rows, choice, every_row, rows.step, rows.steps, np.arange(rows.steps))
        return step_best, request_best

    def step_fits(self, rows: Rows) -> np.ndarray:
        """[paths, steps]: whether each path can run the whole step: its latent cache and the
        expanded K/V it holds fit the GPU's memory (per layer), and every row can run it."""
        context = group_sums((rows.new + rows.prefix).astype(np.float64), rows.starts)
        out = np.zeros((len(self.paths), rows.steps), dtype=bool)
        for k, p in enumerate(self.paths):
            resident = group_sums(self.cost.peak_expanded_bytes(p, 1, rows.new, rows.prefix), rows.starts)
            out[k] = context * self.cost.cache_row_bytes() + resident <= self.memory
            if p in self.limited:  # every row of the step must be able to run it
                cannot = (~self.cost.applicable(p, 1, rows.new, rows.prefix)).astype(np.float64)
                out[k] &= group_sums(cannot, rows.starts) == 0
        return out

    def own_choice(self, rows: Rows) -> np.ndarray:
        """[rows]: the code of the path each row takes least time on alone (weights left out)
        among those whose cache and expanded K/V fit; ties to the first. Decode rows (one new
        token) are looked up in a table of their prefixes, each prefix priced once."""
        one = (rows.new == 1) & (rows.prefix > 0)
        out = np.empty(len(rows.new), dtype=np.int8)
        if one.any():
            hi = int(rows.prefix[one].max())
            if len(self.decode_table) <= hi:  # priced once per prefix, kept for the next blocks
                p = np.arange(max(hi + 1, 2 * len(self.decode_table)))
                self.decode_table = self._own_codes(np.ones_like(p), p)
            out[one] = self.decode_table[rows.prefix[one]]
        rest = ~one
        if rest.any():
            out[rest] = self._own_codes(rows.new[rest], rows.prefix[rest])
        return out

    def _own_codes(self, new, prefix) -> np.ndarray:
        if self.cal is None:
            x = row_features(self.cost, new, prefix)
            own = [
                PathLaunches(self.cost, self.hw, None, p, new, prefix, self.layers, features=x).own_seconds()
                for p in self.paths
            ]
        else:
            timed = path_times(self.cost, self.hw, self.cal, 1, new, prefix, self.paths, self.layers)
            own = [timed[p].time_s for p in self.paths]
        fits = [
            (self.cost.resident_bytes(p, 1, new, prefix) <= self.memory) & self.cost.applicable(p, 1, new, prefix)
            for p in self.paths
        ]
        return np.stack([np.where(f, t, np.inf) for f, t in zip(fits, own)]).argmin(axis=0).astype(np.int8)

    def sweep(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The engine's rule at each threshold that changes a step's paths: (step [k], threshold
        [k], seconds [k]), threshold 1 for every step that has other values (the rest run the
        same at any threshold)."""
        e = self.engine
        bp_step, bp_value = rules.breakpoints(e, rows.new, rows.prefix, rows.step, rows.decode, rows.steps)
        varying = np.unique(bp_step)
        steps = np.concatenate([varying, bp_step])
        values = np.concatenate([np.ones(len(varying), dtype=np.int64), bp_value])
        if not len(steps):
            return steps, values, np.zeros(0)
        order = np.argsort(steps, kind="stable")  # each step's regimes together
        steps, values = steps[order], values[order]
        sel, group = rows.gather(steps)
        codes = rules.step_codes(e, rows.new[sel], rows.prefix[sel], group, rows.decode[sel], len(steps), values[group])
        seconds = self.engine_seconds(rows, codes, sel=sel, group=group, groups=len(steps), of=steps)
        return steps, values, seconds
