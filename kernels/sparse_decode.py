"""Sparse absorb decode (DeepSeek Sparse Attention) over a paged latent cache, in Triton.

Every query token attends only to the cache rows its indices name (the top-k its lightning
indexer picked); the attention is the absorb path's MQA: the key is the whole row
``[c (r) | k_r (dR)]``, the value its latent part ``c``. The plain-torch twin, to read first, is
`sparse_decode_naive.mla_sparse_decode_naive`; FLOPs and bytes are counted in
`mlactl.model.cost` (CostModel.sparse_attention: ``2·H·(r+dR) + 2·H·r`` FLOPs a selected row).

Design:

* A program owns one query token, one tile of BLOCK_H of its heads and one split of its index
  list. The heads of a token share its rows (one MQA group), so each row a program gathers
  feeds BLOCK_H rows of scores: a token's rows are read ceil(H / BLOCK_H) times (once at
  H <= 32), never once per head.
* Stage 1 (`_sparse_decode_kernel`) walks the split's indices BLOCK_N at a time: one load of
  the indices, one gather of those cache rows (slot = page * block_size + offset, as FlashMLA's
  sparse kernels take them, so no block table), an online softmax in base 2, and writes a
  normalised output (or an fp32 partial and its lse when split). Stage 2
  (`_sparse_merge_kernel`) merges the splits by lse; an empty split weighs nothing.
* Caches: a bf16/fp16/fp32 cache in q's dtype, or FlashMLA's fp8 sparse layout (README "FP8
  KV Cache": per token r e4m3 values, one fp32 scale per 128 of them, dR bf16 RoPE values: 656
  bytes for DeepSeek-V3.2). The fp8 row is read as bytes, widened exactly, scaled per 128-value
  tile in fp32 and multiplied in q's dtype, as FlashMLA's decode kernel dequantises to bf16.
* An index that is -1, or outside the cache, is skipped (never read); a query with no valid
  index gets out 0 and lse -inf.
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from . import configs
from ._checks import (
    DTYPE_NAMES,
    check_device,
    check_scale,
    check_tensor,
    check_unit_stride,
    device_info,
    latent_cache,
    latent_rank,
    out_and_lse,
)
from .decode import merge_splits
from .sparse_decode_naive import FP8_TILE, sparse_fp8_row_bytes

# ---- tuning defaults (sm_90 compile: Triton 3.9 for sm_90, ptxas 13.4; docs/kernels.md has the
# sweep of 78 configs per cache, benchmarks/results/compile-sm90-sparse-decode.json) ----
# (cache kind) -> heads a tile. Every 64-row config spills (276-11,428 B bf16, 880-10,376 B fp8:
# the [64, 512] fp32 accumulator beside a gathered tile's addresses), so 128 heads are 4 tiles of
# 32 (mma.sync). A token's head tiles run side by side in the grid, so all but the first read
# its rows from L2.
BLOCK_H_WIDE = {"bf16": 32, "fp8": 32}
BLOCK_H_MIN = 16  # tl.dot needs 16 rows; fewer heads are masked padding
# (cache kind) -> (BLOCK_N, num_stages, num_warps) at the tile above: the largest gather of rows
# that compiles with 0 spills for sm_90 with two tiles in flight (the indices carried one tile
# ahead; sm_90 compile, Triton 3.9 / 3.6): bf16 32 rows a gather, 3 stages, 162 registers,
# 110 KiB; fp8 32 rows, 3 stages, 254 registers (both), 105 KiB, the value read twice (kernel)
NO_SPILL = {"bf16": (32, 3, 8), "fp8": (32, 3, 8)}
# at 16-row tiles (16 heads or fewer, e.g. DeepSeek-V3.2 at TP 8): bf16 64 rows, 3 stages, 141
# registers, 164 KiB; fp8 32 rows, 3 stages, 219 / 234 registers (3.9 / 3.6), 87 KiB
NO_SPILL_NARROW = {"bf16": (64, 3, 8), "fp8": (32, 3, 8)}
WAVES = 2  # splits aim at ~2 waves of programs over the SMs
MIN_SPLIT_ROWS = 256  # a split below 256 rows writes as much partial as it reads cache
MAX_SPLITS = 16

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
CONFIG_KEYS = ("BLOCK_H", "BLOCK_N", "num_splits", "num_warps", "num_stages")
_FP8_BYTES = (torch.uint8, torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else (torch.uint8,)
_FITTED: dict = {}


@triton.jit
def _dequant(b_raw, b_sc, BLOCK_N: tl.constexpr, R: tl.constexpr, DTYPE: tl.constexpr):
    """FlashMLA's fp8 values [BLOCK_N, R] (bytes) times their per-128 scales b_sc [BLOCK_N, R // 128]:
    widened exactly, scaled in fp32, rounded once to the query's dtype."""
    b_val = b_raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)  # [BLOCK_N, R], exact
    b_val = tl.reshape(tl.reshape(b_val, [BLOCK_N, R // 128, 128]) * b_sc[:, :, None], [BLOCK_N, R])
    return b_val.to(DTYPE)


# ints that change with the batch or the split count (the lse strides follow the split count):
# not specialised on, so a new batch shape reuses the compiled kernels (tests/test_sparse_decode.py)
_BATCH_INTS = ["num_slots", "topk", "num_splits", "stride_lt", "stride_lh", "stride_l_split"]


@triton.jit(do_not_specialize=_BATCH_INTS)
def _sparse_decode_kernel(
    q,
    kv,
    kv_f32,
    kv_b16,
    indices,
    o,
    lse,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kv,
    stride_kv_f32,
    stride_kv_b16,
    stride_it,
    stride_ot,
    stride_oh,
    stride_o_split,
    stride_lt,
    stride_lh,
    stride_l_split,
    num_slots,
    topk,
    num_splits,
    H: tl.constexpr,
    R: tl.constexpr,
    DR: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One (query token, head tile, split): online softmax over the split's selected rows.

    Grid (head tiles x tokens, splits): a token's head tiles are adjacent programs, so they run
    at the same time and all but the first find the token's rows in L2. num_splits is a run-time
    argument (one compile serves every batch).

    qk_scale = softmax scale * log2(e). Traffic: the tile's queries once ([BLOCK_H, r + dR]), the
    split's indices once, each selected row once (r + dR numbers, or the fp8 row's bytes: its
    r values and r/128 scales feed key and value, its RoPE the key); writes [BLOCK_H, r] outputs
    and BLOCK_H lses (fp32 partials when split).
    """
    N_H: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    pid_t = (tl.program_id(0) // N_H).to(tl.int64)  # B*S_q tokens x topk indices can pass 2**31
    pid_h = tl.program_id(0) % N_H
    pid_split = tl.program_id(1)
    o_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_r = tl.arange(0, R)
    o_dr = tl.arange(0, DR)
    o_n = tl.arange(0, BLOCK_N)

    p_q = q + pid_t * stride_qt + o_h * stride_qh  # [BLOCK_H]
    b_q = tl.load(p_q[:, None] + o_r[None, :], mask=m_h[:, None], other=0.0)  # [BLOCK_H, R]
    b_qpe = tl.load(p_q[:, None] + R + o_dr[None, :], mask=m_h[:, None], other=0.0)  # [BLOCK_H, DR]
    if DOT_FP32:  # Triton's interpreter multiplies bf16 bit patterns in tl.dot: widen to fp32
        b_q = b_q.to(tl.float32)
        b_qpe = b_qpe.to(tl.float32)

    # this split's index positions: whole BLOCK_N tiles, the last one cut at topk
    tiles_per_split = tl.cdiv(tl.cdiv(topk, BLOCK_N), num_splits)
    start = pid_split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, topk)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)  # running max, base 2
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_H, R], dtype=tl.float32)
    p_idx = indices + pid_t * stride_it
    # the indices are carried one tile ahead: the gather of tile i + 1 depends on no load of
    # iteration i, so Triton's pipeliner can issue it while tile i is multiplied (sm_90 compile)
    idx_next = tl.load(p_idx + start + o_n, mask=start + o_n < end, other=-1)  # [BLOCK_N]
    for n0 in range(start, end, BLOCK_N):
        b_idx = idx_next  # [BLOCK_N]
        idx_next = tl.load(p_idx + n0 + BLOCK_N + o_n, mask=n0 + BLOCK_N + o_n < end, other=-1)
        m_n = (b_idx >= 0) & (b_idx < num_slots)  # -1, past the split or out of the cache: never read
        i_row = tl.where(m_n, b_idx, 0).to(tl.int64)  # [BLOCK_N]
        if FP8:  # FlashMLA's row: r e4m3 bytes | r/128 fp32 scales | dR bf16
            p_raw = kv + i_row[:, None] * stride_kv + o_r[None, :]  # [BLOCK_N, R]
            o_t = tl.arange(0, R // 128)
            b_sc = tl.load(
                kv_f32 + i_row[:, None] * stride_kv_f32 + R // 4 + o_t[None, :], mask=m_n[:, None], other=0.0
            )
            b_kv = _dequant(tl.load(p_raw, mask=m_n[:, None], other=0), b_sc, BLOCK_N, R, b_q.dtype)  # [BLOCK_N, R]
            # the value read a second time (from L2): each load then feeds one dot and Triton stages
            # it in shared memory a tile ahead; one load widened for both dots stays a register
            # load, unpipelined (sm_90 compile)
            b_raw = tl.load(p_raw, mask=m_n[:, None], other=0, cache_modifier=".cg")  # [BLOCK_N, R]
            b_v = _dequant(b_raw, b_sc, BLOCK_N, R, b_q.dtype)
            p_pe = kv_b16 + i_row * stride_kv_b16 + (R + 4 * (R // 128)) // 2  # [BLOCK_N]
            b_kpe = tl.load(p_pe[:, None] + o_dr[None, :], mask=m_n[:, None], other=0.0).to(b_q.dtype)
        else:
            p_kv = kv + i_row * stride_kv  # [BLOCK_N]
            b_kv = tl.load(p_kv[:, None] + o_r[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, R]
            b_kpe = tl.load(p_kv[:, None] + R + o_dr[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, DR]
            if DOT_FP32:
                b_kv = b_kv.to(tl.float32)
                b_kpe = b_kpe.to(tl.float32)
            b_v = b_kv
        b_s = tl.dot(b_qpe, tl.trans(b_kpe), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_kv), b_s, input_precision=DOT_PRECISION)
        b_s = tl.where(m_n[None, :], b_s * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # no valid row yet: no NaN
        b_p = tl.exp2(b_s - m_use[:, None])  # [BLOCK_H, BLOCK_N]
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision=DOT_PRECISION)  # [BLOCK_H, R]
        m_i = m_new

    has_keys = l_i > 0
    b_o = acc / tl.where(has_keys, l_i, 1.0)[:, None]  # [BLOCK_H, R]
    b_lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2, -float("inf"))
    p_o = o + pid_t * stride_ot + o_h * stride_oh + pid_split * stride_o_split  # [BLOCK_H]
    tl.store(p_o[:, None] + o_r[None, :], b_o.to(o.dtype.element_ty), mask=m_h[:, None])
    tl.store(lse + pid_t * stride_lt + o_h * stride_lh + pid_split * stride_l_split, b_lse, mask=m_h)


@triton.jit(do_not_specialize=["stride_qt", "stride_qh", "stride_q_split", "num_splits"])
def _sparse_merge_kernel(
    o_part,
    lse_part,
    o,
    lse,
    stride_pt,
    stride_ph,
    stride_p_split,
    stride_qt,
    stride_qh,
    stride_q_split,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    num_splits,
    H: tl.constexpr,
    R: tl.constexpr,
):
    """One (query token, head) row: lse-weighted sum of its splits' partial outputs (num_splits
    at run time: one compile serves every split count)."""
    pid_t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    o_r = tl.arange(0, R)
    p_lse = lse_part + pid_t * stride_qt + pid_h * stride_qh
    p_o = o_part + pid_t * stride_pt + pid_h * stride_ph
    b_o, b_lse = merge_splits(p_lse, p_o, num_splits, stride_q_split, stride_p_split, R)
    tl.store(o + pid_t * stride_ot + pid_h * stride_oh + o_r, b_o.to(o.dtype.element_ty))
    tl.store(lse + pid_t * stride_lt + pid_h * stride_lh, b_lse)


def _empty(shape, dtype, device):
    """Every buffer the launcher allocates comes from here (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def cache_kind(kv_dtype: str) -> str:
    """The NO_SPILL key of a cache dtype name: fp8 (FlashMLA's layout) or bf16 (16- or 32-bit)."""
    return "fp8" if kv_dtype == "fp8" else "bf16"


def heuristic_config(T: int, H: int, topk: int, kv_dtype: str, num_sms: int) -> dict:
    """The launch config without a tuned one: 32-head tiles (fewer heads: the next power of two,
    at least 16), the no-spill gather of NO_SPILL, splits to ~WAVES waves of programs."""
    wide = BLOCK_H_WIDE[cache_kind(kv_dtype)]
    block_h = min(wide, max(BLOCK_H_MIN, triton.next_power_of_2(H)))
    table = NO_SPILL if block_h >= wide else NO_SPILL_NARROW
    block_n, stages, warps = table[cache_kind(kv_dtype)]
    programs = T * triton.cdiv(H, block_h)
    most = max(1, min(MAX_SPLITS, triton.cdiv(topk, block_n), triton.cdiv(topk, MIN_SPLIT_ROWS)))
    splits = max(1, min(most, round(WAVES * num_sms / max(programs, 1))))
    return {"BLOCK_H": block_h, "BLOCK_N": block_n, "num_splits": splits, "num_warps": warps, "num_stages": stages}


def default_config(shape: dict, kv_dtype: str, num_sms: int = 132) -> dict:
    """The heuristic config for a shape bucket {B, H, S_q, topk}, without a GPU (compile stage)."""
    return heuristic_config(shape["B"] * shape["S_q"], shape["H"], shape["topk"], kv_dtype, num_sms)


def _constants(H, r, dR, block_h, fp8, fp32, dot_fp32):
    return dict(
        H=H,
        R=r,
        DR=dR,
        BLOCK_H=block_h,
        FP8=fp8,
        DOT_PRECISION="ieee" if fp32 else "tf32",
        DOT_FP32=dot_fp32,
    )


def compile_spec(shape: dict, config: dict, r: int, dR: int, dtype: str, kv_dtype: str, stage: str = "stage1"):
    """What `mlactl tune compile` needs to build stage 1 for a GPU target without launching it:
    (jit function, signature, constants, argument names divisible by 16, compile options, launch),
    built as `mla_sparse_decode` launches it: the config over the heuristic's for the shape, and
    stage 1's output an fp32 partial when split, else q's dtype. `launch` is {"num_splits",
    "out_dtype", "stage"} as recorded in the compile report. stage "merge": the merge of the
    splits (4 warps, as launched)."""
    fp8 = kv_dtype == "fp8"
    full = {**default_config(shape, kv_dtype), **config}
    full["BLOCK_H"] = min(full["BLOCK_H"], max(BLOCK_H_MIN, triton.next_power_of_2(shape["H"])))  # as launched
    out_dtype = "fp32" if full["num_splits"] > 1 else dtype
    if stage == "merge":
        fn = _sparse_merge_kernel
        consts = {"H": shape["H"], "R": r}
        types = {"o_part": "*fp32", "lse_part": "*fp32", "o": f"*{dtype}", "lse": "*fp32"}
        sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
        aligned = ["o_part", "lse_part", "o", "lse", "stride_pt", "stride_ph", "stride_p_split", "stride_ot"]
        aligned.append("stride_oh")
        launch = {"num_splits": full["num_splits"], "out_dtype": dtype, "stage": "merge"}
        return fn, sig, consts, aligned, {"num_warps": 4, "num_stages": 1}, launch
    consts = _constants(shape["H"], r, dR, full["BLOCK_H"], fp8, dtype == "fp32", False)
    consts["BLOCK_N"] = full["BLOCK_N"]
    kv_type = "u8" if fp8 else dtype
    types = dict(q=f"*{dtype}", kv=f"*{kv_type}", kv_f32="*fp32", kv_b16="*bf16", indices="*i32",
                 o=f"*{out_dtype}", lse="*fp32", qk_scale="fp32")  # fmt: skip
    fn = _sparse_decode_kernel
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    aligned = ["q", "kv", "kv_f32", "kv_b16", "o", "lse", "stride_qt", "stride_qh", "stride_kv", "stride_ot"]
    options = {"num_warps": full["num_warps"], "num_stages": full["num_stages"]}
    return fn, sig, consts, aligned, options, {"num_splits": full["num_splits"], "out_dtype": out_dtype, "stage": stage}


def _check_config(config, source):
    return configs.check_config(
        config, source, pow2={"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 1}, positive=("num_splits", "num_stages")
    )


def _check_inputs(q, kv_cache, indices, r, validate):
    """Shape, dtype and device checks; returns (cache as [slots, row] in its storage type, r,
    dR, fp8)."""
    check_tensor("q", q, 4, tuple(DTYPE_NAMES), contiguous=False)
    kv_cache = latent_cache(kv_cache)
    check_tensor("kv_cache", kv_cache, 3, tuple(DTYPE_NAMES) + _FP8_BYTES, contiguous=False)
    check_tensor("indices", indices, 3, (torch.int32,), contiguous=False)
    check_unit_stride(q=q, kv_cache=kv_cache, indices=indices)
    check_device(q=q, kv_cache=kv_cache, indices=indices)
    B, S_q, H, row = q.shape
    r = latent_rank(row, r)
    dR = row - r
    for name, value in (("r", r), ("dR", dR)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name}={value} must be a power of two >= 16 (r + dR = {row}, r = {r})")
    if tuple(indices.shape[:2]) != (B, S_q):
        raise ValueError(f"indices is {tuple(indices.shape)} but must be [B, S_q, topk] with B, S_q = {B}, {S_q}")
    fp8 = kv_cache.dtype in _FP8_BYTES
    if fp8:
        if r < FP8_TILE or r % FP8_TILE or (r // FP8_TILE) & (r // FP8_TILE - 1):
            raise ValueError(f"r={r}: the fp8 sparse layout needs r a power-of-two multiple of {FP8_TILE}")
        want = sparse_fp8_row_bytes(r, dR)
        if kv_cache.shape[-1] != want:
            raise ValueError(
                f"kv_cache rows are {kv_cache.shape[-1]} bytes but FlashMLA's fp8 sparse layout for r={r}, "
                f"dR={dR} has {want} (r fp8 values, {r // FP8_TILE} fp32 scales, {dR} bf16 RoPE values)"
            )
        if kv_cache.stride(1) % 4 or kv_cache.stride(0) != kv_cache.shape[1] * kv_cache.stride(1):
            raise ValueError("an fp8 kv_cache must be pages of whole rows, laid out back to back (its .contiguous())")
    else:
        if kv_cache.dtype != q.dtype:
            raise ValueError(
                f"kv_cache has dtype {kv_cache.dtype} but q has {q.dtype}; they must match (or the cache is "
                "uint8/float8_e4m3fn bytes in FlashMLA's fp8 sparse layout)"
            )
        if kv_cache.shape[-1] != row:
            raise ValueError(f"kv_cache rows hold {kv_cache.shape[-1]} numbers but q's are r + dR = {row}")
        if kv_cache.stride(0) != kv_cache.shape[1] * kv_cache.stride(1):
            raise ValueError("kv_cache pages must be laid out back to back (slot = page * block_size + offset)")
    slots = kv_cache.shape[0] * kv_cache.shape[1]
    if validate and indices.numel():
        low, high = torch.stack([indices.min(), indices.max()]).tolist()  # one device sync
        if low < -1 or high >= slots:
            raise ValueError(
                f"indices hold slots outside [-1, {slots}) (min {low}, max {high}); -1 marks an unused "
                "entry, a slot is page * block_size + offset"
            )
    return kv_cache, r, dR, fp8


def mla_sparse_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    *,
    r: int | None = None,
    num_splits: int | None = None,
    config: dict | None = None,
    validate: bool = True,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse absorb attention: each query token over the cache rows its indices name.

    Args:
        q: [B, S_q, H, r + dR] fp16/bf16/fp32 latent queries, RoPE part last; last dim contiguous.
        kv_cache: [num_blocks, block_size, r + dR] in q's dtype, or uint8 / float8_e4m3fn
            [num_blocks, block_size, r + 4*r/128 + 2*dR] bytes in FlashMLA's fp8 sparse layout
            (656 for DeepSeek-V3.2); [num_blocks, block_size, 1, ...] is accepted; pages back to back.
        indices: [B, S_q, topk] int32 slots (page id * block_size + offset; positions_to_slots in
            sparse_decode_naive converts a request's token positions); -1 marks an unused entry.
        scale: the model's softmax scale, 1/sqrt(dC + dR).
        r: latent rank; default 512 for a 576-wide query.
        num_splits: splits of each index list (wins over `config`); else tuned, else heuristic.
        config: dict with any of BLOCK_H, BLOCK_N, num_splits, num_warps, num_stages.
        validate: check that every index lies in [-1, slots) (one device sync). With False a
            slot outside the cache is skipped in the kernel, never read.
        out: optional [B, S_q, H, r] tensor in q's dtype to write the output into.

    Returns:
        (out [B, S_q, H, r] in q's dtype, lse [B, S_q, H] fp32 natural-log LSE of scaled scores).

    Raises:
        ValueError: on any bad input, before anything is launched.
    """
    scale = check_scale(scale)
    kv_cache, r, dR, fp8 = _check_inputs(q, kv_cache, indices, r, validate)
    B, S_q, H, _ = q.shape
    topk = indices.shape[2]
    device = q.device
    out, lse = out_and_lse(q, out, r, _empty)
    if B == 0 or S_q == 0 or H == 0:
        return out, lse
    if topk == 0:  # nothing selected: out 0, lse -inf, as a query with only -1 indices
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    T = B * S_q
    kv_name = "fp8" if fp8 else DTYPE_NAMES[kv_cache.dtype]
    device_name, num_sms = device_info(device)
    cfg = heuristic_config(T, H, topk, kv_name, num_sms)
    configs.choose(
        "mla_sparse_decode", cfg, config, _check_config, device_name, kv_name, num_splits, B=B, H=H, S_q=S_q, topk=topk
    )
    cfg["BLOCK_H"] = min(cfg["BLOCK_H"], max(BLOCK_H_MIN, triton.next_power_of_2(H)))
    splits = cfg["num_splits"]

    flat = kv_cache.reshape(kv_cache.shape[0] * kv_cache.shape[1], kv_cache.shape[2])  # [slots, row]; a view
    if fp8:
        kv_u8 = flat.view(torch.uint8)
        kv_args = (kv_u8, kv_u8.view(torch.float32), kv_u8.view(torch.bfloat16))
        strides = (kv_u8.stride(0), kv_u8.stride(0) // 4, kv_u8.stride(0) // 2)
    else:
        kv_args = (flat, flat, flat)
        strides = (flat.stride(0), flat.stride(0), flat.stride(0))
    q3 = q.reshape(T, H, q.shape[3])  # a view when the token dims are uniform, else a copy
    idx = indices.reshape(T, topk)
    out3 = out.view(T, H, r) if out.is_contiguous() else _empty((T, H, r), q.dtype, device)
    lse2 = lse.view(T, H)
    if splits == 1:
        o1, lse1 = out3, lse2
        o1_strides = (*out3.stride()[:2], 0)
        lse1_strides = (*lse2.stride(), 0)
    else:
        o1 = _empty((T, H, splits, r), torch.float32, device)
        lse1 = _empty((T, H, splits), torch.float32, device)
        o1_strides = o1.stride()[:3]
        lse1_strides = lse1.stride()
    constants = _constants(
        H,
        r,
        dR,
        cfg["BLOCK_H"],
        fp8,
        q.dtype == torch.float32,
        q.dtype == torch.bfloat16 and device.type != "cuda",
    )
    grid = (triton.cdiv(H, cfg["BLOCK_H"]) * T, splits)  # a token's head tiles side by side
    args = (q3, *kv_args, idx, o1, lse1, scale * LOG2E.value, q3.stride(0), q3.stride(1), *strides, idx.stride(0),
            *o1_strides, *lse1_strides, flat.shape[0], topk, splits)  # fmt: skip
    _launch(grid, args, constants, cfg, device)
    if splits > 1:
        _sparse_merge_kernel[(T, H)](
            o1, lse1, out3, lse2, *o1.stride()[:3], *lse1.stride(), *out3.stride()[:2], *lse2.stride(), splits,
            H=H, R=r, num_warps=4,
        )  # fmt: skip
    if out3.data_ptr() != out.data_ptr():
        out.copy_(out3.view(B, S_q, H, r))
    return out, lse


def _launch(grid, args, constants, cfg, device):
    """Launch stage 1; if the GPU lacks the shared memory for (BLOCK_N, num_stages), halve
    BLOCK_N (then drop to one stage) and remember what fit."""
    key = (device, *sorted(constants.items()), cfg["BLOCK_N"], cfg["num_stages"], cfg["num_warps"])
    first = _FITTED.get(key, (cfg["BLOCK_N"], cfg["num_stages"]))
    tries = [first]
    block_n = first[0]
    while block_n > 16:
        block_n //= 2
        tries.append((block_n, first[1]))
    tries.append((16, 1))
    for i, (block_n, stages) in enumerate(tries):
        try:
            _sparse_decode_kernel[grid](
                *args, **constants, BLOCK_N=block_n, num_warps=cfg["num_warps"], num_stages=stages
            )
        except OutOfResources:
            if i == len(tries) - 1:
                raise
            continue
        if key not in _FITTED and (block_n, stages) != first:
            warnings.warn(
                f"mla_sparse_decode: BLOCK_N={first[0]}, num_stages={first[1]} exceed shared memory here; "
                f"using BLOCK_N={block_n}, num_stages={stages}",
                stacklevel=3,
            )
        _FITTED[key] = (block_n, stages)
        return
