"""Scoring a calibration on measurements it was not fitted to: `mlactl calibrate score`.

For each group of measured points (op class, kernel source, dtype; the same groups `mlactl
calibrate` fits), the calibration's fit of that op class predicts every point, and the score is

    n          points
    median     median of |predicted / measured - 1|
    p90        its 90th percentile
    bias       median of predicted / measured - 1, signed (> 0: the calibration predicts slow)
    coverage   the share of measurements inside their 80% interval (None: the fit has none)
    measured   the share of points inside the fit's measured range (basis `measured`)

A group whose op class the calibration has no fit for, or no fit of the group's dtype, is
listed with n and nothing else: not covered (an fp8 fit says nothing of an nvfp4 kernel). Of
several fits of a class and dtype, a group takes its own kernel's (measured, or run on the
target by transfer), else the first. Where
the calibration has a decode and a prefill fit of a class, a point takes the one the time
function would (mlactl.decide.calibration.time.op_seconds); an aiconfigurator table says which
it is (its source ends in :decode or :prefill).

Predictions divide by the ceilings the calibration records, which are those of the hardware it
is for: the GPU it was fitted on, or the one `mlactl calibrate transfer` carried it to. The
measurements must come from that GPU (`check_measured_on`): a calibration of another GPU is
refused with the transfer command to run, never scored at the wrong ceilings. A transferred
calibration is scored like any other; its intervals hold the transfer error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.decide.calibration import basis as basis_mod
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.estimate import spread_of
from mlactl.decide.calibration.fit import rel_errors, summary
from mlactl.decide.calibration.model import Points, decode_like
from mlactl.decide.calibration.store import kernel_of, phase_of, transfer_source
from mlactl.util import safe
from mlactl.util.errors import MlactlError


@dataclass(frozen=True)
class Score:
    op: str
    source: str
    dtype: str
    n: int
    median: float | None = None
    p90: float | None = None
    bias: float | None = None
    coverage: float | None = None
    measured: float | None = None
    fit: str | None = None  # the fit that predicted: "<source> (<dtype>)"
    note: str | None = None  # why a group is not covered

    def to_json(self) -> dict:
        return dict(self.__dict__)


def machine_of(calibration) -> tuple[float, float, int | None]:
    """(peak FLOP/s, bandwidth, SMs) the calibration's fits divided by."""
    c = calibration.data.get("ceilings") or {}
    try:
        return float(c["peak_flops"]), float(c["bandwidth_bytes_per_s"]), c.get("sm_count")
    except (KeyError, TypeError, ValueError):
        raise MlactlError(
            f"calibration {calibration.name!r} records no ceilings (peak_flops, bandwidth_bytes_per_s): "
            "run `mlactl calibrate` again"
        ) from None


def check_measured_on(calibration, hardware: str | None, where: str) -> None:
    """Refuse to score `calibration` on measurements taken on other hardware than the one it is
    for (its ceilings would be the wrong GPU's): one line naming the transfer command."""
    if hardware is None or hardware == calibration.hardware:
        return
    t = calibration.transferred
    made = "carried to" if t else "fitted on"
    head = (
        f"calibration {calibration.name!r} was {made} {calibration.hardware}, and {safe.text(where, 80)} was measured "
        f"on {hardware}: it would be scored at {calibration.hardware}'s ceilings. "
    )
    if t and t["from"]["hardware"] == hardware:  # measured on the GPU the transfer started from
        raise MlactlError(head + f"Score the calibration it was carried from instead: {transfer_source(calibration)}")
    raise MlactlError(
        head + f"Carry it there first: `mlactl calibrate transfer {transfer_source(calibration)} --hardware "
        f"{hardware}`, then score the new one"
    )


def fit_of(calibration, op: str, dtype: str, phase: str, kernel: str | None = None) -> dict | None:
    """The file's entry of the fit of op class `op` of exactly this dtype (never another dtype's):
    of this kernel (measured, or run there by transfer) if there is one, then of the phase if
    there is one (Calibration.fit_for)."""
    fit = calibration.fit_for(op, dtype, phase, kernel, exact_dtype=True)
    return None if fit is None else fit.entry


@dataclass(frozen=True)
class Predicted:
    """A group's predicted seconds, 80% interval (NaN: none), whether each point lies in its fit's
    measured range, and the fits used ("<source> (<dtype>)")."""

    time: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    inside: np.ndarray
    used: tuple[str, ...]


def uncovered(calibration, op: str, dtype: str) -> str:
    """Why a group of this op class and dtype is not covered."""
    have = sorted({str(f.dtype) for f in calibration.fits if f.op == op})
    return f"no {op} fit" if not have else f"no {dtype} fit of {op} (the calibration's are {', '.join(have)})"


