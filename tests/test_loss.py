"""RuleLoss (mlactl.decide.loss): the one result type of a rule's time against the best."""

from __future__ import annotations

import math

from mlactl.decide.loss import RuleLoss, lost_against, widened


def test_lost_pct_is_the_loss_over_the_rules_time():
    assert RuleLoss(12.0, 10.0, 2.0).lost_pct == 100.0 * 2.0 / 12.0
    assert RuleLoss(0.0, 0.0, 0.0).lost_pct == 0.0  # work that takes no time loses nothing


def test_an_interval_is_widened_to_hold_its_point():
    # a sampled interval (1.0, 1.5) of a point 1.6 becomes (1.0, 1.6); one that holds it stays
    assert widened((1.0, 1.5), 1.6) == (1.0, 1.6)
    assert widened((1.0, 2.0), 1.6) == (1.0, 2.0)
    assert widened((1.7, 2.0), 1.6) == (1.6, 2.0)
    assert widened(None, 1.6) is None
    assert widened((1.0, 2.0), math.inf) is None  # a path that does not fit has no interval
    assert widened((1.0, 2.0), math.nan) is None


def test_with_spans_sets_each_total_and_leaves_replays_references_unset_where_absent():
    loss = RuleLoss(10.0, 8.0, 2.0).with_spans(time=(9.0, 11.0), lost=(2.5, 3.0), lost_step=(0.0, 1.0))
    assert loss.time_span == (9.0, 11.0)
    assert loss.lost_span == (2.0, 3.0)  # widened down to its point 2.0
    assert loss.best_span is None
    # no per-step reference (a workload's shapes): its interval stays unset
    assert loss.lost_step_s is None and loss.lost_step_span is None
    replayed = RuleLoss(10.0, 8.0, 2.0, 1.5, 0.5).with_spans(lost_step=(1.0, 1.2), lost_request=(0.6, 0.9))
    assert replayed.lost_step_span == (1.0, 1.5) and replayed.lost_request_span == (0.5, 0.9)


def test_a_loss_against_a_reference_is_never_nan_nor_below_zero():
    inf = float("inf")
    rule = [3.0, 1.0, 2.0, inf, inf, inf]
    reference = [1.0, 3.0, inf, 1.0, inf, float("nan")]
    # 3-1; never below 0; the reference does not fit: nothing lost to it; the rule does not
    # fit: +inf whatever the reference (inf - inf is NaN in plain subtraction)
    assert lost_against(rule, reference).tolist() == [2.0, 0.0, 0.0, inf, inf, inf]
    assert float(lost_against(inf, inf)) == inf
