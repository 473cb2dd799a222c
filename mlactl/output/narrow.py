"""Tables that fit the terminal without cutting what matters.

Rich shrinks a table wider than the terminal by cutting cells ("deepseek-v2-li…"). Here each
column says whether it holds a name the user types (never cut, never folded) and when it may be
left out: on a narrow terminal the columns of highest `drop` go first, and a caption says which
ones and where to get them. When `width` is None (output piped or written to a file) nothing is
left out and no cell is cut: a value too wide folds onto a second line, every character kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Col:
    header: str
    justify: Literal["left", "right"] = "right"
    typed: bool = False  # a name the user types (model, hardware, kernel, bucket): shown whole
    drop: int = 0  # 0: always shown; on a narrow terminal, higher numbers are left out first
    fold: int = 0  # > 0: a long text that may fold onto more lines down to this width


def _cell_width(cell) -> int:
    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    return max((len(line) for line in text.plain.splitlines()), default=0)


def natural_widths(cols: list[Col], rows: list[list]) -> list[int]:
    """Each column's width with nothing cut or wrapped: its widest cell or its header."""
    out = []
    for i, col in enumerate(cols):
        out.append(max([len(col.header)] + [_cell_width(r[i]) for r in rows]))
    return out


def table_width(widths: list[int]) -> int:
    """Rich's default box: one space of padding each side and a rule between and around columns."""
    return sum(widths) + 3 * len(widths) + 1


def fit(cols: list[Col], rows: list[list], width: int | None) -> list[int]:
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
    keep = fit(cols, rows, width)
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
