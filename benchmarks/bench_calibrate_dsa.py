"""Held-out error of calibrated time on aiconfigurator's DSA kernel tables (DeepSeek Sparse Attention).

For the systems with a DSA kernel table that fits may be chosen on (h100_sxm, h200_sxm, b200_sxm,
gb200; b300_sxm and gb300 are held out for calibrate transfer and never fitted here), SGLang
0.5.14's three GLM-5 kernel tables (mlactl/decide/calibration/aiconfigurator.py: glm5_mqa_logits
-> indexer, glm5_topk -> topk, glm5_dsa_attn -> sparse_attention): n, the roofline's error (no
fit), and the selected model's held-out error (the term set with the least, 5 folds), each the
median and p90 of |predicted/measured - 1|, with the fitted efficiencies and the seconds the fit
took.

Prints a table and writes benchmarks/results/calibrate-dsa.json. Never a test.

    python benchmarks/bench_calibrate_dsa.py [--systems h200_sxm]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from mlactl.decide.calibration import aiconfigurator as ac
from mlactl.decide.calibration.fit import rel_errors, summary
from mlactl.decide.calibration.run import SYSTEM_PROFILES, machine_for
from mlactl.decide.calibration.selection import select
from mlactl.model import hardware
from mlactl.model.roofline import roofline_time

SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200")
OUT = Path(__file__).parent / "results" / "calibrate-dsa.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--output", type=Path, default=OUT)
    args = ap.parse_args()
    data_dir = ac.default_data_dir()
    rows = []
    for system in args.systems.split(","):
        hw = hardware.from_name(SYSTEM_PROFILES[system])
        machine = machine_for(hw)
        tables = [t for t in ac.find_tables(data_dir, system, "sglang") if t.name in ac.DSA_TABLES]
        for t in tables:
            for (op, src, dtype), pts in ac.table_points(t).items():
                roof = roofline_time(pts.flops, pts.bytes, machine.peak, machine.bandwidth)
                start = time.perf_counter()
                best, _ = select(op, src, dtype, pts, machine)
                took = time.perf_counter() - start
                row = {
                    "system": system,
                    "table": t.name.split("/")[1],
                    "version": t.version,
                    "op": op,
                    "source": src,
                    "n": len(pts),
                    "roofline": summary(rel_errors(roof, pts.time_s)),
                    "held_out": best.held_out,
                    "in_sample": best.in_sample,
                    "terms": list(best.terms),
                    "eta_c": best.params["eta_c"],
                    "eta_m": best.params["eta_m"],
                    "t_fixed_us": best.params["t_fixed_s"] * 1e6,
                    "fit_s": took,
                    "median_measured_ms": float(np.median(pts.time_s) * 1e3),
                }
                rows.append(row)
                print(
                    f"{system:9s} {op:16s} n={row['n']:5d} roofline {row['roofline']['median']:.1%}/"
                    f"{row['roofline']['p90']:.1%}  held out {row['held_out']['median']:.1%}/"
                    f"{row['held_out']['p90']:.1%}  eta_c {row['eta_c']:.2f} eta_m {row['eta_m']:.2f} "
                    f"({'+'.join(row['terms'])}; {took:.0f} s)",
                    flush=True,
                )
    payload = {
        "what": "calibrated time on aiconfigurator-core 0.12's DSA kernel tables (GLM-5 dims), held out 5-fold",
        "machine": {"python": platform.python_version(), "node": platform.node(), "cpus": platform.processor()},
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
