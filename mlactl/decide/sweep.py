"""An engine's threshold tried at every value that changes a path: what `mlactl engines` sweeps
over a workload and `mlactl replay` over a trace, and the one rule that picks the best value.

    i = pick(thresholds, totals, current, lows, highs)   # the least total; ties: the current's
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIE_REL = 1e-12  # totals this close to the least are ties (sums in another order differ by that much)


@dataclass(frozen=True)
class Sweep:
    """A threshold swept over every value that changes a path. `best_range`: the thresholds that
    all reach the least time (high None: unbounded). `curve`: (threshold, time) at each value
    tried (a workload's: every one; a trace's: at most replay's CURVE_POINTS); a None threshold
    is the option off."""

    engine: str
    option: str
    current: int | None  # None: off (vLLM's masked-MHA table: never in this bucket)
    current_time_s: float  # the time under the current threshold
    best: int | None
    best_range: tuple[int, int | None]
    best_time_s: float
    curve: list[tuple[int | None, float]]
    compares: str = ""  # what the threshold is compared with, in words (replay's)

    @property
    def saves(self) -> float:
        """Fraction of the current time the best threshold saves (all of it when the current
        threshold leaves a shape that does not fit)."""
        if not np.isfinite(self.current_time_s):
            return 1.0
        return (self.current_time_s - self.best_time_s) / self.current_time_s if self.current_time_s else 0.0


def tied(totals: np.ndarray) -> np.ndarray:
    """Indices of the totals that tie with the least."""
    least = totals.min()
    return np.flatnonzero(totals <= least + TIE_REL * max(abs(least), 1e-30))


def pick(thresholds: np.ndarray, totals: np.ndarray, current: int, lows, highs) -> int:
    """Index of the least total; among ties, the choice whose range [lows[i], highs[i]] holds
    `current`, else the one nearest to it in log2."""
    ties = tied(totals)
    for i in ties:
        if lows[i] <= current and (highs[i] is None or current <= highs[i]):
            return int(i)
    near = np.abs(np.log2(np.maximum(np.asarray(thresholds, dtype=np.float64)[ties], 1)) - np.log2(max(current, 1)))
    return int(ties[np.argmin(near)])
