"""Limits checked before anything big is allocated: sizes that fit int64 arithmetic, and memory.

Every refusal is one line that states the limit and, for memory, how to split the work.
"""

from __future__ import annotations

import os

from mlactl.util import numbers
from mlactl.util.errors import MlactlError
from mlactl.util.numbers import MAX_SIZE  # noqa: F401 - the size limit, where it was defined before

# Peak memory per unit, measured with /usr/bin/time -f %M on 100K-point grids (2-core x86,
# CPython 3.12, numpy 2): the analysis and its CSV or table output 1.3 KiB a point, its JSON
# 28 KiB a point (one dict per op per path per row); a request of `mlactl batch` 0.6 KiB, its
# JSON 3.2 KiB. Rounded up, so a refused job really would not have fit.
ANALYSIS_BYTES = 1_500
JSON_BYTES = 30_000
REQUEST_BYTES = 800
REQUEST_JSON_BYTES = 4_000
# `mlactl replay`: 342 MB max RSS for 100,000 requests (1.2 million steps) through one engine, the
# ~100 MB of a bare `mlactl` run and the 512K-row pricing blocks included: 2.5 KB a request.
REPLAY_REQUEST_BYTES = 2_500
# A drawn point costs far more in matplotlib than in numpy (a path vertex, a marker, a label).
PLOT_BYTES = 4_000
# Agg's canvas: 4 bytes a pixel, drawn once and copied once to encode the PNG.
PIXEL_BYTES = 12

ENV_MEMORY = "MLACTL_MAX_MEMORY"
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def available_memory() -> int:
    """Bytes the machine can give without swapping (MemAvailable), else its physical memory."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 8 * 1024**3


def memory_budget() -> int:
    """What one command may use: $MLACTL_MAX_MEMORY (bytes, or with K/M/G/T), else half the
    available memory, leaving the rest to the machine's other work."""
    text = os.environ.get(ENV_MEMORY, "").strip().upper().removesuffix("B")
    if text:
        number, unit = (text[:-1], text[-1]) if text[-1] in _SUFFIX else (text, "")
        if not numbers.FLOAT.match(number):
            raise MlactlError(f"${ENV_MEMORY} must be a size such as 4G or 512M, got {text!r}")
        value = float(number) * _SUFFIX[unit]
        if not 0 < value < 2**63:
            raise MlactlError(f"${ENV_MEMORY} must be a positive size such as 4G, got {text!r}")
        return int(value)
    return available_memory() // 2


def _size(n: float) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:.1f} GiB"
    return f"{n / 1024**2:.1f} MiB" if n < 10 * 1024**2 else f"{n / 1024**2:.0f} MiB"


def check_memory(need: float, what: str, split: str) -> None:
    """Refuse a job needing more than the budget, saying how to split it."""
    budget = memory_budget()
    if need > budget:
        source = f"${ENV_MEMORY}" if os.environ.get(ENV_MEMORY, "").strip() else f"half of what is free; ${ENV_MEMORY}"
        raise MlactlError(
            f"{what} would need about {_size(need)} of memory, more than the {_size(budget)} allowed "
            f"({source} sets it): {split}"
        )


def check_points(points: int, fmt: str | None = None) -> None:
    """A grid of `points` analysed (and written in `fmt`, if given)."""
    per = ANALYSIS_BYTES + (JSON_BYTES if fmt == "json" else 0)
    split = "split the grid into several runs (e.g. halves of the --prefix or --new range)"
    if fmt == "json":
        split += ", or use --format csv, which needs 20x less"
    what = f"{points:,} points in {fmt}" if fmt else f"a grid of {points:,} points"
    check_memory(points * per, what, split)


def max_values() -> int:
    """The most values one size list may hold: one axis of a grid that could still fit."""
    return max(1, memory_budget() // ANALYSIS_BYTES)


def check_requests(rows: int, fmt: str = "csv") -> None:
    per = REQUEST_BYTES + (REQUEST_JSON_BYTES if fmt == "json" else 0)
    check_memory(
        rows * per,
        f"{rows:,}+ requests in {fmt}",
        "split the CSV into several files (e.g. `split -l 1000000`, header on each) and run one at a time",
    )


def check_plot(points: int, pixels: float) -> None:
    check_memory(
        points * PLOT_BYTES + pixels * PIXEL_BYTES,
        f"a chart of {points:,} points" if points else f"a {pixels / 1e6:,.0f}-megapixel image",
        "draw fewer points (a coarser --new or --prefix range, e.g. 1:1M:*2) or a lower --dpi, or write .svg/.pdf",
    )


def check_replay(requests: int, processes: int = 1) -> None:
    """A trace of `requests` replayed by `processes` engines side by side."""
    side = f" in {processes} processes" if processes > 1 else ""
    check_memory(
        requests * processes * REPLAY_REQUEST_BYTES,
        f"replaying {requests:,} requests{side}",
        "split the trace by time into several files and replay one at a time"
        + (", or give --jobs 1" if processes > 1 else ""),
    )
