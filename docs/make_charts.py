"""Regenerate the README's charts, docs/images/plot-*.png, by running `mlactl plot` itself.

    python docs/make_charts.py                   # the analytic charts: roofline, crossover, pathmap
    python docs/make_charts.py --results R.json  # also each chart with R's measurements, and the
                                                 # tune sweep (R: a results file `mlactl tune` wrote)

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
    "pathmap": ["pathmap", "--model", "deepseek-v3", "--hardware", "h200", "--threshold", "8K"],
}


def plot(*args: str) -> None:
    """Run `mlactl plot ...` as a user would, and stop on its first failure."""
    print("$ mlactl plot", shlex.join(args))
    subprocess.run([sys.executable, "-m", "mlactl.cli", "plot", *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="a results file from `mlactl tune`: adds the measured charts")
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name, chart in CHARTS.items():
        plot(*chart, "--output", str(IMAGES / f"plot-{name}.png"), "--dpi", DPI)
    if args.results is None:
        return
    # the results name the profile they ran on; plot against that one
    device = json.loads(args.results.read_text())["device"].get("hardware") or "h200"
    for name, chart in CHARTS.items():
        chart = [device if prev == "--hardware" else a for prev, a in zip([None, *chart], chart)]
        plot(*chart, "--results", str(args.results),
               "--output", str(IMAGES / f"plot-{name}-measured.png"), "--dpi", DPI)
    plot("tune", "--results", str(args.results), "--output", str(IMAGES / "plot-tune.png"), "--dpi", DPI)


if __name__ == "__main__":
    main()
