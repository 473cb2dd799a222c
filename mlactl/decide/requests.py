"""Reading a mixed batch: a CSV with a header naming `new` and `prefix` (or `context`), and
optionally `count` (that many identical requests). Other columns are ignored.

Cells are read as the CLI reads sizes: digits with an optional K or M (4K = 4096), at most
2^31 - 1. A UTF-8 byte-order mark (Excel's "CSV UTF-8") is dropped. The file is read row by row
into int64 arrays (24 bytes a request, not a Python list of rows), and the rows are counted
against the memory budget as they come, so a 10M-row file is refused before it fills memory.
"""

from __future__ import annotations

import csv
import io
from array import array
from pathlib import Path

from mlactl.model.shapes import _INT, parse_int
from mlactl.util.errors import MlactlError
from mlactl.util.io import open_input
from mlactl.util.limits import check_requests

# Rows between memory checks: cheap enough to be invisible, fine enough to stop early.
CHECK_EVERY = 65_536
# A request line is a few numbers; a longer one is not a requests CSV (`/dev/zero` has no newline).
MAX_LINE = 4096


def set_prefix(values: dict, path, line: int) -> None:
    """A row that gives `context` (new tokens included) instead of `prefix`: its prefix."""
    if "context" in values:
        if values["context"] < values["new"]:
            raise MlactlError(f"{path}: line {line}: context {values['context']} is shorter than new {values['new']}")
        values["prefix"] = values["context"] - values["new"]


def _lines(fh, path: Path):
    """The file's lines, each read with a bounded readline: never a read that runs forever."""
    while True:
        text = fh.readline(MAX_LINE)
        if not text:
            return
        if len(text) == MAX_LINE and not text.endswith("\n"):
            raise MlactlError(f"{path}: a line longer than {MAX_LINE} characters; not a requests CSV")
        yield text


def read_requests(path: str | Path, fmt: str = "csv") -> tuple[array, array, array]:
    """(new, prefix, count) as int64 arrays (sequences of int), one entry per CSV row."""

    path = Path(path)
    fh = io.TextIOWrapper(open_input(path, "requests"), encoding="utf-8-sig", newline="")
    new, prefix, count = array("q"), array("q"), array("q")
    with fh:
        reader = csv.reader(_lines(fh, path))
        try:
            header_row = next(reader, None)
            if header_row is None:
                raise MlactlError(f"{path}: empty file; expected a header such as new,prefix")
            header = [h.strip().lower() for h in header_row]
            if "new" not in header or ("prefix" not in header) == ("context" not in header):
                raise MlactlError(
                    f"{path}: line 1: the header must name new and one of prefix or context, "
                    f"got {','.join(header_row)[:80]!r}"
                )
            col = {name: header.index(name) for name in ("new", "prefix", "context", "count") if name in header}
            line = reader.line_num
            for row in reader:
                start, line = line + 1, reader.line_num
                if line != start:  # csv joined physical lines: a quoted cell holds a newline
                    raise MlactlError(f"{path}: line {start}: a quoted cell spans lines; one request per line")
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise MlactlError(f"{path}: line {line}: {len(row)} fields, the header has {len(header)}")
                values = {}
                for name, i in col.items():
                    cell = row[i].strip()
                    if not _INT.match(cell):
                        raise MlactlError(f"{path}: line {line}: {name} {cell[:40]!r} is not a whole number")
                    try:
                        values[name] = parse_int(cell, name)
                    except MlactlError as exc:
                        raise MlactlError(f"{path}: line {line}: {exc}") from None
                    if name in ("new", "count") and values[name] < 1:
                        raise MlactlError(f"{path}: line {line}: {name} must be at least 1")
                set_prefix(values, path, line)
                new.append(values["new"])
                prefix.append(values["prefix"])
                count.append(values.get("count", 1))
                if len(new) % CHECK_EVERY == 0:
                    check_requests(len(new), fmt)
        except csv.Error as exc:
            raise MlactlError(f"{path}: line {reader.line_num}: not CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise MlactlError(f"cannot read requests {path}: not UTF-8 text ({exc.reason})") from None
        except OSError as exc:
            raise MlactlError(f"cannot read requests {path}: {exc.strerror or exc}") from None
    if not len(new):
        raise MlactlError(f"{path}: no requests after the header")
    return new, prefix, count
