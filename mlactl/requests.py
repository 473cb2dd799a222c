"""Reading a mixed batch: a CSV with a header naming `new` and `prefix` (or `context`), and
optionally `count` (that many identical requests). Other columns are ignored."""

from __future__ import annotations

import csv
from pathlib import Path

from mlactl.errors import MlactlError


def read_requests(path: str | Path) -> tuple[list[int], list[int], list[int]]:
    from mlactl.io import read_text

    path = Path(path)
    text = read_text(path, "requests")
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise MlactlError(f"{path}: empty file; expected a header such as new,prefix")
    header = [h.strip().lower() for h in rows[0]]
    if "new" not in header or ("prefix" not in header) == ("context" not in header):
        raise MlactlError(
            f"{path}: line 1: the header must name new and one of prefix or context, got {','.join(rows[0])!r}"
        )
    col = {name: header.index(name) for name in ("new", "prefix", "context", "count") if name in header}
    new, prefix, count = [], [], []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise MlactlError(f"{path}: line {line}: {len(row)} fields, the header has {len(header)}")
        values = {}
        for name, i in col.items():
            cell = row[i].strip()
            if not cell.isdigit():
                raise MlactlError(f"{path}: line {line}: {name} {cell!r} is not a whole number")
            values[name] = int(cell)
        if values["new"] < 1:
            raise MlactlError(f"{path}: line {line}: new must be at least 1")
        if values.get("count", 1) < 1:
            raise MlactlError(f"{path}: line {line}: count must be at least 1")
        if "context" in values:
            if values["context"] < values["new"]:
                raise MlactlError(
                    f"{path}: line {line}: context {values['context']} is shorter than new {values['new']}"
                )
            values["prefix"] = values["context"] - values["new"]
        new.append(values["new"])
        prefix.append(values["prefix"])
        count.append(values.get("count", 1))
    if not new:
        raise MlactlError(f"{path}: no requests after the header")
    return new, prefix, count
