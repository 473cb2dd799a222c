"""Workload points: parsing lists and ranges of sizes, and building the (batch, new, prefix) grid.

A size list is comma-separated items; each item is
  an integer            4096, 8K (K = 1024), 1M (M = 1024*1024)
  a linear range        start:stop:step   both ends included when stop is on the step (0:32K:4K)
  a geometric range     start:stop:*factor                                       (1:4096:*2)
"""

from __future__ import annotations

import numpy as np

from mlactl.util import numbers
from mlactl.util.errors import MlactlError, warn
from mlactl.util.limits import check_points, max_values
from mlactl.util.numbers import must_be

# ASCII digits only (mlactl.util.numbers): str.isdigit() and \\d also take '²' or '٣'.
_INT = numbers.INT
MAX_POINTS = 50_000_000


def _int(text: str, option: str, item: str, minimum: int = 1) -> int:
    """A size of a list: refused here when negative (saying what `minimum` is); a size from 0 to
    `minimum` - 1 is refused by parse_sizes, which names the value rather than the range."""
    return numbers.integer(text, option, 0, item=item, negative=must_be(max(minimum, 0)))


def parse_sizes(spec: str | int | list, option: str, minimum: int = 1) -> list[int]:
    """'1,64,512' / '0:32K:4K' / '1:4096:*2' -> sorted unique ints, each >= minimum."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        items = [str(spec)]
    elif isinstance(spec, (list, tuple)):
        items = [str(s) for s in spec]
    else:
        items = str(spec).split(",")
    values: set[int] = set()
    cap, count = min(MAX_POINTS, max_values()), 0
    for item in items:
        item = item.strip()
        if not item:
            raise MlactlError(f"{option}: empty item in {spec!r}")
        parts = item.split(":")
        if len(parts) == 1:
            values.add(_int(parts[0], option, item, minimum))
            continue
        if len(parts) not in (2, 3):
            raise MlactlError(f"{option}: {item!r} is not a range; write start:stop:step or start:stop:*factor")
        start, stop = _int(parts[0], option, item, minimum), _int(parts[1], option, item, minimum)
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
            count += (stop - start) // step + 1
            if count > cap:  # before building it: 50M Python ints take 4 GB
                raise MlactlError(
                    f"{option}: {count:,} values, more than the {cap:,} a grid could hold in memory; "
                    "split the range over several runs or take a coarser step"
                )
            values.update(range(start, stop + 1, step))
    bad = sorted(v for v in values if v < minimum)
    if bad:
        raise MlactlError(f"{option}: {bad[0]} must be {must_be(minimum)}")
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
    check_points(total)
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


def check_context(cfg, context) -> None:
    """One warning when a context (prefix + new) is longer than the model serves
    (`cfg.max_context`, its max_position_embeddings): a 200K-token prompt to DeepSeek-V3
    (163,840) is costed, as asked, but said to be beyond what the model was trained for."""
    limit = getattr(cfg, "max_context", None)
    if limit is None or len(np.atleast_1d(context)) == 0:
        return
    context = np.asarray(context)
    over = int(np.count_nonzero(context > limit))
    if over:
        warn(
            f"{over:,} shape(s) have a context of up to {int(context.max()):,} tokens, beyond the "
            f"{limit:,} that {cfg.name} serves (max_position_embeddings): they are costed as asked"
        )
