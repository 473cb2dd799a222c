"""`mlactl plot ... --data FILE`: the figures a chart drew, as a CSV (or JSON) beside the image.

Each chart of mlactl.output.plot returns `data`, a dict of exactly what it drew. Here it becomes one
row per drawn thing -- a point, a line, a cell, a config -- with a `kind` column saying which,
so a chart can be redrawn, checked or compared elsewhere. `.json` writes `data` as it is.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from mlactl.output.report import dumps
from mlactl.util.errors import MlactlError
from mlactl.util.io import atomic_write


def _roofline(data: dict) -> list[dict]:
    rows = [dict(kind="ceiling", **c) for c in data["ceilings"]]
    rows += [
        dict(kind="attention op" if p["op"] else "path", **{k: v for k, v in p.items() if k != "op"})
        for p in data["points"]
    ]
    rows += [dict(kind="measured", **m) for m in data["measured"]]
    return rows


def _crossover(data: dict) -> list[dict]:
    rows = []
    for panel in data["panels"]:
        where = {"batch": panel["batch"], "prefix": panel["prefix"]}
        for path, times in panel["time_s"].items():
            rows += [
                dict(kind="predicted time", **where, path=path, new=n, time_s=t) for n, t in zip(panel["new"], times)
            ]
        rows += [
            dict(kind="measured time", **where, path=m["path"], new=m["new"], time_s=m["median_s"])
            for m in panel["measured"]
        ]
        for path, n in panel["predicted"].items():
            rows.append(dict(kind="predicted crossover", **where, path=path, new=n))
        rows += [
            dict(kind="measured crossover", **where, source=m["source"], new=m["new"])
            for m in panel["measured_crossovers"]
        ]
        if data.get("asymptotic_new") is not None:
            rows.append(dict(kind="asymptotic crossover by FLOPs", **where, new=data["asymptotic_new"]))
    return rows


def _pathmap(data: dict) -> list[dict]:
    rows = []
    policy = data.get("policy")  # an engine's loss map: its path, slowdown and wrong cells
    for i, prefix in enumerate(data["prefix"]):
        for j, new in enumerate(data["new"]):
            row = {
                "kind": "cell",
                "batch": data["batch"],
                "prefix": prefix,
                "new": new,
                "best": data["best"][i][j],
                "speedup": data["speedup"][i][j],
            }
            if policy is not None:
                row.update(
                    {
                        "policy": policy["name"],
                        "policy_path": policy["path"][i][j],
                        "policy_slowdown": policy["slowdown"][i][j],
                        "policy_wrong": policy["wrong"][i][j],
                    }
                )
            rows.append(row)
    rows += [dict(kind="measured crossover", **m) for m in data["measured_boundary"]]
    return rows


def _tune(data: dict) -> list[dict]:
    rows = [
        {
            "kind": "config",
            "label": c["label"],
            "status": c["status"],
            "reason": c["reason"],
            "median_s": c["median_s"],
            "best": c["label"] == data["best"],
        }
        for c in data["configs"]
    ]
    for key, kind in (("default_median_s", "default config"), ("twin_median_s", "torch twin")):
        if data.get(key):
            rows.append({"kind": kind, "median_s": data[key]})
    return rows


def _replay(data: dict) -> list[dict]:
    rows = [dict(kind="lost over time", **t) for t in data["timeline"]]
    rows += [dict(kind="path mix", **m) for m in data["mix"]]
    return rows


ROWS = {"roofline": _roofline, "crossover": _crossover, "pathmap": _pathmap, "tune": _tune, "replay": _replay}


def to_csv(chart: str, data: dict) -> str:
    rows = ROWS[chart](data)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return out.getvalue()


def write(path: Path, chart: str, data: dict) -> None:
    """Write what `chart` drew to `path`: CSV, or JSON for a .json name; atomically."""

    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".json"):
        raise MlactlError(f"--data {path}: use a .csv or .json file name")
    if suffix == ".json":
        text = dumps(data)
    else:
        text = to_csv(chart, data)
    atomic_write(Path(path), text)


def check(path: Path | None) -> None:
    """Fail on a bad --data name before any work is done."""
    if path is not None and Path(path).suffix.lower() not in (".csv", ".json"):
        raise MlactlError(f"--data {path}: use a .csv or .json file name")
