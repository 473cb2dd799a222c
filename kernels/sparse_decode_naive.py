"""Plain-torch twin of the sparse absorb decode kernel (`sparse_decode.mla_sparse_decode`), and the
torch pieces around it: FlashMLA's fp8 sparse cache layout, the lightning indexer and the
conversion of a request's token positions to cache slots.

DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): each query token attends only to the `topk`
cache rows its indexer picked. The attention is the absorb path's MQA (docs/design.md, "The
math"): the key is the whole row ``[c (r) | k_r (dR)]``, the value its latent part ``c``; every
head of a token shares the token's selected rows. Read this before the kernel.

Indices address the paged cache as FlashMLA's sparse kernels do (deepseek-ai/FlashMLA
README.md, "Sparse Attention (indices tensor)"): slot = page id * block_size + offset in the
page, the cache viewed as [num_blocks * block_size, row]; -1 marks an unused entry.
"""

from __future__ import annotations

import math

import torch

from mlactl.kernels._checks import latent_rank

FP8_TILE = 128  # fp8 values sharing one fp32 scale in FlashMLA's sparse layout
FP8_MAX = 448.0  # largest e4m3 value


def sparse_fp8_row_bytes(r: int, dR: int) -> int:
    """Bytes per token of FlashMLA's "FP8 with scale" cache: r fp8 values, one fp32 scale per 128
    of them, dR bf16 RoPE values (512 + 16 + 128 = 656 for DeepSeek-V3.2)."""
    return r + 4 * -(-r // FP8_TILE) + 2 * dR


def quantize_sparse_fp8(rows: torch.Tensor, r: int) -> torch.Tensor:
    """[..., r + dR] float rows -> [..., 656-style bytes] uint8 in FlashMLA's sparse fp8 layout.

    Per tile of 128 latent values: scale = amax / 448 rounded up to a power of two (at least
    1e-4, as FlashMLA's tests/quant.py), stored = value / scale as e4m3; the RoPE part is kept
    in bf16. Real value = stored * scale."""
    if r % FP8_TILE:
        raise ValueError(f"r={r} must be a multiple of {FP8_TILE} for the sparse fp8 layout")
    *lead, width = rows.shape
    dR = width - r
    x = rows.float().reshape(-1, width)
    tiles = x[:, :r].reshape(-1, r // FP8_TILE, FP8_TILE)  # [N, r/128, 128]
    amax = tiles.abs().amax(dim=-1)  # [N, r/128]
    scale = torch.pow(2.0, torch.ceil(torch.log2(torch.clamp(amax / FP8_MAX, min=1e-4))))  # [N, r/128]
    values = (tiles / scale[..., None]).to(torch.float8_e4m3fn).reshape(-1, r)
    out = torch.empty(x.shape[0], sparse_fp8_row_bytes(r, dR), dtype=torch.uint8, device=rows.device)
    out[:, :r] = values.view(torch.uint8)
    out[:, r : r + 4 * (r // FP8_TILE)] = scale.contiguous().view(torch.uint8)
    out[:, r + 4 * (r // FP8_TILE) :] = x[:, r:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out.reshape(*lead, out.shape[-1])


def dequantize_sparse_fp8(cache: torch.Tensor, r: int) -> torch.Tensor:
    """FlashMLA sparse fp8 bytes [..., row_bytes] -> fp32 rows [..., r + dR]."""
    *lead, width = cache.shape
    nt = r // FP8_TILE
    dR = (width - r - 4 * nt) // 2
    x = cache.reshape(-1, width)
    values = x[:, :r].contiguous().view(torch.float8_e4m3fn).float()  # [N, r]
    scale = x[:, r : r + 4 * nt].contiguous().view(torch.float32)  # [N, r/128]
    rope = x[:, r + 4 * nt :].contiguous().view(torch.bfloat16).float()  # [N, dR]
    latent = (values.reshape(-1, nt, FP8_TILE) * scale[..., None]).reshape(-1, r)
    return torch.cat([latent, rope], dim=-1).reshape(*lead, r + dR)


def rows_of(kv_cache: torch.Tensor, r: int) -> torch.Tensor:
    """The cache as fp32 rows [num_blocks * block_size, r + dR], dequantised if it is fp8 bytes."""
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(2)
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    if flat.dtype in (torch.uint8, torch.float8_e4m3fn):
        return dequantize_sparse_fp8(flat.view(torch.uint8), r)
    return flat.float()


def mla_sparse_decode_naive(q, kv_cache, indices, scale, *, r=None):
    """Sparse absorb attention: every query token over the cache rows its indices name.

    Args:
        q: [B, S_q, H, r + dR] fp16/bf16/fp32 — queries in latent space, RoPE part last.
        kv_cache: [num_blocks, block_size, r + dR] in q's dtype, or uint8 / float8_e4m3fn
            [num_blocks, block_size, row_bytes] in FlashMLA's sparse fp8 layout (656 bytes for
            r = 512, dR = 64); a 4-D cache with one head is accepted.
        indices: [B, S_q, topk] int — cache slots (page * block_size + offset) each query
            reads; -1 (or any slot outside the cache) is skipped.
        scale: the model's softmax scale, 1/sqrt(dC + dR).
        r: latent rank; default 512 for a 576-wide query.

    Returns:
        out [B, S_q, H, r] in q's dtype; lse [B, S_q, H] fp32, natural-log log-sum-exp of the
        scaled scores (-inf and out 0 for a query with no valid index).

    Traffic: each query reads its selected rows once for all its heads (r + dR numbers, or the
    fp8 row's bytes), its own query; writes out and lse.
    """
    B, S_q, H, D = q.shape
    r = latent_rank(D, r)
    rows = rows_of(kv_cache, r)  # [slots, r + dR] fp32
    slots = rows.shape[0]
    idx = indices.long()
    valid = (idx >= 0) & (idx < slots)  # [B, S_q, topk]
    picked = rows[torch.where(valid, idx, 0)]  # [B, S_q, topk, r + dR]
    s = torch.einsum("bshd,bstd->bsht", q.float(), picked) * scale  # [B, S_q, H, topk]
    s = s.masked_fill(~valid[:, :, None, :], -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # [B, S_q, H]
    finite = torch.isfinite(lse)
    p = torch.exp(s - torch.where(finite, lse, 0.0)[..., None])  # [B, S_q, H, topk]; 0 where -inf
    out = torch.einsum("bsht,bstr->bshr", p, picked[..., :r])
    return out.to(q.dtype), lse


# -- around the attention: positions -> slots, and the lightning indexer -------------------------


def positions_to_slots(positions: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, S_q, topk] token positions in each request's context (-1: none) -> cache slots
    (page id * block_size + offset), as FlashMLA's tests/quant.py abs_indices2indices_in_kvcache."""
    pos = positions.long()
    valid = pos >= 0
    safe = torch.where(valid, pos, 0)
    pages = torch.gather(block_table.long(), 1, (safe // block_size).reshape(pos.shape[0], -1)).reshape(pos.shape)
    return torch.where(valid, pages * block_size + safe % block_size, -1).to(torch.int32)


def dsa_indexer_naive(q_index, weights, index_keys, context_lens, topk: int):
    """The lightning indexer's selection in plain torch: which keys each query attends.

    Args:
        q_index: [B, S_q, Hi, di] the index queries of the S_q new tokens of each request.
        weights: [B, S_q, Hi] each index head's weight for each query (weights_proj, scaled).
        index_keys: [B, L, di] the index keys of each request's context (L >= its length).
        context_lens: [B] int — context length of each request, its S_q new tokens included
            (the last S_q positions); query i sees positions <= context_lens[b] - S_q + i.
        topk: how many keys each query keeps.

    Returns:
        [B, S_q, topk] int32 positions in the context, best first; -1 where a query sees fewer
        than topk keys.

    The score of key t for a query is sum over heads of weight * relu(q . k_t) (DeepSeek-V3.2,
    inference/model.py Indexer and kernel.py fp8_index), here in fp32 without the fp8 rounding.
    """
    B, S_q, Hi, di = q_index.shape
    L = index_keys.shape[1]
    logits = torch.einsum("bshd,btd->bsht", q_index.float(), index_keys.float()).relu()  # [B, S_q, Hi, L]
    score = (logits * weights.float()[..., None]).sum(dim=2)  # [B, S_q, L]
    pos = torch.arange(L, device=q_index.device)
    last = context_lens.long()[:, None] - S_q + torch.arange(S_q, device=q_index.device)[None, :]  # [B, S_q]
    seen = pos[None, None, :] <= last[..., None]  # [B, S_q, L]
    score = score.masked_fill(~seen, -math.inf)
    k = min(topk, L)
    best = torch.topk(score, k, dim=-1)
    found = torch.where(torch.isfinite(best.values), best.indices, -1)
    if k < topk:
        found = torch.cat([found, found.new_full((B, S_q, topk - k), -1)], dim=-1)
    return found.to(torch.int32)
