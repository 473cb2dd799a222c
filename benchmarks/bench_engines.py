"""How long `mlactl engines` takes on a large workload CSV (issue 24: 1M rows in <= 30 s).

    python benchmarks/bench_engines.py [--rows 1000000] [--repeats 3] [--json out.json]
    python benchmarks/bench_engines.py --model deepseek-v3.2 --hardware b200 --tp 8   (the DSA rules)

Writes a reproducible random workload (seeded: batch 1..256, new 1..8192 log-uniform, prefix
0..128K, weights 1..1000), then times whole `mlactl engines` runs (read, rules of all four
engines, vLLM's own chunk sizes, both threshold sweeps, JSON out) for each row count up to
--rows. Prints the median with min/max and saves JSON (default
benchmarks/results/engines-<host>.json). Nothing here asserts: timings are noisy.
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

import numpy as np

HERE = Path(__file__).resolve().parent


def workload_csv(path: Path, rows: int, seed: int = 24) -> None:
    rng = np.random.default_rng(seed)
    batch = rng.integers(1, 257, rows)
    new = np.exp(rng.uniform(0, np.log(8192), rows)).astype(np.int64)
    prefix = rng.integers(0, 128 * 1024, rows) * (rng.random(rows) > 0.2)
    weight = rng.integers(1, 1001, rows)
    with open(path, "w") as fh:
        fh.write("batch,new,prefix,weight\n")
        for row in zip(batch.tolist(), new.tolist(), prefix.tolist(), weight.tolist()):
            fh.write(",".join(map(str, row)) + "\n")


def timed(cmd: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="deepseek-v3", help="deepseek-v3.2: the engines' DSA rules and sweeps")
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--tp", default="1")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.json is None:
        tag = "" if args.model == "deepseek-v3" else f"-{args.model}-{args.hardware}-tp{args.tp}"
        args.json = HERE / "results" / f"engines{tag}-{platform.node() or 'host'}.json"
    sizes = [n for n in (30_000, 100_000, 300_000, 1_000_000, 3_000_000) if n <= args.rows] or [args.rows]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sizes:
            path = Path(tmp) / f"w{rows}.csv"
            workload_csv(path, rows)
            out = Path(tmp) / "out.json"
            cmd = [
                sys.executable,
                "-m",
                "mlactl.cli",
                "engines",
                str(path),
                "--hardware",
                args.hardware,
                "--model",
                args.model,
                "--tp",
                args.tp,
                "-f",
                "json",
                "-o",
                str(out),
            ]
            times = timed(cmd, args.repeats)
            s = {"rows": rows, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
            results.append(s)
            print(
                f"{rows:>9,} rows: median {s['median_s']:.2f} s "
                f"(min {s['min_s']:.2f}, max {s['max_s']:.2f}, {len(times)} runs)"
            )
    doc = {
        "benchmark": "mlactl engines on a random workload CSV",
        "command": f"mlactl engines W.csv --hardware {args.hardware} --model {args.model} --tp {args.tp} -f json "
        "-o out.json (the default engines: four for a dense model, sglang and vllm for DSA; every sweep)",
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "target": "1,000,000 rows in <= 30 s (issue 24)",
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"saved {args.json}")


if __name__ == "__main__":
    main()
