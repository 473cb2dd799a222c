"""Absorb-path attention: the torch twin against a hand loop, the Triton kernel against the twin
(CPU interpreter: small shapes, fp16/fp32/fp8 cache), bad inputs, launch-config choice, and
DeepSeek-V3 shapes on a GPU (bf16, fp8)."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from triton.runtime.errors import OutOfResources

from mlactl.kernels import decode
from mlactl.kernels.decode import heuristic_config, mla_decode
from mlactl.kernels.decode_naive import mla_decode_naive

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
SCALE = 0.15

# out is compared elementwise; lse (fp32, from fp32-accumulated scores) much tighter
F32 = dict(atol=1e-5, rtol=1e-5, lse=1e-5)
F16 = dict(atol=2e-3, rtol=4e-3, lse=1e-4)
BF16 = dict(atol=1.2e-2, rtol=1.6e-2, lse=1e-3)


def paged_case(lens, H, S_q, r, dR, block_size, dtype, kv_dtype=None, seed=0, device=DEVICE):
    """Random q and a paged cache whose pages are scattered: each request's pages are a shuffled
    draw from the pool, unused table entries are -1 and a few pages belong to no request."""
    gen = torch.Generator().manual_seed(seed)
    B, D = len(lens), r + dR
    pages = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(pages) + 3
    order = torch.randperm(num_blocks, generator=gen)
    block_table = torch.full((B, max(pages) + 1), -1, dtype=torch.int32)
    taken = 0
    for b, n in enumerate(pages):
        block_table[b, :n] = order[taken : taken + n]
        taken += n
    q = torch.randn(B, S_q, H, D, generator=gen).to(dtype)
    kv = torch.randn(num_blocks, block_size, D, generator=gen)
    kv_scale = None
    if kv_dtype == FP8:  # store kv / kv_scale in fp8; the real cache is fp8 value * kv_scale
        kv_scale = 0.125
        kv = (kv / kv_scale).to(FP8)
    else:
        kv = kv.to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    to = dict(device=device)
    return q.to(**to), kv.to(**to), block_table.to(**to), seqlens.to(**to), kv_scale


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the launcher allocates (out, lse, split partials) starts as NaN, so an
    element the kernels forget to write fails the comparison."""

    def empty(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(decode, "_empty", empty)


def assert_close(got, want, tol):
    out, lse = got
    out_ref, lse_ref = want
    assert out.dtype == out_ref.dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), out_ref.float(), atol=tol["atol"], rtol=tol["rtol"])
    # -inf where a row has no key; assert_close treats equal infinities as equal
    torch.testing.assert_close(lse, lse_ref, atol=tol["lse"], rtol=tol["lse"])


# ---- the twin against a hand-written, non-paged computation -------------------------------------


def hand_attention(q, keys, causal, scale, r):
    """q: [S_q, H, D] list-of-lists math, keys: [n, D] contiguous; explicit loops, floats."""
    S_q, H = len(q), len(q[0])
    n = len(keys)
    out = [[[0.0] * r for _ in range(H)] for _ in range(S_q)]
    lse = [[-math.inf] * H for _ in range(S_q)]
    for s in range(S_q):
        seen = range(n - S_q + s + 1) if causal else range(n)
        for h in range(H):
            scores = [scale * sum(a * b for a, b in zip(q[s][h], keys[t])) for t in seen]
            if not scores:
                continue
            top = max(scores)
            total = sum(math.exp(x - top) for x in scores)
            lse[s][h] = top + math.log(total)
            for t, x in zip(seen, scores):
                w = math.exp(x - top) / total
                for i in range(r):
                    out[s][h][i] += w * keys[t][i]
    return out, lse


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("kv_scale", [None, 0.5], ids=["noscale", "kvscale0.5"])
def test_twin_matches_hand_loop(causal, kv_scale):
    # odd sizes on purpose: the twin has no power-of-two or tile constraints
    r, dR, block_size, S_q, H = 6, 2, 2, 2, 3
    lens = [5, 0, 2, 4]
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(lens), S_q, H, r + dR, generator=gen, dtype=torch.float64).float()
    contiguous = [torch.randn(n, r + dR, generator=gen).float() for n in lens]  # per request
    # page the contiguous caches into a shuffled pool
    num_blocks = sum(math.ceil(n / block_size) for n in lens) + 1
    pool = torch.zeros(num_blocks, block_size, r + dR)
    table = torch.full((len(lens), 3), -1, dtype=torch.int32)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    for b, keys in enumerate(contiguous):
        for j in range(math.ceil(len(keys) / block_size)):
            page = free.pop()
            chunk = keys[j * block_size : (j + 1) * block_size]
            pool[page, : len(chunk)] = chunk
            table[b, j] = page
    out, lse = mla_decode_naive(
        q, pool, table, torch.tensor(lens, dtype=torch.int32), SCALE, causal=causal, kv_scale=kv_scale, r=r
    )
    assert out.shape == (len(lens), S_q, H, r) and lse.shape == (len(lens), S_q, H)
    factor = 1.0 if kv_scale is None else kv_scale
    for b, keys in enumerate(contiguous):
        want_out, want_lse = hand_attention(q[b].tolist(), (keys * factor).tolist(), causal, SCALE, r)
        torch.testing.assert_close(out[b], torch.tensor(want_out), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[b], torch.tensor(want_lse), atol=1e-5, rtol=1e-5)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)  # the empty request


