"""mla_sparse_decode on a GPU: DeepSeek-V3.2's sparse absorb decode (top-2048), bf16 and fp8 caches.

For batches of 1, 16, 64 and 128 decode tokens at 128 heads (TP 1) and 16 (TP 8), each cache
kind: the kernel is checked against its torch twin, then timed with mlactl's harness (L2 flushed
between calls; median, 10th and 90th percentiles), and the achieved TFLOP/s and GB/s are those of
cost.py's sparse attention op (CostModel.sparse_attention) over the median. Prints a table and
saves JSON. A timing never decides a test.

    python benchmarks/bench_sparse_decode.py [--out DIR] [--quick]
    python benchmarks/bench_sparse_decode.py --smoke     (CPU interpreter, tiny shapes: checks the script)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="batch 64 only")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes under TRITON_INTERPRET=1")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from mlactl.kernels.sparse_decode import mla_sparse_decode
    from mlactl.kernels.sparse_decode_naive import mla_sparse_decode_naive
    from mlactl.model.config import from_name
    from mlactl.model.cost import CostModel
    from mlactl.tune import inputs
    from mlactl.tune.common import versions
    from mlactl.tune.timing import time_call

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: use --smoke to check the script on a CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    base = from_name("deepseek-v3.2")
    if args.smoke:
        base = replace(base, H=4, r=128, dR=16, dC=16, dV=16, topk=32)
    dtype = "fp32" if args.smoke else "bf16"
    batches = (2,) if args.smoke else ((64,) if args.quick else (1, 16, 64, 128))
    tps = (1,) if args.smoke else (1, 8)
    rows = []
    for tp in tps:
        cfg = base.with_tp(tp)
        for kv in ("bf16", "fp8"):
            cost = CostModel(cfg, kv_dtype=kv, dtype=dtype)
            for B in batches:
                topk = cfg.index().topk
                page = 16 if args.smoke else inputs.PAGE
                kwargs = inputs.sparse_decode_inputs(cfg, B, 1, topk, 4 * topk, kv, dtype, device, page=page)
                got = mla_sparse_decode(**kwargs)[0]
                want = mla_sparse_decode_naive(**kwargs)[0]
                err = float((got.float() - want.float()).abs().max())
                timing = time_call(lambda kw=kwargs: mla_sparse_decode(**kw), device=device)
                op = cost.sparse_attention(B, B * topk)
                row = {
                    "tp": tp,
                    "H": cfg.H,
                    "kv_dtype": kv,
                    "B": B,
                    "topk": topk,
                    "max_abs_err_vs_twin": err,
                    "median_s": timing.median_s,
                    "p10_s": timing.p10_s,
                    "p90_s": timing.p90_s,
                    "tflops": float(op.flops) / timing.median_s / 1e12,
                    "gbs": float(op.bytes) / timing.median_s / 1e9,
                }
                rows.append(row)
                print(
                    f"TP{tp} H={cfg.H:3d} {kv:4s} B={B:4d}: {timing.median_s * 1e6:9.1f} us "
                    f"(p10 {timing.p10_s * 1e6:.1f}, p90 {timing.p90_s * 1e6:.1f}), {row['tflops']:.1f} TFLOP/s, "
                    f"{row['gbs']:.0f} GB/s, max |kernel - twin| {err:.2e}",
                    flush=True,
                )
    device_name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name(device)
    payload = {"device": device_name, "versions": versions(), "smoke": args.smoke, "rows": rows}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(args.out, f"sparse-decode{'-smoke' if args.smoke else ''}-{stamp}.json")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
