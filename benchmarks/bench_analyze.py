"""How fast `mlactl analyze` starts, and how fast it writes a million points as CSV.

    python benchmarks/bench_analyze.py [--repeats 7] [--points 1000000] [--json out.json]
    python benchmarks/bench_analyze.py --startup-only --repeats 15 --json benchmarks/results/startup-2core.json

Prints medians with min/max and saves JSON (default benchmarks/results/analyze-<host>.json).
Targets: `mlactl analyze` (the default model's roofline table), `mlactl analyze --help` and one
shape within 1.3x of `python -c "import numpy, typer, rich"`; also reported against the floor
any vectorised analysis printing a rich table pays before a line of mlactl (numpy, typer,
rich.console, rich.table), and against what rich alone takes to draw `mlactl analyze`'s output
again (its lines and table read back, the same cells in a rich Table): the least the command can
take while rich draws its table (and `import typer.rich_utils`, which typer loads to draw any
`--help`, for the help's); a 1,000,000-point grid written as CSV in a few seconds on one core.
`--startup-only` skips the grid. Each start is timed by wall clock and by the CPU time the child
used (steadier on a shared machine); the start-up commands run interleaved, so a burst of load
on a shared machine falls on all of them alike. The children read and write their bytecode in a
temporary folder (PYTHONPYCACHEPREFIX), as an installed package reads its .pyc files: with
PYTHONDONTWRITEBYTECODE set and no __pycache__ beside the sources, every start would compile
mlactl again (`--no-bytecode` times that case). `python -X importtime` then lists, per command,
the modules the numpy + typer + rich floor does not load, heaviest first. Nothing here asserts:
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
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_once(cmd: list[str], env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def timed(cmd: list[str], repeats: int, env: Mapping[str, str] | None = None) -> list[tuple[float, float]]:
    """(wall seconds, CPU seconds of the child) of each of `repeats` runs."""
    return [run_once(cmd, env) for _ in range(repeats)]


def interleaved(cmds: dict[str, list[str]], repeats: int, env: Mapping[str, str]) -> dict[str, list]:
    """Each command `repeats` times, taking turns (one run of each, then again)."""
    runs: dict[str, list] = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, cmd in cmds.items():
            runs[name].append(run_once(cmd, env))
    return runs


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
        f"{name:<44} median {s['median_s'] * 1e3:7.1f} ms   (min-max {s['min_s'] * 1e3:.1f}-"
        f"{s['max_s'] * 1e3:.1f}; CPU {s['cpu_median_s'] * 1e3:.1f} ms; {s['runs']} runs)"
    )


def import_times(cmd: list[str], env: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """`python -X importtime`'s (self, cumulative) microseconds of each module `cmd` imports."""
    out = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    found = {}
    for line in out.stderr.decode().splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, total, name = line.split(":", 1)[1].split("|")
        found[name.strip()] = (int(own), int(total))
    return found


def heaviest(cmd: list[str], floor: list[str], env: Mapping[str, str], top: int) -> list[dict]:
    """The `top` modules `cmd` imports and the floor does not, by their own (self) import time."""
    base = import_times(floor, env)
    extra = {name: t for name, t in import_times(cmd, env).items() if name not in base}
    rows = sorted(extra.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"module": name, "self_us": own, "cumulative_us": total} for name, (own, total) in rows] + [
        {"module": f"(all {len(extra)} modules beyond the floor)", "self_us": sum(t[0] for t in extra.values())}
    ]


