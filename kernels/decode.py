"""Absorb-path MLA attention (decode, MTP, short extends) over a paged latent cache, in Triton.

An MQA over the latent cache: every cache row is ``[c (r) | k_r (dR)]``, the key is the whole
row and the value its latent part, so each row is read once and feeds both dot products.
The plain-torch twin, to read first, is `decode_naive.mla_decode_naive`; FLOPs and bytes are
counted in `mlactl.model.cost` (``2·H·(r+dR) + 2·H·r`` FLOPs per (query, key) pair).

Design (flash-decoding with grouped heads):

* A program owns one request ``b``, one tile of BLOCK_H rows and one split of the request's keys.
  Rows are (new token, head) pairs of that request flattened, so the heads of every new token
  share each KV tile the program loads: H·S_q rows per cache read instead of one.
* Stage 1 (`_mla_decode_split_kernel`) streams the split's keys in tiles of BLOCK_N through the
  block table with an online softmax in base 2, and writes a normalised partial output (fp32)
  and its natural-log LSE. With one split it writes the final output directly.
* Stage 2 (`_mla_decode_merge_kernel`) merges the splits of each row by their LSE; empty splits
  carry LSE -inf and weigh nothing.
* Balanced schedule (kernels/schedule.py): instead of one split count for the whole batch, a
  persistent grid of one program per SM (`_mla_decode_planned_kernel`) walks an equal share of
  the batch's KV tiles; only requests a cut runs through are split and merged
  (`_mla_decode_planned_merge_kernel`). `schedule="auto"` picks per tile height (NO_SPILL).
* Page-aligned tiles (BLOCK_N divides the page): one block-table read per tile. At 64-row tiles
  on Hopper (TMA_MIN_BLOCK_H) a tile is one TMA tensor-descriptor copy of the contiguous
  [BLOCK_N, r + dR] rows: whole tiles unmasked, the last one masked; narrower tiles use
  contiguous row pointers.
* Two KV tiles in flight: the block-table entries of tile i + 1 are read in trip i and carried,
  so Triton's pipeliner copies a later tile while one is multiplied (`mlactl tune compile`
  reads kv_buffers and tiles_in_flight from the compiled loop). The split count and the
  balanced plan's fixed cost are run-time arguments, and the ints that follow the batch are not
  specialised on: a new batch shape reuses the compiled kernels.

Split score (SPLIT_SCORE, the 64-row default): the [64, r] fp32 accumulator needs 8 warps (two
warpgroups), and Triton gives every warp of a dot that feeds another dot to M, so both warpgroups
would compute the whole [64, BLOCK_N] score tile (53% of the FLOPs twice: 1.53 times the tile's
tensor-core work). With SPLIT_SCORE no score value flows into a dot (the score dots are summed
after scaling; p and alpha go through a per-program scratch slot across a barrier), so each
warpgroup computes its half of the keys once (docs/kernels.md, "Split score").
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from . import configs, schedule
from ._checks import (
    DTYPE_NAMES,
    check_device,
    check_dim,
    check_scale,
    check_tensor,
    check_unit_stride,
    device_info,
    interpreting,
    latent_cache,
    latent_rank,
    out_and_lse,
)
from ._triton_compat import patch_interpreter_index

patch_interpreter_index()  # Triton 3.6's interpreter with numpy >= 2.4 (see _triton_compat)

# ---- tuning defaults (H200 / sm_90) ----
# Figures marked "sm_90 compile" come from compiling these kernels offline for sm_90 with Triton
# 3.9 (shared memory from the compiler, registers and spills from ptxas, loop size from SASS);
# none is a timing yet. `mlactl tune` measures and stores better ones per shape bucket.
BLOCK_H_WIDE = 64  # 64-row tiles are the smallest M for which Triton emits Hopper wgmma
BLOCK_H_MIN = 16  # tl.dot needs >= 16 rows; fewer (new token, head) rows are masked padding
BLOCK_N_CHOICES = ((64, 3), (32, 3), (16, 3), (16, 1))  # (BLOCK_N, num_stages), best first;
# 64 keys: scores as m64n32 wgmma, 22 loop instructions per key vs 34 at 32 keys (sm_90 compile);
# num_stages 3: two KV tiles in flight; at 64 rows and 64 keys still 408 B of spills (548 B at
# num_stages 2) with ptxas 13.4 (sm_90 compile), hence NO_SPILL below for the defaults
SMEM_BUDGET = 227 * 1024  # Hopper's opt-in shared memory per CTA (228 KiB/SM less 1 KiB reserved)
WARPS_8_FROM = 64 * 128  # 8 warps once the [BLOCK_H, r] fp32 accumulator has 8K numbers:
# [64, 512] is 256 registers/thread at 4 warps, 128 at 8; [16, 512] at 8 warps: 128 registers,
# no spills, 2 CTAs/SM, where 4 warps take 216-255 registers (sm_90 compile)
WAVES = 2  # split-KV aims at ~2 waves of programs over the SMs (1 wave idles SMs at its tail)
MIN_SPLIT_TOKENS = 256  # under 256 keys a split spends as much writing its [rows, r] fp32 partial
# as reading its keys, and the merge rereads it
MAX_SPLITS = 64  # the merge loops over splits; beyond 64 it costs more than the parallelism buys
# (BLOCK_H, fp8 cache) -> (BLOCK_N, num_stages, schedule, SPLIT_SCORE): per tile height the
# config whose stage 1 compiles for sm_90 with 0 spill bytes under Triton 3.9 (ptxas 13.4) and 3.6
# (ptxas 12.8), for both outputs the launcher picks (one split: q's dtype; several: fp32 partials),
# issuing each tensor-core multiply-add once where a config can (issued_mma_over_needed 1.0; the
# sweep is in docs/kernels.md). The balanced kernel keeps more state live across its request loop:
# at 64 rows it spills 1.2-2.7 KB in every config, so 64-row tiles keep the uniform schedule.
# Every default keeps at least two KV tiles in flight across the value dot (the block-table
# entries are carried one tile ahead; `mlactl tune compile` reads kv_buffers and tiles_in_flight
# from the compiled loop, tests/test_compile.py pins them): TMA tiles need num_stages 3 for that
# (3 buffers: tile i + 2 is copied while tile i + 1 is multiplied; at 2 stages the copy of tile
# i + 1 waits for tile i's value dot), cp.async tiles num_stages 3 (2 buffers, since mma.sync
# reads its operands from registers) or 4 (3 buffers).
NO_SPILL = {
    # split score (TMA loads): 1.00 issued/needed, 3 buffers, 0 B under both (237 / 224 registers
    # under 3.9, 249 / 232 under 3.6, one split / several); without the split score 1.53
    (64, False): (32, 3, "uniform", 1),
    (32, False): (32, 3, "balanced", 0),  # 1.53; balanced at BLOCK_N 64: 192 B (split score too)
    # 1.53 (mma.sync), 3 buffers, 176-188 registers, 0 B with the scale as a tensor or a float,
    # under 3.9 and 3.6: the value is copied a second time (see _attend_keys), so both fp8 tiles
    # are staged in shared memory; one tile widened for both dots was an unpipelined register
    # load at 254-255 registers
    (32, True): (32, 4, "uniform", 0),
    (16, False): (64, 3, "balanced", 0),  # 1.00 already: 64 keys give each of the 8 warps its own
    (16, True): (32, 3, "balanced", 0),  # 1.53; balanced at BLOCK_N 64: 96 B (split score: 356 B)
}
FP8_BLOCK_H = 32  # an fp8 cache on 64-row tiles spills 392-1064 B in every config compiled
# (BLOCK_N 16-64, 1-3 stages, 8 or 16 warps), 40-56 B with the split score at 32 keys: the
# widening to bf16 needs registers the [64, r] accumulator holds; 32-row tiles (4 per request
# at H = 128, mma.sync) spill none
USE_TMA = True  # TMA descriptor loads for page-aligned tiles of TMA_MIN_BLOCK_H rows and more
TMA_MIN_BLOCK_H = 64  # sm_90 compile: at 64 rows (wgmma) TMA frees the cp.async address registers,
# 32 keys per tile then spill 0 B (252 registers) where pointer loads spill 40 B; at 16 and 32
# rows (mma.sync) TMA spills 500-3200 B where pointer loads spill none

LOG2E = tl.constexpr(1.4426950408889634)  # softmax runs in base 2: exp2 is one MUFU op
LN2 = tl.constexpr(0.6931471805599453)  # lse is returned in natural log
CONFIG_KEYS = ("BLOCK_H", "BLOCK_N", "num_splits", "num_warps", "num_stages", "SPLIT_SCORE")
_DTYPE_NAMES = DTYPE_NAMES
_FP8 = (torch.float8_e4m3fn,) if hasattr(torch, "float8_e4m3fn") else ()
_FITTED: dict = {}  # launch key -> (BLOCK_N, num_stages) that fit shared memory on this GPU


@triton.jit
def _tma_row(p_bt, n0, num_pages, max_pages, PAGE: tl.constexpr):
    """Row of the [blocks * PAGE, r + dR] cache view where the page-aligned tile at key n0 starts.
    One block-table read; a bad page id (validate=False) reads page 0, never out of bounds."""
    b_pg = _tile_page(p_bt, n0, max_pages, PAGE)
    return tl.where((b_pg >= 0) & (b_pg < num_pages), b_pg, 0) * PAGE + n0 % PAGE


@triton.jit
def _tile_page(p_bt, n0, max_pages, PAGE: tl.constexpr):
    """Page id of the page-aligned tile at key n0 (-1 past the block table's width)."""
    i_page = (tl.zeros([], dtype=tl.int32) + n0) // PAGE  # a tensor under the interpreter too
    return tl.load(p_bt + i_page, mask=i_page < max_pages, other=-1)


@triton.jit
def _key_pages(p_bt, o_n, end, max_pages, PAGE: tl.constexpr):
    """Page id of each key position o_n [BLOCK_N] (-1 past end or the block table's width)."""
    o_page = o_n // PAGE
    return tl.load(p_bt + o_page, mask=(o_n < end) & (o_page < max_pages), other=-1)  # [BLOCK_N]


@triton.jit
def _cta_barrier(n0, INTERPRETED: tl.constexpr):
    """bar.sync 0 for every thread of the program, returning 0 as an int32 that the caller adds to
    the addresses it loads next: those loads then stay after the barrier, and Triton's software
    pipeliner keeps the KV loads of the loop in flight (tl.debug_barrier in a loop stops it: sm_90
    compile, 1 KV buffer instead of num_stages). The interpreter runs programs one at a time."""
    if INTERPRETED:
        return n0 * 0
    else:
        return tl.inline_asm_elementwise(
            "bar.sync 0;\n\tmov.u32 $0, 0;", "=r,r", [n0], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def _score_and_accumulate(
    acc, m_i, l_i, b_q, b_qpe, b_kv, b_kpe, b_v, n0, limit, qk_scale, x_p, x_a,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr, SPLIT_SCORE: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """One KV tile of the online softmax: scores of the rows against keys n0 + [0, BLOCK_N), then p @ v.

    SPLIT_SCORE: each score multiply-add is issued once per program. Triton gives a dot whose
    result reaches another dot one warp layout along M only; at 64 rows and 8 warps that makes both
    warpgroups compute the whole [64, BLOCK_N] score (53% of the FLOPs done twice). Here the two
    score dots are scaled and summed (not chained), and the probabilities p and the rescale alpha
    reach the value dot through this program's scratch (x_p [2, BLOCK_H, BLOCK_N], x_a [2,
    BLOCK_H]: global memory that stays in L1/L2; consecutive tiles take the two slots in turn)
    across a barrier, so no score value flows into a dot and Triton splits the score tile's keys
    across the warpgroups. Extra traffic per tile: BLOCK_H x (2 BLOCK_N + 4) bytes written and
    read back, beside the BLOCK_N x (r + dR) KV tile."""
    o_t = tl.arange(0, BLOCK_N)
    o_n = n0 + o_t  # key positions
    if KV_FP8:  # the launcher passes an fp8 cache as uint8; reinterpret, widen exactly
        b_kv = b_kv.to(tl.float8e4nv, bitcast=True).to(b_q.dtype)
        b_kpe = b_kpe.to(tl.float8e4nv, bitcast=True).to(b_q.dtype)
        b_v = b_v.to(tl.float8e4nv, bitcast=True).to(b_q.dtype)
    if DOT_FP32:
        b_kv = b_kv.to(tl.float32)
        b_kpe = b_kpe.to(tl.float32)
        b_v = b_v.to(tl.float32)
    if SPLIT_SCORE:  # scaled before the sum, so the compiler cannot fold it into one chained dot
        b_s = (
            tl.dot(b_q, tl.trans(b_kv), input_precision=DOT_PRECISION) * qk_scale
            + tl.dot(b_qpe, tl.trans(b_kpe), input_precision=DOT_PRECISION) * qk_scale
        )  # [BLOCK_H, BLOCK_N]
    else:
        b_s = tl.dot(b_qpe, tl.trans(b_kpe), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_kv), b_s, input_precision=DOT_PRECISION)
        b_s = b_s * qk_scale
    b_s = tl.where(o_n[None, :] < limit[:, None], b_s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(b_s, 1))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet: no NaN
    b_p = tl.exp2(b_s - m_use[:, None])  # [BLOCK_H, BLOCK_N]
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(b_p, 1)
    if SPLIT_SCORE:
        o_x = tl.arange(0, BLOCK_H)
        i_x = (n0 // BLOCK_N) % 2  # this tile's slot
        o_xp = (i_x * BLOCK_H + o_x[:, None]) * BLOCK_N + o_t[None, :]  # [BLOCK_H, BLOCK_N]
        tl.store(x_p + o_xp, b_p.to(x_p.dtype.element_ty))
        tl.store(x_a + i_x * BLOCK_H + o_x, alpha)
        zero = _cta_barrier(n0, INTERPRETED)  # every warp's part written before any reads
        b_p = tl.load((x_p + zero) + o_xp)  # [BLOCK_H, BLOCK_N]
        alpha = tl.load((x_a + zero) + i_x * BLOCK_H + o_x)  # [BLOCK_H]
    acc = acc * alpha[:, None]
    acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision=DOT_PRECISION)  # [BLOCK_H, R]
    return acc, m_new, l_i


@triton.jit
def _attend_keys(
    acc,
    m_i,
    l_i,
    b_q,
    b_qpe,
    kv,
    kv_desc,
    kpe_desc,
    p_bt,
    stride_kv_blk,
    stride_kv_tok,
    start,
    end,
    limit,
    qk_scale,
    num_pages,
    max_pages,
    x_p,
    x_a,
    R: tl.constexpr,
    DR: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    TMA: tl.constexpr,
    SPLIT_SCORE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Online softmax of one request's rows over its keys [start, end), in tiles of BLOCK_N.

    x_p, x_a: this program's scratch for SPLIT_SCORE ([2, BLOCK_H, BLOCK_N] in q's dtype and
    [2, BLOCK_H] fp32): consecutive tiles take the two slots in turn, so a warp writing tile
    i + 1 never overwrites what a slower warp still reads of tile i; a barrier at the end lets
    the next call (the next request of a balanced program) start on either slot.

    TMA (page-aligned tiles only): kv_desc / kpe_desc are tensor descriptors over the cache as
    [blocks * PAGE, r + dR] with blocks [BLOCK_N, r] and [BLOCK_N, dR]: one bulk copy per tile
    (Hopper's TMA) instead of a pointer per row, which frees the registers of cp.async addresses.

    p_bt points at the request's block-table row. Reads each cache row once: its [r + dR] numbers
    are the key, its first r the value."""
    o_r = tl.arange(0, R)
    o_dr = tl.arange(0, DR)
    o_t = tl.arange(0, BLOCK_N)
    if TMA:
        # whole tiles first: every row is a key of the context (n0 + BLOCK_N <= end <= seqlen), so
        # nothing is masked and the copied tile goes to the tensor cores as it is
        full_end = start + (end - start) // BLOCK_N * BLOCK_N
        row_next = _tma_row(p_bt, start, num_pages, max_pages, PAGE)
        for n0 in range(start, full_end, BLOCK_N):
            # the page id is carried one tile ahead: the copy of tile i + 1 depends on no load of
            # iteration i, so the pipeliner issues it before tile i's dots (sm_90 compile)
            row0 = row_next
            row_next = _tma_row(p_bt, n0 + BLOCK_N, num_pages, max_pages, PAGE)
            b_kv = kv_desc.load([row0, 0])  # [BLOCK_N, R]
            b_kpe = kpe_desc.load([row0, R])  # [BLOCK_N, DR]
            acc, m_i, l_i = _score_and_accumulate(
                acc, m_i, l_i, b_q, b_qpe, b_kv, b_kpe, b_kv, n0, limit, qk_scale, x_p, x_a,
                BLOCK_H, BLOCK_N, KV_FP8, DOT_PRECISION, DOT_FP32, SPLIT_SCORE, INTERPRETED,
            )  # fmt: skip
        if full_end < end:  # the last tile: the rest of its page may hold anything, NaN too
            row0 = row_next  # the page of the tile at full_end, read by the loop's last trip
            m_n = full_end + o_t < end
            b_kv = tl.where(m_n[:, None], kv_desc.load([row0, 0]), 0)  # [BLOCK_N, R]
            b_kpe = tl.where(m_n[:, None], kpe_desc.load([row0, R]), 0)  # [BLOCK_N, DR]
            acc, m_i, l_i = _score_and_accumulate(
                acc, m_i, l_i, b_q, b_qpe, b_kv, b_kpe, b_kv, full_end, limit, qk_scale, x_p, x_a,
                BLOCK_H, BLOCK_N, KV_FP8, DOT_PRECISION, DOT_FP32, SPLIT_SCORE, INTERPRETED,
            )  # fmt: skip
    else:
        # the block-table entries of the next tile are carried one tile ahead, as on the TMA path
        if PAGE % BLOCK_N == 0:
            pg_next = _tile_page(p_bt, start, max_pages, PAGE)  # one page id: the tile lies in one page
        else:
            pg_next = _key_pages(p_bt, start + o_t, end, max_pages, PAGE)  # [BLOCK_N]
        for n0 in range(start, end, BLOCK_N):
            o_n = n0 + o_t  # key positions
            m_n = o_n < end
            if PAGE % BLOCK_N == 0:  # page-aligned: one block-table read per tile, contiguous rows
                b_page = tl.zeros([BLOCK_N], dtype=tl.int32) + pg_next  # [BLOCK_N], one value
                pg_next = _tile_page(p_bt, n0 + BLOCK_N, max_pages, PAGE)
                m_n = m_n & (b_page >= 0) & (b_page < num_pages)  # a bad page id (validate=False) reads zeros
                p_kv = kv + tl.where(m_n, b_page, 0).to(tl.int64) * stride_kv_blk + ((n0 % PAGE) + o_t) * stride_kv_tok
            else:
                b_page = pg_next  # [BLOCK_N]
                pg_next = _key_pages(p_bt, n0 + BLOCK_N + o_t, end, max_pages, PAGE)
                # defence in depth: with validate=False a bad page id reads zeros, never out of bounds
                m_n = m_n & (b_page >= 0) & (b_page < num_pages)
                p_kv = kv + tl.where(m_n, b_page, 0).to(tl.int64) * stride_kv_blk + (o_n % PAGE) * stride_kv_tok
            b_kv = tl.load(p_kv[:, None] + o_r[None, :], mask=m_n[:, None], other=0)  # [BLOCK_N, R]
            b_kpe = tl.load(p_kv[:, None] + R + o_dr[None, :], mask=m_n[:, None], other=0)  # [BLOCK_N, DR]
            if KV_FP8:  # the value part copied a second time (the copies run together: HBM once, L2
                # twice; .cg keeps the two loads apart): each load then feeds one dot and Triton
                # stages it in shared memory a tile ahead. One load widened for both dots stayed
                # an unpipelined register load (sm_90 compile: 1 tile in flight, 254-255 registers)
                b_v = tl.load(p_kv[:, None] + o_r[None, :], mask=m_n[:, None], other=0, cache_modifier=".cg")
            else:
                b_v = b_kv
            acc, m_i, l_i = _score_and_accumulate(
                acc, m_i, l_i, b_q, b_qpe, b_kv, b_kpe, b_v, n0, limit, qk_scale, x_p, x_a,
                BLOCK_H, BLOCK_N, KV_FP8, DOT_PRECISION, DOT_FP32, SPLIT_SCORE, INTERPRETED,
            )  # fmt: skip
    if SPLIT_SCORE:
        tl.debug_barrier()  # the last tile's slot is read by every warp before anyone reuses it
    return acc, m_i, l_i


@triton.jit
def _tile_rows(pid_h, H: tl.constexpr, S_Q: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rows of row tile pid_h: (new token s, head h) flattened as s * H + h, padded to BLOCK_H.
    Returns (o_row, m_row, o_s, o_hh), each [BLOCK_H]."""
    o_row = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    return o_row, o_row < S_Q * H, o_row // H, o_row % H


@triton.jit
def _attend_request(
    p_q, m_row, o_s, seqlen, start, end, kv, kv_desc, kpe_desc, p_bt, stride_kv_blk, stride_kv_tok,
    qk_scale, kv_scale, num_pages, max_pages, x_p, x_a,
    S_Q: tl.constexpr, R: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr, TMA: tl.constexpr, SPLIT_SCORE: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """One request's rows (query pointers p_q [BLOCK_H]) over its keys [start, end): the
    normalised output [BLOCK_H, R] (fp32) and its natural-log LSE [BLOCK_H] (-inf: no key).

    Traffic: the rows' queries once ([BLOCK_H, r + dR]), then every cache row of [start, end)
    once (`_attend_keys`). Shared by the uniform (split) and the balanced (planned) kernels."""
    o_r = tl.arange(0, R)
    o_dr = tl.arange(0, DR)
    b_q = tl.load(p_q[:, None] + o_r[None, :], mask=m_row[:, None], other=0.0)  # [BLOCK_H, R]
    b_qpe = tl.load(p_q[:, None] + R + o_dr[None, :], mask=m_row[:, None], other=0.0)  # [BLOCK_H, DR]
    if DOT_FP32:  # Triton's interpreter multiplies bf16 bit patterns in tl.dot: widen to fp32
        b_q = b_q.to(tl.float32)
        b_qpe = b_qpe.to(tl.float32)
    # keys at positions < limit are visible to a row (new token s sits at seqlen - S_Q + s)
    if CAUSAL:
        limit = seqlen - S_Q + 1 + o_s  # [BLOCK_H]
    else:
        limit = tl.zeros([BLOCK_H], dtype=tl.int32) + seqlen  # [BLOCK_H]
    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)  # running max, base 2
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_H, R], dtype=tl.float32)  # one [64, 512] fp32 accumulator over 8 warps:
    # Triton splits its columns across the two warpgroups (128 registers/thread); splitting the
    # value dim across programs instead would recompute the scores (53% of the FLOPs) twice.
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, b_q, b_qpe, kv, kv_desc, kpe_desc, p_bt, stride_kv_blk, stride_kv_tok,
        start, end, limit, qk_scale, num_pages, max_pages, x_p, x_a,
        R, DR, PAGE, BLOCK_H, BLOCK_N, KV_FP8, DOT_PRECISION, DOT_FP32, TMA, SPLIT_SCORE, INTERPRETED,
    )  # fmt: skip
    has_keys = l_i > 0
    b_o = acc * (kv_scale / tl.where(has_keys, l_i, 1.0))[:, None]  # [BLOCK_H, R]
    b_lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2, -float("inf"))  # [BLOCK_H]
    return b_o, b_lse


