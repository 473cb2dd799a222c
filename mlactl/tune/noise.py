"""How far a measured crossover can be trusted: its estimate with a bootstrap interval, its
bracket widened by noise, and whether the crossovers of one batch grow with the prefix as they must.

The estimate (`root_crossover`): near the crossover expand and absorb are within a few percent
of each other over many new-token counts, so whether expand wins at one count is decided by
noise, and "the smallest count from which expand wins at every larger one" (kept as
`first_stable`) moved by 28% between two runs of one command on the project's shared CPU. The
ratio of the two paths is smooth in the count, though (they are timed in turns), except for the
odd disturbed timing. So:

1. y = log(expand / absorb) at each count measured (ratio of medians), smoothed by a running
   median of 3 (one disturbed timing can neither make a sign change nor pull the fit);
2. the sign change: the last count where smoothed y > 0 before the counts where it stays < 0;
3. the crossover is the root of the least-squares line through smoothed y against log2(new) over
   the ROOT_WINDOW counts measured on each side of that change. Two a side: y is convex in
   log2(new) (steep at small counts, flat near and past the crossover), and a line through three
   a side on the project's CPU run (counts 32-320) put the root at 201-250 where the two counts
   around the change, 128 and 192, cross at 168.

Its interval comes from BOOTSTRAP resamplings of the rounds of each timing (a round times both
paths, so a resampled round keeps the pair together): the 10th and 90th percentiles of the
resampled roots. On the project's CPU a timing disturbed by another tenant (CV 0.23) put the
ratio at 320 new tokens at 1.29 between 0.86 and 0.82, and `first_stable` at 323 where the ratio
crosses 1 between 128 and 192.

A point is *decided* when the 10th-90th percentile ranges of expand and absorb do not overlap;
otherwise noise alone could flip which one wins there. The measured crossover X (the smallest
measured new count from which expand wins at every larger one) lies above the last count absorb
won decisively and at or below the first count expand won decisively: that pair is its bracket.
With no noise it is the bisection's own bracket (the measured count just below X, and X).

A longer prefix makes expand re-expand more cached tokens per new token, so the crossover cannot
fall as the prefix grows (by FLOPs: 1 at prefix 0, 149 at 512 for the teaching model). A
measured crossover below that of a shorter prefix is flagged `nonmonotone`: noise, or a sweep too
coarse to place it.

Nothing here imports torch.
"""

from __future__ import annotations

import math

import numpy as np

# measured_status of a crossover row
FOUND = "found"  # expand wins from `measured` on
NEVER = "never"  # every new count of the sweep was measured and expand won at none (at the largest)
BUDGET = "budget"  # the time budget cut the sweep before expand won: nothing is known past it


def decided(expand: dict | None, absorb: dict | None) -> str | None:
    """'expand' or 'absorb' when one path's p90 is below the other's p10; None when the ranges
    overlap or a path has no time."""
    if not expand or not absorb:
        return None
    e_lo, e_hi = expand.get("p10_s", expand["median_s"]), expand.get("p90_s", expand["median_s"])
    a_lo, a_hi = absorb.get("p10_s", absorb["median_s"]), absorb.get("p90_s", absorb["median_s"])
    if e_hi < a_lo:
        return "expand"
    if a_hi < e_lo:
        return "absorb"
    return None


def bracket(points: dict[int, dict[str, dict]], crossover: int | None) -> tuple[int | None, int | None]:
    """(low, high) around a measured crossover from the rows {new: {path: row}}: the crossover
    lies in (low, high]. low None: absorb won decisively at no smaller count; high None: expand
    won decisively at no count from the crossover on."""
    if crossover is None:
        return None, None
    wins = {n: decided(rows.get("expand"), rows.get("absorb")) for n, rows in points.items()}
    below = [n for n, w in wins.items() if n < crossover and w == "absorb"]
    above = [n for n, w in wins.items() if n >= crossover and w == "expand"]
    return (max(below) if below else None), (min(above) if above else None)


def flag_nonmonotone(rows: list[dict]) -> None:
    """Set `nonmonotone` on each crossover row (of one batch size) whose measured crossover is
    below one measured at a shorter prefix; "never" counts as above every count measured."""
    by_batch: dict[int, list[dict]] = {}
    for row in rows:
        by_batch.setdefault(row["batch"], []).append(row)
    for group in by_batch.values():
        highest = -math.inf
        for row in sorted(group, key=lambda r: r["prefix"]):
            status = row.get("measured_status")
            value = row.get("measured")
            if value is None and status != NEVER:
                continue  # cut by the budget: says nothing
            level = math.inf if value is None else value
            row["nonmonotone"] = level < highest
            highest = max(highest, level)


