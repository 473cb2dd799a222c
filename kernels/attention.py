"""The attention op: a mixed batch of MLA requests, each through the expand or the absorb path.

    out = mla_attention(q_nope, q_rope, kv_cache, block_table, cache_seqlens, new_lens,
                        w_uk, w_uv, scale, path="auto")

Every request b has new_lens[b] new tokens at the end of its cache_seqlens[b]-token context
(their latents are already in the paged cache, as an engine writes them before attention);
prefix = context - new. The queries of all new tokens are packed in request order.

expand          gather the context latents, expand them by W_UK/W_UV, causal varlen attention
expand_chunked  the same with the prefix expanded `chunk` tokens at a time and merged by lse
absorb          q_nope . W_UK -> [latent | rope] query, split-KV MQA over the paged latent
                cache (requests grouped by their new-token count), latent output . W_UV
auto            per request, by mlactl.decide.policy.AutoPolicy: a calibration of mlactl's own paths
                on this device (`mlactl calibrate --from results`), else the crossovers `mlactl
                tune paths` measured on it, else the roofline of its hardware profile, else FLOPs

backend="triton" runs mlactl's Triton kernels; backend="torch" runs their plain-torch twins
(any device, a CPU included). All paths compute the same function (docs/design.md, "The
math"); they differ in cost, which is what mlactl measures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import torch

from mlactl.decide.policy import AutoPolicy
from mlactl.kernels._checks import FLOAT_DTYPES, FP8_DTYPES, check_new_lens, check_scale, check_tensor, dtype_name
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.util.defaults import DEFAULT_CHUNK, KERNEL_BACKENDS, MLA_PATHS

PATHS = MLA_PATHS
BACKENDS = KERNEL_BACKENDS


@lru_cache(maxsize=32)
def _auto_policy(device_name: str, H: int, r: int, dC: int, dR: int, dV: int, kv_dtype: str, dtype: str):

    cfg = MLAConfig("runtime", hidden=0, H=H, q_lora_rank=None, r=r, dC=dC, dR=dR, dV=dV, layers=1)
    return AutoPolicy(CostModel(cfg, kv_dtype=kv_dtype, dtype=dtype), device_name)


def auto_policy(q_nope, kv_cache, w_uk, w_uv):
    """The AutoPolicy for these tensors' device and dims (cached per process)."""
    device = q_nope.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    H, dC = q_nope.shape[1], q_nope.shape[2]
    r = w_uk.shape[2]
    return _auto_policy(
        device_name,
        H,
        r,
        dC,
        kv_cache.shape[-1] - r,
        w_uv.shape[1],
        dtype_name(kv_cache.dtype),
        dtype_name(q_nope.dtype),
    )


def _ops(backend: str):
    if backend == "triton":
        from mlactl.kernels.decode import mla_decode
        from mlactl.kernels.merge import merge_attn_states
        from mlactl.kernels.prefill import mla_prefill

        return mla_decode, mla_prefill, merge_attn_states
    if backend == "torch":
        from mlactl.kernels.decode_naive import mla_decode_naive
        from mlactl.kernels.merge import merge_attn_states_naive
        from mlactl.kernels.prefill_naive import mla_prefill_naive

        return mla_decode_naive, mla_prefill_naive, merge_attn_states_naive
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def _check(q_nope, q_rope, kv_cache, block_table, cache_seqlens, new_lens, w_uk, w_uv):
    check_tensor("q_nope", q_nope, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("q_rope", q_rope, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("kv_cache", kv_cache, 3, FLOAT_DTYPES + FP8_DTYPES, contiguous=False)
    check_tensor("new_lens", new_lens, 1, (torch.int32,), contiguous=False)
    check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,), contiguous=False)
    check_tensor("w_uk", w_uk, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("w_uv", w_uv, 3, FLOAT_DTYPES, contiguous=False)
    T, H, dC = q_nope.shape
    if q_rope.shape[:2] != (T, H):
        raise ValueError(
            f"q_rope is {tuple(q_rope.shape)} but must be [T_q, H, dR] with T_q, H = {T}, {H} (from q_nope)"
        )
    if q_rope.dtype != q_nope.dtype:
        raise ValueError(f"q_rope has dtype {q_rope.dtype} but q_nope has {q_nope.dtype}; they must match")
    if w_uk.shape[:2] != (H, dC):
        raise ValueError(f"w_uk is {tuple(w_uk.shape)} but must be [H, dC, r] with H, dC = {H}, {dC} (from q_nope)")
    r = w_uk.shape[2]
    if w_uv.shape[0] != H or w_uv.shape[2] != r:
        raise ValueError(f"w_uv is {tuple(w_uv.shape)} but must be [H, dV, r] with H, r = {H}, {r}")
    dR = kv_cache.shape[-1] - r
    if dR != q_rope.shape[2]:
        raise ValueError(
            f"kv_cache rows hold {kv_cache.shape[-1]} numbers but r + dR = {r} + {q_rope.shape[2]} (w_uk, q_rope)"
        )
    ctxs = cache_seqlens.tolist()
    return r, check_new_lens(new_lens, ctxs, T, "q_nope"), ctxs


def _paths_for(path, news, ctxs, policy, tensors) -> list[str]:
    B = len(news)
    if isinstance(path, str):
        if path == "auto":
            chooser = policy or auto_policy(*tensors)
            prefix = [c - n for n, c in zip(news, ctxs)]
            return [str(p) for p in chooser(news, prefix)] if B else []
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)} or 'auto', got {path!r}")
        return [path] * B
    chosen = list(path)
    if len(chosen) != B or any(p not in PATHS for p in chosen):
        raise ValueError(f"a per-request path list needs {B} entries from {', '.join(PATHS)}")
    return chosen


