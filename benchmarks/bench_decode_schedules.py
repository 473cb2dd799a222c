"""mla_decode's schedules side by side on a GPU, where balanced ships (16 heads) and where it does not (128).

For the batch mixes of bench_splitkv.py (one 128K among 63 x 1K, 128 x 4K, power-law), DeepSeek-V3
dims (r 512, dR 64), bf16, page 64, at H = 16 (TP 8: 16-row tiles, `schedule="auto"` runs the
balanced plan) and H = 128 (TP 1: 64-row tiles, auto runs uniform splits; the balanced kernel
spills there). Variants:

* H 16: ``uniform`` (today's split rule), ``balanced`` (the shipped plan, FlashMLA's fixed cost
  of 5 tiles of 64 keys per piece) and ``balanced-F-bytes`` (the fixed cost the bytes alone give,
  1 tile): which fixed cost plans better is what this measures (kernels/schedule.py).
* H 128: ``uniform`` (the shipped default: split score), ``uniform-nosplit`` (the previous
  default, each score computed by both warpgroups) and ``balanced`` (for the record).

Each variant is checked against the torch twin first (max |error| against a threshold; a row
over it is marked WRONG and the script exits 1), then timed: CUDA events via
triton.testing.do_bench, five runs, median and spread. Prints a table, saves JSON after every row
(so a kill keeps what was measured). A timing never decides a test.

Usage: python benchmarks/bench_decode_schedules.py [--out DIR] [--quick] [--budget SECONDS]
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

# the largest |kernel - twin| accepted, by the activation dtype (tests/test_decode.py uses the same)
MAX_ABS_ERR = {"bf16": 2e-2, "fp32": 1e-4}


def variants(H: int, smoke: bool):
    """(name, mla_decode keyword arguments, FIXED_OVERHEAD_KEYS or None) of each variant at H heads."""
    wide = H >= (4 if smoke else 64)
    if wide:
        return [
            ("uniform", {"schedule": "uniform"}, None),
            ("uniform-nosplit", {"schedule": "uniform", "config": {"SPLIT_SCORE": 0, "num_stages": 3}}, None),
            ("balanced", {"schedule": "balanced"}, None),
        ]
    return [
        ("uniform", {"schedule": "uniform"}, None),
        ("balanced", {"schedule": "balanced"}, None),
        ("balanced-F-bytes", {"schedule": "balanced"}, 0),
    ]


def save(doc: dict, path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="two mixes (skewed, 128 x 4K), fewer repetitions")
    ap.add_argument("--budget", type=float, default=None, help="seconds after which rows not started are skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes under TRITON_INTERPRET=1 (checks the script)")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_splitkv import mixes

    from mlactl.kernels import schedule
    from mlactl.kernels.decode import mla_decode
    from mlactl.kernels.decode_naive import mla_decode_naive

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: use --smoke to check the script on a CPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    dtype_name = "fp32" if args.smoke else "bf16"
    r, dR, page = (32, 16, 16) if args.smoke else (512, 64, 64)
    heads = (2, 4) if args.smoke else (16, 128)
    all_mixes = mixes()
    if args.quick:
        all_mixes = {k: v for k, v in all_mixes.items() if k in ("one 128K among 63x1K", "128 x 4K uniform")}
    if args.smoke:
        all_mixes = {"smoke skewed": [600, 20, 0, 33]}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode-schedules-smoke.json" if args.smoke else "decode-schedules.json")
    doc = {
        "what": "mla_decode schedules and the split score, measured; max |error| against the torch twin",
        "device": "cpu-interpreter" if args.smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "max_abs_err_threshold": MAX_ABS_ERR[dtype_name],
        "rows": [],
    }
    gen = torch.Generator(device="cpu").manual_seed(0)
    wrong = 0
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
            base = None
            for variant, kwargs, fixed_keys in variants(H, args.smoke):
                row = {"mix": name, "H": H, "B": B, "tokens": sum(lens), "variant": variant}
                if args.budget is not None and time.perf_counter() - started > args.budget:
                    row["status"] = f"skipped: budget of {args.budget:.0f} s spent"
                    doc["rows"].append(row)
                    continue
                keys = schedule.FIXED_OVERHEAD_KEYS
                if fixed_keys is not None:
                    schedule.FIXED_OVERHEAD_KEYS = fixed_keys
                try:
                    run = functools.partial(mla_decode, q, kv, table, seqlens, scale, r=r, validate=False, **kwargs)
                    got = run()[0].float()
                    row["max_abs_err"] = float((got - want).abs().max())
                    row["status"] = "ok" if row["max_abs_err"] <= MAX_ABS_ERR[dtype_name] else "WRONG"
                    wrong += row["status"] == "WRONG"
                    if args.smoke:
                        row["median_us"] = None
                    else:
                        import triton

                        reps = 20 if args.quick else 50
                        times = [triton.testing.do_bench(run, warmup=5, rep=reps) for _ in range(5)]
                        row["median_us"] = statistics.median(times) * 1e3
                        row["spread_us"] = (max(times) - min(times)) * 1e3
                        row["GB_per_s"] = sum(lens) * (r + dR) * kv.element_size() / (row["median_us"] * 1e-6) / 1e9
                        base = base or row["median_us"]  # the first variant, uniform
                        row["vs_uniform"] = base / row["median_us"]
                except Exception as exc:  # noqa: BLE001 - one failing variant must not lose the others
                    row["status"] = f"error: {type(exc).__name__}: {str(exc).strip()[:200]}"
                finally:
                    schedule.FIXED_OVERHEAD_KEYS = keys
                doc["rows"].append(row)
                save(doc, path)
                med = "-" if row.get("median_us") is None else f"{row['median_us']:.1f} us"
                ratio = f"{row['vs_uniform']:.3f}x" if "vs_uniform" in row else "-"
                err = f"{row['max_abs_err']:.2e}" if "max_abs_err" in row else "-"
                print(
                    f"{name:24s} H={H:<4d} {variant:17s} err {err} (<= {MAX_ABS_ERR[dtype_name]:.0e})  {med:>12s}"
                    f"  vs uniform {ratio}  {row['status']}",
                    flush=True,
                )
    save(doc, path)
    print(f"saved {path}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
