"""Prediction intervals of calibrated time: how far a fitted time can be trusted.

A calibrated time comes with an 80% interval built from two kinds of evidence, both kept in the
calibration file when `mlactl calibrate` fits:

1. **Models that fit about as well.** Every candidate term set is scored on held-out data (random
   folds and the blocked split, mlactl.decide.calibration.fit). The sets whose score lies within
   ENSEMBLE_REL (relative) plus ENSEMBLE_ABS (absolute) of the best one's are *members*: at
   shapes the measurements cover they agree closely; beyond them they can part ways (one
   extrapolates a wave step, another does not), and the interval shows it.
2. **Held-out residuals** (conformal style): the quantiles of log(measured / predicted) of the
   selected fit over the random folds' held-out points, and over the blocked split's upper part
   (fit below, predict above). A point inside the measured range (basis `measured`) draws its
   residual from the first; a point beyond it (`extrapolated`) from the wider of the two at each
   level, scaled by the square root of its octaves beyond the range over the blocked split's
   median octaves, where that is above 1 (an error that grew over that distance keeps growing,
   as a random walk's would). Quantiles are stored at LEVELS.

Steps are claims: where the fit's time steps with a count (tiles, waves, KV blocks, splits) and
no measured shape samples the step (basis.steps_sampled), half of the draws take the same fit
with its counts continuous (model.predict(smooth=True)).

An op's time is then a random variable: SCENARIOS draws, each a member (in turns), a residual
level (stratified: (k + 1/2) / SCENARIOS, shuffled) and a step choice, independent between op
classes and fixed within one draw (a residual is systematic for a region of shapes, not noise
from point to point). A path's time, a crossover or an engine's loss is computed draw by draw;
its interval is the 10th and 90th percentile over the draws, its point value the selected fit's.
The seed is fixed: the same calibration gives the same intervals.

An op class with no fit keeps its roofline time: an ideal, so its draws lie between the
roofline and the roofline / ROOFLINE_ETA_LOW (log-uniform). At the largest tenth of their shapes,
the attention kernels of aiconfigurator 0.12's H100, H200 and B200 tables take 0.52-0.92 of
their roofline's speed (median per table; the lowest tenth down to 0.32 for TRT-LLM's fp8 expand
on a B200), SGLang's fp8-cache decode aside (0.06: its pass over the cache).

Empirical check (`fit_interval`): on the random folds, each held-out point's interval from the
fits that never saw it and the residuals of the other folds contains the measurement in 75-85%
of cases for the tables mlactl reads (benchmarks/bench_calibrate.py prints each group's figure).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.decide.calibration import basis as basis_mod

COVERAGE = 0.8  # the interval's nominal coverage: 10th to 90th percentile
LOW, HIGH = (1 - COVERAGE) / 2, 1 - (1 - COVERAGE) / 2
LEVELS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99)
ENSEMBLE_REL = 0.25  # members: score <= best * (1 + ENSEMBLE_REL) + ENSEMBLE_ABS
ENSEMBLE_ABS = 0.01
ENSEMBLE_MAX = 4  # members besides the selected fit (the best-scored ones)
SCENARIOS = 128
SEED = 22
STEP_MIN = 0.02  # a step's effect below 2% of the time is not worth a claim
ROOFLINE_ETA_LOW = 0.35
SCALE_MIN, SCALE_MAX = 0.25, 4.0  # the conformal factor on the residuals (calibrated_scale)


def quantiles(log_residuals) -> list[float] | None:
    """log(measured / predicted) at LEVELS; None with fewer than 10 residuals."""
    r = np.asarray(log_residuals, dtype=np.float64)
    r = r[np.isfinite(r)]
    if len(r) < 10:
        return None
    return [round(float(v), 6) for v in np.quantile(r, LEVELS)]


def residual_at(q, u) -> np.ndarray:
    """The residual quantile function at levels u (linear between LEVELS, flat beyond them)."""
    return np.interp(np.asarray(u, dtype=np.float64), LEVELS, np.asarray(q, dtype=np.float64))


def widened(q_random, q_blocked) -> list[float]:
    """At each level, the residual farther from zero of the two (the lower levels' lower, the
    upper levels' upper): an extrapolated point's residuals."""
    if q_blocked is None:
        return list(q_random)
    return [min(a, b) if lv < 0.5 else max(a, b) for lv, a, b in zip(LEVELS, q_random, q_blocked)]


@dataclass(frozen=True)
class Draws:
    """The SCENARIOS draws of one op class: residual level, member index and step choice."""

    level: np.ndarray  # [S] in (0, 1)
    member: np.ndarray  # [S] int
    step: np.ndarray  # [S] bool: take the smooth (step-free) time where a step is unsampled


def draws(key: int, members: int, scenarios: int = SCENARIOS) -> Draws:
    """Deterministic, stratified draws for the op class numbered `key` (independent per key)."""
    rng = np.random.default_rng([SEED, key])
    level = (rng.permutation(scenarios) + 0.5) / scenarios
    member = rng.permutation(scenarios) % max(members, 1)
    step = rng.permutation(scenarios) < scenarios // 2
    return Draws(level, member, step)


@dataclass(frozen=True)
class OpSpread:
    """One op class's time at some points and what its interval is drawn from.

    time: the selected fit's seconds; alternatives: [M, ...] the members' seconds (the selected
    first; NaN where a member does not apply); smooth: the selected fit's step-free seconds;
    unsampled: where a step (> STEP_MIN) is not sampled; basis/octaves/axis: per point
    (basis.basis); q_random, q_blocked: stored residual quantiles (None: no interval);
    blocked_octaves: the blocked split's median octaves beyond its training range; scale: the
    factor on the residuals that makes the held-out coverage nominal (see `calibrated_scale`).
    roofline: the op class has no fit (time is its roofline).
    """

    time: np.ndarray
    alternatives: np.ndarray
    smooth: np.ndarray
    unsampled: np.ndarray
    basis: np.ndarray
    octaves: np.ndarray
    axis: np.ndarray  # object array of axis names
    q_random: list | None
    q_blocked: list | None = None
    blocked_octaves: float | None = None
    scale: float = 1.0
    roofline: bool = False

    @classmethod
    def of_roofline(cls, time) -> OpSpread:
        t = np.asarray(time, dtype=np.float64)
        return cls(
            t, t[None], t, np.zeros(t.shape, bool), np.full(t.shape, basis_mod.ROOFLINE, dtype=object),
            np.zeros(t.shape), np.full(t.shape, "", dtype=object), None, roofline=True,
        )  # fmt: skip

    @property
    def has_interval(self) -> bool:
        return self.roofline or self.q_random is not None

    def residuals(self, level: float) -> np.ndarray:
        """log(measured / predicted) at this level for each point, by its basis."""
        shape = np.shape(self.time)
        if self.q_random is None:
            return np.zeros(shape)
        inside = float(residual_at(self.q_random, level))
        outside = float(residual_at(widened(self.q_random, self.q_blocked), level))
        reference = self.blocked_octaves if self.blocked_octaves and self.blocked_octaves > 0 else 1.0
        # NaN octaves (no range recorded) count as four references: twice the residual
        octaves = np.where(np.isfinite(self.octaves), self.octaves, 4 * reference)
        scale = np.sqrt(np.maximum(1.0, octaves / reference))
        extrapolated = self.basis != basis_mod.MEASURED
        return np.where(extrapolated, outside * scale, inside).reshape(shape)

    def parts(self, d: Draws) -> tuple[np.ndarray, np.ndarray]:
        """([S, ...] seconds of each draw's member and step choice, [S, ...] its residual)."""
        t = np.asarray(self.time, dtype=np.float64)
        if self.roofline:
            eta = np.exp(np.log(ROOFLINE_ETA_LOW) * d.level)  # log-uniform in [ROOFLINE_ETA_LOW, 1]
            return t[None] / eta.reshape((-1,) + (1,) * t.ndim), np.zeros((len(d.level),) + t.shape)
        alts = np.asarray(self.alternatives, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(self.unsampled & (t > 0), self.smooth / t, 1.0)
        base = np.empty((len(d.level),) + t.shape)
        resid = np.empty_like(base)
        for s in range(len(d.level)):
            alt = alts[d.member[s] % len(alts)]
            base[s] = np.where(np.isfinite(alt), alt, t) * (ratio if d.step[s] else 1.0)
            resid[s] = self.residuals(d.level[s])
        return base, resid

    def scenarios(self, d: Draws) -> np.ndarray:
        """[S, ...] seconds, one per draw."""
        base, resid = self.parts(d)
        return base * np.exp(self.scale * resid)


def percentiles(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The interval (LOW and HIGH percentiles) over the draws (axis 0)."""
    lo, hi = np.quantile(samples, [LOW, HIGH], axis=0)
    return lo, hi


def interval_around(samples: np.ndarray, time) -> tuple[np.ndarray, np.ndarray]:
    """The interval over the draws (`percentiles`) widened to hold the point value `time`, as mlactl prints it."""
    lo, hi = percentiles(samples)
    return np.minimum(lo, time), np.maximum(hi, time)


def interval(spread: OpSpread, key: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """An op's own 80% interval; None where it has none (too few points to have held out any)."""
    if not spread.has_interval:
        return None
    return percentiles(spread.scenarios(draws(key, len(spread.alternatives))))


def poisson_sample(size: np.ndarray, target: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(drawn, probability) of a seeded Poisson sample of about `target` of the items, each with
    a probability proportional to its `size` (positive), capped at 1, the capped items' share
    going to the rest. Weighting a drawn item by 1 / probability estimates a total without bias
    (Horvitz-Thompson)."""
    prob = np.minimum(1.0, target * size / size.sum())
    for _ in range(8):
        capped = prob >= 1.0
        rest = size[~capped].sum()
        if rest <= 0:
            break
        prob = np.where(capped, 1.0, np.minimum(1.0, (target - capped.sum()) * size / rest))
    return np.random.default_rng(seed).random(len(size)) < prob, prob


def calibrated_scale(base: np.ndarray, resid: np.ndarray, y: np.ndarray) -> float:
    """The factor on the residuals at which the draws' 80% interval holds 80% of `y` (the
    conformal step): with members and step choices in the draws as well as residuals, the
    residuals alone would cover more. base, resid: [S, n] (OpSpread.parts); y: [n]. Bisection in
    [SCALE_MIN, SCALE_MAX]; the share inside grows with the factor."""
    lo, hi = SCALE_MIN, SCALE_MAX
    for _ in range(20):
        mid = (lo + hi) / 2
        a, b = percentiles(base * np.exp(mid * resid))
        if np.mean((a <= y) & (y <= b)) < COVERAGE:
            lo = mid
        else:
            hi = mid
    return round(hi, 4)


def members_of(scored: list, best) -> list:
    """The fits that score within the tolerance of the best one's (ENSEMBLE_*), best first, at
    most ENSEMBLE_MAX besides it. `scored`: [(score, FitResult)]."""
    best_score = next(s for s, r in scored if r is best)
    close = sorted(
        ((s, r) for s, r in scored if r is not best and s <= best_score * (1 + ENSEMBLE_REL) + ENSEMBLE_ABS),
        key=lambda sr: sr[0],
    )
    seen, out = {best.terms}, []
    for _, r in close:
        if r.terms not in seen:
            seen.add(r.terms)
            out.append(r)
    return out[:ENSEMBLE_MAX]
