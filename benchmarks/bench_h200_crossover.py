"""The flagship calibrated answer, remade: DeepSeek-V3's crossover on an H200 with SGLang's
kernels, with its 80% interval and the basis of each op that decides it (issue 22).

1. `mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang` (into a
   temporary MLACTL_HOME: your own calibrations are not touched);
2. `mlactl crossover --hardware h200 --prefix 0,4K,32K --calibration NAME -f json`;
3. `mlactl analyze` at new-token counts around it after 4K and 32K, `--engines sglang -f json`.

Writes benchmarks/results/h200-sglang-crossover.json: the commands, the fits (terms, held-out
and blocked errors, interval coverage), the crossover rows and the analyze rows. Prints the
crossover table. docs/calibration.md ("H200, SGLang 0.5.14: the crossover") quotes it. Needs
`pip install '.[calibrate]'`. Never a test.

    python benchmarks/bench_h200_crossover.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from importlib.metadata import version
from pathlib import Path

from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.util.io import atomic_write

OUT = Path(__file__).parent / "results" / "h200-sglang-crossover.json"
NAME = "h200-aiconfigurator-sglang-0.5.14"
COMMANDS = [
    ["calibrate", "--from", "aiconfigurator", "--system", "h200_sxm", "--framework", "sglang", "-f", "json"],
    ["crossover", "--hardware", "h200", "--prefix", "0,4K,32K", "--calibration", NAME, "-f", "json"],
    ["analyze", "--hardware", "h200", "--new", "100,132,133,157,180", "--prefix", "4K,32K"]
    + ["--calibration", NAME, "--engines", "sglang", "-f", "json"],
]


def run(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise SystemExit(f"mlactl {' '.join(args)} failed:\n{result.output}")
    return json.loads(result.stdout)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # takes no options; --help says so
    with tempfile.TemporaryDirectory() as home:
        os.environ["MLACTL_HOME"] = home
        fits, crossover, analysis = (run(args) for args in COMMANDS)
    rows = [
        {
            "batch": r["batch"],
            "new": r["new"],
            "prefix": r["prefix"],
            "paths": {p: r["paths"][p] for p in ("expand", "expand_chunked", "absorb")},
            "best": r["best"],
        }
        for r in analysis["rows"]
    ]
    out = {
        "benchmark": "h200-sglang-crossover",
        "commands": ["mlactl " + " ".join(a for a in args if a not in ("-f", "json")) for args in COMMANDS],
        "aiconfigurator_core": version("aiconfigurator-core"),
        "calibration_fits": fits["fits"],
        "crossover": crossover["crossover"],
        "rows": rows,
    }
    atomic_write(OUT, json.dumps(out, indent=1) + "\n")
    for r in crossover["crossover"]["by_prefix"]:
        print(
            f"batch {r['batch']}, prefix {r['prefix']}: by FLOPs {r['by_flops']}, calibrated {r['by_time']} "
            f"{r['by_time_interval']}, chunked {r['by_time_chunked']} {r['by_time_chunked_interval']}"
        )
        if r["note"]:
            print("  " + r["note"])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
