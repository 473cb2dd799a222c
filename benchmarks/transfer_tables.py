"""docs/calibration.md's transfer tables, as Markdown, from what bench_transfer.py saved.

    python benchmarks/transfer_tables.py [benchmarks/results/transfer.json]

Prints, in the order the section gives them: each leave-one-GPU-out table, each held-out pair's
table, and every ordered pair's raw transfer per op class (rows, the row-weighted median and p90
of |predicted / measured - 1| over its groups, and the roofline's). Reads; writes nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = {"h100_sxm": "H100", "h200_sxm": "H200", "b200_sxm": "B200", "gb200": "GB200"}
CLASS_HEAD = (
    "| op class | groups | rows | median (range over groups) | p90 (range) | in 80% | roofline median |\n"
    "|---|---|---|---|---|---|---|"
)


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def span(lo_hi) -> str:
    return f"{100 * lo_hi[0]:.0f}–{100 * lo_hi[1]:.0f}"


def class_table(classes: dict) -> str:
    lines = [CLASS_HEAD]
    for op, c in sorted(classes.items()):
        lines.append(
            f"| {op} | {c['groups']} | {c['n']:,} | {pct(c['median'])} ({span(c['median_range'])}) | "
            f"{pct(c['p90'])} ({span(c['p90_range'])}) | {pct(c['coverage'])} | {pct(c['roofline_median'])} |"
        )
    return "\n".join(lines)


def pair_table(rows: list[dict]) -> str:
    """Each (framework, source, target, op class): its scored groups' rows and row-weighted errors."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["covered"] and r.get("error"):  # the unmatched kernels too: raw transfer
            cells.setdefault((r["framework"], r["source_gpu"], r["target_gpu"], r["op"]), []).append(r)
    lines = ["| framework | pair | op class | rows | median | p90 | roofline median |", "|---|---|---|---|---|---|---|"]
    for (fw, src, dst, op), group in sorted(cells.items()):
        n = sum(r["n"] for r in group)

        def mean(get, group=group, n=n):
            return sum(r["n"] * get(r) for r in group) / n

        median, p90 = mean(lambda r: r["error"]["median"]), mean(lambda r: r["error"]["p90"])
        roof = mean(lambda r: r["roofline"]["median"])
        lines.append(f"| {fw} | {src} → {dst} | {op} | {n:,} | {pct(median)} | {pct(p90)} | {pct(roof)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=HERE / "results" / "transfer.json")
    path = parser.parse_args().results
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"Error: cannot read {path}: {e}") from None
    for gpu, result in data["logo"].items():
        print(f"**{NAMES.get(gpu, gpu)} held out** (the other three GPUs' calibrations carried to it, the error model "
              "fitted on the pairs among those three):\n")  # fmt: skip
        print(class_table(result["classes"]) + "\n")
    for pair, result in data["held_out"].items():
        route, framework = pair.split(":")
        source, target = route.split(">")
        print(f"**{source} → {target}, {framework}:**\n")
        print(class_table(result["classes"]) + "\n")
    print(pair_table(data["pairs"]["rows"]))


if __name__ == "__main__":
    main()
