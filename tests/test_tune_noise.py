"""The noise in a measured crossover (mlactl/tune/noise.py), on given times: the bracket the
timings' spreads widen a crossover to, and a crossover that falls as the prefix grows, flagged."""

from mlactl.output import tune_tables
from mlactl.tune import noise, sweep


def _row(median, p10, p90):
    return {"median_s": median, "p10_s": p10, "p90_s": p90}


def test_crossover_bracket_widened_by_noise():
    points = {
        8: {"expand": _row(3, 2.9, 3.1), "absorb": _row(1, 0.9, 1.1)},  # absorb decisively
        16: {"expand": _row(1.1, 0.8, 1.4), "absorb": _row(1.0, 0.9, 1.2)},  # overlap: undecided
        32: {"expand": _row(0.9, 0.7, 1.3), "absorb": _row(1.0, 0.9, 1.1)},  # expand by median only
        64: {"expand": _row(0.5, 0.45, 0.55), "absorb": _row(1.0, 0.9, 1.1)},  # expand decisively
    }
    assert sweep.measured_crossover({n: {p: r["median_s"] for p, r in v.items()} for n, v in points.items()}) == 32
    assert noise.bracket(points, 32) == (8, 64)
    assert noise.bracket(points, None) == (None, None)
    row = {"measured": 32, "measured_low": 8, "measured_high": 64, "measured_status": "found"}
    assert tune_tables.crossover_text(row) == "32 (8–64)"


def test_nonmonotone_over_prefix_is_flagged():
    # crossovers 79 / 79 / 17 at prefixes 0 / 256 / 1K: the last falls
    rows = [
        {"batch": 1, "prefix": p, "measured": m, "measured_status": "found"}
        for p, m in ((0, 79), (256, 79), (1024, 17))
    ]
    noise.flag_nonmonotone(rows)
    assert [r["nonmonotone"] for r in rows] == [False, False, True]
    assert tune_tables.crossover_text(rows[2]).endswith("↓")
    # never (expand won at none of 256 counts) at a short prefix, then 64 at a longer one
    rows = [
        {"batch": 1, "prefix": 0, "measured": None, "measured_status": "never", "measured_new": [1, 256]},
        {"batch": 1, "prefix": 512, "measured": 64, "measured_status": "found"},
    ]
    noise.flag_nonmonotone(rows)
    assert rows[1]["nonmonotone"] is True