@triton.jit
def _store_rows(p_o, p_lse, b_o, b_lse, m_row, R: tl.constexpr):
    """Write a tile's outputs (row pointers p_o [BLOCK_H], in p_o's dtype) and LSEs (p_lse [BLOCK_H])."""
    o_r = tl.arange(0, R)
    tl.store(p_o[:, None] + o_r[None, :], b_o.to(p_o.dtype.element_ty), mask=m_row[:, None])
    tl.store(p_lse, b_lse, mask=m_row)


@triton.jit
def merge_splits(p_lse, p_o, num_splits, stride_q_split, stride_p_split, R: tl.constexpr):
    """The LSE-weighted merge of one row's `num_splits` partial outputs (mla_decode's and
    mla_sparse_decode's second stage): p_lse points at its first split's natural-log LSE, p_o at
    its first [R] output; returns (output [R] fp32, LSE)."""
    o_r = tl.arange(0, R)
    m = tl.full([], -float("inf"), dtype=tl.float32)
    for k in range(num_splits):
        m = tl.maximum(m, tl.load(p_lse + k * stride_q_split))
    m_use = tl.where(m == -float("inf"), 0.0, m)  # every split empty: all weights 0, no NaN
    w_sum = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([R], dtype=tl.float32)
    for k in range(num_splits):
        w_k = tl.exp2((tl.load(p_lse + k * stride_q_split) - m_use) * LOG2E)
        w_sum += w_k
        acc += w_k * tl.load(p_o + k * stride_p_split + o_r)  # [R]; an empty split wrote zeros
    has_keys = w_sum > 0  # a row whose splits all saw no key gets 0 and LSE -inf
    b_o = acc / tl.where(has_keys, w_sum, 1.0)
    return b_o, tl.where(has_keys, m_use + tl.log(tl.where(has_keys, w_sum, 1.0)), -float("inf"))


