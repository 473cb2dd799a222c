"""Measured against calibrated crossovers of the torch backend on this CPU (issues 9 and 22).

1. `mlactl tune paths --backend torch --device cpu` over new-token counts at each prefix (the
   paths timed in turns at each shape, each round's times kept; the run bisects the measured
   crossover), unless --results FILE gives a run already made;
2. `mlactl calibrate --from results` on that run (whole-path fits), and the crossover of the
   calibrated times at each prefix with its 80% interval (`mlactl crossover --calibration`);
3. the same with each prefix held out: fitted on the other prefixes' points only.

The measured crossover is the root of a local fit of log(expand/absorb) with its bootstrap
interval (mlactl.tune.noise.root_crossover), `first_stable` the old definition. The target
(issue 22): at every prefix, the calibrated crossover's interval and the measured one's overlap,
on two runs (run this twice, the second with --output ...-rerun.json).

Prints the table and writes benchmarks/results/cpu-crossover.json. Never a test: the times are
this machine's, and a shared machine's noise moves a measured crossover.

    python benchmarks/bench_cpu_crossover.py                       # measure, then compare
    python benchmarks/bench_cpu_crossover.py --results run.json    # compare a run already made
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from mlactl.decide.calibration import store
from mlactl.decide.calibration.estimate import crossover_intervals
from mlactl.decide.calibration.run import build
from mlactl.decide.calibration.sources import results_points
from mlactl.decide.calibration.time import crossover_by_time
from mlactl.model import hardware
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.results import store as results
from mlactl.tune import noise

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "cpu-crossover.json"
PROFILE = ROOT / "docs" / "results" / "cpu.toml"
NEW = "1,32,64,128,192,256,320,384,512"
PREFIX = "1024,2048,4096"


def measure(path: Path, model: str, new: str, prefix: str, budget: int) -> None:
    mlactl = str(Path(sys.executable).with_name("mlactl"))
    cmd = [mlactl, "tune", "paths", "--backend", "torch", "--device", "cpu"]
    cmd += ["--model", model, "--new", new, "--prefix", prefix, "--budget", str(budget), "--repeats", "3"]
    cmd += ["--results-file", str(path)]
    print("$ mlactl", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def calibrated_crossovers(data: dict, hw, keep_prefix=None) -> tuple[dict, dict, list[dict]]:
    """Calibrate on the run's path points (only those whose prefix passes keep_prefix), then the
    crossover of the calibrated times at every measured prefix and its 80% interval; and the fits."""
    rows = [r for r in data["paths"] if keep_prefix is None or keep_prefix(r["prefix"])]
    groups = results_points(dict(data, paths=rows, kernels=[]), "run")
    # the source `mlactl calibrate --from results` records: the run's dtype sets the peak
    cal_data, fits = build("bench-cpu", hw, {"kind": "results", "files": [], "dtype": data["dtype"]}, groups)
    cal = store.validate(cal_data, "bench")
    cfg = MLAConfig(**{k: v for k, v in data["model"].items() if k in MLAConfig.__dataclass_fields__})
    cost = CostModel(cfg, kv_dtype=data["kv_dtype"], dtype=data["dtype"], chunk=data.get("chunk", 8192))
    prefixes = sorted({c["prefix"] for c in data["crossovers"]})
    found = crossover_by_time(cost, hw, cal, prefixes, max_new=4096)
    spans = crossover_intervals(cost, hw, cal, prefixes, max_new=4096)
    summary = [
        {k: f[k] for k in ("op", "terms", "n", "held_out", "blocked", "drift") if k in f}
        | {"coverage": ((f.get("interval") or {}).get("coverage") or {}).get("held_out")}
        for f in (x.to_json() for x in fits)
    ]
    return dict(zip(prefixes, found)), dict(zip(prefixes, spans)), summary


def measured_now(data: dict, row: dict) -> dict:
    """The crossover row's measured estimate, computed again from the run's timings (each round's
    times) with this mlactl's estimator (noise.root_crossover), so a run made before a change to
    it is read the same way; the row's first_stable where there is no sign change to fit."""
    points: dict = {}
    for r in data["paths"]:
        if (r["batch"], r["prefix"]) == (row["batch"], row["prefix"]) and r.get("status", "ok") == "ok":
            points.setdefault(r["new"], {})[r["path"]] = r
    stable = row.get("first_stable", row.get("measured"))
    found = noise.root_crossover(points, stable)
    if found is None:
        return {"measured": stable, "measured_interval": None, "estimator": "first_stable", "first_stable": stable}
    return {
        "measured": found["measured"],
        "measured_root": found["root"],
        "measured_interval": found["interval"],
        "measured_window": found["window"],
        "estimator": "local_root",
        "first_stable": stable,
    }


