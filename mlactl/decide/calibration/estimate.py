"""Calibrated times with their intervals and each op's basis: the uncertainty beside `path_times`.

`path_times` (time.py) gives the point value of every time; this module gives what stands behind
it, by the same fits:

    est = estimates(cost, hw, calibration, batch, new, prefix, paths)   # {path: PathEstimate}
    est["absorb"].interval()          # (lo, hi) seconds: the 80% interval of the path's time
    est["absorb"].ops["attention"]    # OpEstimate: its time, interval, basis per point

    path_scenarios(...)               # {path: [S, ...] seconds}: draw by draw, for derived figures
    loss_interval(scenarios, chosen)  # the interval of what a choice of paths loses
    crossover_intervals(...)          # the interval of each prefix's crossover

How an interval is drawn is mlactl.decide.calibration.uncertainty's docstring; how a basis is
decided, basis.py's. Where a calibration has a decode and a prefill fit of an op class, a point
takes the one `time.op_seconds` takes, and where that fit's basis is `extrapolated` the other
fit's time joins its members (both tables stand for the same kernel: beyond one table's shapes
the other may know more).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from mlactl.decide.calibration import basis as basis_mod
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.model import OP_CLASSES, PATH_CLASSES, decode_like, op_class
from mlactl.decide.calibration.sources import points_for
from mlactl.decide.calibration.store import Fit
from mlactl.decide.calibration.time import launch_parts, predict_fit, scaled_ops
from mlactl.model.cost import MLA_PATHS, CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.roofline import path_time

KEYS = {c: i for i, c in enumerate(OP_CLASSES + PATH_CLASSES)}  # each op class's own draws


@dataclass(frozen=True)
class OpEstimate:
    """One op's calibrated seconds at each point and what its interval is drawn from: one
    OpSpread per fit used (decode, prefill), each over the points `mask` gives it."""

    cls: str
    time: np.ndarray
    parts: list  # [(mask, OpSpread)]
    basis: np.ndarray  # per point: measured, extrapolated or roofline
    octaves: np.ndarray  # per point: octaves beyond the measured range (0 inside)
    axis: np.ndarray  # per point: the axis farthest out ("" inside)

    @classmethod
    def alone(cls, name: str, spread: u.OpSpread) -> OpEstimate:
        """An op timed by one spread at every point."""
        return cls(name, spread.time, [(np.ones(np.shape(spread.time), bool), spread)], spread.basis, spread.octaves,
                   spread.axis)  # fmt: skip

    @property
    def has_interval(self) -> bool:
        return all(spread.has_interval for _, spread in self.parts)

    def scenarios(self, scenarios: int = u.SCENARIOS) -> np.ndarray:
        """[S, ...] seconds, draw by draw (the op class's own draws)."""
        out = np.zeros((scenarios,) + np.shape(self.time))
        for mask, spread in self.parts:
            d = u.draws(KEYS.get(self.cls, 0), len(spread.alternatives), scenarios)
            out = np.where(mask, spread.scenarios(d), out)
        return out

    def interval(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The 80% interval of the op's time, widened to hold its point value (a roofline op's
        point value is its lowest possible time)."""
        if not self.has_interval:
            return None
        return u.interval_around(self.scenarios(), self.time)

    def basis_json(self, i: int) -> dict:
        """{"basis", ["octaves", "axis"]} of point i, as the JSON outputs write it."""
        code = str(self.basis.reshape(-1)[i])
        if code != basis_mod.EXTRAPOLATED:
            return {"basis": code}
        octaves = float(self.octaves.reshape(-1)[i])
        return {
            "basis": code,
            "octaves": None if not np.isfinite(octaves) else round(octaves, 2),
            "axis": str(self.axis.reshape(-1)[i]),
        }


@dataclass(frozen=True)
class PathEstimate:
    """A path's calibrated seconds and its ops' estimates; a whole-path fit is its one op."""

    name: str
    time: np.ndarray
    ops: dict[str, OpEstimate] = field(default_factory=dict)

    @property
    def has_interval(self) -> bool:
        return all(op.has_interval for op in self.ops.values())

    def scenarios(self, scenarios: int = u.SCENARIOS) -> np.ndarray:
        return functools.reduce(np.add, (op.scenarios(scenarios) for op in self.ops.values()))

    def interval(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The 80% interval of the path's time, widened to hold its point value."""
        if not self.has_interval:
            return None
        return u.interval_around(self.scenarios(), self.time)

    def basis(self) -> np.ndarray:
        """Per point, the weakest basis of its ops: roofline, then extrapolated, then measured."""
        order = {basis_mod.MEASURED: 0, basis_mod.EXTRAPOLATED: 1, basis_mod.ROOFLINE: 2}
        codes = np.stack([np.vectorize(order.get)(op.basis.reshape(-1)) for op in self.ops.values()])
        names = np.array([basis_mod.MEASURED, basis_mod.EXTRAPOLATED, basis_mod.ROOFLINE], dtype=object)
        return names[codes.max(axis=0)].reshape(np.shape(self.time))


@dataclass(frozen=True)
class Spans:
    """Intervals and bases of a grid of points, ready to print: per path its (lo, hi) and the
    weakest basis of its ops; per op its (lo, hi) and basis (OpEstimate)."""

    paths: dict[str, tuple[np.ndarray, np.ndarray] | None]
    path_basis: dict[str, np.ndarray]
    ops: dict[str, dict[str, tuple[np.ndarray, np.ndarray] | None]]
    op_estimates: dict[str, dict[str, OpEstimate]]


CHUNK = 4096  # points whose draws are held at once


def spans(cost, hw, calibration, batch, new, prefix, paths=MLA_PATHS, layers: int = 1) -> Spans:
    """`estimates` reduced to intervals and bases, CHUNK points at a time (the draws of a million
    points would not fit in memory at once). batch, new, prefix: 1-D arrays of one length."""
    batch, new, prefix = (np.asarray(a).reshape(-1) for a in np.broadcast_arrays(batch, new, prefix))
    parts = [
        estimates(cost, hw, calibration, batch[i : i + CHUNK], new[i : i + CHUNK], prefix[i : i + CHUNK], paths, layers)
        for i in range(0, len(new), CHUNK)
    ]

    def cat(values):
        return None if any(v is None for v in values) else tuple(np.concatenate(x) for x in zip(*values))

    names = {p: list(parts[0][p].ops) for p in paths} if parts else {p: [] for p in paths}
    return Spans(
        paths={p: cat([e[p].interval() for e in parts]) for p in paths},
        path_basis={p: np.concatenate([e[p].basis().reshape(-1) for e in parts]) for p in paths},
        ops={p: {o: cat([e[p].ops[o].interval() for e in parts]) for o in names[p]} for p in paths},
        op_estimates={p: {o: _joined([e[p].ops[o] for e in parts]) for o in names[p]} for p in paths},
    )


def _joined(ops: list[OpEstimate]) -> OpEstimate:
    """The chunks' bases of one op as one OpEstimate (its parts are not kept: bases only)."""
    return OpEstimate(
        ops[0].cls,
        np.concatenate([np.reshape(o.time, -1) for o in ops]),
        [],
        np.concatenate([np.reshape(o.basis, -1) for o in ops]),
        np.concatenate([np.reshape(o.octaves, -1) for o in ops]),
        np.concatenate([np.reshape(o.axis, -1) for o in ops]),
    )


def _fit_spread(cost, hw, calibration, fit: Fit, cls: str, batch, new, prefix, path, layers) -> u.OpSpread:
    """One fit's OpSpread at the points (`spread_of` on cost.py's figures there)."""
    pts = points_for(cost, cls, batch, new, prefix, None, path=path)
    return spread_of(fit, cls, pts, calibration.peak(hw), hw.bandwidth, hw.sm_count, layers)


def spread_of(fit: Fit, cls: str, pts, peak: float, bandwidth: float, sm_count, layers: int = 1) -> u.OpSpread:
    """One fit's OpSpread at Points `pts`: its members, its step-free twin, its basis."""
    t = predict_fit(fit, cls, pts, peak, bandwidth, sm_count) * layers
    alts = [t] + [predict_fit(m, cls, pts, peak, bandwidth, sm_count) * layers for m in fit.members]
    smooth = predict_fit(fit, cls, pts, peak, bandwidth, sm_count, smooth=True) * layers
    code, octaves, axis = basis_mod.basis(fit.range, pts)
    shape = np.shape(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(smooth > 0, t / smooth - 1.0, 0.0)
    sampled = basis_mod.steps_sampled(fit.shapes, pts).reshape(shape)
    iv = fit.interval
    return u.OpSpread(
        t, np.stack(alts), smooth, (step > u.STEP_MIN) & ~sampled, code.reshape(shape), octaves.reshape(shape),
        np.asarray(axis, dtype=object).reshape(shape), iv.get("random"), iv.get("blocked"), iv.get("blocked_octaves"),
        float(iv.get("scale", 1.0)),
    )  # fmt: skip


def op_estimate(cost, hw, calibration, cls: str, batch, new, prefix, path=None, layers: int = 1) -> OpEstimate | None:
    """An op class's estimate, or None where the calibration has no fit for it (see the module
    docstring for decode and prefill fits)."""
    fits = calibration.class_fits(cost, cls)
    if fits is None:
        return None
    decode, prefill = fits
    main = _fit_spread(cost, hw, calibration, prefill, cls, batch, new, prefix, path, layers)
    shape = np.shape(main.time)
    if decode is prefill:
        return OpEstimate.alone(cls, main)
    other = _fit_spread(cost, hw, calibration, decode, cls, batch, new, prefix, path, layers)
    on_decode = np.broadcast_to(decode_like(new, prefix), shape)
    parts = []
    for mask, own, alt in ((on_decode, other, main), (~on_decode, main, other)):
        # beyond its own fit's shapes, the other table's fit joins the members
        extra = np.where(own.basis != basis_mod.MEASURED, alt.time, np.nan)
        parts.append((mask, _with_member(own, extra)))

    def pick(a, b) -> np.ndarray:
        return np.where(on_decode, a, b)

    return OpEstimate(
        cls, pick(other.time, main.time), parts, pick(other.basis, main.basis), pick(other.octaves, main.octaves),
        pick(other.axis, main.axis),
    )  # fmt: skip


def _with_member(spread: u.OpSpread, extra: np.ndarray) -> u.OpSpread:
    """`spread` with one more member, NaN (the kept fit's time) where it does not apply: always
    added, so that a point's draws do not depend on the other points asked with it."""
    return replace(spread, alternatives=np.concatenate([spread.alternatives, extra[None]]))


def estimates(
    cost: CostModel, hw: HardwareProfile, calibration, batch, new, prefix, paths=MLA_PATHS, layers: int = 1
) -> dict[str, PathEstimate]:
    """{path: PathEstimate} at every point (a calibration is required: roofline times have no
    interval and every op's basis is `roofline`)."""
    out = {}
    for p in paths:
        roof = path_time(scaled_ops(cost.ops(p, batch, new, prefix), layers), hw, cost.dtype, p)
        whole = calibration.whole_path(cost, p)
        ops: dict[str, OpEstimate] = {}
        if whole:
            cls = f"path:{p}"
            spread = _fit_spread(cost, hw, calibration, whole, cls, batch, new, prefix, None, layers)
            spread = _broadcast(spread, np.shape(roof.flops))
            # the draws are the fit's: expand_chunked timed by expand's fit draws as expand does
            ops[p] = OpEstimate.alone(whole.op, spread)
        else:
            for op in roof.ops:
                cls = op_class(p, op.name)
                est = op_estimate(cost, hw, calibration, cls, batch, new, prefix, p, layers)
                ops[op.name] = est or OpEstimate.alone(cls, u.OpSpread.of_roofline(op.time_s))
        total = sum(o.time for o in ops.values())
        out[p] = PathEstimate(p, np.broadcast_to(total, np.shape(roof.flops)), ops)
    return out


def _broadcast(spread: u.OpSpread, shape) -> u.OpSpread:
    b = lambda a: np.broadcast_to(a, shape)  # noqa: E731
    return replace(
        spread, time=b(spread.time), smooth=b(spread.smooth), unsampled=b(spread.unsampled), basis=b(spread.basis),
        octaves=b(spread.octaves), axis=b(spread.axis),
        alternatives=np.broadcast_to(spread.alternatives, (len(spread.alternatives),) + tuple(shape)),
    )  # fmt: skip


def path_scenarios(
    cost: CostModel, hw: HardwareProfile, calibration, batch, new, prefix, paths=MLA_PATHS, layers: int = 1,
    scenarios: int = u.SCENARIOS,
) -> dict[str, np.ndarray]:  # fmt: skip
    """{path: [S, ...] seconds}: each path's time draw by draw; draw s of every path uses the same
    draws of each op class, so figures derived from several paths (a loss, a crossover) are
    computed draw by draw and their interval taken over the draws (`loss_interval`)."""
    return {p: e.scenarios(scenarios) for p, e in estimates(cost, hw, calibration, batch, new, prefix, paths,
                                                             layers).items()}  # fmt: skip


def loss_interval(
    scenarios: dict[str, np.ndarray], chosen, allowed: dict[str, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The 80% interval of what running `chosen` (a path name per point) loses against the best
    path, draw by draw: `scenarios` from `path_scenarios`; `allowed[path]` (bool per point, default
    all) says where a path may be best (a path whose expanded K/V does not fit may not)."""
    names = list(scenarios)
    stack = np.stack([scenarios[p] for p in names])  # [P, S, ...]
    if allowed is not None:
        ok = np.stack([np.broadcast_to(allowed.get(p, True), stack.shape[2:]) for p in names])
        stack = np.where(ok[:, None], stack, np.inf)
    best = stack.min(axis=0)
    chosen = np.asarray(chosen)
    mine = np.zeros_like(best)
    for i, p in enumerate(names):
        mine = np.where(chosen == p, stack[i], mine)
    return u.percentiles(np.maximum(mine - best, 0.0))


RULE_CHUNK = 2048  # points whose draws rule_draws holds at once: 128 x 6 paths x 2,048 x 8 B, 12 MB


def rule_draws(
    cost: CostModel, hw: HardwareProfile, calibration, batch, new, prefix, shared: dict, rules: dict,
    layers: int = 1, chunk: int = RULE_CHUNK,
):  # fmt: skip
    """Draw by draw, what each rule's choice of paths takes and what the best path takes, a chunk
    of points at a time: yields (slice of the points, {rule: [S, chunk] seconds}, [S, chunk] the
    best path's). `shared[path]` is each path's point time at every point (+inf where it does not
    fit or cannot run: never the best); `rules[name] = (paths, own)`, the rule's path per point and
    its own time of each path (an engine's own chunk size or indexer), which scales that path's
    draws by own / shared. Draw s of every path uses the same draws of each op class, so a loss
    is computed within a draw. Yields nothing at all where an op has no evidence (a fit without an
    interval): check `has_evidence` first."""
    batch, new, prefix = (np.asarray(a).reshape(-1) for a in np.broadcast_arrays(batch, new, prefix))
    choices = tuple(shared)
    for start in range(0, len(new), chunk):
        part = slice(start, start + chunk)
        est = estimates(cost, hw, calibration, batch[part], new[part], prefix[part], choices, layers)
        draws = {p: est[p].scenarios() for p in choices}
        ok = {p: np.isfinite(shared[p][part]) for p in choices}
        best = np.min(np.stack([np.where(ok[p], draws[p], np.inf) for p in choices]), axis=0)
        taken = {}
        for name, (paths, own) in rules.items():
            mine = np.zeros_like(best)
            for p in choices:
                on = paths[part] == p
                if on.any():
                    base, theirs = shared[p][part], own[p][part]
                    with np.errstate(divide="ignore", invalid="ignore"):
                        scale = np.where(np.isfinite(base) & (base > 0), theirs / base, np.inf)
                    mine = np.where(on, draws[p] * scale, mine)
            taken[name] = mine
        yield part, taken, best


def has_evidence(cost: CostModel, hw: HardwareProfile, calibration, paths) -> bool:
    """Whether every op of these paths has an interval (a fit that carries its evidence)."""
    one = (np.array([1]), np.array([1]), np.array([1]))
    return all(e.has_interval for e in estimates(cost, hw, calibration, *one, paths).values())


def loss_spans(
    cost: CostModel, hw: HardwareProfile, calibration, batch, new, prefix, shared: dict, rules: dict, layers: int = 1
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """{rule: (lo, hi)} per point: the 80% interval of what each rule loses against the best path
    (rule_draws), widened to hold 0; None where an op has no evidence."""
    if not has_evidence(cost, hw, calibration, tuple(shared)):
        return None
    n = np.broadcast_arrays(batch, new, prefix)[0].size
    out = {name: (np.zeros(n), np.zeros(n)) for name in rules}
    for part, taken, best in rule_draws(cost, hw, calibration, batch, new, prefix, shared, rules, layers):
        for name, mine in taken.items():
            with np.errstate(invalid="ignore"):
                lo, hi = u.percentiles(np.maximum(mine - best, 0.0))
            out[name][0][part], out[name][1][part] = lo, hi
    return out


def batch_interval(
    cost: CostModel, hw: HardwareProfile, calibration, new, prefix, count, paths, scenarios: int = u.SCENARIOS
) -> tuple[float, float] | None:
    """The 80% interval of a mixed batch's calibrated time (time.batch_time: one launch per op and
    path over its request rows). Draw by draw, each launch is scaled by its op's draws at those
    rows, weighted by the rows' own times; the interval holds the point value. None where an op
    has no interval (a fit without evidence)."""
    total = np.zeros(scenarios)
    point = 0.0
    paths = np.asarray(paths)
    for path in dict.fromkeys(paths.tolist()):  # each path the rows run, in their order
        rows = paths == path
        if not rows.any():
            continue
        launches = launch_parts(cost, hw, calibration, path, count[rows], new[rows], prefix[rows])
        est = estimates(cost, hw, calibration, count[rows], new[rows], prefix[rows], (path,))[path]
        if not est.has_interval:
            return None
        for launch, op in zip(launches, est.ops.values()):
            own = np.reshape(op.time, -1)
            factor = op.scenarios(scenarios).reshape(scenarios, -1).sum(axis=1) / own.sum() if own.sum() > 0 else 1.0
            total += launch * factor
            point += launch
    lo, hi = u.percentiles(total)
    return float(min(float(lo), float(point))), float(max(float(hi), float(point)))


BLOCK_ELEMENTS = 1 << 21  # draws x prefixes x new counts evaluated at once by crossover_intervals
EXACT_UP_TO = 512  # crossover_intervals tries every count up to this, then steps of 2**(1/64) (1.1%)


def window_intervals(
    cost: CostModel,
    hw: HardwareProfile,
    calibration,
    prefixes,
    batch: int = 1,
    path: str = "masked_expand",
    against: str = "sparse_absorb",
    max_new: int = 1 << 17,
    scenarios: int = u.SCENARIOS,
) -> list[tuple[tuple[int, int], tuple[int, int]] | None]:
    """For each prefix, the 80% intervals of a DSA window's first and last new-token counts (where
    `path` runs and is faster than `against`, as mlactl.model.roofline.window_by_time defines it),
    over the draws of `path_scenarios`: ((first lo, first hi), (last lo, last hi)), or None where
    more than a tenth of the draws find no window within max_new. Counts are searched one by one
    up to WINDOW_EXACT and 4.4% apart beyond (16 to the octave): an end above 64 is that close,
    and a calibrated crossover's windows at the default prefixes take seconds, not tens of them."""
    prefixes = np.asarray(prefixes, dtype=np.float64).reshape(-1)
    grid = search_counts(max_new, exact_up_to=WINDOW_EXACT, per_octave=16)
    first = np.full((scenarios, len(prefixes)), np.inf)
    last = np.full((scenarios, len(prefixes)), -np.inf)
    width = max(16, min(256, BLOCK_ELEMENTS // (scenarios * max(1, len(prefixes)))))
    for start in range(0, len(grid), width):
        n = grid[start : start + width][None, :]
        p = prefixes[:, None]
        est = estimates(cost, hw, calibration, batch, n, p, (path, against))
        runs = np.broadcast_to(cost.applicable(path, batch, n, p), np.broadcast_shapes(n.shape, p.shape))
        wins = (est[path].scenarios(scenarios) < est[against].scenarios(scenarios)) & runs  # [S, P, new]
        counts = np.broadcast_to(n, wins.shape)
        first = np.minimum(first, np.where(wins, counts, np.inf).min(axis=2))
        last = np.maximum(last, np.where(wins, counts, -np.inf).max(axis=2))
    out: list[tuple[tuple[int, int], tuple[int, int]] | None] = []
    for k in range(len(prefixes)):
        none = ~np.isfinite(first[:, k])
        if none.mean() > u.LOW:  # more than a tenth of the draws: no window
            out.append(None)
            continue
        f, la = first[~none, k], last[~none, k]
        # order statistics (counts, not between two of them)
        f_lo, f_hi = np.quantile(f, u.LOW, method="lower"), np.quantile(f, u.HIGH, method="higher")
        l_lo, l_hi = np.quantile(la, u.LOW, method="lower"), np.quantile(la, u.HIGH, method="higher")
        out.append(((int(f_lo), int(f_hi)), (int(l_lo), int(l_hi))))
    return out


WINDOW_EXACT = 64  # window_intervals tries every count up to this, then 16 to the octave


def search_counts(max_new: int, exact_up_to: int = EXACT_UP_TO, per_octave: int = 64) -> np.ndarray:
    """The new counts a crossover interval is searched over: every one up to `exact_up_to`, then
    a geometric grid `per_octave` to the octave, and max_new."""
    exact = np.arange(1, min(exact_up_to, max_new) + 1)
    if max_new <= exact_up_to:
        return exact.astype(np.float64)
    octaves = np.log2(max_new / exact_up_to)
    steps = np.arange(1, int(np.ceil(per_octave * octaves)) + 1) / per_octave
    geometric = np.round(exact_up_to * 2.0**steps)
    grid = np.unique(np.concatenate([exact, geometric[geometric < max_new], [max_new]]))
    return grid.astype(np.float64)


def crossover_intervals(
    cost: CostModel,
    hw: HardwareProfile,
    calibration,
    prefixes,
    batch: int = 1,
    path: str = "expand",
    max_new: int = 1 << 17,
    scenarios: int = u.SCENARIOS,
) -> list[tuple[int | None, int | None]]:
    """For each prefix, the 80% interval (lo, hi) of the crossover (the smallest new-token count at
    which `path` is faster than absorb, as mlactl.model.roofline.crossover_by_time defines it),
    over the draws of `path_scenarios`; hi None where more than a tenth of the draws find none
    within max_new, and lo None too where nine tenths do (no end: none up to max_new). Counts are
    searched one by one up to EXACT_UP_TO and 1.1% apart beyond
    (`search_counts`): an end above 512 is that close."""
    prefixes = np.asarray(prefixes, dtype=np.float64).reshape(-1)
    grid = search_counts(max_new)
    found = np.full((scenarios, len(prefixes)), np.inf)
    todo = np.ones_like(found, dtype=bool)
    start = 0
    while todo.any() and start < len(grid):
        cols = np.flatnonzero(todo.any(axis=0))
        width = max(16, min(256, BLOCK_ELEMENTS // (scenarios * len(cols))))
        n = grid[start : start + width][None, :]
        est = estimates(cost, hw, calibration, batch, n, prefixes[cols][:, None], (path, "absorb"))
        wins = est[path].scenarios(scenarios) < est["absorb"].scenarios(scenarios)  # [S, cols, new]
        hit, first = wins.any(axis=2), wins.argmax(axis=2)
        pending = todo[:, cols]
        found[:, cols] = np.where(pending & hit, n[0][first], found[:, cols])
        todo[:, cols] = pending & ~hit
        start += width
    # order statistics (no interpolation between a count and "none found")
    lo = np.quantile(found, u.LOW, axis=0, method="lower")
    hi = np.quantile(found, u.HIGH, axis=0, method="higher")
    return [(None if not np.isfinite(a) else int(a), None if not np.isfinite(b) else int(b)) for a, b in zip(lo, hi)]
