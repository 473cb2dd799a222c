"""Progress of long work: reported by the library, shown (or not) by whoever runs it.

A library function that may run for seconds opens a task and advances it:

    with progress.task("crossover search", total=points) as bar:
        ...
        bar.advance(block)

With nothing installed (a library caller, a test) a task costs nothing and shows nothing. The
CLI installs a display for each command (mlactl.output.progress): a rich progress bar on
stderr, drawn only when stderr is a terminal and only once a task has run for a moment, so
quick commands and pipes see no bar at all.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Protocol


class Task(Protocol):
    def advance(self, amount: float = 1) -> None: ...


class _Silent:
    def advance(self, amount: float = 1) -> None:
        pass


SILENT = _Silent()

# (description, total or None) -> a context manager yielding a Task
Display = Callable[[str, "float | None"], "contextlib.AbstractContextManager[Task]"]
_DISPLAY: contextvars.ContextVar[Display | None] = contextvars.ContextVar("mlactl_progress", default=None)


@contextlib.contextmanager
def task(description: str, total: float | None = None) -> Iterator[Task]:
    """A unit of long work: `total` steps (None: unknown, a spinner with the time elapsed)."""
    display = _DISPLAY.get()
    if display is None:
        yield SILENT
        return
    with display(description, total) as shown:
        yield shown


@contextlib.contextmanager
def showing(display: Display | None) -> Iterator[None]:
    """Show the tasks opened inside the block with `display` (None: show nothing)."""
    token = _DISPLAY.set(display)
    try:
        yield
    finally:
        _DISPLAY.reset(token)
