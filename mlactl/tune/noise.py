"""How far a measured crossover can be trusted: its estimate with a bootstrap interval, its
bracket widened by noise, and whether the crossovers of one batch grow with the prefix as they must.

The estimate (`root_crossover`): near the crossover expand and absorb are within a few percent
of each other over many new-token counts, so whether expand wins at one count is decided by
noise, and "the smallest count from which expand wins at every larger one" (kept as
`first_stable`) moved by 28% between two runs of one command on the project's shared CPU. The
ratio of the two paths is smooth in the count, though (they are timed in turns). So the crossover
is the root of a straight line fitted to y = log(expand / absorb) against log2(new) over the
ROOT_WINDOW counts measured on each side of the sign change before `first_stable` (at least
two, one on each side). Its interval comes from BOOTSTRAP resamplings of the rounds of each
timing (a round times both paths, so a resampled round keeps the pair together): the 10th and
90th percentiles of the resampled roots.

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


ROOT_WINDOW = 3  # measured counts on each side of the sign change that the local fit uses
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


def root_crossover(points: dict[int, dict[str, dict]], first_stable: int | None) -> dict | None:
    """The crossover estimated as the root of a local fit of log(expand / absorb) (see above):
    {"root", "measured" (the smallest whole count from the root on), "interval" ([lo, hi], None
    without repeated timings), "window" ([lowest, highest] count fitted), "bootstrap" (draws
    that gave a root)}; None where there is no sign change to fit (no count below first_stable
    where absorb won, or no first_stable)."""
    if first_stable is None:
        return None
    ys = {n: _log_ratio(rows.get("expand"), rows.get("absorb")) for n, rows in points.items()}
    ns = sorted(n for n, y in ys.items() if y is not None)
    if first_stable not in ns or ns.index(first_stable) == 0:
        return None
    i = ns.index(first_stable)
    window = ns[max(0, i - ROOT_WINDOW) : i + ROOT_WINDOW]
    x = np.log2(np.asarray(window, dtype=np.float64))
    y = np.asarray([ys[n] for n in window])
    root = _root(x, y, x[0], x[-1])
    if root is None:
        return None
    out = {"root": round(2**root, 3), "measured": math.ceil(2**root - 1e-9), "window": [window[0], window[-1]]}
    rounds = [_paired_rounds(points[n].get("expand"), points[n].get("absorb")) for n in window]
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
        r = _root(x, np.asarray(yb), x[0], x[-1])
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
