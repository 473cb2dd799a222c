"""The sm_90 compile report of every listed model's defaults (no GPU): what docs/kernels.md quotes.

For DeepSeek-V3 at TP 1/2/4/8, Kimi K2 and DeepSeek-V2-Lite, bf16 and fp8 caches, each decode
default as the launcher launches it (tune/compile.py, `default_cases`: its schedule, split count
and output dtype, for the uniform schedule both outputs, the merges, and an fp8 cache's scale as a
float), DeepSeek-V3.2's sparse decode at TP 1 and 8, plus prefill's and merge's defaults for
DeepSeek-V3. Saved as compile-sm90-defaults.json, with `-triton36` in the name under Triton 3.6
(ptxas 12.8), so both toolchains' figures sit side by side.

Each key loop also gets `estimate`: a cycle estimate of one trip of the compiled loop on an H200
(`loop_estimate`), and the TFLOP/s and TB/s it implies. It is arithmetic on the compiled code's
counts, not a measurement; docs/kernels.md ("Cycle estimates") states its assumptions.

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

# ---- the cycle estimate of one trip of a compiled key loop (H200; leads, not measurements) ----
CLOCK = 1.98e9  # boost clock, Hz
SMS = 132
WGMMA_MACS = 989e12 / 2 / SMS / CLOCK  # dense bf16 multiply-adds per SM per cycle: 1,892
MMA_SYNC_SHARE = 0.5  # assumed: mma.sync reaches half of wgmma's rate on Hopper
SMEM_BYTES = 128  # shared-memory bytes per SM per cycle
HBM_BYTES = 4.8e12 / SMS / CLOCK  # one SM's share of HBM bandwidth: 18.4 B per cycle
BARRIER_CYCLES = 30  # assumed cost of one bar.sync once the warps arrive together
DRAIN_CYCLES = 60  # assumed: a wgmma.wait_group 0 exposes the last wgmma's latency
COPY_LATENCY = 1500  # assumed loaded HBM latency of a tile's copy, cycles (0.76 us)


def loop_estimate(r: dict, row_bytes: int, tiles_sharing: int) -> dict:
    """Cycles of one trip of the key loop of compile result `r` on one SM (one CTA per SM: every
    default takes more than half of the registers or shared memory), from its compiled counts:

    * tensor: the MACs issued per trip (issued_mma_over_needed includes any duplicated work) at
      WGMMA_MACS, or MMA_SYNC_SHARE of it for mma.sync;
    * shared memory: the wgmma operands read from it (A and B of every instruction of each
      warpgroup), every thread's ld/st.shared, ldmatrix and cp.async bytes (loop_shared_bytes,
      from the PTX), and a TMA-copied KV tile, at SMEM_BYTES;
    * barriers and drains: bar.sync and wgmma.wait_group in the loop, at BARRIER_CYCLES and
      DRAIN_CYCLES;
    * the KV tile from HBM: BLOCK_N rows of `row_bytes`, shared by `tiles_sharing` programs that
      run together (the row tiles of a request, a token's head tiles), at HBM_BYTES.

    compute = max(tensor, shared memory) + barriers + drains. With two tiles in flight the copy
    overlaps it (trip = max(compute, HBM)); with one, trip = compute + max(COPY_LATENCY, HBM)."""
    warps = r["num_warps"]
    keys = r["config"]["BLOCK_N"]
    wgmma = sum(n for k, n in r["loop_mma_shapes"].items() if k.startswith("wgmma"))
    smem = 0.0
    for key, n in r["loop_mma_shapes"].items():
        kind, shape = key.split()
        m, rest = shape[1:].split("n")
        nn, kk = (int(x) for x in rest.split("k"))
        if kind == "wgmma":
            smem += n * (warps // 4) * (int(m) * kk + nn * kk) * 2
    ops = r["loop_ops"]
    smem += sum(r["loop_shared_bytes_per_thread"].values()) * 32 * warps
    smem += keys * row_bytes if ops["tma_copy"] else 0
    rate = WGMMA_MACS if wgmma else WGMMA_MACS * MMA_SYNC_SHARE
    tensor = r["mma_macs_issued_per_loop"] / rate
    compute = max(tensor, smem / SMEM_BYTES) + ops["bar_sync"] * BARRIER_CYCLES + ops["wgmma_wait"] * DRAIN_CYCLES
    hbm_bytes = keys * row_bytes / tiles_sharing
    hbm = hbm_bytes / HBM_BYTES
    trip = max(compute, hbm) if r["tiles_in_flight"] >= 2 else compute + max(COPY_LATENCY, hbm)
    flops = 2 * r["mma_macs_needed_per_loop"]
    return {
        "tensor_cycles": round(tensor),
        "smem_cycles": round(smem / SMEM_BYTES),
        "barrier_drain_cycles": ops["bar_sync"] * BARRIER_CYCLES + ops["wgmma_wait"] * DRAIN_CYCLES,
        "hbm_cycles": round(hbm),
        "trip_cycles": round(trip),
        "tflops": round(flops / trip * CLOCK * SMS / 1e12),
        "tb_per_s": round(hbm_bytes / trip * CLOCK * SMS / 1e12, 2),
    }


def _row_bytes(r: dict) -> int:
    if r["kv_dtype"] != "fp8":
        return 2 * 576  # r + dR = 512 + 64 in every listed model
    return 656 if r["kernel"] == "mla_sparse_decode" else 576  # FlashMLA's sparse fp8 row; e4m3 x 576


def _sharing(r: dict) -> int:
    """Programs that read the same KV tile at the same time: a request's row tiles (decode), a
    token's head tiles (sparse decode, adjacent in its grid)."""
    rows = r["shape"]["H"] * r["shape"].get("S_q", 1)
    return max(1, -(-rows // r["config"]["BLOCK_H"]))


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
    for tp in (1, 8):
        for kv in ("bf16", "fp8"):
            for case in stage.default_cases(model.from_name("deepseek-v3.2").with_tp(tp), ("mla_sparse_decode",),
                                            "sm_90", "bf16", kv):  # fmt: skip
                case.label = f"deepseek-v3.2 tp{tp}"
                cases.append(case)
    for case in stage.default_cases(model.from_name("deepseek-v3"), ("mla_prefill", "merge_attn_states"), "sm_90"):
        case.label = "deepseek-v3 tp1"
        cases.append(case)
    rows = stage.compile_cases(cases)
    for r in rows:
        r["dropped"] = stage.verdict(r)
        if r["kernel"] in ("mla_decode", "mla_sparse_decode") and r.get("stage") == "stage1" and not r["error"]:
            r["estimate"] = loop_estimate(r, _row_bytes(r), _sharing(r))
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
            f"regs {r['registers']} spill {r['spill_bytes']} mma x {'-' if ratio is None else f'{ratio:.2f}'} "
            f"kv buffers {r.get('kv_buffers')} in flight {r.get('tiles_in_flight')} {r.get('estimate', '')}"
        )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
