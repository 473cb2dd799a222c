"""Compile-only experiment (no GPU): does Triton 3.9's warp specialisation on sm_90 issue each
score wgmma once per KV tile, and what do TMA tensor-descriptor loads do to the spills?

A stripped decode tile loop ([64, 512 + 64] queries, 64 keys per tile, 8 warps, 2 stages), built
four ways: pointer loads or host tensor descriptors, each with tl.range(warp_specialize=False
/ True). Prints ptxas figures and the wgmma per loop. Findings: docs/kernels.md.

Usage: TRITON_DEFAULT_FP_FUSION=1 python benchmarks/experiments/ws_score_once.py
"""

# ruff: noqa
import re, sys, triton, triton.language as tl, json
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mlactl.tune.compile import parse_ptxas_log, loop_counts


@triton.jit
def k(
    q, kv, o, n_keys, R: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr
):
    o_h = tl.arange(0, BLOCK_H)
    o_r = tl.arange(0, R)
    o_dr = tl.arange(0, DR)
    o_t = tl.arange(0, BLOCK_N)
    b_q = tl.load(q + o_h[:, None] * (R + DR) + o_r[None, :])
    b_qpe = tl.load(q + o_h[:, None] * (R + DR) + R + o_dr[None, :])
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R], tl.float32)
    for n0 in tl.range(0, n_keys, BLOCK_N, warp_specialize=WS):
        p = kv + (n0 + o_t)[:, None] * (R + DR)
        b_kv = tl.load(p + o_r[None, :])
        b_kpe = tl.load(p + R + o_dr[None, :])
        s = tl.dot(b_qpe, tl.trans(b_kpe))
        s = tl.dot(b_q, tl.trans(b_kv), s)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        pr = tl.exp2(s - m_new[:, None])
        al = tl.exp2(m_i - m_new)
        l_i = l_i * al + tl.sum(pr, 1)
        acc = acc * al[:, None]
        acc = tl.dot(pr.to(b_kv.dtype), b_kv, acc)
        m_i = m_new
    tl.store(o + o_h[:, None] * R + o_r[None, :], acc / l_i[:, None])


@triton.jit
def k_desc(
    q,
    kv_desc,
    kpe_desc,
    o,
    n_keys,
    R: tl.constexpr,
    DR: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WS: tl.constexpr,
):
    o_h = tl.arange(0, BLOCK_H)
    o_r = tl.arange(0, R)
    o_dr = tl.arange(0, DR)
    b_q = tl.load(q + o_h[:, None] * (R + DR) + o_r[None, :])
    b_qpe = tl.load(q + o_h[:, None] * (R + DR) + R + o_dr[None, :])
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R], tl.float32)
    for n0 in tl.range(0, n_keys, BLOCK_N, warp_specialize=WS):
        b_kv = kv_desc.load([n0, 0])
        b_kpe = kpe_desc.load([n0, R])
        s = tl.dot(b_qpe, tl.trans(b_kpe))
        s = tl.dot(b_q, tl.trans(b_kv), s)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        pr = tl.exp2(s - m_new[:, None])
        al = tl.exp2(m_i - m_new)
        l_i = l_i * al + tl.sum(pr, 1)
        acc = acc * al[:, None]
        acc = tl.dot(pr.to(b_kv.dtype), b_kv, acc)
        m_i = m_new
    tl.store(o + o_h[:, None] * R + o_r[None, :], acc / l_i[:, None])


import subprocess, tempfile, os
from triton.backends.nvidia.compiler import get_ptxas


def build(fn, sig, const, warps, stages):
    try:
        c = triton.compile(
            ASTSource(fn, sig, const, {}),
            target=GPUTarget("cuda", 90, 32),
            options=dict(num_warps=warps, num_stages=stages),
        )
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]}
    ptx = c.asm["ptx"]
    d = tempfile.mkdtemp()
    open(d + "/k.ptx", "w").write(ptx)
    r = subprocess.run(
        [get_ptxas(90).path, "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", d + "/k.ptx", "-o", d + "/k.o"],
        capture_output=True,
        text=True,
    )
    out = parse_ptxas_log(r.stderr)
    out.update(loop_counts(ptx, {"wgmma": "wgmma.mma_async", "tma": "cp.async.bulk.tensor"}))
    out["wgmma_total"] = ptx.count("wgmma.mma_async")
    out["shapes"] = sorted(set(re.findall(r"m64n\d+k16", ptx)))
    out["setmaxnreg"] = ptx.count("setmaxnreg")
    out["smem"] = c.metadata.shared
    out["ws_partitions"] = c.asm["ttgir"].count("ttg.warp_specialize")
    return out


const = dict(R=512, DR=64, BLOCK_H=64, BLOCK_N=64)
sig = dict(q="*bf16", kv="*bf16", o="*fp32", n_keys="i32", **{k: "constexpr" for k in const}, WS="constexpr")
from triton.tools.tensor_descriptor import TensorDescriptor

for ws in (False, True):
    print("ptr WS", ws, json.dumps(build(k, sig, dict(const, WS=ws), 8, 2)), flush=True)
sigd = dict(
    q="*bf16",
    kv_desc="tensordesc<bf16[64, 512]>",
    kpe_desc="tensordesc<bf16[64, 64]>",
    o="*fp32",
    n_keys="i32",
    **{k: "constexpr" for k in const},
    WS="constexpr",
)
for ws in (False, True):
    print("desc WS", ws, json.dumps(build(k_desc, sigd, dict(const, WS=ws), 8, 2)), flush=True)