ROOT_WINDOW = 2  # measured counts on each side of the sign change that the local fit uses
BOOTSTRAP = 200
BOOTSTRAP_SEED = 22
INTERVAL = (0.1, 0.9)  # the bootstrap interval's percentiles: 80%, as calibrated intervals


def _log_ratio(expand: dict | None, absorb: dict | None) -> float | None:
    if not expand or not absorb or not expand.get("median_s") or not absorb.get("median_s"):
        return None
    return math.log(expand["median_s"] / absorb["median_s"])


def _root(x: np.ndarray, y: np.ndarray, low: float, high: float) -> float | None:
    """The root of the least-squares line through (x, y), if it falls (y decreasing with x), kept
    within [low, high] (the window's counts, log2)."""
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    slope, icept = np.polyfit(x, y, 1)
    if not slope < 0:
        return None
    return float(np.clip(-icept / slope, low, high))


def _running_median(values: list[float]) -> list[float]:
    """Each value replaced by the median of it and its two neighbours (the ends kept)."""
    out = list(values)
    for k in range(1, len(values) - 1):
        out[k] = float(np.median(values[k - 1 : k + 2]))
    return out


def sign_change(ns: list[int], ys: list[float]) -> int | None:
    """The index in `ns` of the first count of the run, at the end, where the smoothed y stays below
    0, if some count before it has it above (see the module docstring); else None."""
    smooth = _running_median(ys)
    k = len(ns)
    while k > 0 and smooth[k - 1] < 0:
        k -= 1
    if k == len(ns) or k == 0:
        return None
    return k


def root_crossover(points: dict[int, dict[str, dict]], first_stable: int | None) -> dict | None:
    """The crossover estimated as the root of a local fit of log(expand / absorb) (see above):
    {"root", "measured" (the smallest whole count from the root on), "interval" ([lo, hi], None
    without repeated timings), "window" ([lowest, highest] count fitted), "bootstrap" (draws
    that gave a root)}; None where there is no sign change to fit (expand wins from the smallest
    count measured, or at none; `first_stable` None: expand does not win at the largest)."""
    if first_stable is None:
        return None
    ratios = {n: _log_ratio(rows.get("expand"), rows.get("absorb")) for n, rows in points.items()}
    ys: dict[int, float] = {n: y for n, y in ratios.items() if y is not None}
    ns = sorted(ys)
    i = sign_change(ns, [ys[n] for n in ns])
    if i is None:
        return None
    lo_i, hi_i = max(0, i - ROOT_WINDOW), min(len(ns), i + ROOT_WINDOW)
    near = ns[max(0, lo_i - 1) : hi_i + 1]  # the window and a neighbour each side, for the smoothing
    inside = slice(lo_i - max(0, lo_i - 1), lo_i - max(0, lo_i - 1) + hi_i - lo_i)
    x = np.log2(np.asarray(near, dtype=np.float64))[inside]

    def fitted_root(values: list[float]) -> float | None:
        y = np.asarray(_running_median(values))[inside]
        return _root(x, y, x[0], x[-1])

    root = fitted_root([ys[n] for n in near])
    if root is None:
        return None
    window = near[inside]
    out = {"root": round(2**root, 3), "measured": math.ceil(2**root - 1e-9), "window": [window[0], window[-1]]}
    rounds = [_paired_rounds(points[n].get("expand"), points[n].get("absorb")) for n in near]
    if any(r is None for r in rounds):
        out.update(interval=None, bootstrap=0)
        return out
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    roots = []
    for _ in range(BOOTSTRAP):
        yb = []
        for e, a in rounds:
            pick = rng.integers(0, len(e), len(e))
            yb.append(math.log(float(np.median(e[pick])) / float(np.median(a[pick]))))
        r = fitted_root(yb)
        if r is not None:
            roots.append(2**r)
    if len(roots) < BOOTSTRAP / 2:  # most resamplings find no falling line: no interval worth the name
        out.update(interval=None, bootstrap=len(roots))
        return out
    lo, hi = np.quantile(roots, INTERVAL)
    out.update(
        interval=[min(math.ceil(lo - 1e-9), out["measured"]), max(math.ceil(hi - 1e-9), out["measured"])],
        bootstrap=len(roots),
    )
    return out


def _paired_rounds(expand: dict | None, absorb: dict | None):
    """(expand times, absorb times) of the rounds both were timed in, or None without them."""
    e, a = (expand or {}).get("times_s"), (absorb or {}).get("times_s")
    if not e or not a:
        return None
    k = min(len(e), len(a))
    return np.asarray(e[:k], dtype=np.float64), np.asarray(a[:k], dtype=np.float64)
