"""The 80% intervals of a calibrated replay's totals: the engine's attention time, the best, and
what the rule loses against the best path per step, per request and both.

A calibrated time's draws (mlactl.decide.calibration.uncertainty) are per op class and fixed
within a draw: draw s scales every point of an op class by what its member, residual level and
step choice give there. A replay step is launches, one per op class and path over the step's
rows (calibration.steps.PathLaunches); draw s of a launch is its point seconds times the draw's
factor for that op class over those rows, as `estimate.batch_interval` scales a batch:

* an op that reads each row's own keys (attention, the indexer, top-k; a whole-path fit): the
  factor is sum over the rows of their draws over the sum of their point times (a row's own time
  weighs its factor);
* a projection (a GEMM over the launch's summed rows): the factor at the launch's summed shape,
  where `near` and the basis of the projection are judged too.

Each step's draws are then compared within the draw: the engine's rule, the best one path for
the step (a path that cannot hold the step is never best), each request on its own best path
(the point times' choice), and the least of the three, as pricing.py does with point times; the
trace's totals are summed draw by draw and the interval taken over the draws.

Two economies, both checked against drawing every row and every step
(tests/test_replay_intervals.py):

* **cells**: a row's draws are looked up in cells of CELLS_PER_OCTAVE to the octave of its new
  tokens and of its prefix (every count to 11 is its own cell), each cell's draws computed once
  at a representative shape and kept for the rest of the trace: a trace of millions of rows has
  a few thousand cells;
* **a sample of steps**: above INTERVAL_STEPS steps, what a draw adds to a total's point value
  (each step's draw less its point value) is summed over a Poisson sample of about that many
  steps, each step's probability proportional to its calibrated attention time, LOSS_BOOST
  times that where the rule loses (capped at 1; `sample_size`), weighted by 1 / probability
  (Horvitz-Thompson, as `mlactl engines` samples a workload's shapes). The point values are
  always every step's; only the draws' departures from them are sampled, which vary far less
  from step to step than the times do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.estimate import estimates, has_evidence
from mlactl.decide.calibration.model import PROJECTIONS
from mlactl.decide.calibration.steps import group_sums
from mlactl.decide.loss import RuleLoss, Span, lost_against
from mlactl.decide.replay.pricing import Pricer, Rows

CELLS_PER_OCTAVE = 8
INTERVAL_STEPS = 16384  # steps whose draws are summed, about; every step below this many
ROWS_PER_CHUNK = 1 << 15  # rows whose draws are held at once: [rows, 128] float64, 32 MB
SAMPLE_SEED = 22
LOSS_BOOST = 10.0  # a step where the rule loses is drawn this many times likelier (sample_size)
CELL_SPAN = 1 << 12  # code = new cell * CELL_SPAN + prefix cell (prefix cells < 512 to 2**63)
TOTALS = ("time", "best", "lost", "lost_step", "lost_request")


def cell_codes(new, prefix) -> np.ndarray:
    """[n] int64: each (new, prefix)'s cell: floor(C log2 new), and 0 for no prefix else
    1 + floor(C log2 prefix), C = CELLS_PER_OCTAVE."""
    c = CELLS_PER_OCTAVE
    n = np.floor(c * np.log2(np.maximum(np.asarray(new, dtype=np.float64), 1.0))).astype(np.int64)
    p = np.asarray(prefix, dtype=np.float64)
    q = np.where(p > 0, 1 + np.floor(c * np.log2(np.maximum(p, 1.0))), 0).astype(np.int64)
    return n * CELL_SPAN + q


def _middle(q: np.ndarray) -> np.ndarray:
    """The whole number at the geometric middle of cell q (of C to the octave), kept in the cell."""
    c = CELLS_PER_OCTAVE
    lo, hi = np.ceil(2.0 ** (q / c)), np.ceil(2.0 ** ((q + 1) / c)) - 1
    return np.clip(np.round(2.0 ** ((q + 0.5) / c)), lo, np.maximum(lo, hi))


def cell_shapes(codes) -> tuple[np.ndarray, np.ndarray]:
    """(new, prefix) standing for each cell: its geometric middle."""
    codes = np.asarray(codes, dtype=np.int64)
    qn, qp = codes // CELL_SPAN, codes % CELL_SPAN
    return _middle(qn), np.where(qp > 0, _middle(qp - 1), 0.0)


class Cells:
    """One path's op classes at cells, computed as rows first reach them: `time` [classes, n]
    the point seconds, `draws` [classes, n, S]. `names`: the path's launches' op names (each
    class's), or None for a whole-path fit."""

    def __init__(self, cost, hw, calibration, path: str, names: list[str] | None, scenarios: int):
        self.cost, self.hw, self.cal, self.path, self.names, self.s = cost, hw, calibration, path, names, scenarios
        self.codes = np.zeros(0, dtype=np.int64)
        k = 1 if names is None else len(names)
        self.time = np.zeros((k, 0))
        self.draws = np.zeros((k, 0, scenarios))

    def index(self, codes) -> np.ndarray:
        """Each code's position in the arrays (computing the cells not seen yet)."""
        codes = np.asarray(codes, dtype=np.int64)
        missing = np.setdiff1d(np.unique(codes), self.codes)
        if len(missing):
            new, prefix = cell_shapes(missing)
            est = estimates(self.cost, self.hw, self.cal, 1, new, prefix, (self.path,))[self.path]
            ops = list(est.ops.values()) if self.names is None else [est.ops[n] for n in self.names]
            t = np.stack([np.broadcast_to(np.reshape(o.time, -1), missing.shape) for o in ops]).astype(np.float64)
            d = np.stack(
                [np.broadcast_to(o.scenarios(self.s).reshape(self.s, -1).T, (len(missing), self.s)) for o in ops]
            )
            codes_all = np.concatenate([self.codes, missing])
            order = np.argsort(codes_all)
            self.codes = codes_all[order]
            self.time = np.concatenate([self.time, t], axis=1)[:, order]
            self.draws = np.concatenate([self.draws, d], axis=1)[:, order]
        return np.searchsorted(self.codes, codes)

    def factors(self, k: int, at: np.ndarray) -> np.ndarray:
        """[len(at), S]: class k's draws over its point time at cells `at` (1 where it takes none)."""
        t = self.time[k, at]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(t[:, None] > 0, self.draws[k, at] / t[:, None], 1.0)


@dataclass
class Totals:
    """[S] each total's draws less its point value, summed over the steps drawn (weighted): a
    total's draw is its point value (every step's) plus this (the difference estimator: a step's
    draws move with its point value, so what is sampled is only how far they move)."""

    time: np.ndarray
    best: np.ndarray
    lost: np.ndarray
    lost_step: np.ndarray
    lost_request: np.ndarray

    @classmethod
    def zeros(cls, scenarios: int) -> Totals:
        return cls(*(np.zeros(scenarios) for _ in TOTALS))

    def spans(self, loss: RuleLoss) -> RuleLoss:
        """The point totals `loss` with each one's 80% interval (RuleLoss.with_spans widens each
        to hold its point value); None where a draw's total is not finite."""

        def span(name: str) -> Span | None:
            d = getattr(loss, f"{name}_s") + getattr(self, name)
            if name != "time" and name != "best":  # a loss is never below 0 (a sampled departure can be)
                d = np.maximum(d, 0.0)
            if not np.all(np.isfinite(d)):
                return None
            lo, hi = u.percentiles(d)
            return float(lo), float(hi)

        return loss.with_spans(*(span(name) for name in TOTALS))


def sample_size(engine: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """[steps] what a step's chance to be drawn is proportional to: its attention time under the
    rule (a draw's departure from a time grows with it), LOSS_BOOST times that where the rule
    loses at the point values (a loss lives in few steps: they are drawn more often, and weigh
    less each)."""
    return engine * np.where(lost > 0, LOSS_BOOST, 1.0)


def step_weights(size: np.ndarray, target: int | None = None, seed: int = SAMPLE_SEED) -> np.ndarray:
    """[steps] each step's weight in the drawn totals: 1 for every step up to `target` steps
    (default INTERVAL_STEPS); above, a Poisson sample with probability proportional to `size`
    (capped at 1; the capped steps' share goes to the rest), weight 1 / probability, 0 for the
    steps not drawn. Seeded: the same schedule draws the same steps."""
    target = INTERVAL_STEPS if target is None else target
    n = len(size)
    if n <= target:
        return np.ones(n)
    size = np.where(np.isfinite(size) & (size > 0), size, 0.0)
    floor = size[size > 0].min() if (size > 0).any() else 1.0
    drawn, prob = u.poisson_sample(np.maximum(size, floor), target, seed)
    return np.where(drawn, 1.0 / prob, 0.0)


def sub_rows(rows: Rows, steps: np.ndarray) -> Rows:
    """The rows of some of a block's steps (in order) as a block of their own."""
    at, step = rows.gather(steps)
    counts = rows.counts[steps]
    starts = np.cumsum(counts) - counts
    return Rows(rows.first, len(steps), step, starts, rows.new[at], rows.prefix[at], rows.decode[at])


class Drawer:
    """Draws a calibrated replay's totals for one engine, a block of steps at a time:

    drawer = Drawer(pricer, weights)        # weights: step_weights over the schedule
    for each block: drawer.add(rows)       # after the block is priced
    drawer.totals.spans(loss)               # loss: the point totals (a RuleLoss)
    """

    def __init__(self, pricer: Pricer, weights: np.ndarray, scenarios: int = u.SCENARIOS):
        self.p, self.w, self.s = pricer, np.asarray(weights, dtype=np.float64), scenarios
        self.totals = Totals.zeros(scenarios)
        self.cells: dict[tuple[int, str], Cells] = {}

    @staticmethod
    def possible(pricer: Pricer) -> bool:
        """Whether every op of the engine's paths has an interval (a calibration with evidence)."""
        p = pricer
        if p.cal is None:
            return False
        return has_evidence(p.cost, p.hw, p.cal, p.paths) and has_evidence(p.engine_cost, p.hw, p.cal, p.paths)

    def add(self, rows: Rows) -> None:
        weights = self.w[rows.first : rows.first + rows.steps]
        drawn = np.flatnonzero(weights > 0)
        counts = rows.counts
        start = 0
        while start < len(drawn):
            # whole steps, at most ROWS_PER_CHUNK rows (one step at least)
            ends = np.cumsum(counts[drawn[start:]])
            stop = start + max(1, int(np.searchsorted(ends, ROWS_PER_CHUNK, side="right")))
            steps = drawn[start:stop]
            self._add(sub_rows(rows, steps), weights[steps])
            start = stop

    def _add(self, rows: Rows, w: np.ndarray) -> None:
        p = self.p
        figs = p.figures(rows)
        codes = p.engine_codes(rows)
        every = np.arange(len(rows.new))
        cells = cell_codes(rows.new, rows.prefix)
        engine = self._sum(p.engine_figs, p.engine_class_launches(rows, codes), codes, rows, cells)
        choice = p.own_choice(rows)
        launches = p.class_launches(figs, rows, choice, every, rows.step, rows.steps)
        request = self._sum(figs, launches, choice, rows, cells)
        step = np.full((rows.steps, self.s + 1), np.inf)
        ones = np.zeros(len(rows.new), dtype=np.int8)
        for k, ok in enumerate(p.step_fits(rows)):
            one: list = [None] * len(p.paths)
            one[k] = figs[k].class_seconds(rows.starts)
            t = self._sum(figs, one, ones + k, rows, cells)
            step = np.minimum(step, np.where(ok[:, None], t, np.inf))
        best = np.minimum(np.minimum(engine, step), request)
        with np.errstate(invalid="ignore"):
            totals = {
                "time": engine,
                "best": best,
                "lost": engine - best,
                "lost_step": lost_against(engine, step),
                "lost_request": lost_against(engine, request),
            }
            for name, t in totals.items():  # each step's draws less its point value (the last column)
                dev = t[:, :-1] - t[:, -1:]
                getattr(self.totals, name)[:] += w @ np.where(np.isfinite(dev), dev, 0.0)

    def _table(self, fig) -> Cells:
        key = (id(fig.cost), fig.path)
        if key not in self.cells:
            whole = len(fig.class_names) == 1 and fig.class_names[0].startswith("path:")
            names = None if whole else list(fig.op_names)
            self.cells[key] = Cells(fig.cost, self.p.hw, self.p.cal, fig.path, names, self.s)
        return self.cells[key]

    def _sum(self, figs, launches: list, codes, rows: Rows, cells: np.ndarray) -> np.ndarray:
        """[steps, S + 1]: each step's draws of these launches (per path [classes, steps] or
        None), row i on path codes[i], and last, the launches' point seconds."""
        out = np.zeros((rows.steps, self.s + 1))
        for k, parts in enumerate(launches):
            if parts is None:
                continue
            fig, on = figs[k], np.flatnonzero(codes == k)
            table = self._table(fig)
            # the launches' summed shapes (a projection's factor is taken there)
            new = group_sums(np.where(codes == k, rows.new, 0).astype(np.float64), rows.starts)
            prefix = group_sums(np.where(codes == k, rows.prefix, 0).astype(np.float64), rows.starts)
            launched = np.flatnonzero(new > 0)
            at = table.index(np.concatenate([cells[on], cell_codes(new[launched], prefix[launched])]))
            at, whole_at = at[: len(on)], at[len(on) :]
            # each row's factor weighs by its point time: per step, its rows' draws over their times
            n_cells = len(table.codes)
            pairs, count = np.unique(rows.step[on] * n_cells + at, return_counts=True)
            p_step, p_cell = pairs // n_cells, pairs % n_cells
            first = np.flatnonzero(np.r_[True, p_step[1:] != p_step[:-1]])
            present = p_step[first]
            for c, name in enumerate(fig.class_names):
                if not parts[c].any():
                    continue
                f = np.ones((rows.steps, self.s))
                if name in PROJECTIONS:
                    f[launched] = table.factors(c, whole_at)
                else:
                    num = np.add.reduceat(count[:, None] * table.draws[c, p_cell], first, axis=0)
                    den = np.add.reduceat(count * table.time[c, p_cell], first)
                    with np.errstate(divide="ignore", invalid="ignore"):
                        f[present] = np.where(den[:, None] > 0, num / den[:, None], 1.0)
                out[:, :-1] += parts[c][:, None] * f
            out[:, -1] += parts.sum(axis=0)
        return out
