"""Workload points: parsing lists and ranges of sizes, and building the (batch, new, prefix) grid.

A size list is comma-separated items; each item is
  an integer            4096, 8K (K = 1024), 1M (M = 1024*1024)
  a linear range        start:stop:step   both ends included when stop is on the step (0:32K:4K)
  a geometric range     start:stop:*factor                                       (1:4096:*2)
"""

from __future__ import annotations

import re

import numpy as np

from mlactl.errors import MlactlError

_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_INT = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")
MAX_POINTS = 50_000_000


def _int(text: str, option: str, item: str) -> int:
    match = _INT.match(text)
    if not match:
        raise MlactlError(f"{option}: {item!r} is not a whole number (use digits, optionally K or M)")
    return int(match.group(1)) * _SUFFIX[match.group(2).lower()]


def parse_sizes(spec: str | int | list, option: str, minimum: int = 1) -> list[int]:
    """'1,64,512' / '0:32K:4K' / '1:4096:*2' -> sorted unique ints, each >= minimum."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        items = [str(spec)]
    elif isinstance(spec, (list, tuple)):
        items = [str(s) for s in spec]
    else:
        items = str(spec).split(",")
    values: set[int] = set()
    for item in items:
        item = item.strip()
        if not item:
            raise MlactlError(f"{option}: empty item in {spec!r}")
        parts = item.split(":")
        if len(parts) == 1:
            values.add(_int(parts[0], option, item))
            continue
        if len(parts) not in (2, 3):
            raise MlactlError(f"{option}: {item!r} is not a range; write start:stop:step or start:stop:*factor")
        start, stop = _int(parts[0], option, item), _int(parts[1], option, item)
        if stop < start:
            raise MlactlError(f"{option}: range {item!r} ends before it starts")
        step_text = parts[2].strip() if len(parts) == 3 else "1"
        if step_text.startswith("*"):
            factor = _int(step_text[1:], option, item)
            if factor < 2:
                raise MlactlError(f"{option}: geometric factor in {item!r} must be at least 2")
            if start == 0:
                raise MlactlError(f"{option}: geometric range {item!r} cannot start at 0")
            v = start
            while v <= stop:
                values.add(v)
                v *= factor
        else:
            step = _int(step_text, option, item)
            if step < 1:
                raise MlactlError(f"{option}: step in {item!r} must be at least 1")
            if (stop - start) // step + 1 > MAX_POINTS:
                raise MlactlError(f"{option}: range {item!r} has more than {MAX_POINTS} values")
            values.update(range(start, stop + 1, step))
    bad = sorted(v for v in values if v < minimum)
    if bad:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise MlactlError(f"{option}: {bad[0]} must be {what}")
    return sorted(values)


def grid(
    batch: list[int], new: list[int], prefix: list[int] | None = None, context: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every combination, ordered batch, then prefix (or context), then new; int64 arrays.

    With `context` instead of `prefix`, prefix = context - new, and a context shorter than a new
    count is an error rather than a silently dropped point.
    """
    if (prefix is None) == (context is None):
        raise MlactlError("give either --prefix or --context, not both")
    outer: list[int] = prefix if prefix is not None else context  # type: ignore[assignment]  # one is set
    total = len(batch) * len(outer) * len(new)
    if total > MAX_POINTS:
        raise MlactlError(f"the grid has {total:,} points; the limit is {MAX_POINTS:,}")
    b, o, n = (
        axis.reshape(-1)
        for axis in np.meshgrid(
            np.asarray(batch, np.int64), np.asarray(outer, np.int64), np.asarray(new, np.int64), indexing="ij"
        )
    )
    if context is None:
        return b, n, o
    short = o < n
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise MlactlError(f"--context {o[i]} is shorter than --new {n[i]}: the context includes the new tokens")
    return b, n, o - n
