"""The expand path end to end: paged latent cache -> k_nope, v -> attention, whole or chunked.

* `gather_latents` reads each request's context rows [c | k_r] out of the paged cache
  (dequantising fp8 with kv_scale).
* `expand_kv` up-projects latents into per-head keys and values: two plain matmuls in torch
  (cuBLAS does them at peak; 2*r*H*(dC+dV) FLOPs per token, mlactl/cost.py "expand kv").
* `mla_prefill_expand` expands every request's whole context and runs one causal attention.
* `mla_prefill_chunked` bounds the expanded K/V to max(new, chunk) tokens per request: the new
  tokens first attend causally to themselves, then each prefix is expanded `chunk` tokens at a
  time (non-causal: every new query sees every prefix token) and each partial is merged in by
  its lse (merge_attn_states), as vLLM's MLA backend does for chunked context. The step count
  and memory are those of mlactl/cost.py's expand_chunked.

The attention and merge functions are arguments, so the same drivers run the Triton kernels
(the defaults) or the torch twins (`attn=mla_prefill_naive, merge=merge_attn_states_naive`,
what `mlactl tune --backend torch` times on a CPU). This module imports triton only when a
default is used.

Requests are described like the decode kernel's: block_table [B, max_blocks] int32,
cache_seqlens [B] int32 (context length, new tokens included: they are already in the cache),
and new_lens [B] int32, the new tokens per request, which are the last new_lens[b] of its
context. q holds the queries of the new tokens of all requests, packed: [sum(new_lens), H, dC+dR].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mlactl.kernels._checks import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    check_new_lens,
    check_positive,
    check_scale,
    check_tensor,
    latent_rank,
    torch_name,
)
from mlactl.kernels.prefill_naive import check_inner_stride, check_same_device
from mlactl.util.defaults import DEFAULT_CHUNK  # prefix tokens per request and step (512 MiB of K/V at 128 heads)


def _resolve_r(kv_cache: torch.Tensor, r) -> int:
    """The latent rank: the same rule as mla_decode's (r may be left out for 576-wide rows)."""
    return latent_rank(kv_cache.shape[-1], r)


