"""Run the fuzz suite (tests/test_fuzz.py) with a longer budget and save what it tried.

    python benchmarks/fuzz.py                  # 500 examples per test ("long" profile)
    python benchmarks/fuzz.py --examples 2000  # more

Prints, and saves as benchmarks/results/fuzz-<YYYYMMDD-HHMMSS>.json: examples per test, runs per
reader/command by exit status (0 or 2; anything else fails the suite), the wall time, pytest's
verdict and the machine. A failure prints Hypothesis's minimal example, as pytest does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="Hypothesis examples per test (default 500)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the JSON")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        counts_path = Path(tmp) / "counts.json"
        env = dict(
            os.environ,
            MLACTL_FUZZ_PROFILE="long",
            MLACTL_FUZZ_EXAMPLES=str(args.examples),
            MLACTL_FUZZ_COUNTS=str(counts_path),
        )
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_fuzz.py"), "-q", "-p", "no:cacheprovider"],
            env=env,
            cwd=ROOT,
        )
        wall = time.monotonic() - start
        counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}

    doc = {
        "schema": "mlactl.fuzz",
        "schema_version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "examples_per_test": args.examples,
        "passed": proc.returncode == 0,
        "wall_s": round(wall, 1),
        "runs": counts,
        "runs_total": sum(counts.values()),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
    }
    print(json.dumps(doc, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fuzz-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"saved {path}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
