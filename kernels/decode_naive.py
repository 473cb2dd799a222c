"""Plain-torch twin of the absorb-path attention kernel (`absorb.mla_decode`).

The absorb path is an MQA over the latent cache: every head attends to the same cache rows
``[c (r) | k_r (dR)]``; the key is the whole row, the value is its latent part ``c``. Read this
before the kernel: it computes the same thing in the most obvious way.
"""

from __future__ import annotations

import math

import torch

from mlactl.kernels._checks import latent_rank


def mla_decode_naive(q, kv_cache, block_table, cache_seqlens, scale, *, causal=True, kv_scale=None, r=None):
    """Absorb-path attention of `S_q` new tokens per request against a paged latent cache.

    Args:
        q: [B, S_q, H, r + dR] fp16/bf16/fp32 — queries already in latent space, RoPE part last.
        kv_cache: [num_blocks, block_size, r + dR] (or FlashMLA's [num_blocks, block_size, 1,
            r + dR]) in q's dtype, or fp8 e4m3 with `kv_scale`.
        block_table: [B, max_blocks] int — page ids of each request, in token order.
        cache_seqlens: [B] int — context length of each request, the S_q new tokens included.
        scale: float — softmax scale, 1/sqrt(dC + dR) of the model.
        causal: new token i sits at position cache_seqlens[b] - S_q + i and sees keys at
            positions <= that; False: every new token sees all cache_seqlens[b] keys.
        kv_scale: float or 1-element tensor — real cache value = stored value * kv_scale.
        r: latent rank (value width); default 512 for a 576-wide row, else required.

    Returns:
        out: [B, S_q, H, r] in q's dtype; lse: [B, S_q, H] fp32, natural-log log-sum-exp of the
        scaled scores. A request without keys gets out 0 and lse -inf.

    Traffic: reads each request's cache rows once (r + dR numbers per key) for both the scores
    and the values, and the queries once; writes out and lse.
    """
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(2)  # [num_blocks, block_size, r + dR]
    B, S_q, H, D = q.shape
    r = latent_rank(D, r)
    block_size = kv_cache.shape[1]
    device = q.device
    out = torch.zeros(B, S_q, H, r, dtype=q.dtype, device=device)  # [B, S_q, H, r]
    lse = torch.full((B, S_q, H), -math.inf, dtype=torch.float32, device=device)  # [B, S_q, H]
    factor = 1.0 if kv_scale is None else kv_scale
    if isinstance(factor, torch.Tensor):
        factor = factor.to(device=device, dtype=torch.float32).reshape(())
    for b, n in enumerate(cache_seqlens.tolist()):
        if n <= 0:
            continue
        pages = block_table[b, : math.ceil(n / block_size)].long()
        kv = kv_cache[pages].reshape(-1, D)[:n].float() * factor  # [n, r + dR]
        s = torch.einsum("shd,td->sht", q[b].float(), kv) * scale  # [S_q, H, n]
        if causal:
            pos = torch.arange(n - S_q, n, device=device)  # [S_q] position of each new token
            seen = torch.arange(n, device=device)[None, :] <= pos[:, None]  # [S_q, n]
            s = s.masked_fill(~seen[:, None, :], -math.inf)
        lse_b = torch.logsumexp(s, dim=-1)  # [S_q, H]
        finite = torch.isfinite(lse_b)
        p = torch.exp(s - torch.where(finite, lse_b, 0.0)[..., None])  # [S_q, H, n]
        out[b] = torch.einsum("sht,tr->shr", p, kv[:, :r]).to(q.dtype)
        lse[b] = lse_b
    return out, lse
