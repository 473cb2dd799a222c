"""How reproducible is the expand/absorb ratio on this machine? (what a measured crossover rests on)

At one prefix and a few new-token counts near the crossover, times both paths of the torch
backend in turns (mlactl.tune.timing.time_interleaved, `--rounds` rounds), `--repeat` times over,
and prints each measurement's ratio of medians and the spread of the per-round ratios. If two
measurements of the same shape disagree by more than the ratio's change over the new-token range,
no crossover measured here can be checked to that precision.

Prints a table and writes benchmarks/results/cpu-ratio-noise.json. Never a test.

    python benchmarks/bench_cpu_ratio_noise.py --prefix 1024 --new 128,160,192,224,256
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from mlactl.kernels.attention import mla_attention
from mlactl.model.config import from_name
from mlactl.tune.inputs import paged_batch
from mlactl.tune.timing import time_interleaved

OUT = Path(__file__).parent / "results" / "cpu-ratio-noise.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v2-lite")
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--new", default="128,160,192,224,256")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--output", default=str(OUT))
    args = ap.parse_args()
    cfg = from_name(args.model)
    rows = []
    for n in (int(x) for x in args.new.split(",")):
        args_ = paged_batch(cfg, 1, n, args.prefix, "fp32", "fp32", torch.device("cpu"), page=16).attention_args()
        fns = {p: functools.partial(mla_attention, **args_, path=p, backend="torch") for p in ("expand", "absorb")}
        for k in range(args.repeat):
            t = time_interleaved(fns, warmup=1, budget_s=0, min_repeats=args.rounds, max_repeats=args.rounds)
            per_round = np.array(t["expand"].times_s) / np.array(t["absorb"].times_s)
            row = {
                "prefix": args.prefix,
                "new": n,
                "measurement": k + 1,
                "rounds": args.rounds,
                "expand_median_s": t["expand"].median_s,
                "absorb_median_s": t["absorb"].median_s,
                "ratio_of_medians": t["expand"].median_s / t["absorb"].median_s,
                "per_round_ratio_p25": float(np.percentile(per_round, 25)),
                "per_round_ratio_median": float(np.median(per_round)),
                "per_round_ratio_p75": float(np.percentile(per_round, 75)),
            }
            rows.append(row)
            print(
                f"prefix {args.prefix} new {n:4d} #{k + 1}: expand/absorb {row['ratio_of_medians']:.3f} "
                f"(per round: median {row['per_round_ratio_median']:.3f}, "
                f"IQR {row['per_round_ratio_p25']:.3f}-{row['per_round_ratio_p75']:.3f})",
                flush=True,
            )
    spread = []
    for n in sorted({r["new"] for r in rows}):
        ratios = [r["ratio_of_medians"] for r in rows if r["new"] == n]
        spread.append(max(ratios) / min(ratios) - 1)
    print(f"largest disagreement between measurements of one shape: {100 * max(spread):.1f}%")
    out = {
        "benchmark": "cpu-ratio-noise",
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        },
        "model": args.model,
        "rows": rows,
        "largest_disagreement": max(spread),
    }
    from mlactl.util.io import atomic_write

    atomic_write(args.output, json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
