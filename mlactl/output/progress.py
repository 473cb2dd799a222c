"""The progress bar the CLI shows for a long task (mlactl.util.progress): rich, on stderr.

Shown only when stderr is a terminal (a pipe, a file or a test runner sees nothing), and only
once a task has run for AFTER_S seconds (a timer starts it, so a task that is one long call with
no steps still gets its spinner), so the commands that finish at once never flash a bar. The bar
is transient: it is erased when the task ends and leaves the output as it was.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from mlactl.util import numbers, safe

# A task shorter than this shows no bar. $MLACTL_PROGRESS_AFTER overrides it (tests set 0).
AFTER_S = 0.5
ENV_AFTER = "MLACTL_PROGRESS_AFTER"


def _after() -> float:
    text = os.environ.get(ENV_AFTER, "")
    return min(float(text), 60.0) if numbers.FLOAT.match(text) else AFTER_S


def columns_for(total: float | None) -> list:
    """A bar's columns: with a known total, the bar, done/total, time taken and left; without,
    a spinner and the time taken (also what `mlactl tune`'s own bars show)."""
    if total is None:
        return [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
    return [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]


class _Bar:
    """A task's bar, started by a timer once the task has run for `after` seconds."""

    def __init__(self, console: Console, description: str, total: float | None):
        self.console, self.description, self.total = console, description, total
        self.done = 0.0
        self.progress: Progress | None = None
        self.id = TaskID(0)
        self.lock = threading.Lock()
        self.closed = False
        self.timer = threading.Timer(_after(), self._show)
        self.timer.daemon = True
        self.timer.start()

    def advance(self, amount: float = 1) -> None:
        with self.lock:
            self.done += amount
            if self.progress is not None:
                self.progress.update(self.id, completed=self.done)

    def _show(self) -> None:
        with self.lock:
            if not self.closed:
                self._start()

    def _start(self) -> None:
        columns = columns_for(self.total)
        # never take over stdout: the answer (a table, JSON, CSV) goes there while the bar draws
        self.progress = Progress(
            *columns, console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False
        )
        self.progress.start()
        self.id = self.progress.add_task(safe.markup(self.description), total=self.total, completed=int(self.done))

    def close(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.closed = True
            if self.progress is not None:
                self.progress.stop()


def display(console: Console | None = None):
    """A display for mlactl.util.progress.showing: rich bars on `console` (default: stderr), or
    None when that is not a terminal."""
    console = console or Console(stderr=True, emoji=False)
    if not console.is_terminal:
        return None

    @contextlib.contextmanager
    def show(description: str, total: float | None) -> Iterator[_Bar]:
        bar = _Bar(console, description, total)
        try:
            yield bar
        finally:
            bar.close()

    return show
