"""Old and new mla_decode side by side on a GPU: today's uniform split rule vs the balanced plan.

For the batch mixes of bench_splitkv.py (one 128K among 63 x 1K, 128 x 4K, power-law), at
DeepSeek-V3 H = 128 and H = 16, bf16: each schedule is checked against the torch twin, then timed
(CUDA events via triton.testing.do_bench, median and spread over repetitions). Prints a table and
saves JSON. A timing never decides a test.

Usage: python benchmarks/bench_decode_schedules.py [--out DIR] [--quick]
       python benchmarks/bench_decode_schedules.py --smoke   (CPU interpreter, tiny shapes)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="H=128 only, fewer repetitions")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes under TRITON_INTERPRET=1 (checks the script)")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_splitkv import mixes

    from mlactl.kernels.decode import mla_decode
    from mlactl.kernels.decode_naive import mla_decode_naive

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: use --smoke to check the script on a CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    r, dR, page = (32, 16, 16) if args.smoke else (512, 64, 64)
    heads = (4,) if args.smoke else ((128,) if args.quick else (128, 16))
    all_mixes = mixes()
    if args.smoke:
        all_mixes = {"smoke skewed": [600, 20, 0, 33]}
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for name, lens in all_mixes.items():
        for H in heads:
            B = len(lens)
            pages = [-(-n // page) for n in lens]
            table = torch.zeros(B, max(max(pages), 1), dtype=torch.int32)
            perm = torch.randperm(sum(pages), generator=gen).to(torch.int32)
            at = 0
            for b, n in enumerate(pages):
                table[b, :n] = perm[at : at + n]
                at += n
            kv = (torch.randn(max(sum(pages), 1), page, r + dR, generator=gen) * 0.5).to(dtype).to(device)
            q = (torch.randn(B, 1, H, r + dR, generator=gen) * 0.5).to(dtype).to(device)
            table, seqlens = table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)
            scale = (128 + 64) ** -0.5
            want = mla_decode_naive(q, kv, table, seqlens, scale, r=r)[0].float()
            for sched in ("uniform", "balanced"):
                row = {"mix": name, "H": H, "B": B, "tokens": sum(lens), "schedule": sched}

                run = functools.partial(mla_decode, q, kv, table, seqlens, scale, r=r, schedule=sched, validate=False)

                got = run()[0].float()
                row["max_abs_err"] = float((got - want).abs().max())
                if args.smoke:
                    row["median_us"] = None
                else:
                    import triton

                    reps = 20 if args.quick else 50
                    times = [triton.testing.do_bench(run, warmup=5, rep=reps) for _ in range(5)]
                    row["median_us"] = statistics.median(times) * 1e3
                    row["spread_us"] = (max(times) - min(times)) * 1e3
                    row["GB_per_s"] = sum(lens) * (r + dR) * kv.element_size() / (row["median_us"] * 1e-6) / 1e9
                rows.append(row)
                med = "-" if row["median_us"] is None else f"{row['median_us']:.1f} us"
                print(f"{name:24s} H={H:<4d} {sched:9s} err {row['max_abs_err']:.2e}  {med}", flush=True)
    doc = {
        "what": "mla_decode uniform vs balanced split-KV, measured",
        "device": "cpu-interpreter" if args.smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode-schedules-smoke.json" if args.smoke else "decode-schedules.json")
    fd, tmp = tempfile.mkstemp(dir=args.out, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
