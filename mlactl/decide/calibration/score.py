"""Scoring a calibration on measurements it was not fitted to: `mlactl calibrate score`.

For each group of measured points (op class, kernel source, dtype; the same groups `mlactl
calibrate` fits), the calibration's fit of that op class predicts every point, and the score is

    n          points
    median     median of |predicted / measured - 1|
    p90        its 90th percentile
    bias       median of predicted / measured - 1, signed (> 0: the calibration predicts slow)
    coverage   the share of measurements inside their 80% interval (None: the fit has none)
    measured   the share of points inside the fit's measured range (basis `measured`)

A group whose op class the calibration has no fit for is listed with n and nothing else. Where
the calibration has a decode and a prefill fit of a class, a point takes the one the time
function would (mlactl.decide.calibration.time.op_seconds); an aiconfigurator table says which
it is (its source ends in :decode or :prefill). Predictions divide by the ceilings the
calibration was fitted with (its "ceilings"), so no hardware profile is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.decide.calibration import basis as basis_mod
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.estimate import spread_of
from mlactl.decide.calibration.model import DECODE_MAX_NEW, Points
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


def _phase(source: str) -> str | None:
    for phase in ("decode", "prefill"):
        if source.endswith(":" + phase):
            return phase
    return None


def score_group(calibration, key: tuple[str, str, str], pts: Points) -> Score:
    op, source, dtype = key
    peak, bandwidth, sms = machine_of(calibration)
    phase = _phase(source)
    decode = calibration.fit_for(op, dtype, phase or "decode")
    prefill = calibration.fit_for(op, dtype, phase or "prefill")
    if decode is None:
        return Score(op, source, dtype, len(pts))
    y = np.asarray(pts.time_s, dtype=np.float64)
    decode_like = (
        np.ones(len(pts), bool)
        if phase == "decode"
        else np.zeros(len(pts), bool)
        if phase == "prefill"
        else (pts.context > pts.new) & (pts.new <= DECODE_MAX_NEW)
    )
    t, lo, hi = np.empty(len(pts)), np.empty(len(pts)), np.empty(len(pts))
    inside = np.zeros(len(pts), bool)
    used = []
    for fit, rows in ((decode, np.flatnonzero(decode_like)), (prefill, np.flatnonzero(~decode_like))):
        if len(rows) == 0:
            continue
        used.append(f"{fit.get('source')} ({fit.get('dtype')})")
        spread = spread_of(fit, op, pts.take(rows), peak, bandwidth, sms)
        t[rows] = spread.time
        inside[rows] = spread.basis == basis_mod.MEASURED
        if spread.has_interval:  # widened to hold the point value, as printed intervals are
            a, b = u.percentiles(spread.scenarios(u.draws(0, len(spread.alternatives))))
            lo[rows], hi[rows] = np.minimum(a, spread.time), np.maximum(b, spread.time)
        else:
            lo[rows], hi[rows] = np.nan, np.nan
    ratio = t / y - 1.0
    err = np.abs(ratio)
    covered = np.isfinite(lo)
    return Score(
        op,
        source,
        dtype,
        len(pts),
        float(np.median(err)),
        float(np.percentile(err, 90)),
        float(np.median(ratio)),
        float(np.mean((lo <= y) & (y <= hi))) if covered.all() else None,
        float(np.mean(inside)),
        " + ".join(dict.fromkeys(used)),
    )


def score(calibration, groups: dict) -> list[Score]:
    """A Score per measured group ({(op, source, dtype): Points}), in sorted order."""
    if not groups:
        raise MlactlError("no measured points to score")
    return [score_group(calibration, key, pts) for key, pts in sorted(groups.items())]