def test_twin_defaults_r_for_deepseek_rows_only():
    q = torch.zeros(1, 1, 1, 48)
    with pytest.raises(ValueError, match="r .latent rank. cannot be inferred"):
        mla_decode_naive(
            q, torch.zeros(1, 16, 48), torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), SCALE
        )
    out, _ = mla_decode_naive(
        torch.zeros(1, 1, 1, 576),
        torch.zeros(1, 16, 576),
        torch.zeros(1, 1, dtype=torch.int32),
        torch.ones(1, dtype=torch.int32),
        SCALE,
    )
    assert out.shape[-1] == 512


# ---- the kernel against the twin (CPU interpreter) ---------------------------------------------

# (lens, H, S_q, r, dR, block_size, dtype, kv_dtype, causal, num_splits, config, tol)
KERNEL_CASES = [
    pytest.param(
        (1, 17, 300),
        4,
        1,
        32,
        16,
        16,
        torch.float16,
        None,
        True,
        1,
        None,
        F16,
        id="B3-H4-Sq1-r32-bs16-len1,17,300-fp16-split1",
    ),
    pytest.param(
        (1, 17, 300),
        4,
        1,
        32,
        16,
        16,
        torch.float16,
        None,
        True,
        4,
        None,
        F16,
        id="B3-H4-Sq1-r32-bs16-len1,17,300-fp16-split4-empty-splits",
    ),
    pytest.param(
        (1, 31, 33, 100),
        2,
        1,
        64,
        16,
        32,
        torch.float32,
        None,
        True,
        3,
        None,
        F32,
        id="B4-H2-Sq1-r64-bs32-len1,31,33,100-fp32-split3",
    ),
    pytest.param(
        (64, 65),
        16,
        1,
        32,
        16,
        64,
        torch.float16,
        None,
        True,
        2,
        None,
        F16,
        id="B2-H16-Sq1-r32-bs64-len64,65-fp16-split2",
    ),
    pytest.param(
        (17, 40), 1, 1, 32, 16, 16, torch.float32, None, True, 1, None, F32, id="B2-H1-Sq1-r32-bs16-len17,40-fp32"
    ),
    pytest.param(
        (3, 100),
        5,
        3,
        32,
        16,
        16,
        torch.float16,
        None,
        True,
        2,
        None,
        F16,
        id="B2-H5-Sq3-r32-bs16-len3,100-fp16-causal-split2",
    ),
    pytest.param(
        (4, 70),
        3,
        4,
        32,
        16,
        32,
        torch.float32,
        None,
        False,
        3,
        None,
        F32,
        id="B2-H3-Sq4-r32-bs32-len4,70-fp32-noncausal-split3",
    ),
    pytest.param(
        (20, 90),
        24,
        3,
        32,
        16,
        16,
        torch.float16,
        None,
        True,
        1,
        None,
        F16,
        id="B2-H24-Sq3-r32-bs16-len20,90-fp16-causal-rows72-of-BLOCK_H64",
    ),
    pytest.param(
        (10, 130),
        2,
        2,
        32,
        16,
        64,
        torch.float32,
        None,
        True,
        2,
        {"BLOCK_N": 16},
        F32,
        id="B2-H2-Sq2-r32-bs64-BLOCK_N16-len10,130-fp32",
    ),
    pytest.param(
        (5, 200),
        4,
        1,
        32,
        16,
        16,
        torch.float16,
        None,
        True,
        2,
        {"BLOCK_N": 64},
        F16,
        id="B2-H4-Sq1-r32-bs16-BLOCK_N64-len5,200-fp16",
    ),
    pytest.param(
        (0, 1, 50),
        4,
        1,
        32,
        16,
        16,
        torch.float16,
        None,
        True,
        2,
        None,
        F16,
        id="B3-H4-Sq1-r32-bs16-len0,1,50-fp16-empty-request",
    ),
    pytest.param(
        (0, 9),
        2,
        2,
        32,
        16,
        16,
        torch.float32,
        None,
        False,
        1,
        None,
        F32,
        id="B2-H2-Sq2-r32-bs16-len0,9-fp32-noncausal-empty-request-split1",
    ),
    pytest.param(
        (300, 1000),
        4,
        1,
        32,
        16,
        32,
        torch.float16,
        None,
        True,
        None,
        None,
        F16,
        id="B2-H4-Sq1-r32-bs32-len300,1000-fp16-default-config",
    ),
    pytest.param(
        (7, 45),
        2,
        2,
        16,
        32,
        16,
        torch.float32,
        None,
        True,
        2,
        {"BLOCK_H": 32},
        F32,
        id="B2-H2-Sq2-r16-dR32-bs16-len7,45-fp32-BLOCK_H32",
    ),
    pytest.param(
        (2, 17, 300),
        4,
        2,
        32,
        16,
        16,
        torch.bfloat16,
        None,
        True,
        3,
        None,
        BF16,
        id="B3-H4-Sq2-r32-bs16-len2,17,300-bf16-split3",
    ),
    pytest.param(
        (1, 17, 300),
        4,
        1,
        32,
        16,
        16,
        torch.float16,
        FP8,
        True,
        3,
        None,
        F16,
        id="B3-H4-Sq1-r32-bs16-len1,17,300-fp8cache-qfp16-split3",
    ),
    pytest.param(
        (2, 64, 97),
        3,
        2,
        32,
        16,
        32,
        torch.float32,
        FP8,
        True,
        1,
        None,
        F32,
        id="B3-H3-Sq2-r32-bs32-len2,64,97-fp8cache-qfp32-split1",
    ),
]


