"""How fast `mlactl analyze` starts, and how fast it writes a million points as CSV.

    python benchmarks/bench_analyze.py [--repeats 7] [--points 1000000] [--json out.json]

Prints medians with min/max and saves JSON (default benchmarks/results/analyze-<host>.json).
Targets: one shape within 1.3x of importing numpy + typer + rich (the floor any vectorised
analysis printing a rich table pays before a line of mlactl); a 1,000,000-point grid written as
CSV in a few seconds on one core. `--startup-only` skips the grid. Each start is timed by wall
clock and by the CPU time the child used (steadier on a shared machine). Nothing here asserts:
timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str], repeats: int, **kwargs) -> list[tuple[float, float]]:
    """(wall seconds, CPU seconds of the child) of each run."""
    times = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kwargs)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append((wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))
    return times


def summary(runs: list[tuple[float, float]]) -> dict:
    wall = [w for w, _ in runs]
    cpu = [c for _, c in runs]
    return {
        "median_s": statistics.median(wall),
        "min_s": min(wall),
        "max_s": max(wall),
        "cpu_median_s": statistics.median(cpu),
        "runs": len(runs),
    }


def show(name: str, s: dict) -> None:
    print(
        f"{name:<44} median {s['median_s'] * 1e3:9.1f} ms   (min {s['min_s'] * 1e3:.1f}, "
        f"max {s['max_s'] * 1e3:.1f}; CPU {s['cpu_median_s'] * 1e3:.1f} ms; {s['runs']} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--points", type=int, default=1_000_000, help="grid size for the CSV run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--startup-only", action="store_true", help="time the start only, not the grid")
    args = parser.parse_args()

    py = sys.executable
    results: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    timed([py, "-c", "import typer, rich"], 2)  # warm the file cache
    base = summary(timed([py, "-c", "import typer, rich"], args.repeats))
    # what any vectorised analysis printing a rich table must import, before a line of mlactl
    floor = summary(
        timed(
            [py, "-c", "import typer, rich, numpy, rich.console, rich.table"],
            args.repeats,
            env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
        )
    )
    one = summary(timed([py, "-m", "mlactl.cli", "analyze", "--new", "1", "--prefix", "4096"], args.repeats))
    results["import_typer_rich"] = base
    results["import_floor"] = floor
    results["analyze_one_shape"] = one
    results["startup_ratio"] = one["median_s"] / base["median_s"]
    results["startup_ratio_floor"] = one["median_s"] / floor["median_s"]
    results["startup_cpu_ratio_floor"] = one["cpu_median_s"] / floor["cpu_median_s"]
    show('python -c "import typer, rich"', base)
    show("floor: + numpy, rich.console, rich.table", floor)
    show("mlactl analyze --new 1 --prefix 4096", one)
    print(
        f"{'ratio to the floor (target 1.3x)':<44} {results['startup_ratio_floor']:.2f}x wall, "
        f"{results['startup_cpu_ratio_floor']:.2f}x CPU (to typer + rich alone: {results['startup_ratio']:.2f}x)"
    )
    if args.startup_only:
        save(results, args.json)
        return

    # a grid of `points`: 10 batches x 1000 new counts x points/10000 prefixes
    prefixes = max(1, args.points // 10_000)
    grid = ["--batch", "1:10", "--new", "1:1000", "--prefix", f"0:{(prefixes - 1) * 1024}:1024"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "grid.csv"
        for label, extra in (("csv", []), ("csv_with_ops", ["--ops"])):
            runs = summary(
                timed(
                    [py, "-m", "mlactl.cli", "analyze", *grid, "--format", "csv", *extra, "--output", str(out)],
                    max(1, args.repeats // 3),
                )
            )
            runs["points"] = prefixes * 10_000
            runs["bytes"] = out.stat().st_size
            results[f"grid_{label}"] = runs
            show(f"{runs['points']:,} points -> {label} ({runs['bytes'] / 1e6:.0f} MB)", runs)

    save(results, args.json)


def save(results: dict, where: Path | None) -> None:
    path = where or HERE / "results" / f"analyze-{platform.node() or 'host'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
