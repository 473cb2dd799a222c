"""Compile-only experiment (no GPU): how the 64-row decode loop gets each score multiply-add issued
once per program in plain Triton (docs/kernels.md, "Split score"). A stripped loop ([64, 512 + 64]
queries, TMA descriptor loads, 8 warps), built for sm_90 in modes:

    0   the chained score dots, p straight into the value dot (the old default)
    3   p and alpha through a per-program scratch slot and tl.debug_barrier; dots still chained
    4   as 3, the two score dots in the other order
    5   as 3, the score dots added (the compiler folds the add into a chained dot)
    7   as 3, the score dots scaled then added: no score value reaches a dot
    8   as 7, the other order
    9   as 7 without the barrier (racy: only to see that the barrier is what stops pipelining)
    10  as 7, volatile scratch loads;  11  as 7, .cg scratch loads
    12  as 7, the barrier as inline asm returning 0 added to the scratch addresses (what ships)

Prints per mode: ptxas figures, issued / needed (mlactl.tune.compile), wgmma shapes, shared
memory, and the KV buffers the pipeliner allocated ("kvbuf": 3x... = pipelined, 1 = not).

Usage: TRITON_DEFAULT_FP_FUSION=1 python benchmarks/experiments/split_score_once.py
"""

# ruff: noqa
import re, sys, json, subprocess, tempfile
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.backends.nvidia.compiler import get_ptxas
from mlactl.tune.compile import parse_ptxas_log, loop_mma_macs, issued_over_needed


@triton.jit
def k_desc(
    q,
    kv_desc,
    kpe_desc,
    o,
    scr,
    n_keys,
    R: tl.constexpr,
    DR: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MODE: tl.constexpr,
):
    pid = tl.program_id(0)
    o_h = tl.arange(0, BLOCK_H)
    o_r = tl.arange(0, R)
    o_dr = tl.arange(0, DR)
    o_t = tl.arange(0, BLOCK_N)
    b_q = tl.load(q + o_h[:, None] * (R + DR) + o_r[None, :])
    b_qpe = tl.load(q + o_h[:, None] * (R + DR) + R + o_dr[None, :])
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R], tl.float32)
    p_scr = scr + pid * 2 * BLOCK_H * BLOCK_N + o_h[:, None] * BLOCK_N + o_t[None, :]
    i = 0
    for n0 in range(0, n_keys, BLOCK_N):
        b_kv = kv_desc.load([n0, 0])
        b_kpe = kpe_desc.load([n0, R])
        if MODE >= 9:
            s = tl.dot(b_q, tl.trans(b_kv)) * 0.125 + tl.dot(b_qpe, tl.trans(b_kpe)) * 0.125
        elif MODE == 7:
            s = tl.dot(b_q, tl.trans(b_kv)) * 0.125 + tl.dot(b_qpe, tl.trans(b_kpe)) * 0.125
        elif MODE == 8:
            s = tl.dot(b_qpe, tl.trans(b_kpe)) * 0.125 + tl.dot(b_q, tl.trans(b_kv)) * 0.125
        elif MODE == 5:
            s = tl.dot(b_q, tl.trans(b_kv)) + tl.dot(b_qpe, tl.trans(b_kpe))
        elif MODE == 4:
            s = tl.dot(b_q, tl.trans(b_kv))
            s = tl.dot(b_qpe, tl.trans(b_kpe), s)
        else:
            s = tl.dot(b_qpe, tl.trans(b_kpe))
            s = tl.dot(b_q, tl.trans(b_kv), s)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        pr = tl.exp2(s - m_new[:, None])
        al = tl.exp2(m_i - m_new)
        l_i = l_i * al + tl.sum(pr, 1)
        if MODE >= 3:
            slot = p_scr + (i % 2) * BLOCK_H * BLOCK_N
            p_al = scr + 4096 * 1024 + pid * 2 * BLOCK_H + (i % 2) * BLOCK_H + o_h
            tl.store(slot, pr.to(b_kv.dtype))
            tl.store(p_al, al.to(tl.bfloat16))
            if MODE == 12:
                zero = tl.inline_asm_elementwise(
                    "bar.sync 0;\n\tmov.u32 $0, 0;", "=r,r", [n0], dtype=tl.int32, is_pure=False, pack=1
                )
                slot = slot + zero
                p_al = p_al + zero
            elif MODE != 9:
                tl.debug_barrier()
            if MODE == 10:
                pb = tl.load(slot, volatile=True)
                al2 = tl.load(p_al, volatile=True).to(tl.float32)
            elif MODE == 11:
                pb = tl.load(slot, cache_modifier=".cg")
                al2 = tl.load(p_al, cache_modifier=".cg").to(tl.float32)
            else:
                pb = tl.load(slot)
                al2 = tl.load(p_al).to(tl.float32)
            acc = acc * al2[:, None]
            acc = tl.dot(pb, b_kv, acc)
        elif MODE == 0:
            acc = acc * al[:, None]
            acc = tl.dot(pr.to(b_kv.dtype), b_kv, acc)
        else:
            acc = acc * al[:, None]
            slot = p_scr + (i % 2) * BLOCK_H * BLOCK_N
            tl.store(slot, pr.to(b_kv.dtype))
            tl.debug_barrier()
            if MODE == 1:
                pb = tl.load(slot)
            else:
                pb = tl.load(slot, volatile=True)
            acc = tl.dot(pb, b_kv, acc)
        m_i = m_new
        i += 1
    tl.store(o + o_h[:, None] * R + o_r[None, :], acc / l_i[:, None])


def build(fn, sig, const, warps, stages):
    c = triton.compile(
        ASTSource(fn, sig, const, {}),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=warps, num_stages=stages),
    )
    ptx = c.asm["ptx"]
    d = tempfile.mkdtemp()
    open(d + "/k.ptx", "w").write(ptx)
    r = subprocess.run(
        [get_ptxas(90).path, "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", d + "/k.ptx", "-o", d + "/k.o"],
        capture_output=True,
        text=True,
    )
    out = parse_ptxas_log(r.stderr)
    macs = loop_mma_macs(ptx)
    need = const["BLOCK_H"] * const["BLOCK_N"] * (2 * const["R"] + const["DR"])
    out["ratio"] = issued_over_needed(macs, warps, need)
    out["shapes"] = sorted(set(re.findall(r"m64n\d+k16", ptx)))
    out["smem"] = c.metadata.shared
    ttgir = c.asm["ttgir"]
    out["async_copies"] = ttgir.count("async_copy_global_to_local")
    out["bar"] = ptx.count("bar.sync")
    out["kvbuf"] = [
        l.split("memdesc<")[1].split(",")[0] for l in ttgir.splitlines() if "local_alloc : ()" in l and "bf16" in l
    ]
    return out


for bn in (32, 64):
    const = dict(R=512, DR=64, BLOCK_H=64, BLOCK_N=bn)
    sigd = dict(
        q="*bf16",
        kv_desc=f"tensordesc<bf16[{bn}, 512]>",
        kpe_desc=f"tensordesc<bf16[{bn}, 64]>",
        o="*fp32",
        scr="*bf16",
        n_keys="i32",
        **{k: "constexpr" for k in const},
        MODE="constexpr",
    )
    for mode in (0, 3, 4, 5, 7, 8, 9, 10, 11, 12):
        for st in (3,):
            try:
                print(bn, mode, st, json.dumps(build(k_desc, sigd, dict(const, MODE=mode), 8, st)), flush=True)
            except Exception as e:
                print(bn, mode, st, "ERR", str(e)[:300])
