"""Tables that fit the terminal without cutting a value the user must read or type.

Rich shrinks a table that is wider than the console by cutting its cells ("deepseek-v2-li…",
"10.1µ…"), which hides the very names a user types. Here each column's full width is measured
first, and what does not fit is handled the way the table's reader needs:

* `table` (one table, rows given): the columns of highest `drop` are left out first and a
  caption says which ones and where to read them; a long text column may fold onto more lines;
  a `typed` column (a name the user types) is never cut or folded.
* `fit` (a wide grid, columns given): columns go, in order, into as many stacked tables as the
  width needs, each repeating the KEY columns; with `drop`, a column of priority > 0 is left out
  where that saves a whole table.

When `width` is None (output piped or written to a file) nothing is left out and nothing is cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from rich.console import Group, JustifyMethod
from rich.table import Table
from rich.text import Text


def cell_width(cell) -> int:
    """Terminal cells of the widest line of a cell (markup read, not counted)."""
    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell), emoji=False)  # as printed
    return max((Text(line).cell_len for line in text.plain.splitlines()), default=0)


def stamp(created) -> str:
    """A file's `created` (2026-11-30T12:00:00Z) as a table shows it, to the minute: 2026-11-30 12:00."""
    text = str(created or "")
    return text[:16].replace("T", " ") if len(text) >= 16 and text[10:11] == "T" else text or "—"


def table_width(widths: list[int]) -> int:
    """Rich's default box: one space of padding each side and a rule between and around columns."""
    return sum(widths) + 3 * len(widths) + 1


# -- one table, columns left out by priority ------------------------------------------------------


@dataclass(frozen=True)
class Col:
    header: str
    justify: Literal["left", "right"] = "right"
    typed: bool = False  # a name the user types (model, hardware, kernel, bucket): shown whole
    drop: int = 0  # 0: always shown; on a narrow terminal, higher numbers are left out first
    fold: int = 0  # > 0: a long text that may fold onto more lines down to this width


def natural_widths(cols: list[Col], rows: list[list]) -> list[int]:
    """Each column's width with nothing cut or wrapped: its widest cell or its header."""
    return [max([len(col.header)] + [cell_width(r[i]) for r in rows]) for i, col in enumerate(cols)]


def shown(cols: list[Col], rows: list[list], width: int | None) -> list[int]:
    """Indices of the columns to show within `width` (all when None)."""
    keep = list(range(len(cols)))
    widths = [min(w, c.fold) if c.fold else w for c, w in zip(cols, natural_widths(cols, rows))]
    if width is None:
        return keep
    while table_width([widths[i] for i in keep]) > width:
        droppable = [i for i in keep if cols[i].drop > 0]
        if not droppable:
            break
        keep.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
    return keep


def table(
    title: str,
    cols: list[Col],
    rows: list[list],
    width: int | None,
    *,
    caption: str | None = None,
    elsewhere: str = "a wider terminal or --format json",
) -> Table:
    """A rich Table of `rows` under `cols`, fitted to `width` (None: full values, nothing left out);
    `elsewhere` says where the columns left out can be read."""
    keep = shown(cols, rows, width)
    widths = natural_widths(cols, rows)
    left_out = [cols[i].header for i in range(len(cols)) if i not in keep]
    notes = [caption] if caption else []
    if left_out:
        notes.append(f"not shown at {width} columns: {', '.join(left_out)} ({elsewhere})")
    out = Table(title=title, caption="\n".join(notes) or None, caption_justify="left")
    for i in keep:
        col = cols[i]
        if col.typed:
            out.add_column(col.header, justify=col.justify, no_wrap=True, min_width=widths[i])
        else:
            out.add_column(col.header, justify=col.justify, overflow="fold")
    for row in rows:
        out.add_row(*(row[i] for i in keep))
    return out


# -- a wide grid, stacked into tables that repeat the key columns ---------------------------------

KEY = -1  # repeated in every stacked table, never dropped
KEEP = 0  # never dropped; stacked into a further table when it does not fit


@dataclass
class Column:
    header: str
    cells: list  # str or rich Text, one per row
    justify: JustifyMethod = "right"
    priority: int = KEEP  # >0: may be dropped, the highest first

    @cached_property
    def width(self) -> int:
        """Its widest cell or header, measured once: stacking and dropping ask it for every trial
        table (set the header and cells before asking)."""
        return max([cell_width(self.header)] + [cell_width(c) for c in self.cells])


def _stack(columns: list[Column], width: int | None) -> list[list[Column]]:
    """Columns in order, into as many tables as `width` needs, each starting with the KEY ones."""
    keys = [c for c in columns if c.priority == KEY]
    groups: list[list[Column]] = [list(keys)]
    for c in columns:
        if c.priority == KEY:
            continue
        trial = groups[-1] + [c]
        if width is not None and len(groups[-1]) > len(keys) and table_width([x.width for x in trial]) > width:
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
        out = Table(title=title if i == 0 else None)
        for c in group:
            out.add_column(c.header, justify=c.justify, no_wrap=True, min_width=c.width)
        for row in zip(*(c.cells for c in group)):
            out.add_row(*row)
        tables.append(out)
    notes = [caption] if caption else []
    if dropped:
        notes.append(f"not shown at this width: {', '.join(dropped)} (widen the terminal, or --format csv)")
    if notes:
        tables[-1].caption = "; ".join(notes)
    return Fitted(tables, dropped)


# -- any table, fitted where it is printed ---------------------------------------------------------


def natural_width(table: Table) -> int:
    """A rich Table's width with every cell whole on one line (its widest line per cell)."""
    widths = [
        max([cell_width(c.header)] + [cell_width(x) for x in c._cells]) for c in table.columns
    ]  # rich keeps a column's cells in `_cells`
    return table_width(widths)


def _keys(table: Table, width: int) -> int:
    """How many leading columns identify a row (repeated in each stacked table): the first, and
    the left-justified text columns right after it (an engine and its step type), while they take
    at most half the width."""
    widths = [max([cell_width(c.header)] + [cell_width(x) for x in c._cells]) for c in table.columns]
    count = 1
    while (
        count < len(table.columns) - 1
        and table.columns[count].justify == "left"
        and table_width(widths[: count + 1]) <= width // 2
    ):
        count += 1
    return count


def fit_any(item, width: int | None):
    """`item` as printed within `width` terminal columns: a rich Table wider than that is stacked
    (`fit`) into tables that repeat the columns naming a row, so no number is cut ('10,…') and no
    name shortened ('sglang-t…'); anything else, or a table that fits, as it is. The one place
    every command's tables pass on their way to a terminal (mlactl.cli.common.emit)."""
    if width is None or not isinstance(item, Table) or not item.columns or natural_width(item) <= width:
        return item
    keys = _keys(item, width)
    columns = [
        Column(
            c.header if isinstance(c.header, str) else Text.from_markup(str(c.header)).plain,
            list(c._cells),
            justify=c.justify,
            priority=KEY if i < keys else KEEP,
        )
        for i, c in enumerate(item.columns)
    ]
    title = item.title if isinstance(item.title, str) else ""
    caption = item.caption if isinstance(item.caption, str) else ""
    tables = _stack_fitted(columns, width, title, caption)
    return tables[0] if len(tables) == 1 else Group(*tables)


def _stack_fitted(columns: list[Column], width: int, title: str, caption: str) -> list[Table]:
    tables = fit(columns, width, drop=False, title=title, caption=caption).tables
    for out in tables:
        out.caption_justify = "left"
    return tables
