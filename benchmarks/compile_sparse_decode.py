"""Compile sweep of mla_sparse_decode for sm_90 (no GPU): shared memory, registers and spills of
every (BLOCK_H, BLOCK_N, num_warps, num_stages) in {16, 32, 64} x {16, 32, 64} x {4, 8, 16} x
{1, 2, 3} (16 warps only from 32 rows), for a bf16 cache and FlashMLA's fp8 layout, at
DeepSeek-V3.2's dims (H = 128, r = 512, dR = 64, top-2048, 2 splits). It chose the NO_SPILL
defaults in kernels/sparse_decode.py. Not a timing.

    python benchmarks/compile_sparse_decode.py [--kv bf16,fp8] [--output FILE]

Writes benchmarks/results/compile-sm90-sparse-decode.json (minutes: one Triton + ptxas build a
config, in a child process without the interpreter).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from mlactl.tune.compile import Case, compile_cases

OUT = Path(__file__).parent / "results" / "compile-sm90-sparse-decode.json"
SHAPE = {"B": 64, "H": 128, "S_q": 1, "topk": 2048}


def cases(kv: str) -> list[Case]:
    out = []
    for bh, bn, w, st in itertools.product((16, 32, 64), (16, 32, 64), (4, 8, 16), (1, 2, 3)):
        if bh == 16 and w == 16:
            continue
        config = {"BLOCK_H": bh, "BLOCK_N": bn, "num_warps": w, "num_stages": st, "num_splits": 2}
        out.append(Case("mla_sparse_decode", SHAPE, config, kv_dtype=kv, label="sweep"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--output", type=Path, default=OUT)
    args = ap.parse_args()
    found = {}
    for kv in args.kv.split(","):
        rows = []
        for r in compile_cases(cases(kv), timeout=7200):
            row = {k: r.get(k) for k in ("config", "smem_bytes", "registers", "spill_bytes", "stack_bytes")}
            row.update(wgmma_per_loop=r.get("wgmma_per_loop"), mma_per_loop=r.get("mma_per_loop"), error=r["error"])
            rows.append(row)
            print(kv, row, flush=True)
        found[kv] = rows
    payload = {"what": "mla_sparse_decode stage 1 compiled for sm_90 (Triton 3.9, ptxas 13.4)", "shape": SHAPE, **found}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
