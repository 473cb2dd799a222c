"""Regenerate the README's charts, docs/images/plot-*.png, by running `mlactl plot` itself.

    python docs/make_charts.py        # the analytic charts: roofline, crossover, pathmap
    python docs/make_charts.py --results docs/results/cpu-teaching-tp8-torch.json \
        --hardware docs/results/cpu.toml \
        --tune-results docs/results/interpret-teaching-tp8-mla_decode.json
                                      # also the measured charts and the tune sweep

The commands below are the ones docs/plot-section.md shows; nothing here draws or measures
anything itself, so the pictures change only when the tool does. Measured charts are made only
from a real results file: there are no made-up measurements.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"
DPI = "80"  # keeps each image under ~150 KB
CHARTS = {  # image name -> `mlactl plot` arguments
    "roofline": ["roofline", "--model", "deepseek-v3", "--hardware", "h200"],
    "crossover": ["crossover", "--model", "deepseek-v3", "--hardware", "h200", "--prefix", "0,4K,32K"],
    "pathmap": ["pathmap", "--model", "deepseek-v3", "--hardware", "h200"],
    "pathmap-sglang": ["pathmap", "--model", "deepseek-v3", "--hardware", "h200", "--policy", "sglang"],
}


def plot(*args: str) -> None:
    """Run `mlactl plot ...` as a user would, and stop on its first failure."""
    print("$ mlactl plot", shlex.join(args))
    subprocess.run([sys.executable, "-m", "mlactl.cli", "plot", *args], check=True)


def matching(results: Path, hardware: str | None) -> list[str]:
    """The model, tensor parallelism, dtypes and hardware options a results file was measured with."""
    data = json.loads(results.read_text())
    model = data["model"]
    return [
        "--model",
        model["name"],
        "--tp",
        str(model.get("tp", 1)),
        "--kv-dtype",
        data["kv_dtype"],
        "--dtype",
        data["dtype"],
        "--hardware",
        hardware or data["device"].get("hardware") or "h200",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="a results file of `mlactl tune paths`: adds the measured charts")
    parser.add_argument("--hardware", help="profile name or .toml for --results (default: the one it names)")
    parser.add_argument("--tune-results", type=Path, help="a results file of `mlactl tune kernels`: the tune chart")
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name, chart in CHARTS.items():
        plot(*chart, "--output", str(IMAGES / f"plot-{name}.png"), "--dpi", DPI)
    if args.results is not None:
        same = matching(args.results, args.hardware)
        for name, extra in (
            ("roofline", []),
            (
                "crossover",
                ["--prefix", ",".join(str(r["prefix"]) for r in json.loads(args.results.read_text())["crossovers"])],
            ),
            ("pathmap", []),
        ):
            plot(
                name,
                *same,
                *extra,
                "--results",
                str(args.results),
                "--output",
                str(IMAGES / f"plot-{name}-measured.png"),
                "--dpi",
                DPI,
            )
    if args.tune_results is not None:
        plot("tune", "--results", str(args.tune_results), "--output", str(IMAGES / "plot-tune.png"), "--dpi", DPI)


if __name__ == "__main__":
    main()
