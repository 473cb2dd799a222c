"""Tables that fit a terminal without cutting a value: drop columns by priority, then stack.

Rich shrinks a table that is wider than the console and cuts its cells ("10.1µ…", "exp…"),
which hides the very names a user must type. Here each column's full width is measured first;
what does not fit is dropped (least important first, only where the caller allows it) and what
still does not fit goes to a second table that repeats the key columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

KEY = -1  # repeated in every stacked table, never dropped
KEEP = 0  # never dropped; stacked into a further table when it does not fit


@dataclass
class Column:
    header: str
    cells: list  # str or rich Text, one per row
    justify: JustifyMethod = "right"
    priority: int = KEEP  # >0: may be dropped, the highest first

    @property
    def width(self) -> int:
        return max([Text.from_markup(self.header).cell_len] + [_cell_len(c) for c in self.cells])


def _cell_len(cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else Text(str(cell)).cell_len


def table_width(columns: list[Column]) -> int:
    """Width of a rich Table (default box, padding 1) whose cells are never cut."""
    return sum(c.width for c in columns) + 3 * len(columns) + 1


def _stack(columns: list[Column], width: int | None) -> list[list[Column]]:
    """Columns in order, into as many tables as `width` needs, each starting with the KEY ones."""
    keys = [c for c in columns if c.priority == KEY]
    groups: list[list[Column]] = [list(keys)]
    for c in columns:
        if c.priority == KEY:
            continue
        if width is not None and len(groups[-1]) > len(keys) and table_width(groups[-1] + [c]) > width:
            groups.append(list(keys))
        groups[-1].append(c)
    return groups


@dataclass
class Fitted:
    tables: list[Table]
    dropped: list[str] = field(default_factory=list)


def fit(columns: list[Column], width: int | None, *, drop: bool, title: str = "", caption: str = "") -> Fitted:
    """One or more tables holding `columns` within `width` (None: one table, everything).

    Columns go, in order, into as many tables as the width needs, each repeating the KEY columns.
    With `drop`, a column of priority > 0 (highest first) is left out where that saves a table.
    """
    columns = list(columns)
    dropped: list[str] = []
    groups = _stack(columns, width)
    if width is not None and drop:
        # drop a column only where that saves a whole stacked table
        for worst in sorted((c for c in columns if c.priority > 0), key=lambda c: -c.priority):
            trial = [c for c in columns if c is not worst]
            if len(_stack(trial, width)) < len(groups):
                columns, groups = trial, _stack(trial, width)
                dropped.append(worst.header)
    tables = []
    for i, group in enumerate(groups):
        table = Table(title=title if i == 0 else None)
        for c in group:
            table.add_column(c.header, justify=c.justify, no_wrap=True, min_width=c.width)
        for row in zip(*(c.cells for c in group)):
            table.add_row(*row)
        tables.append(table)
    notes = [caption] if caption else []
    if dropped:
        notes.append(f"not shown at this width: {', '.join(dropped)} (widen the terminal, or --format csv)")
    if notes:
        tables[-1].caption = "; ".join(notes)
    return Fitted(tables, dropped)