def _check_paged(kv_cache, block_table, cache_seqlens) -> list[int]:
    """Validate the paged-cache description; returns the context lengths (read to the host)."""
    check_tensor("kv_cache", kv_cache, 3, FLOAT_DTYPES + FP8_DTYPES, contiguous=False)
    check_tensor("block_table", block_table, 2, (torch.int32,), contiguous=False)
    check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,), contiguous=False)
    check_same_device(kv_cache=kv_cache, block_table=block_table, cache_seqlens=cache_seqlens)
    num_blocks, block_size, _ = kv_cache.shape
    B, max_blocks = block_table.shape
    if cache_seqlens.shape[0] != B:
        raise ValueError(f"cache_seqlens has {cache_seqlens.shape[0]} entries but block_table has {B} rows")
    lens = cache_seqlens.tolist()
    for b, n in enumerate(lens):
        if n < 0 or n > max_blocks * block_size:
            raise ValueError(
                f"cache_seqlens[{b}] is {n}; it must be in [0, {max_blocks * block_size}] "
                f"(block_table rows of {max_blocks} blocks of {block_size})"
            )
    used = [-(-n // block_size) for n in lens]
    if any(used):
        cols = torch.arange(max_blocks, device=block_table.device)[None, :]
        in_use = cols < torch.tensor(used, device=block_table.device)[:, None]
        ids = block_table[in_use]
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_blocks:
            raise ValueError(
                f"block_table holds block {lo if lo < 0 else hi} for a cached token, "
                f"outside kv_cache's {num_blocks} blocks"
            )
    return lens


def _check_kv_scale(kv_cache, kv_scale):
    """The dequant scale (real value = stored value * kv_scale, as in mla_decode); required for fp8."""
    if kv_scale is None:
        if kv_cache.dtype in FP8_DTYPES:
            raise ValueError("kv_scale is required with an fp8 kv_cache (real value = fp8 value * kv_scale)")
        return None
    if isinstance(kv_scale, torch.Tensor):
        if kv_scale.numel() != 1 or not kv_scale.dtype.is_floating_point:
            raise ValueError(
                f"kv_scale must be a float or a 1-element float tensor, got shape "
                f"{tuple(kv_scale.shape)} {torch_name(kv_scale.dtype)}"
            )
        if kv_scale.device != kv_cache.device:
            raise ValueError(f"kv_scale is on {kv_scale.device} but kv_cache on {kv_cache.device}")
        return kv_scale.to(torch.float32).reshape(())
    return check_positive("kv_scale", kv_scale)


def _gather(kv_cache, block_table, starts, counts, r, kv_scale, dtype):
    """Rows [c | k_r] of positions starts[b] .. starts[b]+counts[b]-1 of each request b, in order.

    returns latent [N, r], k_rope [N, dR]: views into one gathered [N, r+dR] buffer (unit last
    stride, row stride r+dR), N = sum(counts).
    """
    device = kv_cache.device
    block_size = kv_cache.shape[1]
    counts_t = torch.tensor(counts, dtype=torch.long)
    req = torch.repeat_interleave(torch.arange(len(counts)), counts_t)  # [N]
    first = torch.cumsum(counts_t, 0) - counts_t  # [B]
    pos = torch.arange(req.shape[0]) - first[req] + torch.tensor(starts, dtype=torch.long)[req]
    req, pos = req.to(device), pos.to(device)
    blocks = block_table[req, pos // block_size].long()  # [N]
    if kv_cache.dtype in FP8_DTYPES:  # gather fp8 as bytes: index kernels need not know fp8
        rows = kv_cache.view(torch.uint8)[blocks, pos % block_size].view(kv_cache.dtype)  # [N, r+dR]
    else:
        rows = kv_cache[blocks, pos % block_size]  # [N, r+dR]
    if kv_scale is not None:
        rows = (rows.float() * kv_scale).to(dtype)
    elif rows.dtype != dtype:
        rows = rows.to(dtype)
    return rows[:, :r], rows[:, r:]


def gather_latents(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_scale: float | torch.Tensor | None = None,
    *,
    r: int | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every request's context out of the paged cache, packed.

    Args:
        kv_cache: [num_blocks, block_size, r + dR] rows [c | k_r]; fp16/bf16/fp32 or fp8.
        block_table: [B, max_blocks] int32; token p of request b is in block
            block_table[b, p // block_size].
        cache_seqlens: [B] int32 context length of each request.
        kv_scale: per-tensor scale, real value = stored * kv_scale (float or 1-element tensor);
            required for an fp8 cache.
        r: latent rank; may be left out only for 576-wide rows (r = 512).
        dtype: result dtype; default the cache's, bf16 for fp8.

    Returns:
        (latent [T_k, r], k_rope [T_k, dR], cu_seqlens_k [B + 1] int32); latent and k_rope are
        views of one gathered buffer.

    Raises:
        ValueError: on any bad input.
    """
    lens = _check_paged(kv_cache, block_table, cache_seqlens)
    r = _resolve_r(kv_cache, r)
    scale = _check_kv_scale(kv_cache, kv_scale)
    dtype = _result_dtype(kv_cache, dtype)
    latent, k_rope = _gather(kv_cache, block_table, [0] * len(lens), lens, r, scale, dtype)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.long), 0)
    return latent, k_rope, cu.to(kv_cache.device)


def _result_dtype(kv_cache, dtype):
    if dtype is None:
        return torch.bfloat16 if kv_cache.dtype in FP8_DTYPES else kv_cache.dtype
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of float16, bfloat16, float32, got {dtype!r}")
    return dtype


def _check_weights(w_uk, w_uv, r=None, H=None):
    check_tensor("w_uk", w_uk, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("w_uv", w_uv, 3, FLOAT_DTYPES, contiguous=False)
    if w_uv.dtype != w_uk.dtype:
        raise ValueError(f"w_uv has dtype {torch_name(w_uv.dtype)} but w_uk has {torch_name(w_uk.dtype)}")
    if w_uv.shape[0] != w_uk.shape[0]:
        raise ValueError(f"w_uv has {w_uv.shape[0]} heads but w_uk has {w_uk.shape[0]}; shapes [H, dV, r], [H, dC, r]")
    if w_uv.shape[2] != w_uk.shape[2]:
        raise ValueError(f"w_uv.shape[2] is {w_uv.shape[2]} but w_uk.shape[2] is {w_uk.shape[2]}; both are r")
    if r is not None and w_uk.shape[2] != r:
        raise ValueError(f"w_uk.shape[2] is {w_uk.shape[2]} but the latent has r = {r}")
    if H is not None and w_uk.shape[0] != H:
        raise ValueError(f"w_uk has {w_uk.shape[0]} heads but q has {H}")


def expand_kv(latent: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Up-project latents into per-head keys and values (two torch matmuls; cuBLAS on a GPU).

    Args:
        latent: [T, r] latents c.
        w_uk: [H, dC, r] key up-projection, in latent's dtype.
        w_uv: [H, dV, r] value up-projection, in latent's dtype.

    Returns:
        (k_nope [T, H, dC] = W_UK[h] c, v [T, H, dV] = W_UV[h] c), in latent's dtype.

    Raises:
        ValueError: on any bad input.
    """
    check_tensor("latent", latent, 2, FLOAT_DTYPES, contiguous=False)
    _check_weights(w_uk, w_uv, r=latent.shape[1])
    if latent.dtype != w_uk.dtype:
        raise ValueError(f"latent has dtype {torch_name(latent.dtype)} but w_uk has {torch_name(w_uk.dtype)}")
    check_same_device(latent=latent, w_uk=w_uk, w_uv=w_uv)
    T = latent.shape[0]
    H, dC, r = w_uk.shape
    dV = w_uv.shape[1]
    k_nope = (latent @ w_uk.reshape(H * dC, r).T).view(T, H, dC)  # [T, H*dC] -> [T, H, dC]
    v = (latent @ w_uv.reshape(H * dV, r).T).view(T, H, dV)  # [T, H*dV] -> [T, H, dV]
    return k_nope, v


def _default_attn(attn):
    if attn is None:
        from mlactl.kernels.prefill import mla_prefill as attn
    return attn


def _default_merge(merge):
    if merge is None:
        from mlactl.kernels.merge import merge_attn_states as merge
    return merge


def _validate_driver(q, kv_cache, block_table, cache_seqlens, new_lens, w_uk, w_uv, scale, kv_scale, r):
    lens = _check_paged(kv_cache, block_table, cache_seqlens)
    check_tensor("q", q, 3, FLOAT_DTYPES, contiguous=False)
    check_inner_stride("q", q)
    check_tensor("new_lens", new_lens, 1, (torch.int32,), contiguous=False)
    check_same_device(q=q, kv_cache=kv_cache, new_lens=new_lens, w_uk=w_uk, w_uv=w_uv)
    r = _resolve_r(kv_cache, r)
    dR = kv_cache.shape[2] - r
    _check_weights(w_uk, w_uv, r=r, H=q.shape[1])
    if w_uk.dtype != q.dtype:
        raise ValueError(f"w_uk has dtype {torch_name(w_uk.dtype)} but q has {torch_name(q.dtype)}; they must match")
    if q.shape[2] != w_uk.shape[1] + dR:
        raise ValueError(
            f"q.shape[2] is {q.shape[2]} but must equal dC + dR = {w_uk.shape[1]} + {dR} (w_uk, kv_cache row width - r)"
        )
    if kv_cache.dtype not in FP8_DTYPES and kv_cache.dtype != q.dtype:
        raise ValueError(
            f"kv_cache has dtype {torch_name(kv_cache.dtype)} but q has {torch_name(q.dtype)}; "
            "they must match (or the cache must be fp8)"
        )
    news = check_new_lens(new_lens, lens, q.shape[0])
    return check_scale(scale), _check_kv_scale(kv_cache, kv_scale), r, lens, news


def _cu(lengths, device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def mla_prefill_expand(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    new_lens: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scale: float,
    *,
    kv_scale: float | torch.Tensor | None = None,
    r: int | None = None,
    attn: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unchunked expand path: expand each request's whole context, one causal attention.

    Expanded K/V held at once: all context tokens of all requests.

    Args:
        q: [T_q, H, dC + dR] queries of the new tokens, packed (T_q = sum(new_lens)).
        kv_cache: [num_blocks, block_size, r + dR] paged latent cache.
        block_table: [B, max_blocks] int32.
        cache_seqlens: [B] int32 context lengths, new tokens included.
        new_lens: [B] int32 new tokens per request.
        w_uk, w_uv: [H, dC, r] and [H, dV, r] up-projections, in q's dtype.
        scale: softmax scale, 1/sqrt(dC + dR).
        kv_scale: for an fp8 cache, real value = stored * kv_scale.
        r: latent rank; may be left out only for 576-wide rows (r = 512).
        attn: mla_prefill (default) or a function with its signature, e.g. mla_prefill_naive.

    Returns:
        (out [T_q, H, dV] in q's dtype, lse [T_q, H] fp32).

    Raises:
        ValueError: on any bad input.
    """
    scale, kv_scale, r, lens, news = _validate_driver(
        q, kv_cache, block_table, cache_seqlens, new_lens, w_uk, w_uv, scale, kv_scale, r
    )
    attn = _default_attn(attn)
    ctx = [c if n else 0 for c, n in zip(lens, news)]  # a request with no new token needs no keys
    latent, k_rope = _gather(kv_cache, block_table, [0] * len(ctx), ctx, r, kv_scale, q.dtype)
    k_nope, v = expand_kv(latent, w_uk, w_uv)
    return attn(
        q,
        k_nope,
        k_rope,
        v,
        _cu(news, q.device),
        _cu(ctx, q.device),
        scale,
        causal=True,
        max_seqlen_q=max(news, default=0),
        max_seqlen_k=max(ctx, default=0),
    )


def mla_prefill_chunked(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    new_lens: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scale: float,
    *,
    chunk: int = DEFAULT_CHUNK,
    kv_scale: float | torch.Tensor | None = None,
    r: int | None = None,
    attn: Callable | None = None,
    merge: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The expand path with each prefix expanded `chunk` tokens at a time, merged by lse.

    Args:
        q, kv_cache, block_table, cache_seqlens, new_lens, w_uk, w_uv, scale, kv_scale, r, attn:
            as mla_prefill_expand.
        chunk: prefix tokens per request expanded per step, >= 1 (mlactl/cost.py's expand_chunked).
        merge: merge_attn_states (default) or merge_attn_states_naive.

    Returns:
        (out [T_q, H, dV] in q's dtype, lse [T_q, H] fp32).

    Raises:
        ValueError: on any bad input.

    Step 0: the new tokens of each request attend causally to their own expanded K/V.
    Step c >= 1: prefix tokens [(c-1)*chunk, c*chunk) of every request whose prefix reaches that
    far are expanded; the queries of those requests (one slice of q, from the first to the last
    of them) attend to them non-causally, and the partial result is merged into out/lse in place.
    Expanded K/V held at once: the new tokens (step 0), then at most `chunk` tokens per request,
    so per request max(new, min(prefix, chunk)) tokens instead of new + prefix.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1 (prefix tokens expanded per step), got {chunk!r}")
    scale, kv_scale, r, lens, news = _validate_driver(
        q, kv_cache, block_table, cache_seqlens, new_lens, w_uk, w_uv, scale, kv_scale, r
    )
    attn, merge = _default_attn(attn), _default_merge(merge)
    device = q.device
    cu_new = _cu(news, device)
    cu_new_host = cu_new.tolist()
    prefix = [c - n if n else 0 for c, n in zip(lens, news)]  # no new token: nothing to attend

    # step 0: new tokens against themselves, causal (len_q == len_k: the plain diagonal)
    latent, k_rope = _gather(kv_cache, block_table, prefix, news, r, kv_scale, q.dtype)
    k_nope, v = expand_kv(latent, w_uk, w_uv)
    max_new = max(news, default=0)
    out, lse = attn(
        q, k_nope, k_rope, v, cu_new, cu_new, scale, causal=True, max_seqlen_q=max_new, max_seqlen_k=max_new
    )
    del latent, k_rope, k_nope, v

    # steps 1..: prefix positions [lo, lo + chunk) of every request
    for lo in range(0, max(prefix, default=0), chunk):
        part = [b for b, p in enumerate(prefix) if p > lo]
        b0, b1 = part[0], part[-1]  # requests in between with shorter prefixes get no keys
        counts = [max(0, min(p, lo + chunk) - lo) for p in prefix[b0 : b1 + 1]]
        latent, k_rope = _gather(kv_cache, block_table[b0 : b1 + 1], [lo] * len(counts), counts, r, kv_scale, q.dtype)
        k_nope, v = expand_kv(latent, w_uk, w_uv)
        rows = slice(cu_new_host[b0], cu_new_host[b1 + 1])
        o_c, lse_c = attn(
            q[rows],
            k_nope,
            k_rope,
            v,
            cu_new[b0 : b1 + 2] - cu_new[b0],
            _cu(counts, device),
            scale,
            causal=False,
            max_seqlen_q=max(news[b0 : b1 + 1]),
            max_seqlen_k=max(counts),
        )
        _, lse_m = merge(out[rows], lse[rows], o_c, lse_c, out=out[rows])
        lse[rows] = lse_m
    return out, lse
