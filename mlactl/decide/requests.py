"""The one reader of request and workload CSVs (`mlactl batch`, `mlactl engines`).

A header names the columns: `new` and one of `prefix` or `context` (context = prefix + new),
and optionally `batch`, `count` and `weight`. Other columns are ignored; a column named twice
(`new,new,prefix`) is refused. What the optional columns mean depends on the command:

    batch    one mixed batch: a row is `count` (or `batch`) alike requests; `weight` is refused
    engines  a workload of shapes: a row is a batch of `batch` alike requests that runs `weight`
             (or `count`) times

Numbers are read the same way by both commands:

* sizes (new, prefix, context, batch, count): as mlactl.util.numbers reads them: ASCII digits
  with an optional K or M (4K = 4096), an exponent (`1e3`) or digit groups (`1_000`), at most
  2^31 - 1; no sign (`-0` and `+1` are refused), nothing that is not whole (`1.5` is refused);
* weight: a plain decimal number (`1.5`, `2e3`) above 0 and at most 1e12; no K, no sign.

Digits that are not ASCII (`٤`) are refused. A UTF-8 byte-order mark is dropped. The file is
read line by line with a bounded readline into int64 arrays, and the rows are counted against
the memory budget as they come, so a 10M-row file is refused before it fills memory.
"""

from __future__ import annotations

import csv
import io
import re
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlactl.util import numbers
from mlactl.util.errors import MlactlError
from mlactl.util.io import open_input
from mlactl.util.limits import MAX_SIZE, check_requests

# Rows between memory checks: cheap enough to be invisible, fine enough to stop early.
CHECK_EVERY = 65_536
# A request line is a few numbers; a longer one is not a requests CSV (`/dev/zero` has no newline).
MAX_LINE = 4096
# The largest weight: a shape that runs a trillion times is already beyond any trace.
MAX_WEIGHT = 1e12
SIZES = ("new", "prefix", "context", "batch", "count")
KNOWN = (*SIZES, "weight")
_WEIGHT = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


@dataclass
class Rows:
    """The columns of a requests or workload CSV as int64 / float64 arrays (None: absent)."""

    new: np.ndarray
    prefix: np.ndarray
    batch: np.ndarray | None
    count: np.ndarray | None
    weight: np.ndarray | None
    source: str

    def __len__(self) -> int:
        return len(self.new)


def size_cell(cell: str, name: str) -> int:
    """One size as the CSVs write it (see the module docstring): the forms of
    mlactl.util.numbers (`4096`, `8K`, `1e3`, `1_000`), no sign."""
    text = cell.strip()
    match = numbers.INT.match(text) if text[:1] not in ("+", "-") else None
    value = None if match is None else numbers.whole(match, MAX_SIZE)
    if value is None:
        why = numbers.why_not_number(text) or "ASCII digits, e.g. 4096, 8K, 1e3 or 1_000; no sign"
        raise MlactlError(f"{name} {numbers.shown_text(text)} is not a whole number ({why})")
    if value > MAX_SIZE:
        raise MlactlError(f"{name}: {text[:40]!r} is above the limit of {MAX_SIZE:,} (2^31 - 1)")
    return value


def weight_cell(cell: str, name: str) -> float:
    if not _WEIGHT.fullmatch(cell):
        raise MlactlError(f"{name} {cell[:40]!r} must be a positive number such as 1, 2.5 or 1e3")
    value = float(cell)
    if not 0 < value <= MAX_WEIGHT:
        raise MlactlError(f"{name} {cell[:40]!r} must be above 0 and at most {MAX_WEIGHT:g}")
    return value


def _lines(fh, path: Path):
    """The file's lines, each read with a bounded readline: never a read that runs forever."""
    while True:
        text = fh.readline(MAX_LINE)
        if not text:
            return
        if len(text) == MAX_LINE and not text.endswith("\n"):
            raise MlactlError(f"{path}: a line longer than {MAX_LINE} characters; not a requests CSV")
        yield text


def _header(row: list[str], path: Path) -> dict[str, int]:
    header = [h.strip().lower() for h in row]
    seen = set()
    for h in header:
        if h in KNOWN and h in seen:
            raise MlactlError(f"{path}: line 1: column {h!r} is named twice; name each column once")
        seen.add(h)
    if "new" not in header or ("prefix" not in header) == ("context" not in header):
        raise MlactlError(
            f"{path}: line 1: the header must name new and one of prefix or context, got {','.join(row)[:80]!r}"
        )
    return {name: header.index(name) for name in KNOWN if name in header}


_SIZE_COLUMN = re.compile(r"[ \t]*[0-9]+[ \t]*(?:\n[ \t]*[0-9]+[ \t]*)*", re.ASCII)
_WEIGHT_CELL = r"[ \t]*(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*"
_WEIGHT_COLUMN = re.compile(f"{_WEIGHT_CELL}(?:\\n{_WEIGHT_CELL})*", re.ASCII)