def predicted(calibration, key: tuple[str, str, str], pts: Points, intervals: bool = True) -> Predicted | None:
    """The calibration's prediction of every point of a group, or None where it has no fit of
    the group's op class and dtype (see the module docstring); without `intervals`, lo and hi
    are NaN (not drawn)."""
    op, source, dtype = key
    peak, bandwidth, sms = machine_of(calibration)
    phase = phase_of(source)
    kernel = kernel_of(source)
    decode = calibration.fit_for(op, dtype, phase or "decode", kernel, exact_dtype=True)
    prefill = calibration.fit_for(op, dtype, phase or "prefill", kernel, exact_dtype=True)
    if decode is None or prefill is None:  # both or neither: a fit of this dtype is both's fallback
        return None
    # a table says its phase; other points take the fit the time function would
    on_decode = np.full(len(pts), phase == "decode") if phase else decode_like(pts.new, pts.context - pts.new)
    t, lo, hi = np.empty(len(pts)), np.empty(len(pts)), np.empty(len(pts))
    inside = np.zeros(len(pts), bool)
    used = []
    for fit, rows in ((decode, np.flatnonzero(on_decode)), (prefill, np.flatnonzero(~on_decode))):
        if len(rows) == 0:
            continue
        used.append(f"{fit.source} ({fit.dtype})")
        spread = spread_of(fit, op, pts.take(rows), peak, bandwidth, sms)
        t[rows] = spread.time
        inside[rows] = spread.basis == basis_mod.MEASURED
        if spread.has_interval and intervals:  # widened to hold the point value, as printed intervals are
            d = u.draws(0, len(spread.alternatives))
            lo[rows], hi[rows] = u.interval_around(spread.scenarios(d), spread.time)
        else:
            lo[rows], hi[rows] = np.nan, np.nan
    return Predicted(t, lo, hi, inside, tuple(dict.fromkeys(used)))


def score_group(calibration, key: tuple[str, str, str], pts: Points) -> Score:
    op, source, dtype = key
    p = predicted(calibration, key, pts)
    if p is None:
        return Score(op, source, dtype, len(pts), note=uncovered(calibration, op, dtype))
    y = np.asarray(pts.time_s, dtype=np.float64)
    ratio = p.time / y - 1.0
    err = summary(np.abs(ratio))
    covered = np.isfinite(p.lo)
    return Score(
        op,
        source,
        dtype,
        len(pts),
        err["median"],
        err["p90"],
        float(np.median(ratio)),
        float(np.mean((p.lo <= y) & (y <= p.hi))) if covered.all() else None,
        float(np.mean(p.inside)),
        " + ".join(p.used),
    )


def score(calibration, groups: dict, hardware: str | None = None, where: str = "the measurements") -> list[Score]:
    """A Score per measured group ({(op, source, dtype): Points}), in sorted order; `hardware`
    names the profile the measurements were taken on (None: the calibration's own)."""
    check_measured_on(calibration, hardware, where)
    if not groups:
        raise MlactlError("no measured points to score")
    return [score_group(calibration, key, pts) for key, pts in sorted(groups.items())]


def panels(calibration, groups: dict) -> list[dict]:
    """Per op class, what `mlactl plot transfer` draws: every covered point's measured and
    predicted seconds, its 80% interval (NaN: none) and its roofline at the calibration's
    ceilings; with the class's median and p90 of |predicted / measured - 1| and the roofline's.
    Classes in sorted order; a group no fit covers is left out."""
    peak, bandwidth, _ = machine_of(calibration)
    by_op: dict[str, list] = {}
    for key, pts in sorted(groups.items()):
        p = predicted(calibration, key, pts)
        if p is None:
            continue
        roof = np.maximum(np.asarray(pts.flops) / peak, np.asarray(pts.bytes) / bandwidth)
        by_op.setdefault(key[0], []).append((np.asarray(pts.time_s, dtype=np.float64), p, roof))
    out = []
    for op, parts in by_op.items():
        y = np.concatenate([a for a, _, _ in parts])
        t = np.concatenate([p.time for _, p, _ in parts])
        roof = np.concatenate([r for _, _, r in parts])
        lo = np.concatenate([p.lo for _, p, _ in parts])
        hi = np.concatenate([p.hi for _, p, _ in parts])
        err, roof_err = summary(rel_errors(t, y)), summary(rel_errors(roof, y))
        inside = (lo <= y) & (y <= hi)
        out.append(
            {
                "op": op,
                "n": int(len(y)),
                "measured_s": y.tolist(),
                "predicted_s": t.tolist(),
                "lo_s": lo.tolist(),
                "hi_s": hi.tolist(),
                "roofline_s": roof.tolist(),
                "median": err["median"],
                "p90": err["p90"],
                "roofline_median": roof_err["median"],
                "coverage": float(np.mean(inside)) if np.isfinite(lo).all() else None,
            }
        )
    return out
