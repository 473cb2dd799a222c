"""Unbounded work, bounded (issue 24): how long and how much memory each search and start-up takes.

    python benchmarks/bench_bounds.py [--repeats 5] [--json out.json] [--base DIR]

Cases (each a fresh `mlactl` process; wall time median with min/max, and peak RSS):
  * `mlactl analyze` start-up (one shape), the figure `python -X importtime` breaks down;
  * `mlactl crossover` at its defaults, by roofline and with a calibration whose expansion is so
    slow that expand wins only past 1K new tokens (the search's worst case at the defaults);
  * the issue's cases: `--max-new 16M` on a model where expand never wins (it grew past 8 GB),
    the same search with --calibration, and a calibrated crossover over 256 prefixes.
Targets (the issue's): any crossover search <= 5 s and <= 1 GB at the defaults.

With --base DIR (a checkout of another commit, e.g. `git archive main | tar -x -C DIR`), every
case runs on both trees, alternately, so the machine's load falls on both alike.
Saves JSON to benchmarks/results/bounds-<host>.json. Nothing here asserts: timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Runs mlactl's entry point in-process and prints the process's peak RSS (KiB) to stderr at exit.
RUNNER = (
    "import resource, sys\n"
    "from mlactl.cli import main\n"
    "sys.argv = ['mlactl', *sys.argv[1:]]\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print(f'MAXRSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)\n"
)

NEVER = {  # r = 32: absorb is cheaper per pair than expand, so expand never wins
    "_name_or_path": "never-expand",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "kv_lora_rank": 32,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_hidden_layers": 61,
}


def slow_expand_calibration(hardware: str) -> dict:
    """Every op at 60% of the datasheet but the up-projection at 0.1%: expand wins only far out."""
    fits = []
    for op in ("kv_expand", "expand_attention", "lse_merge", "q_absorb", "absorb_attention", "out_absorb"):
        eta = 0.001 if op == "kv_expand" else 0.6
        fits.append(
            {
                "op": op,
                "source": "bench",
                "dtype": "bf16",
                "terms": ["fixed", "pad", "waves", "serial"],
                "params": {"t_fixed_s": 5e-6, "eta_c": eta, "eta_m": 0.8, "t_iter_s": 1e-7},
            }
        )
    return {"schema": "mlactl.calibration", "schema_version": 1, "name": "slow", "hardware": hardware, "fits": fits}


def run(tree: Path, args: list[str], env: dict) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *args],
        env=dict(env, PYTHONPATH=str(tree)),
        cwd=env["MLACTL_HOME"],  # not a checkout: `python -c` puts the working folder first on sys.path
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"mlactl {' '.join(args)} failed ({done.returncode}): {done.stderr[-500:]}")
    rss = int(next(line.split()[1] for line in done.stderr.splitlines() if line.startswith("MAXRSS")))
    return wall, rss


def summary(walls: list[float], rss: list[int]) -> dict:
    return {
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
        "runs": len(walls),
        "peak_rss_mib": max(rss) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=HERE / "results" / f"bounds-{platform.node() or 'host'}.json")
    parser.add_argument("--base", type=Path, help="another checkout to compare with (run alternately)")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / "calibrations").mkdir(parents=True)
        (home / "calibrations" / "slow.json").write_text(json.dumps(slow_expand_calibration("h800")))
        never = Path(tmp) / "never.json"
        never.write_text(json.dumps(NEVER))
        env = dict(os.environ, MLACTL_HOME=str(home), OPENBLAS_NUM_THREADS="1")
        # (args, run on --base too): the unbounded cases are not run on a base that lacks the
        # bounds -- they take minutes and 8+ GB there (the figures; 292 s and 9 GB measured
        # for 256 calibrated prefixes on this project's 2-core machine)
        cases = {
            "analyze start-up (one shape)": (["analyze", "--new", "1", "--prefix", "4096"], True),
            "crossover, defaults": (["crossover"], True),
            "crossover, defaults, --calibration (expand wins late)": (["crossover", "--calibration", "slow"], True),
            "crossover --max-new 16M, expand never wins": (
                ["crossover", "--model", str(never), "--max-new", "16M"],
                False,
            ),
            "crossover --max-new 16M, --calibration": (
                ["crossover", "--calibration", "slow", "--max-new", "16M"],
                False,
            ),
            "crossover, 256 prefixes, --calibration": (
                ["crossover", "--calibration", "slow", "--prefix", "0:255K:1K"],
                False,
            ),
        }
        trees = {"this tree": ROOT} | ({"base": opts.base.resolve()} if opts.base else {})
        found: dict = {}
        for name, (args, on_base) in cases.items():
            here = {label: tree for label, tree in trees.items() if on_base or label == "this tree"}
            walls: dict = {t: [] for t in here}
            rss: dict = {t: [] for t in here}
            for _ in range(opts.repeats):
                for label, tree in here.items():  # alternately: load falls on both alike
                    wall, peak = run(tree, args, env)
                    walls[label].append(wall)
                    rss[label].append(peak)
            for label in here:
                s = summary(walls[label], rss[label])
                found[f"{name} [{label}]"] = s
                print(
                    f"{name:58s} {label:9s} median {s['median_s'] * 1e3:8.1f} ms  "
                    f"(min {s['min_s'] * 1e3:.1f}, max {s['max_s'] * 1e3:.1f}, {s['runs']} runs)  "
                    f"peak {s['peak_rss_mib']:.0f} MiB"
                )
    out = {
        "benchmark": "bounds",
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cases": found,
    }
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"saved {opts.json}")


if __name__ == "__main__":
    main()
