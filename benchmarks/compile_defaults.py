"""The sm_90 compile report of every listed model's defaults (no GPU): what docs/kernels.md quotes.

For DeepSeek-V3 at TP 1/2/4/8, Kimi K2 and DeepSeek-V2-Lite, bf16 and fp8 caches, each decode
default as the launcher launches it (tune/compile.py, `default_cases`: its schedule, split count
and output dtype, and for the uniform schedule both outputs), plus prefill's and merge's defaults
for DeepSeek-V3. Saved as compile-sm90-defaults.json, with `-triton36` in the name under Triton
3.6 (ptxas 12.8), so both toolchains' figures sit side by side.

Usage: python benchmarks/compile_defaults.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os

from mlactl.model import config as model
from mlactl.tune import compile as stage
from mlactl.util.io import atomic_write

LISTED = [("deepseek-v3", 1), ("deepseek-v3", 2), ("deepseek-v3", 4), ("deepseek-v3", 8), ("kimi-k2", 1)]
LISTED += [("deepseek-v2-lite", 1)]


def main() -> None:
    import triton

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    cases = []
    for name, tp in LISTED:
        cfg = model.from_name(name).with_tp(tp)
        for kv in ("bf16", "fp8"):
            for case in stage.default_cases(cfg, ("mla_decode",), "sm_90", "bf16", kv):
                case.label = f"{name} tp{tp}"
                cases.append(case)
    for case in stage.default_cases(model.from_name("deepseek-v3"), ("mla_prefill", "merge_attn_states"), "sm_90"):
        case.label = "deepseek-v3 tp1"
        cases.append(case)
    rows = stage.compile_cases(cases)
    for r in rows:
        r["dropped"] = stage.verdict(r)
    suffix = "" if triton.__version__.startswith("3.9") else f"-triton{triton.__version__[:3].replace('.', '')}"
    path = os.path.join(args.out, f"compile-sm90-defaults{suffix}.json")
    doc = {
        "what": "mlactl tune compile for the listed defaults as launched, sm_90, no GPU",
        "triton": triton.__version__,
        "ptxas": sorted({f"{r.get('ptxas')} {r.get('ptxas_version')}" for r in rows}),
        "rows": rows,
    }
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    print(f"{'model':>20} {'kernel':>17} {'B':>5} {'H':>4} {'kv':>5} {'sched':>9} {'out':>8} {'config':>40}")
    for r in rows:
        c = " ".join(f"{k}={v}" for k, v in r["config"].items())
        out = f"{r.get('out_dtype')} x{r.get('num_splits')}" if r.get("num_splits") else r.get("out_dtype")
        ratio = r.get("issued_mma_over_needed")
        print(
            f"{r['label']:>20} {r['kernel']:>17} {r['shape'].get('B', '-'):>5} {r['shape']['H']:>4} "
            f"{r['kv_dtype']:>5} {r.get('variant') or '-':>9} {out:>8} {c:>40} smem {r['smem_bytes'] / 1024:.1f} "
            f"regs {r['registers']} spill {r['spill_bytes']} mma x {'-' if ratio is None else f'{ratio:.2f}'}"
        )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