def overlap(a, b) -> bool | None:
    """Whether two intervals [lo, hi] (hi None: open above) share a count; None if one is missing."""
    if a is None or b is None or a[0] is None or b[0] is None:
        return None
    a_hi = float("inf") if a[1] is None else a[1]
    b_hi = float("inf") if b[1] is None else b[1]
    return a[0] <= b_hi and b[0] <= a_hi


def err(calibrated, measured) -> float | None:
    if calibrated is None or not measured:
        return None
    return calibrated / measured - 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", help="a `tune paths` results file to compare (default: measure now)")
    ap.add_argument("--model", default="deepseek-v2-lite")
    ap.add_argument("--new", default=NEW)
    ap.add_argument("--prefix", default=PREFIX)
    ap.add_argument("--budget", type=int, default=1200)
    ap.add_argument("--output", default=str(OUT))
    args = ap.parse_args()
    start = time.time()
    if args.results:
        run = Path(args.results)
    else:
        run = Path(args.output).with_suffix(".run.json")
        if run.exists():
            run.unlink()
        measure(run, args.model, args.new, args.prefix, args.budget)
    data = results.load(run)
    hw = hardware.load_profile(PROFILE)
    in_sample, spans, fits = calibrated_crossovers(data, hw)
    rows = []
    for c in sorted(data["crossovers"], key=lambda c: c["prefix"]):
        c = dict(c, **measured_now(data, c))
        p = c["prefix"]
        held, held_spans, _ = calibrated_crossovers(data, hw, keep_prefix=lambda q, p=p: q != p)
        measured_interval = c.get("measured_interval")
        rows.append(
            {
                "prefix": p,
                "measured": c.get("measured"),
                "measured_root": c.get("measured_root"),
                "measured_interval": measured_interval,
                "estimator": c.get("estimator"),
                "measured_window": c.get("measured_window"),
                "first_stable": c.get("first_stable", c.get("measured")),
                "first_stable_bracket": [c.get("measured_low"), c.get("measured_high")],
                "nonmonotone": c.get("nonmonotone"),
                "flops": c.get("predicted_by_flops"),
                "calibrated": in_sample[p],
                "calibrated_interval": list(spans[p]),
                "calibrated_error": err(in_sample[p], c.get("measured")),
                "intervals_overlap": overlap(spans[p], measured_interval),
                "calibrated_prefix_held_out": held[p],
                "held_out_interval": list(held_spans[p]),
                "held_out_error": err(held[p], c.get("measured")),
                "held_out_overlap": overlap(held_spans[p], measured_interval),
            }
        )

    def span(v) -> str:
        return "—" if v is None else "–".join("?" if x is None else str(x) for x in v)

    print(
        f"\n{'prefix':>6} {'measured':>9} {'(80%)':>11} {'first stable':>12} {'FLOPs':>6} {'calibrated':>10} "
        f"{'(80%)':>11} {'overlap':>7} {'err':>6} {'prefix held out':>15} {'(80%)':>11} {'overlap':>7}"
    )
    for r in rows:
        e1 = "—" if r["calibrated_error"] is None else f"{100 * r['calibrated_error']:+.1f}%"
        print(
            f"{r['prefix']:>6} {str(r['measured']):>9} {span(r['measured_interval']):>11} "
            f"{str(r['first_stable']):>12} {str(r['flops']):>6} {str(r['calibrated']):>10} "
            f"{span(r['calibrated_interval']):>11} {str(r['intervals_overlap']):>7} {e1:>6} "
            f"{str(r['calibrated_prefix_held_out']):>15} {span(r['held_out_interval']):>11} "
            f"{str(r['held_out_overlap']):>7}"
        )
    for f in fits:
        blocked = f.get("blocked") or {}
        print(
            f"  fit {f['op']:12} terms {'+'.join(f['terms']):24} held-out median "
            f"{100 * f['held_out']['median']:.1f}% p90 {100 * f['held_out']['p90']:.1f}%; blocked "
            f"{100 * blocked.get('median', float('nan')):.1f}% / {100 * blocked.get('p90', float('nan')):.1f}%; "
            f"80% interval held-out coverage {f['coverage']}"
        )
    both = sum(1 for r in rows if r["intervals_overlap"])
    print(f"\n{both}/{len(rows)} prefixes where the calibrated and the measured crossover's 80% intervals overlap")
    out = {
        "benchmark": "cpu-crossover",
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "run": str(run.resolve().relative_to(ROOT)) if run.resolve().is_relative_to(ROOT) else str(run),
        "model": data["model"].get("name"),
        "dtype": data["dtype"],
        "seconds": round(time.time() - start, 1),
        "prefixes": rows,
        "fits": fits,
    }
    from mlactl.util.io import atomic_write

    atomic_write(args.output, json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
