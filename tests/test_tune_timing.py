"""Timing a launch (mlactl/tune/timing.py), on given times and fake clocks: the coefficient of
variation and the percentiles by hand, a noisy timing measured again until it is stable, and
interleaved timing, which takes turns and so cancels a machine that slows down as it runs. No
assertion depends on a real timing."""

import pytest

from mlactl.tune import timing


def test_coefficient_of_variation_by_hand():
    # 1, 2, 3: mean 2, sample stdev 1
    assert timing.coefficient_of_variation([1.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert timing.coefficient_of_variation([2.0, 2.0]) == 0.0
    t = timing.summarize([1.0, 2.0, 3.0, 4.0, 100.0], "wall-clock", "warm")
    assert t.p10_s == pytest.approx(1.4) and t.p90_s == pytest.approx(61.6)  # linear interpolation
    assert t.to_dict()["unstable"] is True and "cv" in t.to_dict()


def test_unstable_timing_is_measured_again(monkeypatch):
    made = iter([0.30, 0.25, 0.04, 0.01])

    def fake(fns, **kw):
        return {name: timing.Timing(1.0, 0.9, 1.1, 5, "wall-clock", "warm", cv=next(made)) for name in fns}

    monkeypatch.setattr(timing, "time_interleaved", fake)
    got = timing.time_stable(lambda: None, repeats=5)
    assert got.cv == 0.04 and got.remeasured == 2  # stops once stable
    made = iter([0.30, 0.25, 0.20])
    got = timing.time_stable(lambda: None, repeats=2)
    assert got.cv == 0.20 and got.remeasured == 2 and got.to_dict()["unstable"] is True


def test_interleaved_timing_takes_turns(monkeypatch):
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    timing.time_interleaved(fns, warmup=0, min_repeats=3, max_repeats=3)
    # one call of each to size the repetitions, then three rounds, each starting elsewhere
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]


def test_interleaved_timing_cancels_a_slowing_machine(monkeypatch):
    # a fake clock: every call costs 1 s times a slowdown that grows 10% per call, alike for both
    clock, calls = [0.0], [0]

    def work():
        calls[0] += 1
        clock[0] += 1.1 ** calls[0]

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    kw = dict(warmup=0, min_repeats=9, max_repeats=9)
    both = timing.time_interleaved({"a": work, "b": work}, **kw)
    paired = both["a"].median_s / both["b"].median_s
    one_after_other = timing.time_call(work, **kw).median_s / timing.time_call(work, **kw).median_s
    assert abs(paired - 1) < 0.1  # by hand: the medians are calls 11 and 12 (ratio 1/1.1)
    assert one_after_other < 0.5  # the first timed 10 calls before the second: 1.1**-10 = 0.39
