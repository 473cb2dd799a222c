"""What a path rule costs on some work against the best paths on the same work: one result type
for `mlactl engines` (a workload's shapes) and `mlactl replay` (a trace's steps).

    loss = RuleLoss(time_s=12.0, best_s=10.0, lost_s=2.0)
    loss.lost_pct                      # 16.7: the loss as a share of the rule's time

Calibrated, each total has its 80% interval (`*_span`, None where it has none: a roofline time, an
op without evidence, a path that does not fit the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

Span = tuple[float, float]


@dataclass(frozen=True)
class RuleLoss:
    time_s: float  # the work under the rule's paths
    best_s: float  # ... on the best paths (replay: per step the least of the best one path,
    #               each request on its own best path, and the rule's)
    lost_s: float  # what the rule loses against the best (>= 0; +inf where a path it takes does not fit)
    # replay's two other references: the best one path per step, step by step, and each request
    # on its own best path (None for work that is not steps of several requests)
    lost_step_s: float | None = None
    lost_request_s: float | None = None
    time_span: Span | None = None
    best_span: Span | None = None
    lost_span: Span | None = None
    lost_step_span: Span | None = None
    lost_request_span: Span | None = None

    def with_spans(
        self,
        time: Span | None = None,
        best: Span | None = None,
        lost: Span | None = None,
        lost_step: Span | None = None,
        lost_request: Span | None = None,
    ) -> RuleLoss:
        """These totals with their intervals, each widened to hold its point value (`widened`)."""
        return replace(
            self,
            time_span=widened(time, self.time_s),
            best_span=widened(best, self.best_s),
            lost_span=widened(lost, self.lost_s),
            lost_step_span=None if self.lost_step_s is None else widened(lost_step, self.lost_step_s),
            lost_request_span=None if self.lost_request_s is None else widened(lost_request, self.lost_request_s),
        )

    @property
    def lost_pct(self) -> float:
        """The loss as a share of the rule's time (0 for work that takes no time)."""
        return 100.0 * self.lost_s / self.time_s if self.time_s else 0.0


def widened(span: Span | None, point: float) -> Span | None:
    """An interval stretched to hold its point value (a sampled interval can miss it); None
    where there is none or the point is not finite (a path that does not fit)."""
    if span is None or point != point or point in (float("inf"), float("-inf")):
        return None
    return (min(span[0], point), max(span[1], point))


def lost_against(rule, reference) -> np.ndarray:
    """What the rule's times lose against a reference's, element by element: never below 0;
    +inf where the rule's path does not fit (its time is +inf), whatever the reference; 0 where
    only the reference does not fit (no path of that kind runs the step, so the rule loses
    nothing to it). Never NaN."""
    rule, reference = np.asarray(rule, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isfinite(reference), np.maximum(rule - reference, 0.0), 0.0)
    return np.where(np.isposinf(rule), np.inf, gap)