def mla_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    new_lens: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scale: float,
    *,
    path: str | Sequence[str] = "auto",
    chunk: int = DEFAULT_CHUNK,
    kv_scale: float | torch.Tensor | None = None,
    backend: str = "triton",
    policy: Callable[[list[int], list[int]], Sequence[str]] | None = None,
    return_paths: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
    """MLA attention of a mixed batch.

    Args:
        q_nope: [T_q, H, dC] non-RoPE query parts of all new tokens, packed in request order.
        q_rope: [T_q, H, dR] their RoPE parts (rotated).
        kv_cache: [num_blocks, block_size, r + dR] paged latent cache ([c | k_r] per token), in
            the queries' dtype or fp8 e4m3 with `kv_scale`.
        block_table: [B, max_blocks] int32; cache_seqlens: [B] int32 context lengths including
            the new tokens; new_lens: [B] int32 new tokens per request.
        w_uk: [H, dC, r] and w_uv: [H, dV, r] up-projections (kv_b_proj split per head).
        scale: the model's softmax scale, 1/sqrt(dC + dR).
        path: "expand", "expand_chunked", "absorb", "auto", or one of the first three per request.
        chunk: prefix tokens per step of expand_chunked.
        kv_scale: for an fp8 cache, float or 1-element tensor; real value = stored * kv_scale.
        backend: "triton" (kernels) or "torch" (the twins).
        policy: for "auto", a callable (new, prefix) -> path names, instead of AutoPolicy.
        return_paths: also return the path each request ran.

    Returns:
        out [T_q, H, dV] in the queries' dtype (and the list of paths with return_paths).

    Raises:
        ValueError: on any bad input, before anything is launched.
    """
    scale = check_scale(scale)
    r, news, ctxs = _check(q_nope, q_rope, kv_cache, block_table, cache_seqlens, new_lens, w_uk, w_uv)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
    decode, prefill, merge = _ops(backend)
    chosen = _paths_for(path, news, ctxs, policy, (q_nope, kv_cache, w_uk, w_uv))
    T, H, _ = q_nope.shape
    out = torch.empty((T, H, w_uv.shape[1]), dtype=q_nope.dtype, device=q_nope.device)
    starts = [0]
    for n in news:
        starts.append(starts[-1] + n)
    device = q_nope.device
    rows: slice | torch.Tensor  # the packed query rows of the requests on path p

    for p in PATHS:
        requests = [b for b, c in enumerate(chosen) if c == p and news[b] > 0]
        if not requests:
            continue
        if len(requests) == len(news):  # the whole batch on one path: no gathers
            rows, table, lens, new = slice(None), block_table, cache_seqlens, new_lens
        else:
            rows = _token_rows(requests, starts, news, device)
            sub = torch.tensor(requests, dtype=torch.long, device=device)
            table, lens, new = block_table[sub], cache_seqlens[sub], new_lens[sub]
        if p == "absorb":
            out[rows] = _absorb(
                q_nope[rows],
                q_rope[rows],
                kv_cache,
                table,
                lens,
                [news[b] for b in requests],
                w_uk,
                w_uv,
                scale,
                kv_scale,
                r,
                decode,
            )
            continue
        q = torch.cat([q_nope[rows], q_rope[rows]], dim=-1)
        from mlactl.kernels import expansion

        if p == "expand":
            o, _ = expansion.mla_prefill_expand(
                q, kv_cache, table, lens, new, w_uk, w_uv, scale, kv_scale=kv_scale, r=r, attn=prefill
            )
        else:
            o, _ = expansion.mla_prefill_chunked(
                q,
                kv_cache,
                table,
                lens,
                new,
                w_uk,
                w_uv,
                scale,
                chunk=chunk,
                kv_scale=kv_scale,
                r=r,
                attn=prefill,
                merge=merge,
            )
        out[rows] = o
    return (out, chosen) if return_paths else out


def _token_rows(requests, starts, lengths, device) -> torch.Tensor:
    """Packed token indices of the given requests: starts[b] .. starts[b] + lengths[b]."""
    return torch.cat([torch.arange(starts[b], starts[b] + lengths[b], device=device) for b in requests])


def _absorb(q_nope, q_rope, kv_cache, block_table, cache_seqlens, news, w_uk, w_uv, scale, kv_scale, r, decode):
    """The absorb path for requests packed in order; one decode launch per distinct new count."""
    q_latent = torch.einsum("thd,hdr->thr", q_nope, w_uk)  # q_absorb: [T, H, r]
    q = torch.cat([q_latent, q_rope], dim=-1)  # [T, H, r + dR]
    o_latent = torch.empty_like(q_latent)
    starts = [0]
    for n in news:
        starts.append(starts[-1] + n)
    for n in sorted(set(news)):
        group = [i for i, m in enumerate(news) if m == n]
        if len(group) == len(news):  # one new-token count (plain decode): no gathers
            rows, table, lens = slice(None), block_table, cache_seqlens
        else:
            rows = _token_rows(group, starts, news, q.device)
            sub = torch.tensor(group, dtype=torch.long, device=q.device)
            table, lens = block_table[sub], cache_seqlens[sub]
        q_group = q[rows].reshape(len(group), n, *q.shape[1:])  # [b, S_q, H, r + dR]
        o, _ = decode(q_group, kv_cache, table, lens, scale, causal=True, kv_scale=kv_scale, r=r)
        o_latent[rows] = o.reshape(len(group) * n, *o.shape[2:])
    return torch.einsum("thr,hvr->thv", o_latent, w_uv)  # out_absorb: [T, H, dV]