@pytest.mark.parametrize(
    "lens, H, S_q, r, dR, block_size, dtype, kv_dtype, causal, num_splits, config, tol", KERNEL_CASES
)
def test_kernel_matches_twin(
    poisoned, lens, H, S_q, r, dR, block_size, dtype, kv_dtype, causal, num_splits, config, tol
):
    q, kv, table, seqlens, kv_scale = paged_case(lens, H, S_q, r, dR, block_size, dtype, kv_dtype)
    got = mla_decode(
        q, kv, table, seqlens, SCALE, causal=causal, kv_scale=kv_scale, r=r, num_splits=num_splits, config=config
    )
    want = mla_decode_naive(q, kv, table, seqlens, SCALE, causal=causal, kv_scale=kv_scale, r=r)
    assert got[0].shape == (len(lens), S_q, H, r) and got[1].shape == (len(lens), S_q, H)
    assert_close(got, want, tol)
    empty = [b for b, n in enumerate(lens) if n == 0]
    assert torch.all(got[0][empty] == 0) and torch.all(got[1][empty] == -math.inf)


SPLIT_SCORE_CASES = [  # (lens, H, S_q, block_size, dtype, kv_dtype, schedule, num_splits, BLOCK_N, tol)
    pytest.param((1, 17, 300), 4, 1, 16, torch.float32, None, "uniform", 3, 16, F32, id="B3-H4-fp32-uniform-split3"),
    pytest.param((5, 200), 4, 1, 16, torch.float16, None, "uniform", 1, 64, F16, id="B2-H4-fp16-uniform-1split-N64"),
    pytest.param((0, 300, 50, 17), 3, 1, 16, torch.float16, None, "balanced", None, 16, F16, id="B4-H3-fp16-balanced"),
    pytest.param((700, 5, 64), 4, 2, 24, torch.float16, FP8, "balanced", None, 32, F16, id="B3-H4-Sq2-fp8-balanced"),
    pytest.param((9, 70), 5, 3, 16, torch.bfloat16, None, "uniform", 2, 16, BF16, id="B2-H5-Sq3-bf16-noncausal"),
]


@pytest.mark.parametrize("lens, H, S_q, block_size, dtype, kv_dtype, sched, splits, block_n, tol", SPLIT_SCORE_CASES)
def test_split_score_matches_twin(poisoned, lens, H, S_q, block_size, dtype, kv_dtype, sched, splits, block_n, tol):
    """SPLIT_SCORE (the score tile split across warpgroups, p and alpha through the NaN-poisoned
    scratch slots): the same output as the twin, on both schedules and every tile path."""
    causal = S_q != 3  # the S_q = 3 case runs non-causal
    q, kv, table, seqlens, kv_scale = paged_case(lens, H, S_q, 32, 16, block_size, dtype, kv_dtype)
    config = {"BLOCK_N": block_n, "SPLIT_SCORE": 1}
    got = mla_decode(
        q, kv, table, seqlens, SCALE, r=32, kv_scale=kv_scale, causal=causal, config=config,
        num_splits=splits, schedule=sched,
    )  # fmt: skip
    assert_close(got, mla_decode_naive(q, kv, table, seqlens, SCALE, r=32, kv_scale=kv_scale, causal=causal), tol)


def test_kernel_kv_scale_tensor_4d_cache_strided_q_and_out(poisoned):
    """kv_scale as a device tensor (no sync), FlashMLA's [blocks, page, 1, D] cache, a q that is
    a slice of a wider buffer, and an out= buffer poisoned by the caller."""
    lens, H, S_q, r, dR = (9, 70), 3, 2, 32, 16
    q, kv, table, seqlens, kv_scale = paged_case(lens, H, S_q, r, dR, 16, torch.float16, FP8)
    wide = torch.full((2, S_q, H, r + dR + 8), float("nan"), dtype=q.dtype, device=q.device)
    wide[..., : r + dR] = q
    q_strided = wide[..., : r + dR]
    assert not q_strided.is_contiguous()
    out = torch.full((2, S_q, H, r), float("nan"), dtype=q.dtype, device=q.device)
    scale_t = torch.tensor([kv_scale], device=q.device)
    got = mla_decode(q_strided, kv.unsqueeze(2), table, seqlens, SCALE, kv_scale=scale_t, r=r, num_splits=2, out=out)
    assert got[0] is out
    assert_close(got, mla_decode_naive(q, kv, table, seqlens, SCALE, kv_scale=kv_scale, r=r), F16)


def test_kernel_unvalidated_matches(poisoned):
    q, kv, table, seqlens, _ = paged_case((33, 5), 4, 1, 32, 16, 16, torch.float32)
    got = mla_decode(q, kv, table, seqlens, SCALE, r=32, validate=False)
    assert_close(got, mla_decode_naive(q, kv, table, seqlens, SCALE, r=32), F32)


# ---- launch-config choice ----------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch):
    """Record (grid, constants, cfg) of every stage-1 launch, then launch for real."""
    seen = []
    real = decode._launch_split

    def record(grid, args, constants, cfg, device):
        seen.append((grid, constants, dict(cfg)))
        return real(grid, args, constants, cfg, device)

    monkeypatch.setattr(decode, "_launch_split", record)
    return seen


