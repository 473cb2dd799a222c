"""What a kept fit carries into the calibration file besides its parameters: the evidence its
intervals and each op's basis are drawn from.

    "range":    {axis: [lowest, highest]} of the measured shapes (basis.py)
    "shapes":   the distinct measured shapes, log2 per axis (the steps test, basis.py)
    "interval": {"levels", "random", "blocked", "blocked_octaves", "scale",
                 "coverage": {"nominal", "held_out", "n"}}   (uncertainty.py)
    "members":  [{"terms", "params", "held_out", "blocked"}]: the term sets that fit about as
                well (uncertainty.members_of), the kept one not repeated

`coverage.held_out` is the empirical check of the 80% interval on the random folds: each
point's interval from the fits that never saw it (the kept one and its members, the steps test
against the training folds' shapes), the residual quantiles of the other folds' points and the
residual factor (`scale`) calibrated on the other folds' points; the share of measurements
inside. `scale` itself is calibrated on every held-out point.
"""

from __future__ import annotations

import math

import numpy as np

from mlactl.decide.calibration import basis
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.model import Points
from mlactl.util.errors import MlactlError


def _smooth_spread(t, smooth, pts: Points, train_shapes) -> np.ndarray:
    """Where a step of more than STEP_MIN is not sampled by the training shapes."""
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(smooth > 0, t / smooth - 1.0, 0.0)
    return (step > u.STEP_MIN) & ~basis.steps_sampled(train_shapes, pts)


def _blocked_octaves(pts: Points, split) -> float | None:
    if split is None:
        return None
    train, test = pts.take(split.train), pts.take(split.test)
    octaves, _ = basis.outside(basis.measured_range(train), test)
    return round(float(np.median(octaves)), 4)


def held_out_coverage(best, members: list, pts: Points, machine, q_blocked, b_oct) -> tuple[float | None, int, float]:
    """(share of measurements inside their held-out 80% interval, points checked, the residual
    factor of uncertainty.calibrated_scale); see the module docstring. The factor a fold's points
    are checked with is calibrated on the other folds' points only. `q_blocked`, `b_oct`: the
    blocked split's residual quantiles and median octaves (`evidence` works them out)."""
    ev = best.evidence
    if ev is None or not ev.folds:
        return None, 0, 1.0
    y = np.asarray(pts.time_s, dtype=np.float64)
    log_res = np.log(y / ev.held_out_pred)
    d = u.draws(0, len(members) + 1)
    base = np.full((len(d.level), len(pts)), np.nan)
    resid = np.zeros_like(base)
    for test, params in ev.folds:
        rest = np.setdiff1d(np.arange(len(pts)), test)
        q = u.quantiles(log_res[rest])
        if q is None:
            return None, 0, 1.0
        sub, train = pts.take(test), pts.take(rest)
        t = ev.held_out_pred[test]
        alts = np.stack([t] + [m.evidence.held_out_pred[test] for m in members])
        smooth = machine.predict(params, best.terms, sub, smooth=True)
        code, octaves, axis = basis.basis(basis.measured_range(train), sub)
        spread = u.OpSpread(
            t, alts, smooth, _smooth_spread(t, smooth, sub, basis.measured_shapes(train)), code, octaves,
            np.asarray(axis, dtype=object), q, q_blocked, b_oct,
        )  # fmt: skip
        base[:, test], resid[:, test] = spread.parts(d)
    inside = []
    for test, _ in ev.folds:
        rest = np.setdiff1d(np.arange(len(pts)), test)
        scale = u.calibrated_scale(base[:, rest], resid[:, rest], y[rest])
        lo, hi = u.percentiles(base[:, test] * np.exp(scale * resid[:, test]))
        inside.append((lo <= y[test]) & (y[test] <= hi))
    flat = np.concatenate(inside)
    return round(float(flat.mean()), 4), int(len(flat)), u.calibrated_scale(base, resid, y)


def evidence(best, members: list, pts: Points, machine) -> dict:
    """The "range", "shapes", "interval" and "members" entries of a kept fit (see above)."""
    out: dict = {"range": basis.measured_range(pts), "shapes": basis.measured_shapes(pts)}
    ev = best.evidence
    y = np.asarray(pts.time_s, dtype=np.float64)
    q_random = None if ev is None else u.quantiles(np.log(y / ev.held_out_pred))
    if q_random is not None:
        q_blocked = None
        if ev.split is not None and ev.blocked_pred is not None:
            q_blocked = u.quantiles(np.log(y[ev.split.test] / ev.blocked_pred))
        b_oct = _blocked_octaves(pts, ev.split)
        coverage, n, scale = held_out_coverage(best, members, pts, machine, q_blocked, b_oct)
        out["interval"] = {
            "levels": list(u.LEVELS),
            "random": q_random,
            "blocked": q_blocked,
            "blocked_octaves": b_oct,
            "scale": scale,
            "coverage": {"nominal": u.COVERAGE, "held_out": coverage, "n": n},
        }
    out["members"] = [
        {"terms": list(m.terms), "params": m.params, "held_out": m.held_out, "blocked": m.blocked} for m in members
    ]
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_evidence(f: dict, at: str, check_model) -> None:
    """A calibration file's evidence entries of fit `f` (see the module docstring), each field a
    prediction reads; `check_model(member, where)` checks a member's terms and params. Every
    entry is optional (store.py). One MlactlError line on anything wrong."""
    names = basis.axes_of(f.get("op", ""))
    rng = f.get("range")
    if rng is not None:
        ends = [rng.get(a) if isinstance(rng, dict) else None for a in names]
        if not all(isinstance(e, list) and len(e) == 2 and all(_number(v) and v >= 0 for v in e) for e in ends):
            raise MlactlError(f"{at}: 'range' must give [lowest, highest] for each of {', '.join(names)}")
    shapes = f.get("shapes")
    if shapes is not None:
        rows = shapes if isinstance(shapes, list) else [None]
        if not all(isinstance(x, list) and len(x) == len(names) and all(_number(v) for v in x) for x in rows):
            raise MlactlError(f"{at}: 'shapes' must list measured shapes of {len(names)} numbers each")
    iv = f.get("interval")
    if iv is not None:
        levels = len(u.LEVELS)
        bad = f"{at}: 'interval' must hold 'random' (and 'blocked', or null) quantiles at {levels} levels and a 'scale'"
        if not isinstance(iv, dict):
            raise MlactlError(bad)
        for key in ("random", "blocked"):
            q = iv.get(key)
            if q is None and key == "blocked":
                continue
            if not isinstance(q, list) or len(q) != levels or not all(_number(v) for v in q):
                raise MlactlError(bad)
            if any(b < a for a, b in zip(q, q[1:])):
                raise MlactlError(f"{at}: interval.{key} quantiles must not decrease")
        if not _number(iv.get("scale")) or iv["scale"] <= 0:
            raise MlactlError(bad)
        b = iv.get("blocked_octaves")
        if b is not None and (not _number(b) or b < 0):
            raise MlactlError(f"{at}: interval.blocked_octaves must be a number >= 0 or null")
    members = f.get("members", [])
    if not isinstance(members, list):
        raise MlactlError(f"{at}: 'members' must be a list")
    for i, m in enumerate(members):
        if not isinstance(m, dict):
            raise MlactlError(f"{at}: members[{i}] must be an object")
        check_model(m, f"{at}: members[{i}]")
