"""`mlactl tune paths --ray`: N Ray workers against the serial run, on this machine.

    python benchmarks/bench_ray.py [--workers 1,2] [--repeats 3] [--json out.json]

Each repetition tunes the same grid of path points (torch backend, the `teaching` model at tp 8,
fp32 on the CPU) into a fresh results file: serially, then on a local Ray cluster with N CPU
workers. Cluster and worker start-up are timed apart from the sweep. Per run it reports units
per second, the driver's busy time per unit (dispatch, merging into the store, saving it) and
the workers' measuring time per unit. Prints medians with min/max and saves JSON (default
benchmarks/results/ray-<host>.json). Nothing here asserts: timings are noisy, above all on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCHES, PREFIXES = [1, 2, 4], [0, 64, 256]
NEWS = [1, 4, 16, 64]  # 3 x 3 x 4 = 36 units


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def show(name: str, s: dict, unit: str, scale: float = 1.0) -> None:
    print(
        f"{name:<46} median {s['median'] * scale:9.3f} {unit}   (min {s['min'] * scale:.3f}, "
        f"max {s['max'] * scale:.3f}, {s['runs']} runs)"
    )


def make_run(folder: Path, name: str, workers: int | None):
    from mlactl.cli.tune import Run

    return Run(
        model="teaching",
        tp="8",
        backend="torch",
        quick=True,
        results_file=folder / f"{name}.json",
        ray="local" if workers else None,
        workers=workers,
    )


def serial_once(folder: Path, i: int) -> dict:
    from mlactl.tune import sweep

    run = make_run(folder, f"serial-{i}", None)
    start = time.perf_counter()
    sweep.tune_paths(run.ctx, BATCHES, NEWS, PREFIXES, run.chunk, refine=False)
    wall = time.perf_counter() - start
    units = len(BATCHES) * len(PREFIXES) * len(NEWS)
    return {"wall_s": wall, "units": units, "units_per_s": units / wall}


def ray_once(folder: Path, i: int, workers: int) -> dict:
    from mlactl.tune import ray_runner

    start = time.perf_counter()
    run = make_run(folder, f"ray{workers}-{i}", workers)
    started = time.perf_counter() - start
    try:
        _, stats = ray_runner.tune_paths(run.cluster, BATCHES, NEWS, PREFIXES, refine=False)
    finally:
        run.cluster.close()
    return {
        "start_s": started,
        "wall_s": stats.wall_s,
        "units": stats.units,
        "failed": stats.failed,
        "units_per_s": stats.units / stats.wall_s,
        "driver_per_unit_s": stats.driver_s / stats.units,
        "worker_per_unit_s": stats.worker_s / stats.units,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]

    import ray
    import torch

    torch.set_num_threads(1)  # the serial run gets one core, as each worker does
    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, configure_logging=False)
    out: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "grid": {"batches": BATCHES, "prefixes": PREFIXES, "news": NEWS, "model": "teaching tp8 fp32 torch"},
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLACTL_HOME"] = tmp  # tuned configs and profiles stay out of the user's home
        folder = Path(tmp)
        runs = {"serial": [serial_once(folder, i) for i in range(args.repeats)]}
        for n in counts:
            runs[f"ray-{n}"] = [ray_once(folder, i, n) for i in range(args.repeats)]
    ray.shutdown()
    out["runs"] = runs

    load = out["load_avg_at_start"][0]
    print(f"{out['host']}: {out['cpus']} CPUs, load {load:.1f}, torch {out['torch']}, ray {out['ray']}")
    for name, rows in runs.items():
        show(f"{name}: units per second", summary([r["units_per_s"] for r in rows]), "/s")
        if name != "serial":
            show(f"{name}: cluster + worker start", summary([r["start_s"] for r in rows]), "s")
            show(f"{name}: driver busy per unit", summary([r["driver_per_unit_s"] for r in rows]), "ms", 1e3)
            show(f"{name}: worker measuring per unit", summary([r["worker_per_unit_s"] for r in rows]), "ms", 1e3)
    path = args.json or HERE / "results" / f"ray-{platform.node()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
