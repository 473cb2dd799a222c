"""The best threshold of a sweep, picked by hand on small tables."""

import numpy as np

from mlactl.decide.sweep import Sweep, pick


def test_the_least_total_wins():
    assert pick(np.array([1, 8, 64]), np.array([3.0, 1.0, 2.0]), 1, [1, 2, 9], [1, 8, None]) == 1


def test_a_tie_keeps_the_current_threshold_where_its_range_holds_it():
    totals = np.array([2.0, 1.0, 1.0, 1.0])
    thresholds = np.array([1, 16, 256, 4096])
    lows, highs = [1, 2, 17, 257], [1, 16, 256, None]
    assert pick(thresholds, totals, 200, lows, highs) == 2  # 200 lies in (16, 256]
    assert pick(thresholds, totals, 10_000, lows, highs) == 3  # and past 4096, in the open range


def test_a_tie_away_from_the_current_goes_to_the_nearest_in_log2():
    # current 100 lies in no tied range; log2 distances to 16 and 4096 are 2.64 and 5.36
    assert pick(np.array([1, 16, 4096]), np.array([1.0, 1.0, 1.0]), 100, [1, 2, 4000], [1, 16, None]) == 1


def test_totals_within_rounding_of_the_least_are_ties():
    totals = np.array([1.0 + 1e-15, 1.0, 5.0])
    assert pick(np.array([1, 2, 3]), totals, 1, [1, 2, 3], [1, 2, None]) == 0


def test_saves_is_the_share_of_the_current_time():
    s = Sweep("sglang", "t", 8192, 10.0, 4096, (2049, 4096), 7.5, [])
    assert s.saves == 0.25
    assert Sweep("vllm", "t", None, float("inf"), 64, (1, 64), 3.0, []).saves == 1.0  # a shape that did not fit
    assert Sweep("vllm", "t", 1, 0.0, 1, (1, 1), 0.0, []).saves == 0.0
