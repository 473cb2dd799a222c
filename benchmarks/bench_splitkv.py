"""Balance of split-KV schedules for mla_decode, computed on a CPU (no GPU, no timing).

For three batch mixes, the planned makespan (the most work any SM gets: KV tiles plus a fixed
cost per request piece) of today's uniform rule and of the balanced planner (kernels/schedule.py),
over two ideals:

* tiles/SM:  total KV tiles / SMs (the issue's ideal; no schedule reaches it when fixed costs
  are large: every request pays at least one);
* bound:     (total tiles + one fixed cost per request) / SMs, a lower bound for any schedule.

The fixed cost F of a request piece is FlashMLA's (5 tiles of 64 keys at every head count,
kernels/schedule.py) or, at 16 heads, the bytes alone (1 tile): which is nearer the truth is for
the GPU to say (bench_decode_schedules.py times both). Each row is planned and scored with its F.

Mixes: one 128K context among 63 of 1K; 128 uniform requests of 4K; power-law lengths (Pareto,
alpha 1.2, capped at 128K, seed 0): 64 requests from 256 tokens (a light batch, ~8 tiles per
SM) and 128 from 1K. Shapes: DeepSeek-V3 at 128 heads per GPU
(TP1, 64-row tiles: 2 row tiles per request) and 16 heads (TP8), bf16 cache, BLOCK_N 64, 132 SMs
(H200). Today's rule: `decode.heuristic_config` split count, programs dealt in launch order to the
SM that frees up first.

Usage: python benchmarks/bench_splitkv.py [--sms 132] [--out benchmarks/results/splitkv-balance.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

import torch

from mlactl.kernels import schedule
from mlactl.kernels.decode import BLOCK_H_MIN, BLOCK_H_WIDE, heuristic_config


def mixes() -> dict[str, list[int]]:
    rng = random.Random(0)
    light = [min(131072, int(256 * (1.0 - rng.random()) ** (-1 / 1.2))) for _ in range(64)]
    busy = [min(131072, int(1024 * (1.0 - rng.random()) ** (-1 / 1.2))) for _ in range(128)]
    return {
        "one 128K among 63x1K": [131072] + [1024] * 63,
        "128 x 4K uniform": [4096] * 128,
        "64 power-law from 256": light,
        "128 power-law from 1K": busy,
    }


def evaluate(
    lens: list[int], H: int, sms: int, block_n: int = 64, r: int = 512, dR: int = 64, fixed_model: str = "flashmla"
) -> dict:
    rows = H  # S_q = 1
    block_h = min(BLOCK_H_WIDE, max(BLOCK_H_MIN, 1 << (rows - 1).bit_length()))
    n_h = -(-rows // block_h)
    parts = max(1, sms // n_h)
    keys = schedule.FIXED_OVERHEAD_KEYS
    schedule.FIXED_OVERHEAD_KEYS = keys if fixed_model == "flashmla" else 0  # "bytes": the bytes alone
    try:
        fixed = schedule.split_cost_tiles(block_h, r, dR, block_n, 2, 2)
    finally:
        schedule.FIXED_OVERHEAD_KEYS = keys
    tiles = sum(-(-n // block_n) for n in lens)
    ideal = tiles * n_h / sms
    bound = (tiles + len(lens) * fixed) * n_h / sms

    pl = schedule.plan(torch.tensor(lens, dtype=torch.int32), block_n, parts, fixed)
    balanced = max(schedule.part_costs(schedule.simulate(pl), fixed))
    splits = heuristic_config(len(lens), H, 1, r, dR, max(lens), 64, torch.bfloat16, torch.bfloat16, sms)["num_splits"]
    uniform = max(schedule.uniform_costs(lens, block_n, splits, sms, fixed, n_h))
    return {
        "H": H,
        "fixed_model": fixed_model,
        "B": len(lens),
        "tiles": tiles,
        "fixed_tiles": fixed,
        "sms": sms,
        "row_tiles": n_h,
        "parts": parts,
        "uniform_splits": splits,
        "uniform_makespan": uniform,
        "balanced_makespan": balanced,
        "split_requests": int((pl.n_splits > 1).sum()),
        "partial_slots_used": int(pl.n_splits[pl.n_splits > 1].sum()),
        "partial_slots_allocated": pl.max_partials,
        "ideal_tiles_per_sm": ideal,
        "bound_per_sm": bound,
        "uniform_over_ideal": uniform / ideal,
        "balanced_over_ideal": balanced / ideal,
        "balanced_over_bound": balanced / bound,
        "bound_over_ideal": bound / ideal,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "splitkv-balance.json"))
    args = ap.parse_args()
    rows = []
    for name, lens in mixes().items():
        for H in (128, 16):
            for model in ("flashmla", "bytes"):
                if H == 128 and model == "bytes":
                    continue  # at 64-row tiles both give F = 5
                rows.append({"mix": name, **evaluate(lens, H, args.sms, fixed_model=model)})
    head = f"{'mix':22s} {'H':>4s} {'F from':>8s} {'tiles':>6s} {'F':>2s} {'ideal':>6s} {'bound':>6s} {'b/ideal':>7s}"
    head += f" {'uniform':>8s} {'x ideal':>8s} {'balanced':>8s} {'x ideal':>8s} {'x bound':>8s} {'split':>5s}"
    print(head)
    for r in rows:
        print(
            f"{r['mix']:22s} {r['H']:4d} {r['fixed_model']:>8s} {r['tiles']:6d} {r['fixed_tiles']:2d} "
            f"{r['ideal_tiles_per_sm']:6.1f} {r['bound_per_sm']:6.1f} {r['bound_over_ideal']:7.3f} "
            f"{r['uniform_makespan']:8d} {r['uniform_over_ideal']:8.2f} {r['balanced_makespan']:8d} "
            f"{r['balanced_over_ideal']:8.3f} {r['balanced_over_bound']:8.3f} {r['split_requests']:5d}"
        )
    doc = {
        "what": "split-KV balance, planned on a CPU: makespan in KV tiles (BLOCK_N 64) incl. fixed costs",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)), suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