def test_config_precedence(monkeypatch, launches):
    asked = []

    def lookup(kernel, device_name, dtype, **shape):
        asked.append((kernel, device_name, dtype, shape))
        return {"num_splits": 3, "BLOCK_N": 16}

    monkeypatch.setattr(decode.configs, "lookup", lookup)
    q, kv, table, seqlens, _ = paged_case((40, 100), 4, 1, 32, 16, 16, torch.float16)
    mla_decode(q, kv, table, seqlens, SCALE, r=32)
    device_name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    assert asked == [("mla_decode", device_name, "fp16", dict(B=2, H=4, S_q=1, ctx=100))]
    assert launches[-1][0][1] == 3 and launches[-1][2]["BLOCK_N"] == 16  # tuned config used
    mla_decode(q, kv, table, seqlens, SCALE, r=32, config={"num_splits": 2})
    assert len(asked) == 1 and launches[-1][0][1] == 2  # an explicit config skips the lookup
    mla_decode(q, kv, table, seqlens, SCALE, r=32, config={"num_splits": 2}, num_splits=5)
    assert launches[-1][0][1] == 5  # num_splits= wins over everything
    mla_decode(q, kv, table, seqlens, SCALE, r=32, config={"BLOCK_H": 64})
    assert launches[-1][2]["BLOCK_H"] == 16  # never taller than one request's rows need
    monkeypatch.setattr(decode.configs, "lookup", lambda *a, **k: {"BLOCK_N": 24})
    with pytest.warns(UserWarning, match="ignoring tuned config"):
        mla_decode(q, kv, table, seqlens, SCALE, r=32)
    assert launches[-1][2]["BLOCK_N"] == 64  # a bad tuned entry falls back to the heuristic


