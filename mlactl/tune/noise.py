"""How far a measured crossover can be trusted: its bracket, widened by noise, and whether the
crossovers of one batch grow with the prefix as they must.

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