def _sizes(cells: list[str], name: str, lines, path) -> np.ndarray:
    """A column of sizes: one regex over the whole column and one int conversion in C; only
    where that fails (a K or M, a bad cell) does it go cell by cell, for the line's message."""
    if max(map(len, cells)) <= 12 and _SIZE_COLUMN.fullmatch("\n".join(cells)):
        values = np.fromiter(map(int, cells), dtype=np.int64, count=len(cells))
        if values.max() <= MAX_SIZE:
            return values
    out = np.empty(len(cells), dtype=np.int64)
    for i, cell in enumerate(cells):
        try:
            out[i] = size_cell(cell.strip(), name)
        except MlactlError as exc:
            raise MlactlError(f"{path}: line {lines[i]}: {exc}") from None
    return out


def _weights(cells: list[str], lines, path) -> np.ndarray:
    if _WEIGHT_COLUMN.fullmatch("\n".join(cells)):
        values = np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
        if ((values > 0) & (values <= MAX_WEIGHT)).all():
            return values
    for i, cell in enumerate(cells):
        try:
            weight_cell(cell.strip(), "weight")
        except MlactlError as exc:
            raise MlactlError(f"{path}: line {lines[i]}: {exc}") from None
    raise AssertionError("a weight column that failed as a whole passed cell by cell")  # pragma: no cover


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def read_rows(path: str | Path, what: str = "requests", fmt: str = "csv", rows_are: str = "requests") -> Rows:
    """Every row of a requests or workload CSV, checked (see the module docstring)."""
    path = Path(path)
    # the one reader: regular files only, never a read that blocks (mlactl.util.io)
    fh = io.TextIOWrapper(open_input(path, what), encoding="utf-8-sig", newline="")
    cells: dict[str, list[str]] = {}
    lines = array("q")
    with fh:
        reader = csv.reader(_lines(fh, path))
        try:
            header_row = next(reader, None)
            if header_row is None:
                raise MlactlError(f"{path}: empty file; expected a header such as new,prefix")
            col = _header(header_row, path)
            width = len(header_row)
            cells = {name: [] for name in col}
            take = [(cells[name].append, i) for name, i in col.items()]
            line = reader.line_num
            for row in reader:
                start, line = line + 1, reader.line_num
                if line != start:  # csv joined physical lines: a quoted cell holds a newline
                    raise MlactlError(f"{path}: line {start}: a quoted cell spans lines; one row per line")
                if len(row) != width:
                    if not any(cell.strip() for cell in row):
                        continue
                    raise MlactlError(f"{path}: line {line}: {len(row)} fields, the header has {width}")
                if width == 1 and not row[0].strip():
                    continue
                for append, i in take:
                    append(row[i])
                lines.append(line)
                if len(lines) % CHECK_EVERY == 0:
                    check_requests(len(lines), fmt)
        except csv.Error as exc:
            raise MlactlError(f"{path}: line {reader.line_num}: not CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise MlactlError(f"cannot read {what} {path}: not UTF-8 text ({exc.reason})") from None
        except OSError as exc:
            raise MlactlError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not lines:
        raise MlactlError(f"{path}: no {rows_are} after the header")
    # a row of empty cells (`,,`) is skipped, as a blank line is
    blank = np.ones(len(lines), dtype=bool)
    for values in cells.values():
        blank &= np.fromiter((not c.strip() for c in values), dtype=bool, count=len(values))
    if blank.any():
        keep = np.flatnonzero(~blank)
        cells = {k: [v[i] for i in keep] for k, v in cells.items()}
        lines = array("q", (lines[i] for i in keep))
        if not lines:
            raise MlactlError(f"{path}: no {rows_are} after the header")
    cols = {name: _sizes(c, name, lines, path) for name, c in cells.items() if name in SIZES}
    weight = _weights(cells["weight"], lines, path) if "weight" in cells else None
    for name in ("new", "batch", "count"):
        if name in cols and (cols[name] < 1).any():
            raise MlactlError(f"{path}: line {lines[_first(cols[name] < 1)]}: {name} must be at least 1")
    if "context" in cols:
        short = cols["context"] < cols["new"]
        if short.any():
            i = _first(short)
            raise MlactlError(
                f"{path}: line {lines[i]}: context {cols['context'][i]} is shorter than new {cols['new'][i]}"
            )
        cols["prefix"] = cols["context"] - cols["new"]
    return Rows(cols["new"], cols["prefix"], cols.get("batch"), cols.get("count"), weight, str(path))


def read_requests(path: str | Path, fmt: str = "csv") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One mixed batch (`mlactl batch`): (new, prefix, count) int64 arrays, one entry per row;
    a row is `count` (or `batch`) alike requests. A `weight` column is refused: a batch runs once."""
    rows = read_rows(path, "requests", fmt)
    if rows.weight is not None:
        raise MlactlError(
            f"{path}: line 1: a weight column belongs to a workload (`mlactl engines`); a batch CSV "
            "lists one batch: give alike requests as count"
        )
    if rows.batch is not None and rows.count is not None:
        raise MlactlError(f"{path}: line 1: give count or batch (alike requests per row), not both")
    count = rows.count if rows.count is not None else rows.batch
    return rows.new, rows.prefix, count if count is not None else np.ones(len(rows), dtype=np.int64)