def test_heuristic_deepseek_shapes():
    bf16 = torch.bfloat16
    wide = heuristic_config(128, 128, 1, 512, 64, 8192, 64, bf16, bf16, 132)
    assert wide["BLOCK_H"] == 64 and wide["num_warps"] == 8 and wide["num_splits"] == 1
    # 32 keys, 3 stages (3 TMA buffers, two tiles in flight), split score: the config that compiles
    # for sm_90 without spilling at 64 rows under Triton 3.9 and 3.6, for both outputs (NO_SPILL;
    # tests/test_compile.py compiles it and reads its buffers from the compiled loop)
    assert (wide["BLOCK_N"], wide["num_stages"], wide["SPLIT_SCORE"]) == (32, 3, 1)
    # by hand: q 64 x 576 x 2 = 73,728 B + 3 KV buffers of 32 x 576 x 2 = 110,592 B + p 64 x 32 x 2
    # = 4,096 B + 2,048 B scratch = 190,464 B, under Hopper's 232,448 B
    assert decode.smem_bytes(64, 32, 3, 576, 2, 2, False, 512, True) == 190_464 <= decode.SMEM_BUDGET
    narrow = heuristic_config(128, 16, 1, 512, 64, 8192, 64, bf16, bf16, 132)
    assert narrow["BLOCK_H"] == 16 and narrow["num_warps"] == 8 and narrow["num_splits"] == 2
    assert narrow["SPLIT_SCORE"] == 0  # 16 rows x 64 keys issue each multiply-add once already
    mtp = heuristic_config(8, 16, 4, 512, 64, 8192, 64, bf16, FP8, 132)
    # 4 new tokens x 16 heads fill a 64-row tile, but an fp8 cache takes 32-row ones (FP8_BLOCK_H)
    assert mtp["BLOCK_H"] == 32 and mtp["num_splits"] > 1
    assert heuristic_config(8, 16, 4, 512, 64, 8192, 64, bf16, bf16, 132)["BLOCK_H"] == 64
    lone = heuristic_config(1, 128, 1, 512, 64, 8192, 64, bf16, bf16, 132)
    assert 2 <= lone["num_splits"] <= min(decode.MAX_SPLITS, 8192 // decode.MIN_SPLIT_TOKENS)
    short = heuristic_config(1, 16, 1, 512, 64, 100, 64, bf16, bf16, 132)
    assert short["num_splits"] == 1  # 100 keys: under one split's worth
    assert heuristic_config(1, 16, 1, 512, 64, 1000, 64, bf16, bf16, 132)["num_splits"] <= 16


def test_shared_memory_fallback(monkeypatch, poisoned):
    """A GPU that rejects a (BLOCK_N, num_stages) for shared memory gets the next smaller one."""
    real = decode._mla_decode_split_kernel
    tried = []

    class Picky:
        def __getitem__(self, grid):
            def launch(*args, BLOCK_N, num_stages, **kwargs):
                tried.append((BLOCK_N, num_stages))
                if BLOCK_N > 16:
                    raise OutOfResources(300_000, 232_448, "shared memory")
                return real[grid](*args, BLOCK_N=BLOCK_N, num_stages=num_stages, **kwargs)

            return launch

    monkeypatch.setattr(decode, "_mla_decode_split_kernel", Picky())
    monkeypatch.setattr(decode, "_FITTED", {})
    q, kv, table, seqlens, _ = paged_case((30, 50), 2, 1, 32, 16, 16, torch.float32)
    with pytest.warns(UserWarning, match="shared memory"):
        got = mla_decode(
            q, kv, table, seqlens, SCALE, r=32, config={"BLOCK_N": 64, "num_stages": 2}, schedule="uniform"
        )
    assert tried == [(64, 2), (32, 3), (16, 3)]
    assert_close(got, mla_decode_naive(q, kv, table, seqlens, SCALE, r=32), F32)
    tried.clear()
    mla_decode(q, kv, table, seqlens, SCALE, r=32, config={"BLOCK_N": 64, "num_stages": 2}, schedule="uniform")
    assert tried == [(16, 3)]  # remembered


# ---- the GPU path compiles for sm_90 and fits its shared memory (no GPU needed) ---------------

SM90_COMPILE = r"""
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mlactl.kernels import decode

def compile_split(dtype, kv, H, B, split_score):
    shape = dict(B=B, H=H, S_q=1, ctx=8192)
    fn, sig, const, aligned, options, launch = decode.compile_spec(
        shape, {"SPLIT_SCORE": split_score}, 512, 64, 64, dtype, kv, variant="uniform")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    qb, kb = {"bf16": 2, "fp16": 2}[dtype], 1 if kv == "fp8" else 2
    estimate = decode.smem_bytes(const["BLOCK_H"], const["BLOCK_N"], options["num_stages"], 576, qb, kb,
                                 kv == "fp8", 512, split_score)
    return dict(shared=k.metadata.shared, estimate=estimate, block_h=const["BLOCK_H"],
                wgmma="warp_group_dot" in k.asm["ttgir"], case=[dtype, kv, H, B, split_score], **launch)

merge = decode._mla_decode_merge_kernel  # the split count is a run-time argument (an i32)
sig = {n: "constexpr" if n in ("H", "R") else "i32" for n in merge.arg_names}
sig.update(o_part="*fp32", lse_part="*fp32", o="*bf16", lse="*fp32")
triton.compile(ASTSource(merge, sig, dict(H=128, R=512)), target=GPUTarget("cuda", 90, 32),
               options=dict(num_warps=4))
cases = [("bf16", "bf16", 128, 128, 1), ("bf16", "bf16", 128, 16, 1), ("bf16", "bf16", 128, 128, 0),
         ("bf16", "fp8", 128, 128, 0), ("fp16", "fp16", 16, 128, 0), ("bf16", "fp8", 16, 128, 0),
         ("bf16", "bf16", 32, 128, 1)]
print(json.dumps([compile_split(*case) for case in cases]))
"""


@pytest.mark.slow
def test_sm90_compile_fits_shared_memory():
    """Compile the default configs of DeepSeek-V3 shapes for sm_90 (Triton's own compiler and
    ptxas; no GPU): they must compile, fit Hopper's shared memory, and a 64-row tile must use
    wgmma. Runs in a subprocess because the interpreter, set for this session, patches tl."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for case in found:
        assert case["shared"] <= decode.SMEM_BUDGET, case
        assert case["shared"] <= case["estimate"], case  # the heuristic's estimate is not short
        assert case["wgmma"] == (case["block_h"] == 64), case
    # what the launcher writes: one split (B 128 at H 128) q's dtype, several (B 16) fp32 partials
    assert [(c["num_splits"] == 1, c["out_dtype"]) for c in found[:2]] == [(True, "bf16"), (False, "fp32")]


# ---- bad inputs: one ValueError each, naming the argument, before any launch -------------------


def _valid():
    q, kv, table, seqlens, _ = paged_case((5, 20), 2, 1, 32, 16, 16, torch.float16)
    return dict(q=q, kv_cache=kv, block_table=table, cache_seqlens=seqlens, scale=SCALE, r=32)


def _with(**changes):
    def make():
        args = _valid()
        for key, value in changes.items():
            args[key] = value(args) if callable(value) else value
        return args

    return make


BAD_INPUTS = [
    pytest.param(_with(q=lambda a: a["q"][0]), "q must have 4 dimensions", id="q-rank3"),
    pytest.param(_with(q=lambda a: a["q"].to(torch.int32)), "q has dtype int32", id="q-int"),
    pytest.param(
        _with(q=lambda a: a["q"].transpose(2, 3).contiguous().transpose(2, 3)),
        "q must be contiguous in its last",
        id="q-last-dim-strided",
    ),
    pytest.param(
        _with(kv_cache=lambda a: a["kv_cache"].float()), "kv_cache has dtype .*float32 but q", id="kv-dtype-mismatch"
    ),
    pytest.param(
        _with(kv_cache=lambda a: a["kv_cache"][..., :40]), r"kv_cache.shape\[2\] is 40", id="kv-row-width-mismatch"
    ),
    pytest.param(
        _with(kv_cache=lambda a: a["kv_cache"].unsqueeze(2).expand(-1, -1, 2, -1)),
        "kv_cache has 2 heads",
        id="kv-2-heads",
    ),
    pytest.param(_with(kv_cache=lambda a: a["kv_cache"][0]), "kv_cache must have 3 dimensions", id="kv-rank2"),
    pytest.param(_with(kv_cache=lambda a: a["kv_cache"][:, :0]), "kv_cache has block_size 0", id="kv-block-size-0"),
    pytest.param(_with(block_table=lambda a: a["block_table"].long()), "block_table has dtype int64", id="table-int64"),
    pytest.param(
        _with(block_table=lambda a: a["block_table"][:1]), r"block_table.shape\[0\] is 1", id="table-batch-mismatch"
    ),
    pytest.param(
        _with(block_table=lambda a: a["block_table"][:, :1]), "block_table has 1 columns", id="table-too-short"
    ),
    pytest.param(
        _with(
            block_table=lambda a: a["block_table"].clone().index_fill_(1, torch.tensor([0], device=a["q"].device), 99)
        ),
        "block_table has block ids outside",
        id="table-id-too-big",
    ),
    pytest.param(
        _with(
            block_table=lambda a: a["block_table"].clone().index_fill_(1, torch.tensor([1], device=a["q"].device), -1)
        ),
        "block_table has block ids outside",
        id="table-id-negative-in-use",
    ),
    pytest.param(
        _with(cache_seqlens=lambda a: a["cache_seqlens"].long()), "cache_seqlens has dtype int64", id="seqlens-int64"
    ),
    pytest.param(
        _with(cache_seqlens=lambda a: a["cache_seqlens"][:1]),
        r"cache_seqlens.shape\[0\] is 1",
        id="seqlens-batch-mismatch",
    ),
    pytest.param(
        _with(cache_seqlens=lambda a: torch.stack([a["cache_seqlens"]] * 2, 1)[:, 0]),
        "cache_seqlens must be contiguous",
        id="seqlens-strided",
    ),
    pytest.param(
        _with(cache_seqlens=lambda a: a["cache_seqlens"] - 6),
        r"cache_seqlens\[0\] = -1 is negative",
        id="seqlens-negative",
    ),
    pytest.param(
        _with(
            q=lambda a: a["q"].expand(-1, 3, -1, -1).contiguous(),
            cache_seqlens=lambda a: torch.full_like(a["cache_seqlens"], 2),
        ),
        r"cache_seqlens\[0\] = 2 is below S_q=3",
        id="seqlens-below-Sq-causal",
    ),
    pytest.param(_with(scale=0.0), "softmax scale must be a positive", id="scale-zero"),
    pytest.param(_with(scale=-0.1), "softmax scale must be a positive", id="scale-negative"),
    pytest.param(_with(scale=float("nan")), "softmax scale must be a positive", id="scale-nan"),
    pytest.param(_with(kv_cache=lambda a: a["kv_cache"].to(FP8)), "kv_scale is required", id="fp8-without-kv_scale"),
    pytest.param(_with(kv_scale=-1.0), "kv_scale must be a positive", id="kv_scale-negative"),
    pytest.param(
        _with(kv_scale=lambda a: torch.ones(2, device=a["q"].device)),
        "kv_scale must be a float or a 1-element",
        id="kv_scale-2-elements",
    ),
    pytest.param(_with(r=None), r"r \(latent rank\) cannot be inferred", id="r-not-inferable"),
    pytest.param(_with(r=24), "r=24 must be a power of two", id="r-not-pow2"),
    pytest.param(
        _with(q=lambda a: a["q"][..., :40], kv_cache=lambda a: a["kv_cache"][..., :40]),
        "dR=8 must be a power of two >= 16",
        id="dR-8",
    ),
    pytest.param(_with(num_splits=0), "num_splits.* must be a positive integer", id="num_splits-0"),
    pytest.param(_with(config={"BLOCK_M": 64}), "config has unknown keys", id="config-unknown-key"),
    pytest.param(_with(config={"BLOCK_H": 24}), r"config\['BLOCK_H'\] must be a power of two", id="config-BLOCK_H-24"),
    pytest.param(
        _with(config={"SPLIT_SCORE": 2}), r"config\['SPLIT_SCORE'\] must be 0 or 1", id="config-SPLIT_SCORE-2"
    ),
    pytest.param(
        _with(out=lambda a: torch.empty(2, 1, 2, 16, dtype=a["q"].dtype, device=a["q"].device)),
        "out must be",
        id="out-wrong-shape",
    ),
    pytest.param(
        _with(block_table=lambda a: a["block_table"].to("meta")), "inputs are on different devices", id="devices-mixed"
    ),
]


@pytest.mark.parametrize("make, message", BAD_INPUTS)
def test_bad_input_raises(monkeypatch, make, message):
    def no_launch(*args, **kwargs):
        raise AssertionError("launched despite bad input")

    monkeypatch.setattr(decode, "_launch_split", no_launch)
    args = make()
    with pytest.raises(ValueError, match=message):
        mla_decode(**args)


def test_cpu_tensors_refused_without_interpreter(monkeypatch):
    args = _valid()
    args = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="Triton kernels need CUDA tensors"):
        mla_decode(**args)


# ---- GPU: DeepSeek-V3 shapes (r=512, dR=64, page 64) --------------------------------------------

DSV3_SCALE = 1 / math.sqrt(128 + 64)
GPU_CASES = [  # (H, S_q, block_size, dtype, kv_dtype, num_splits, tol); lens 1|S_q, 777, 4096, 8192
    pytest.param(128, 1, 64, torch.bfloat16, None, None, BF16, id="H128-Sq1-bs64-bf16"),
    pytest.param(16, 1, 64, torch.bfloat16, None, None, BF16, id="H16-Sq1-bs64-bf16"),
    pytest.param(128, 1, 64, torch.bfloat16, FP8, None, BF16, id="H128-Sq1-bs64-fp8"),
    pytest.param(16, 1, 64, torch.bfloat16, FP8, None, BF16, id="H16-Sq1-bs64-fp8"),
    pytest.param(16, 4, 64, torch.bfloat16, None, None, BF16, id="H16-Sq4-MTP-bs64-bf16"),
    pytest.param(128, 2, 64, torch.bfloat16, FP8, 7, BF16, id="H128-Sq2-bs64-fp8-split7"),
    pytest.param(128, 1, 64, torch.float16, None, 64, F16, id="H128-Sq1-bs64-fp16-split64"),
    pytest.param(64, 1, 16, torch.bfloat16, None, None, BF16, id="H64-Sq1-bs16-bf16"),
    pytest.param(32, 3, 32, torch.bfloat16, None, 3, BF16, id="H32-Sq3-bs32-bf16-rows96"),
    pytest.param(8, 2, 64, torch.bfloat16, FP8, None, BF16, id="H8-Sq2-bs64-fp8"),
    pytest.param(2, 1, 64, torch.float16, None, 5, F16, id="H2-Sq1-bs64-fp16-split5"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("H, S_q, block_size, dtype, kv_dtype, num_splits, tol", GPU_CASES)
def test_gpu_deepseek_v3(poisoned, H, S_q, block_size, dtype, kv_dtype, num_splits, tol):
    lens = (S_q, 777, 4096, 8192)
    q, kv, table, seqlens, kv_scale = paged_case(lens, H, S_q, 512, 64, block_size, dtype, kv_dtype)
    got = mla_decode(q, kv, table, seqlens, DSV3_SCALE, kv_scale=kv_scale, num_splits=num_splits)
    torch.cuda.synchronize()
    want = mla_decode_naive(q, kv, table, seqlens, DSV3_SCALE, kv_scale=kv_scale)
    assert_close(got, want, tol)


@pytest.mark.gpu
def test_gpu_unvalidated_big_batch(poisoned):
    lens = tuple(range(1000, 1000 + 64 * 97, 97))  # B=64, no sync, splits sized by the table
    q, kv, table, seqlens, _ = paged_case(lens, 128, 1, 512, 64, 64, torch.bfloat16)
    got = mla_decode(q, kv, table, seqlens, DSV3_SCALE, validate=False)
    assert_close(got, mla_decode_naive(q, kv, table, seqlens, DSV3_SCALE), BF16)


# ---- Triton 3.6's interpreter with numpy >= 2.4 (kernels/_triton_compat.py) ---------------------


def test_interpreter_index_compat_patches_only_the_old_rule():
    """Triton 3.6 turns a loop bound into an int with int(array of shape [1]), which numpy 2.4
    refuses; 3.9 squeezes first. The fix applies only where the interpreter's own rule fails."""
    import numpy as np

    from mlactl.kernels import _triton_compat as compat

    def rule_36(tensor, scope):  # triton 3.6.0, triton/runtime/interpreter.py, _patch_lang_tensor
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    def rule_39(tensor, scope):  # triton 3.9.0, the same function
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    import warnings

    try:
        with warnings.catch_warnings():  # numpy 2.3 converts with a DeprecationWarning, 2.4 refuses
            warnings.simplefilter("error", DeprecationWarning)
            int(np.ones(1, dtype=np.int32))
        numpy_refuses = False
    except (TypeError, DeprecationWarning):
        numpy_refuses = True
    assert compat._needs_patch(rule_36) is numpy_refuses
    assert compat._needs_patch(rule_39) is False

    class Handle:
        data = np.array([7], dtype=np.int64)

    class Scalar:
        handle = Handle()

    assert compat._index_of(Scalar()) == 7
    Scalar.__index__ = compat._index_of
    assert list(range(Scalar(), 10)) == [7, 8, 9]


# ---- odd shapes against the twin and an fp64 reference (NaN-poisoned buffers) --------------------


def fp64_decode(q, kv, table, seqlens, scale, r, causal, kv_scale):
    """fp64, one request and new token at a time: the request's keys gathered page by page from
    the block table, then softmax(q k^T * scale) @ v. Written apart from the twin."""
    B, S_q, H, _ = q.shape
    page = kv.shape[1]
    pool = kv.float().double() * (1.0 if kv_scale is None else kv_scale)
    out = torch.zeros(B, S_q, H, r, dtype=torch.float64)
    lse = torch.full((B, S_q, H), -math.inf, dtype=torch.float64)
    for b in range(B):
        n = int(seqlens[b])
        rows = torch.cat([pool[int(table[b, j])] for j in range(math.ceil(n / page))] or [pool[:0, 0]])[:n]
        for s in range(S_q):
            seen = n - S_q + s + 1 if causal else n
            if seen <= 0:
                continue
            scores = q[b, s].cpu().double() @ rows[:seen].T * scale  # [H, seen]
            lse[b, s] = torch.logsumexp(scores, -1)
            out[b, s] = torch.softmax(scores, -1) @ rows[:seen, :r]
    return out, lse


ODD_CASES = [  # (lens, H, S_q, page, dtype, kv_dtype, schedule, num_splits, config, tol)
    pytest.param((40, 3, 77), 20, 3, 17, torch.float16, None, "uniform", 2, {}, F16, id="H20-Sq3-page17-uniform2"),
    pytest.param(
        (50, 130),
        33,
        4,
        24,
        torch.float32,
        None,
        "balanced",
        None,
        {"BLOCK_N": 16},
        F32,
        id="H33-Sq4-page24-balanced-3rowtiles",
    ),  # fmt: skip
    pytest.param(
        (9, 61, 100),
        40,
        1,
        17,
        torch.float16,
        FP8,
        "uniform",
        3,
        {"SPLIT_SCORE": 1},
        F16,
        id="H40-page17-fp8-splitscore-uniform3",
    ),  # fmt: skip
    pytest.param(
        (64, 5, 97),
        20,
        3,
        24,
        torch.float32,
        None,
        "balanced",
        None,
        {"BLOCK_N": 16, "SPLIT_SCORE": 1},
        F32,
        id="H20-Sq3-page24-balanced-splitscore",
    ),  # fmt: skip
    pytest.param(
        (33, 80),
        40,
        1,
        32,
        torch.float32,
        None,
        "uniform",
        1,
        {"BLOCK_N": 16},
        F32,
        id="H40-page32-aligned-carried-page-ids",
    ),  # fmt: skip
]


@pytest.mark.parametrize("lens, H, S_q, page, dtype, kv_dtype, sched, splits, config, tol", ODD_CASES)
def test_odd_shapes_match_twin_and_fp64(poisoned, lens, H, S_q, page, dtype, kv_dtype, sched, splits, config, tol):
    """Odd head counts (rows that leave a tile part empty), pages of 17 and 24 keys (the per-key
    block-table path, its page ids carried a tile ahead) and S_q 3-4, on both schedules."""
    causal = S_q != 4
    q, kv, table, seqlens, kv_scale = paged_case(lens, H, S_q, 32, 16, page, dtype, kv_dtype, seed=H)
    got = mla_decode(q, kv, table, seqlens, SCALE, r=32, kv_scale=kv_scale, causal=causal, num_splits=splits,
                     config=config, schedule=sched)  # fmt: skip
    assert_close(got, mla_decode_naive(q, kv, table, seqlens, SCALE, r=32, kv_scale=kv_scale, causal=causal), tol)
    out64, lse64 = fp64_decode(q, kv, table, seqlens, SCALE, 32, causal, kv_scale)
    torch.testing.assert_close(got[0].cpu().double(), out64, atol=tol["atol"], rtol=tol["rtol"])
    torch.testing.assert_close(got[1].cpu().double(), lse64, atol=tol["lse"], rtol=tol["lse"])


@pytest.mark.parametrize("sched", ["uniform", "balanced"])
def test_tma_odd_shape_carried_rows_match_fp64(monkeypatch, poisoned, sched):
    """The TMA path (page-aligned tiles, the row of tile i + 1 carried a tile ahead, the last tile
    masked) with 20 heads x 3 new tokens: 60 rows of a 64-row tile, contexts that end mid-tile."""
    monkeypatch.setattr(decode, "TMA_MIN_BLOCK_H", 16)
    q, kv, table, seqlens, _ = paged_case((45, 3, 110), 20, 3, 32, 16, 32, torch.float32, seed=3)
    assert decode._descriptors(kv, 16, 32, 16, q.device, 64)[2]
    splits = 2 if sched == "uniform" else None
    got = mla_decode(q, kv, table, seqlens, SCALE, r=32, num_splits=splits, config={"BLOCK_N": 16}, schedule=sched)
    out64, lse64 = fp64_decode(q, kv, table, seqlens, SCALE, 32, True, None)
    torch.testing.assert_close(got[0].double(), out64, atol=F32["atol"], rtol=F32["rtol"])
    torch.testing.assert_close(got[1].double(), lse64, atol=F32["lse"], rtol=F32["lse"])


# ---- no compile at serving time: one Triton cache key per kernel across batch shapes -------------


def jit_cache_keys(launches):
    """Triton's own cache key (triton/runtime/jit.py: the binder's specialisation and options,
    `compute_cache_key`) of each recorded launch, for an sm_90 target: the key under which a GPU
    would look up, or else compile, the kernel. Works under the interpreter (no GPU, no compile)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    keys = {}
    for name, kernel, args, kwargs in launches:
        fn = JITFunction(kernel.fn, **getattr(kernel, "kwargs", {})) if hasattr(kernel, "fn") else kernel
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        _, specialization, options = binder(*args, **kwargs)
        keys.setdefault(name, set()).add(compute_cache_key({}, specialization, options))
    return keys


@pytest.fixture
def recorded(monkeypatch):
    """Record (name, kernel, args, kwargs) of every decode kernel launch, then launch for real."""
    seen = []

    class Record:
        def __init__(self, name):
            self.name, self.real = name, getattr(decode, name)
            self.arg_names = self.real.arg_names

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append((self.name, self.real, args, kwargs))
                return self.real[grid](*args, **kwargs)

            return launch

    for name in ("_mla_decode_split_kernel", "_mla_decode_merge_kernel", "_mla_decode_planned_kernel",
                 "_mla_decode_planned_merge_kernel"):  # fmt: skip
        monkeypatch.setattr(decode, name, Record(name))
    return seen


def test_new_batch_shapes_reuse_the_compiled_kernels(recorded):
    """Batches of 1-9 requests with contexts from 1 to 700 keys, block tables of 1 to 12 pages,
    split counts 1-8 (uniform) and any plan (balanced): each kernel has one cache key, except
    the uniform stage 1, whose one-split launch writes q's dtype (a second key, compiled once).
    Before the split count and the plan's fixed cost were run-time arguments, every split count
    was a compile."""
    for B, ctx in ((1, 1), (3, 100), (2, 333), (9, 700), (4, 64)):
        lens = [max(1, ctx - 13 * b) for b in range(B)]
        q, kv, table, seqlens, _ = paged_case(lens, 4, 1, 32, 16, 64, torch.float16, seed=B)
        for splits in (None, 1, 2, 5, 8):
            mla_decode(q, kv, table, seqlens, SCALE, r=32, num_splits=splits, schedule="uniform")
        mla_decode(q, kv, table, seqlens, SCALE, r=32, schedule="balanced")
    keys = jit_cache_keys(recorded)
    counts = {name: len(k) for name, k in keys.items()}
    assert counts == {
        "_mla_decode_split_kernel": 2,  # q's dtype out (one split) and fp32 partials
        "_mla_decode_merge_kernel": 1,
        "_mla_decode_planned_kernel": 1,
        "_mla_decode_planned_merge_kernel": 1,
    }, counts
