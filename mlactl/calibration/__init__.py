"""Calibrated time: cost.py's FLOPs and bytes mapped to measured time, per op class.

model.py    the time of one op class: t_fixed + roofline with fitted efficiencies + the terms
            the data earns (tile padding, waves, split-KV, serial KV-block latency)
fit.py      robust fit in relative error; k-fold held-out error
sources     aiconfigurator.py (NVIDIA's measured tables), sources.py (tune results, CSV)
store.py    calibration files under $MLACTL_HOME/calibrations/
time.py     THE time function every printed time goes through (roofline or calibrated)

Importing this package does not import scipy (only fitting does) nor torch.
"""

from __future__ import annotations

from mlactl.calibration.model import BASE_TERMS, TERMS
from mlactl.calibration.store import Calibration, check_hardware, load, resolve

# the candidate term sets a fit tries; the one with the least held-out error is kept, so a term
# stays only where it lowers the held-out error (docs/calibration.md)
CANDIDATE_TERMS: tuple[tuple[str, ...], ...] = (
    BASE_TERMS,
    ("fixed", "pad", "waves"),
    ("fixed", "kvpad", "serial"),
    ("fixed", "pad", "waves", "kvpad", "serial"),
    ("fixed", "pad", "waves", "split", "kvpad", "serial"),
)

__all__ = ["CANDIDATE_TERMS", "TERMS", "Calibration", "check_hardware", "fit_groups", "load", "resolve"]


def fit_groups(groups: dict, machine, *, select: bool = True, k: int | None = None) -> list:
    """Fit every (op class, source, dtype) group; with `select`, each keeps the candidate term set
    with the least held-out error (mean of median and p90), else the base model."""
    from mlactl.calibration.fit import K_FOLDS, fit

    k = k or K_FOLDS
    out = []
    for (op, source, dtype), pts in sorted(groups.items()):
        candidates = CANDIDATE_TERMS if select and not op.startswith("path:") else (BASE_TERMS,)
        best = None
        for terms in candidates:
            result = fit(pts, machine, terms, source, dtype, k)
            ho = result.held_out
            score = (ho["median"] + ho["p90"]) / 2 if ho["median"] is not None else 0.0
            if best is None or score < best[0] - 1e-9:
                best = (score, result)
        out.append(best[1])
    return out