# ints that change with the batch (block-table width, split count and the strides that follow
# it) are not specialised on: a new batch shape reuses the compiled kernel (tests/test_decode.py
# counts Triton's cache keys across batches)
_BATCH_INTS = ["stride_bt", "num_pages", "max_pages", "stride_lb", "stride_ls", "stride_lh"]


@triton.jit(do_not_specialize=_BATCH_INTS + ["stride_l_split", "num_splits"])
def _mla_decode_split_kernel(
    q,
    kv,
    kv_desc,
    kpe_desc,
    x_p,
    x_a,
    block_table,
    seqlens,
    kv_scale_ptr,
    o,
    lse,
    qk_scale,
    kv_scale,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kv_blk,
    stride_kv_tok,
    stride_bt,
    stride_ob,
    stride_os,
    stride_oh,
    stride_o_split,
    stride_lb,
    stride_ls,
    stride_lh,
    stride_l_split,
    num_pages,
    max_pages,
    num_splits,
    H: tl.constexpr,
    S_Q: tl.constexpr,
    R: tl.constexpr,
    DR: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_SCALE_FROM_PTR: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    TMA: tl.constexpr,
    SPLIT_SCORE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """One (row tile, split, request): online softmax over the split's keys, normalised output.

    qk_scale = softmax scale * kv_scale * log2(e): the softmax runs in base 2 (exp2).
    Traffic: reads the tile's queries once ([BLOCK_H, r + dR]), every cache row of the split once
    (r + dR numbers, used as key and, its first r, as value) and the split's block-table entries;
    writes [BLOCK_H, r] outputs and BLOCK_H LSEs (fp32 partials when there are several splits).
    """
    pid_h = tl.program_id(0)
    pid_split = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)  # B x rows x splits x r partials can pass 2**31
    if KV_SCALE_FROM_PTR:
        kv_scale = tl.load(kv_scale_ptr).to(tl.float32)
        qk_scale = qk_scale * kv_scale
    seqlen = tl.load(seqlens + pid_b)
    o_row, m_row, o_s, o_hh = _tile_rows(pid_h, H, S_Q, BLOCK_H)
    i_x = (pid_b * num_splits + pid_split) * tl.num_programs(0) + pid_h  # this program's scratch

    # this split's keys: a contiguous run of whole BLOCK_N tiles, the last one cut at seqlen
    n_tiles = tl.cdiv(seqlen, BLOCK_N)
    tiles_per_split = tl.cdiv(n_tiles, num_splits)
    start = pid_split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seqlen)

    b_o, b_lse = _attend_request(
        q + pid_b * stride_qb + o_s * stride_qs + o_hh * stride_qh, m_row, o_s, seqlen, start, end,
        kv, kv_desc, kpe_desc, block_table + pid_b * stride_bt, stride_kv_blk, stride_kv_tok,
        qk_scale, kv_scale, num_pages, max_pages, x_p + i_x * 2 * BLOCK_H * BLOCK_N, x_a + i_x * 2 * BLOCK_H,
        S_Q, R, DR, PAGE, BLOCK_H, BLOCK_N, CAUSAL, KV_FP8, DOT_PRECISION, DOT_FP32, TMA, SPLIT_SCORE,
        INTERPRETED,
    )  # fmt: skip
    p_o = o + pid_b * stride_ob + o_s * stride_os + o_hh * stride_oh + pid_split * stride_o_split
    p_lse = lse + pid_b * stride_lb + o_s * stride_ls + o_hh * stride_lh + pid_split * stride_l_split
    _store_rows(p_o, p_lse, b_o, b_lse, m_row, R)