# `python -c "import numpy, typer, rich"` is the floor the start-up target is set against;
# `import rich` alone loads neither rich's console nor its table, which every table mlactl
# prints needs: the second floor adds them
FLOORS = {
    "import_numpy_typer_rich": ["-c", "import numpy, typer, rich"],
    "import_floor": ["-c", "import typer, rich, numpy, rich.console, rich.table"],
}
# what rich alone costs to print what `mlactl analyze` prints: its lines and table, read back from
# its output (TABLE_TEXT) and drawn again with a rich Table of the same cells; no line of mlactl
# runs. The start-up target cannot be met below this floor while the table is drawn by rich.
RICH_TABLE = """
import sys, numpy, typer, rich.console, rich.table
con = rich.console.Console()
table, rows = None, []
for line in open(sys.argv[1], encoding="utf-8").read().splitlines():
    bar = line[:1] or " "
    if bar in "\u2503\u2502":  # a header or body row: its cells between the bars
        cells = [c.strip() for c in line.strip(bar).split(bar)]
        if bar == "\u2503":
            table = rich.table.Table(*cells)
        else:
            table.add_row(*cells)
    elif bar not in "\u250f\u2521\u2514":  # not a rule of the box: a line of text
        if table is not None:
            con.print(table)
            table = None
        con.print(line, highlight=False)
"""
TABLE_TEXT = "analyze-output.txt"
COMMANDS = {
    "analyze_help": ["-m", "mlactl.cli", "analyze", "--help"],
    "analyze_default": ["-m", "mlactl.cli", "analyze"],
    "analyze_one_shape": ["-m", "mlactl.cli", "analyze", "--new", "1", "--prefix", "4096"],
}
LABELS = {
    "import_numpy_typer_rich": 'python -c "import numpy, typer, rich"',
    "import_floor": "+ rich.console, rich.table",
    "rich_table_floor": "+ drawing analyze's output with rich",
    "rich_help_floor": "+ typer.rich_utils (any --help)",
    "analyze_help": "mlactl analyze --help",
    "analyze_default": "mlactl analyze",
    "analyze_one_shape": "mlactl analyze --new 1 --prefix 4096",
}


def child_env(cache: str, bytecode: bool) -> dict[str, str]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if bytecode:  # as an installed package: .pyc files read, written once
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def startup(results: dict, repeats: int, bytecode: bool, top: int, cache: str) -> None:
    py = sys.executable
    env = child_env(cache, bytecode)
    text = Path(cache) / TABLE_TEXT
    with text.open("wb") as fh:
        subprocess.run([py, *COMMANDS["analyze_default"]], check=True, stdout=fh, env=env)
    cmds = {name: [py, *argv] for name, argv in {**FLOORS, **COMMANDS}.items()}
    cmds["rich_table_floor"] = [py, "-c", RICH_TABLE, str(text)]
    cmds["rich_help_floor"] = [py, "-c", "import numpy, typer, typer.rich_utils"]
    for cmd in cmds.values():  # warm the file cache and write the bytecode
        run_once(cmd, env)
    runs = interleaved(cmds, repeats, env)
    results["bytecode"] = bytecode
    for name in cmds:
        results[name] = summary(runs[name])
        show(LABELS[name], results[name])
    ratios: dict[str, dict] = {}
    for name in COMMANDS:
        ratios[name] = {
            floor: {
                "wall": results[name]["median_s"] / results[floor]["median_s"],
                "cpu": results[name]["cpu_median_s"] / results[floor]["cpu_median_s"],
            }
            for floor in FLOORS
        }
        one = ratios[name]
        print(
            f"{LABELS[name]:<44} {one['import_numpy_typer_rich']['wall']:.2f}x numpy + typer + rich (target 1.3x; "
            f"CPU {one['import_numpy_typer_rich']['cpu']:.2f}x), {one['import_floor']['wall']:.2f}x with rich's "
            f"console and table"
        )
    results["ratios"] = ratios
    least = results["rich_table_floor"]["median_s"] / results["import_numpy_typer_rich"]["median_s"]
    results["rich_table_floor_ratio"] = least
    print(f"{LABELS['rich_table_floor']:<44} {least:.2f}x numpy + typer + rich: the least `mlactl analyze` can take")
    helps = results["rich_help_floor"]["median_s"] / results["import_numpy_typer_rich"]["median_s"]
    results["rich_help_floor_ratio"] = helps
    print(f"{LABELS['rich_help_floor']:<44} {helps:.2f}x numpy + typer + rich: what typer loads to draw a --help")
    if top:
        floor = cmds["import_numpy_typer_rich"]
        results["importtime"] = {name: heaviest(cmds[name], floor, env, top) for name in COMMANDS}
        for name, rows in results["importtime"].items():
            print(f"\n{LABELS[name]}: heaviest imports beyond numpy + typer + rich (-X importtime, self us)")
            for row in rows:
                print(f"  {row['self_us']:8d}  {row['module']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--points", type=int, default=1_000_000, help="grid size for the CSV run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--startup-only", action="store_true", help="time the start only, not the grid")
    parser.add_argument("--no-bytecode", action="store_true", help="compile every start (PYTHONDONTWRITEBYTECODE)")
    parser.add_argument("--importtime", type=int, default=15, metavar="N", help="list N heaviest imports (0: none)")
    args = parser.parse_args()

    py = sys.executable
    results: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as cache:
        startup(results, args.repeats, not args.no_bytecode, args.importtime, cache)
    results["load_average_after"] = os.getloadavg()
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