@triton.jit(do_not_specialize=_BATCH_INTS + ["fixed"])
def _mla_decode_planned_kernel(
    q,
    kv,
    kv_desc,
    kpe_desc,
    x_p,
    x_a,
    block_table,
    seqlens,
    kv_scale_ptr,
    o,
    lse,
    o_part,
    lse_part,
    cuts,
    b_first,
    b_last,
    starts,
    first_part,
    n_splits,
    slots,
    qk_scale,
    kv_scale,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kv_blk,
    stride_kv_tok,
    stride_bt,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_ls,
    stride_lh,
    num_pages,
    max_pages,
    fixed,
    H: tl.constexpr,
    S_Q: tl.constexpr,
    R: tl.constexpr,
    DR: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_SCALE_FROM_PTR: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    TMA: tl.constexpr,
    SPLIT_SCORE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """One (row tile, part) of a balanced plan (kernels/schedule.py): a persistent program walks
    the requests its part of the work line touches, each from its first to its last tile there.

    A request wholly inside the part gets its final output and LSE written here; a piece of a
    split request writes an fp32 partial to its slot in o_part [slots, S_q * H, r] and lse_part.
    Traffic per piece as `_mla_decode_split_kernel`: the query tile once, each cache row once.
    """
    pid_h = tl.program_id(0)
    pid_p = tl.program_id(1)
    if KV_SCALE_FROM_PTR:
        kv_scale = tl.load(kv_scale_ptr).to(tl.float32)
        qk_scale = qk_scale * kv_scale
    x0 = tl.load(cuts + pid_p)
    x1 = tl.load(cuts + pid_p + 1)
    o_row, m_row, o_s, o_hh = _tile_rows(pid_h, H, S_Q, BLOCK_H)
    i_x = (pid_p * tl.num_programs(0) + pid_h).to(tl.int64)  # this program's scratch
    for b in range(tl.load(b_first + pid_p), tl.load(b_last + pid_p) + 1):
        i_b = tl.full([], 0, tl.int64) + b  # (the interpreter hands range() ints)
        seqlen = tl.load(seqlens + i_b)
        n_tiles = tl.cdiv(seqlen, BLOCK_N)
        start_b = tl.load(starts + i_b) + fixed
        t0 = tl.minimum(tl.maximum(x0 - start_b, 0), n_tiles)
        t1 = tl.minimum(tl.maximum(x1 - start_b, 0), n_tiles)
        owner = (n_tiles == 0) & (x0 <= start_b - fixed) & (start_b - fixed < x1)
        if (t1 > t0) | owner:
            b_o, b_lse = _attend_request(
                q + i_b * stride_qb + o_s * stride_qs + o_hh * stride_qh, m_row, o_s, seqlen,
                t0 * BLOCK_N, tl.minimum(t1 * BLOCK_N, seqlen),
                kv, kv_desc, kpe_desc, block_table + i_b * stride_bt, stride_kv_blk, stride_kv_tok,
                qk_scale, kv_scale, num_pages, max_pages, x_p + i_x * 2 * BLOCK_H * BLOCK_N, x_a + i_x * 2 * BLOCK_H,
                S_Q, R, DR, PAGE, BLOCK_H, BLOCK_N, CAUSAL, KV_FP8, DOT_PRECISION, DOT_FP32, TMA, SPLIT_SCORE,
                INTERPRETED,
            )  # fmt: skip
            if tl.load(n_splits + i_b) > 1:  # a piece of a split request: fp32, to its partial slot
                slot = (tl.load(slots + i_b) + pid_p - tl.load(first_part + i_b)).to(tl.int64)
                _store_rows(o_part + (slot * S_Q * H + o_row) * R, lse_part + slot * S_Q * H + o_row,
                            b_o, b_lse, m_row, R)  # fmt: skip
            else:  # the whole request: its final output
                p_o = o + i_b * stride_ob + o_s * stride_os + o_hh * stride_oh
                _store_rows(p_o, lse + i_b * stride_lb + o_s * stride_ls + o_hh * stride_lh, b_o, b_lse, m_row, R)


@triton.jit
def _mla_decode_planned_merge_kernel(
    o_part,
    lse_part,
    n_splits,
    slots,
    o,
    lse,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_ls,
    stride_lh,
    H: tl.constexpr,
    S_Q: tl.constexpr,
    R: tl.constexpr,
):
    """One (row, request): LSE-weighted sum of a split request's pieces; unsplit ones return."""
    pid_row = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    n = tl.load(n_splits + pid_b)
    if n > 1:
        i_row = tl.load(slots + pid_b).to(tl.int64) * S_Q * H + pid_row  # its first piece's row
        b_o, b_lse = merge_splits(lse_part + i_row, o_part + i_row * R, n, S_Q * H, S_Q * H * R, R)
        o_r = tl.arange(0, R)
        i_s = pid_row // H
        i_h = pid_row % H
        tl.store(o + pid_b * stride_ob + i_s * stride_os + i_h * stride_oh + o_r, b_o.to(o.dtype.element_ty))
        tl.store(lse + pid_b * stride_lb + i_s * stride_ls + i_h * stride_lh, b_lse)


@triton.jit(do_not_specialize=["stride_qb", "stride_qs", "stride_qh", "stride_q_split", "num_splits"])
def _mla_decode_merge_kernel(
    o_part,
    lse_part,
    o,
    lse,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_p_split,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_q_split,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_ls,
    stride_lh,
    num_splits,
    H: tl.constexpr,
    R: tl.constexpr,
):
    """One (request, new token, head) row: LSE-weighted sum of its splits' partial outputs
    (num_splits at run time: one compile serves every split count)."""
    pid_row = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    i_s = pid_row // H
    i_h = pid_row % H
    o_r = tl.arange(0, R)

    p_lse = lse_part + pid_b * stride_qb + i_s * stride_qs + i_h * stride_qh
    p_o = o_part + pid_b * stride_pb + i_s * stride_ps + i_h * stride_ph
    b_o, b_lse_out = merge_splits(p_lse, p_o, num_splits, stride_q_split, stride_p_split, R)
    p_out = o + pid_b * stride_ob + i_s * stride_os + i_h * stride_oh
    tl.store(p_out + o_r, b_o.to(o.dtype.element_ty))
    tl.store(lse + pid_b * stride_lb + i_s * stride_ls + i_h * stride_lh, b_lse_out)


def _empty(shape, dtype, device):
    """Every buffer the launcher allocates comes from here (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _is_pow2_at_least(x, low):
    return isinstance(x, int) and not isinstance(x, bool) and x >= low and x & (x - 1) == 0


def smem_bytes(block_h, block_n, stages, row, q_bytes, kv_bytes, fp8, r=None, split_score=False):
    """Shared memory of one program as Triton lays it out for sm_90 (checked against the compiler
    for the DeepSeek shapes, tests/test_decode.py): the query tile, the KV buffers (num_stages of
    them for TMA tiles, num_stages - 1 for cp.async ones: the page ids are carried one tile
    ahead; an fp8 tile's value part twice, see _attend_keys), and 2 KiB of scratch; with
    `r`, at least the [BLOCK_H, r] fp32 accumulator, which the epilogue converts through shared
    memory (128 KiB at 64 rows: more than the loop's buffers once BLOCK_N is 16); with
    split_score, the [BLOCK_H, BLOCK_N] p tile the value dot reads from shared memory."""
    buffers = stages if block_h >= TMA_MIN_BLOCK_H else max(1, stages - 1)
    per_key = row + ((r or row) if fp8 else 0)  # an fp8 tile's value part is copied a second time
    loop = block_h * row * q_bytes + buffers * block_n * per_key * kv_bytes + 2048
    loop += block_h * block_n * q_bytes if split_score else 0
    return max(loop, block_h * r * 4) if r else loop


def heuristic_config(B, H, S_q, r, dR, ctx, block_size, q_dtype, kv_dtype, num_sms):
    """The launch config without a tuned one: wide tiles, smem-fitting KV tiles, split-KV to
    ~WAVES waves, never more splits than pages or tiles of the longest context."""
    rows = S_q * H
    block_h = min(BLOCK_H_WIDE, max(BLOCK_H_MIN, triton.next_power_of_2(rows)))
    row = r + dR
    q_bytes = torch.finfo(q_dtype).bits // 8
    kv_bytes = torch.finfo(kv_dtype).bits // 8
    fp8 = kv_dtype in _FP8
    if fp8:
        block_h = min(block_h, FP8_BLOCK_H)
    block_n, stages = BLOCK_N_CHOICES[-1]
    for bn, st in BLOCK_N_CHOICES:
        if smem_bytes(block_h, bn, st, row, q_bytes, kv_bytes, fp8, r) <= SMEM_BUDGET:
            block_n, stages = bn, st
            break
    split_score = 0
    if (block_h, fp8) in NO_SPILL and (r, dR) == (512, 64):  # the DeepSeek latent the sweep compiled
        bn, st, _, split = NO_SPILL[block_h, fp8]
        if smem_bytes(block_h, bn, st, row, q_bytes, kv_bytes, fp8, r, split) <= SMEM_BUDGET:
            block_n, stages, split_score = bn, st, split
    num_warps = 8 if block_h * r >= WARPS_8_FROM else 4
    programs = B * triton.cdiv(rows, block_h)
    most = min(MAX_SPLITS, triton.cdiv(ctx, block_size), triton.cdiv(ctx, block_n), triton.cdiv(ctx, MIN_SPLIT_TOKENS))
    splits = max(1, min(most, round(WAVES * num_sms / max(programs, 1))))
    return {
        "BLOCK_H": block_h,
        "BLOCK_N": block_n,
        "num_splits": splits,
        "num_warps": num_warps,
        "num_stages": stages,
        "SPLIT_SCORE": split_score,
    }


_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": _FP8[0] if _FP8 else None}
H200_SMS = 132  # the compile stage sizes splits for an H200 when no GPU says otherwise


def default_config(shape: dict, r: int, dR: int, page: int, dtype: str, kv_dtype: str, num_sms: int = H200_SMS) -> dict:
    """The heuristic config for a shape bucket {B, H, S_q, ctx}, without a GPU (compile stage)."""
    cfg = heuristic_config(
        shape["B"], shape["H"], shape["S_q"], r, dR, shape["ctx"], page,
        _TORCH_DTYPES[dtype], _TORCH_DTYPES[kv_dtype], num_sms,
    )  # fmt: skip
    cfg["BLOCK_H"] = min(cfg["BLOCK_H"], max(BLOCK_H_MIN, triton.next_power_of_2(shape["S_q"] * shape["H"])))
    return cfg


def default_variant(config: dict, fp8: bool = False) -> str:
    """The stage-1 kernel schedule="auto" runs for a config without an explicit num_splits: the
    one NO_SPILL lists for its tile height (else balanced under 64 rows, uniform at 64)."""
    found = NO_SPILL.get((config["BLOCK_H"], bool(fp8)))
    if found:
        return found[2]
    return "balanced" if config["BLOCK_H"] < 64 else "uniform"


def compile_spec(
    shape: dict,
    config: dict,
    r: int,
    dR: int,
    page: int,
    dtype: str,
    kv_dtype: str,
    causal=True,
    variant=None,
    capability: int = 90,
    kv_scale: str = "tensor",
    stage: str = "stage1",
):
    """What `mlactl tune compile` needs to build stage 1 for a GPU target without launching it:
    (jit function, signature, constants, argument names divisible by 16, compile options, launch),
    built as `mla_decode` launches it: the schedule `launch_variant` picks (a config with its own
    num_splits runs uniform), the split count of the config or the heuristic, and the output
    dtype that split count implies (one split: stage 1 writes q's dtype; several: fp32 partials).
    `launch` is {"variant", "num_splits", "out_dtype", "kv_scale", "stage"} as recorded in the
    compile report. variant: "balanced" or "uniform" to force one (schedule= of mla_decode).
    kv_scale: how an fp8 cache's scale is passed, "tensor" (read on the device) or "float".
    stage: "stage1", or "merge" for the merge the launch runs after it (uniform with several
    splits: `_mla_decode_merge_kernel`; balanced: `_mla_decode_planned_merge_kernel`)."""
    fp8 = kv_dtype == "fp8"
    full = {**default_config(shape, r, dR, page, dtype, kv_dtype), **config}
    variant = launch_variant(full, fp8, "num_splits" in config, variant or "auto")
    splits = full["num_splits"] if variant == "uniform" else 1
    from_ptr = fp8 and kv_scale == "tensor"
    consts = _constants(shape["H"], shape["S_q"], r, dR, page, full["BLOCK_H"], causal, fp8, from_ptr,
                        dtype == "fp32", False, full.get("SPLIT_SCORE", 0))  # fmt: skip
    consts["BLOCK_N"] = full["BLOCK_N"]
    consts["TMA"] = (  # as _descriptors decides
        USE_TMA and full["BLOCK_H"] >= TMA_MIN_BLOCK_H and page % full["BLOCK_N"] == 0 and capability >= 90
    )
    if stage == "merge":
        return _merge_spec(shape, r, dtype, variant, splits, kv_scale)
    kv_type = "u8" if fp8 else dtype
    if consts["TMA"]:
        desc = {"kv_desc": f"tensordesc<{kv_type}[{full['BLOCK_N']}, {r}]>"}
        desc["kpe_desc"] = f"tensordesc<{kv_type}[{full['BLOCK_N']}, {dR}]>"
    else:
        desc = {"kv_desc": f"*{kv_type}", "kpe_desc": f"*{kv_type}"}
    out_dtype = dtype if variant == "balanced" or splits == 1 else "fp32"
    types = dict(q=f"*{dtype}", kv="*u8" if fp8 else f"*{dtype}", block_table="*i32", seqlens="*i32", **desc,
                 kv_scale_ptr="*fp32", o=f"*{out_dtype}", lse="*fp32", qk_scale="fp32", kv_scale="fp32",
                 x_p=f"*{dtype}", x_a="*fp32")  # fmt: skip
    aligned = ["q", "kv", "o", "lse", "x_p", "x_a", "stride_qb", "stride_qs", "stride_qh", "stride_kv_blk",
               "stride_kv_tok", "stride_ob", "stride_os", "stride_oh"]  # fmt: skip
    if variant == "balanced":
        fn = _mla_decode_planned_kernel
        types.update(o_part="*fp32", lse_part="*fp32")
        types.update({n: "*i32" for n in ("cuts", "b_first", "b_last", "starts", "first_part", "n_splits", "slots")})
        aligned += ["o_part", "lse_part"]
    else:
        fn = _mla_decode_split_kernel
        aligned.append("stride_o_split")  # 0 with one split: divisible by 16 too
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    options = {"num_warps": full["num_warps"], "num_stages": full["num_stages"]}
    launch = {"variant": variant, "num_splits": splits, "out_dtype": out_dtype, "kv_scale": kv_scale, "stage": stage}
    return fn, sig, consts, aligned, options, launch


def _merge_spec(shape, r, dtype, variant, splits, kv_scale):
    """compile_spec of the merge a launch runs after stage 1 (4 warps, as launched)."""
    if variant == "balanced":
        fn = _mla_decode_planned_merge_kernel
        consts = {"H": shape["H"], "S_Q": shape["S_q"], "R": r}
        types = {"o_part": "*fp32", "lse_part": "*fp32", "n_splits": "*i32", "slots": "*i32", "o": f"*{dtype}",
                 "lse": "*fp32"}  # fmt: skip
    else:
        fn = _mla_decode_merge_kernel
        consts = {"H": shape["H"], "R": r}
        types = {"o_part": "*fp32", "lse_part": "*fp32", "o": f"*{dtype}", "lse": "*fp32"}
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    aligned = [n for n in ("o_part", "lse_part", "o", "lse", "stride_pb", "stride_ps", "stride_ph", "stride_p_split",
                           "stride_ob", "stride_os", "stride_oh") if n in fn.arg_names]  # fmt: skip
    launch = {"variant": variant, "num_splits": splits, "out_dtype": dtype, "kv_scale": kv_scale, "stage": "merge"}
    return fn, sig, consts, aligned, {"num_warps": 4, "num_stages": 1}, launch


def launch_variant(config: dict, fp8: bool, explicit_splits: bool, schedule: str = "auto") -> str:
    """The stage-1 kernel mla_decode runs: schedule= when it names one, uniform when a split count
    is given (argument, config or tuned config), else the one NO_SPILL lists (default_variant)."""
    if schedule not in ("auto", "balanced", "uniform"):
        raise ValueError(f"schedule must be auto, balanced or uniform, got {schedule!r}")
    if schedule != "auto":
        return schedule
    return "uniform" if explicit_splits else default_variant(config, fp8)


def _constants(H, S_q, r, dR, page, block_h, causal, fp8, from_ptr, fp32, dot_fp32, split_score):
    return dict(
        H=H,
        S_Q=S_q,
        R=r,
        DR=dR,
        PAGE=page,
        BLOCK_H=block_h,
        CAUSAL=bool(causal),
        KV_FP8=fp8,
        KV_SCALE_FROM_PTR=from_ptr,
        DOT_PRECISION="ieee" if fp32 else "tf32",
        DOT_FP32=dot_fp32,
        SPLIT_SCORE=bool(split_score),
        INTERPRETED=interpreting(),
    )


def _check_config(config, source):
    return configs.check_config(
        config,
        source,
        pow2={"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 1},
        positive=("num_splits", "num_stages"),
        flags=("SPLIT_SCORE",),
    )


def _check_inputs(q, kv_cache, block_table, cache_seqlens, r, causal, kv_scale, validate):
    """Shape, dtype and device checks; returns (kv_cache as 3-D, r, dR, max context)."""
    check_tensor("q", q, 4, tuple(_DTYPE_NAMES), contiguous=False)
    kv_cache = latent_cache(kv_cache)
    check_tensor("kv_cache", kv_cache, 3, tuple(_DTYPE_NAMES) + _FP8, contiguous=False)
    check_tensor("block_table", block_table, 2, (torch.int32,), contiguous=False)
    check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,))
    check_unit_stride(q=q, kv_cache=kv_cache, block_table=block_table)
    check_device(q=q, kv_cache=kv_cache, block_table=block_table, cache_seqlens=cache_seqlens)
    B, S_q, H, row = q.shape
    r = latent_rank(row, r)
    dR = row - r
    for name, value in (("r", r), ("dR", dR)):
        if not _is_pow2_at_least(value, 16):
            raise ValueError(f"{name}={value} must be a power of two >= 16 (r + dR = {row}, r = {r})")
    check_dim("kv_cache", kv_cache, 2, row, "q.shape[-1] = r + dR")
    check_dim("block_table", block_table, 0, B, "the batch size q.shape[0]")
    check_dim("cache_seqlens", cache_seqlens, 0, B, "the batch size q.shape[0]")
    if kv_cache.shape[1] < 1:
        raise ValueError(f"kv_cache has block_size 0 (shape {tuple(kv_cache.shape)})")
    fp8 = kv_cache.dtype in _FP8
    if not fp8 and kv_cache.dtype != q.dtype:
        raise ValueError(
            f"kv_cache has dtype {kv_cache.dtype} but q has {q.dtype}; they must match "
            "(or the cache is fp8 e4m3 with kv_scale)"
        )
    if fp8 and kv_scale is None:
        raise ValueError("kv_scale is required with an fp8 kv_cache (real value = fp8 value * kv_scale)")
    if isinstance(kv_scale, torch.Tensor):
        if kv_scale.numel() != 1 or kv_scale.dtype not in _DTYPE_NAMES:
            raise ValueError(
                f"kv_scale must be a float or a 1-element float tensor, got shape "
                f"{tuple(kv_scale.shape)} {kv_scale.dtype}"
            )
        if kv_scale.device != q.device:
            raise ValueError(f"kv_scale is on {kv_scale.device} but q on {q.device}")
        if validate:
            _check_positive("kv_scale", kv_scale.item())
    elif kv_scale is not None:
        _check_positive("kv_scale", kv_scale)

    block_size = kv_cache.shape[1]
    if not validate:
        return kv_cache, r, dR, block_table.shape[1] * block_size
    lens = cache_seqlens.tolist()  # one device sync
    for b, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"cache_seqlens[{b}] = {n} is negative")
        if causal and 0 < n < S_q:
            raise ValueError(
                f"cache_seqlens[{b}] = {n} is below S_q={S_q}: causal new tokens must "
                "all be in the cache (0 marks an empty request)"
            )
    need = triton.cdiv(max(lens, default=0), block_size)
    if need > block_table.shape[1]:
        raise ValueError(
            f"block_table has {block_table.shape[1]} columns but cache_seqlens needs "
            f"{need} blocks of {block_size} (max length {max(lens)})"
        )
    if need:
        pages = (cache_seqlens.long() + block_size - 1) // block_size  # [B] pages in use
        used = torch.arange(need, device=block_table.device)[None, :] < pages[:, None]  # [B, need]
        ids = block_table[:, :need][used]
        low, high = torch.stack([ids.min(), ids.max()]).tolist()  # one more sync
        if low < 0 or high >= kv_cache.shape[0]:
            raise ValueError(
                f"block_table has block ids outside [0, {kv_cache.shape[0]}) in the "
                f"entries cache_seqlens uses (min {low}, max {high})"
            )
    return kv_cache, r, dR, max(lens, default=0)


def _check_positive(name, value):
    try:
        return check_scale(value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("softmax scale", name)) from None


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: float,
    *,
    causal: bool = True,
    kv_scale: float | torch.Tensor | None = None,
    r: int | None = None,
    num_splits: int | None = None,
    config: dict | None = None,
    validate: bool = True,
    out: torch.Tensor | None = None,
    schedule: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorb-path MLA attention of S_q new tokens per request against a paged latent cache.

    Args:
        q: [B, S_q, H, r + dR] fp16/bf16/fp32, RoPE part last; last dim contiguous.
        kv_cache: [num_blocks, block_size, r + dR] (or [num_blocks, block_size, 1, r + dR]) in
            q's dtype, or float8_e4m3fn with `kv_scale`; last dim contiguous.
        block_table: [B, max_blocks] int32 page ids, in token order (any page order).
        cache_seqlens: [B] int32 context lengths including the S_q new tokens (0: empty request).
        scale: softmax scale of the model, 1/sqrt(dC + dR).
        causal: new token i sits at cache_seqlens[b] - S_q + i and sees keys up to there.
        kv_scale: float or 1-element tensor on q's device; real cache value = stored * kv_scale.
        r: latent rank; default 512 for a 576-wide row.
        num_splits: split-KV factor (wins over `config`); else tuned config, else heuristic.
        config: dict with any of BLOCK_H, BLOCK_N, num_splits, num_warps, num_stages and
            SPLIT_SCORE (0 or 1: the score tile split across warpgroups, see _score_and_accumulate).
        validate: read cache_seqlens and block_table to check them (one device sync). With False
            the heuristic sizes splits by block_table's width instead of the longest context.
        out: optional [B, S_q, H, r] tensor in q's dtype to write the output into.
        schedule: "balanced" (kernels/schedule.py: each SM an equal share of the batch's KV
            tiles, only long requests split), "uniform" (every request in num_splits equal
            splits), or "auto": uniform when num_splits is given (argument, config or tuned
            config), else the schedule NO_SPILL lists for the tile (uniform at 64 rows).

    Returns:
        (out [B, S_q, H, r] in q's dtype, lse [B, S_q, H] fp32 natural-log LSE of scaled scores).

    Raises:
        ValueError: on any bad input, before anything is launched.
    """
    scale = check_scale(scale)
    kv_cache, r, dR, ctx = _check_inputs(q, kv_cache, block_table, cache_seqlens, r, causal, kv_scale, validate)
    B, S_q, H, _ = q.shape
    device = q.device
    out, lse = out_and_lse(q, out, r, _empty)
    if B == 0 or H == 0 or S_q == 0:
        return out, lse

    device_name, num_sms = device_info(device)
    cfg = heuristic_config(B, H, S_q, r, dR, max(ctx, 1), kv_cache.shape[1], q.dtype, kv_cache.dtype, num_sms)
    dtype_name = ("fp8" if kv_cache.dtype in _FP8 else _DTYPE_NAMES[kv_cache.dtype]) if config is None else ""
    chosen = configs.choose(
        "mla_decode",
        cfg,
        config,
        _check_config,
        device_name,
        dtype_name,
        num_splits,
        B=B,
        H=H,
        S_q=S_q,
        ctx=max(ctx, 1),
    )
    explicit_splits = num_splits is not None or "num_splits" in chosen
    # a tile taller than the (new token, head) rows of one request only multiplies padding
    cfg["BLOCK_H"] = min(cfg["BLOCK_H"], max(BLOCK_H_MIN, triton.next_power_of_2(S_q * H)))

    fp8 = kv_cache.dtype in _FP8
    kv_arg = kv_cache.view(torch.uint8) if fp8 else kv_cache
    if isinstance(kv_scale, torch.Tensor):
        scale_ptr, kv_scale_val, from_ptr = kv_scale.reshape(1), 1.0, True  # read on device
    else:
        kv_scale_val = 1.0 if kv_scale is None else float(kv_scale)
        scale_ptr, from_ptr = cache_seqlens, False  # the pointer is unused: any tensor will do
    if launch_variant(cfg, fp8, explicit_splits, schedule) == "balanced":
        _run_balanced(q, kv_arg, kv_cache, block_table, cache_seqlens, scale_ptr, out, lse, scale, kv_scale_val,
                      from_ptr, cfg, causal, r, dR, num_sms, device)  # fmt: skip
        return out, lse
    splits = cfg["num_splits"]
    if splits == 1:  # one split: stage 1 writes the final output, no merge
        o1, lse1 = out, lse
        o1_strides = (*out.stride()[:3], 0)
        lse1_strides = (*lse.stride(), 0)
    else:
        o1 = _empty((B, S_q, H, splits, r), torch.float32, device)
        lse1 = _empty((B, S_q, H, splits), torch.float32, device)
        o1_strides = o1.stride()[:4]
        lse1_strides = lse1.stride()
    grid = (triton.cdiv(S_q * H, cfg["BLOCK_H"]), splits, B)
    args = (
        q,
        kv_arg,
        block_table,
        cache_seqlens,
        scale_ptr,
        o1,
        lse1,
        scale * kv_scale_val * LOG2E.value,
        kv_scale_val,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        kv_cache.stride(0),
        kv_cache.stride(1),
        block_table.stride(0),
        *o1_strides,
        *lse1_strides,
        kv_cache.shape[0],
        block_table.shape[1],
        splits,
    )
    constants = _constants(
        H,
        S_q,
        r,
        dR,
        kv_cache.shape[1],
        cfg["BLOCK_H"],
        causal,
        fp8,
        from_ptr,
        q.dtype == torch.float32,
        q.dtype == torch.bfloat16 and device.type != "cuda",
        cfg.get("SPLIT_SCORE", 0),
    )
    _launch_split(grid, args, constants, cfg, device)
    if splits > 1:
        _mla_decode_merge_kernel[(S_q * H, B)](
            o1,
            lse1,
            out,
            lse,
            *o1.stride()[:4],
            *lse1.stride(),
            *out.stride()[:3],
            *lse.stride(),
            splits,
            H=H,
            R=r,
            num_warps=4,
        )
    return out, lse


def _run_balanced(q, kv_arg, kv_cache, block_table, seqlens, scale_ptr, out, lse, scale, kv_scale_val, from_ptr,
                  cfg, causal, r, dR, num_sms, device):  # fmt: skip
    """Plan the batch on the device (kernels/schedule.py), then the persistent stage 1 and the
    merge of the split requests only. No host sync: the plan's shapes depend on (B, P) alone."""
    B, S_q, H, _ = q.shape
    rows = S_q * H
    fp8 = kv_cache.dtype in _FP8
    n_h = triton.cdiv(rows, cfg["BLOCK_H"])
    parts = max(1, num_sms // n_h)  # one program per SM: n_h row tiles x parts
    q_bytes = q.element_size()
    kv_bytes = kv_cache.element_size()
    constants = _constants(H, S_q, r, dR, kv_cache.shape[1], cfg["BLOCK_H"], causal, fp8, from_ptr,
                           q.dtype == torch.float32, q.dtype == torch.bfloat16 and device.type != "cuda",
                           cfg.get("SPLIT_SCORE", 0))  # fmt: skip
    key = (device, "balanced", *sorted(constants.items()), cfg["BLOCK_N"], cfg["num_stages"], cfg["num_warps"])
    tries = [_FITTED.get(key, (cfg["BLOCK_N"], cfg["num_stages"]))]
    tries += [c for c in BLOCK_N_CHOICES if c < tries[0]]
    for i, (block_n, stages) in enumerate(tries):
        fixed = schedule.split_cost_tiles(cfg["BLOCK_H"], r, dR, block_n, q_bytes, kv_bytes)
        pl = schedule.plan(seqlens, block_n, parts, fixed)
        kv_desc, kpe_desc, tma = _descriptors(kv_arg, block_n, r, dR, device, cfg["BLOCK_H"])
        o_part = _empty((pl.max_partials, rows, r), torch.float32, device)
        lse_part = _empty((pl.max_partials, rows), torch.float32, device)
        x_p, x_a = _scratch(n_h * parts, constants, block_n, q, lse)
        try:
            _mla_decode_planned_kernel[(n_h, parts)](
                q, kv_arg, kv_desc, kpe_desc, x_p, x_a, block_table, seqlens, scale_ptr, out, lse, o_part, lse_part,
                pl.cuts, pl.b_first, pl.b_last, pl.starts, pl.first_part, pl.n_splits, pl.slot,
                scale * kv_scale_val * LOG2E.value, kv_scale_val,
                q.stride(0), q.stride(1), q.stride(2), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
                *out.stride()[:3], *lse.stride(), kv_cache.shape[0], block_table.shape[1], fixed,
                **constants, BLOCK_N=block_n, TMA=tma, num_warps=cfg["num_warps"], num_stages=stages,
            )  # fmt: skip
        except OutOfResources:
            if i == len(tries) - 1:
                raise
            continue
        _FITTED[key] = (block_n, stages)
        break
    _mla_decode_planned_merge_kernel[(rows, B)](
        o_part, lse_part, pl.n_splits, pl.slot, out, lse, *out.stride()[:3], *lse.stride(),
        H=H, S_Q=S_q, R=r, num_warps=4,
    )  # fmt: skip


def _scratch(programs, constants, block_n, q, lse):
    """SPLIT_SCORE's per-program exchange slots (see _score_and_accumulate): p [programs, 2,
    BLOCK_H, BLOCK_N] in q's dtype and alpha [programs, 2, BLOCK_H] fp32; without it, two unused
    pointers (q and lse)."""
    if not constants["SPLIT_SCORE"]:
        return q, lse
    block_h = constants["BLOCK_H"]
    return (
        _empty((programs, 2, block_h, block_n), q.dtype, q.device),
        _empty((programs, 2, block_h), torch.float32, q.device),
    )


def _tma_capable(device) -> bool:
    """Hopper and later have TMA; the interpreter runs descriptor loads too (so tests cover them)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 9
    return interpreting()


def _descriptors(kv_arg, block_n, r, dR, device, block_h=TMA_MIN_BLOCK_H):
    """(kv_desc, kpe_desc, True) when page-aligned tiles can be loaded by TMA, else (kv, kv, False).

    TMA needs BLOCK_N to divide the page, pages evenly strided (the cache as one
    [blocks * PAGE, r + dR] matrix) and 16-byte aligned rows and base."""
    blocks, page, row = kv_arg.shape
    s_blk, s_tok, s_col = kv_arg.stride()
    elt = kv_arg.element_size()
    if not USE_TMA or block_h < TMA_MIN_BLOCK_H or page % block_n or s_col != 1 or s_blk != page * s_tok:
        return kv_arg, kv_arg, False
    if not _tma_capable(device):
        return kv_arg, kv_arg, False
    if (s_tok * elt) % 16 or kv_arg.data_ptr() % 16 or (r * elt) % 16 or (dR * elt) % 16:
        return kv_arg, kv_arg, False
    flat = kv_arg.as_strided((blocks * page, row), (s_tok, 1))
    kv_desc = TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_n, r])
    kpe_desc = TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_n, dR])
    return kv_desc, kpe_desc, True


def _launch_split(grid, args, constants, cfg, device):
    """Launch stage 1; if the GPU lacks the shared memory for (BLOCK_N, num_stages), step down
    BLOCK_N_CHOICES and remember what fit (the heuristic's estimate can be a little short)."""
    key = (device, *sorted(constants.items()), cfg["BLOCK_N"], cfg["num_stages"], cfg["num_warps"])
    tries = [_FITTED.get(key, (cfg["BLOCK_N"], cfg["num_stages"]))]
    tries += [c for c in BLOCK_N_CHOICES if c < tries[0]]
    for i, (block_n, stages) in enumerate(tries):
        kv_desc, kpe_desc, tma = _descriptors(
            args[1], block_n, constants["R"], constants["DR"], device, constants["BLOCK_H"]
        )
        x_p, x_a = _scratch(grid[0] * grid[1] * grid[2], constants, block_n, args[0], args[6])
        try:
            _mla_decode_split_kernel[grid](
                args[0], args[1], kv_desc, kpe_desc, x_p, x_a, *args[2:], **constants, BLOCK_N=block_n, TMA=tma,
                num_warps=cfg["num_warps"], num_stages=stages,
            )  # fmt: skip
        except OutOfResources:
            if i == len(tries) - 1:
                raise
            continue
        if key not in _FITTED and (block_n, stages) != tries[0]:
            warnings.warn(
                f"mla_decode: BLOCK_N={cfg['BLOCK_N']}, num_stages={cfg['num_stages']} "
                f"exceed shared memory here; using BLOCK_N={block_n}, "
                f"num_stages={stages}",
                stacklevel=3,
            )
        _FITTED[key] = (block_n, stages)
        return
