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
sparse_absorb   DeepSeek Sparse Attention (DSA): q_nope . W_UK, then each query token over only the
                cache rows its `topk_indices` name (the positions a DSA indexer picked, e.g.
                sparse_decode_naive.dsa_indexer_naive), latent output . W_UV. The cache may be
                FlashMLA's fp8 sparse layout (uint8, 656 bytes a token for DeepSeek-V3.2) on this
                path only. `auto` never picks it: a DSA engine asks for it by name

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
SPARSE_PATH = "sparse_absorb"  # a DSA model's absorb path over each query's top-k rows
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
    check_tensor("kv_cache", kv_cache, 3, FLOAT_DTYPES + FP8_DTYPES + (torch.uint8,), contiguous=False)
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
    if kv_cache.dtype == torch.uint8:  # FlashMLA's fp8 sparse layout: bytes, not numbers
        from mlactl.kernels.sparse_decode_naive import sparse_fp8_row_bytes

        if kv_cache.shape[-1] != sparse_fp8_row_bytes(r, q_rope.shape[2]):
            raise ValueError(
                f"kv_cache (uint8) rows are {kv_cache.shape[-1]} bytes but FlashMLA's fp8 sparse layout for "
                f"r={r}, dR={q_rope.shape[2]} has {sparse_fp8_row_bytes(r, q_rope.shape[2])}"
            )
    elif dR != q_rope.shape[2]:
        raise ValueError(
            f"kv_cache rows hold {kv_cache.shape[-1]} numbers but r + dR = {r} + {q_rope.shape[2]} (w_uk, q_rope)"
        )
    ctxs = cache_seqlens.tolist()
    return r, check_new_lens(new_lens, ctxs, T, "q_nope"), ctxs


def _paths_for(path, news, ctxs, policy, tensors, sparse: bool = False) -> list[str]:
    """The path of each request; `sparse` (topk_indices given) admits SPARSE_PATH."""
    B = len(news)
    allowed = PATHS + ((SPARSE_PATH,) if sparse else ())
    names = ", ".join(allowed)
    if isinstance(path, str):
        if path == "auto":
            chooser = policy or auto_policy(*tensors)
            prefix = [c - n for n, c in zip(news, ctxs)]
            return [str(p) for p in chooser(news, prefix)] if B else []
        if path == SPARSE_PATH and not sparse:
            raise ValueError(f"path {SPARSE_PATH!r} needs topk_indices (each query's selected positions)")
        if path not in allowed:
            raise ValueError(f"path must be one of {names} or 'auto', got {path!r}")
        return [path] * B
    chosen = list(path)
    if len(chosen) != B or any(p not in allowed for p in chosen):
        raise ValueError(f"a per-request path list needs {B} entries from {names}")
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
    topk_indices: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
    """MLA attention of a mixed batch.

    Args:
        q_nope: [T_q, H, dC] non-RoPE query parts of all new tokens, packed in request order.
        q_rope: [T_q, H, dR] their RoPE parts (rotated).
        kv_cache: [num_blocks, block_size, r + dR] paged latent cache ([c | k_r] per token), in
            the queries' dtype or fp8 e4m3 with `kv_scale`; for sparse_absorb only, also uint8
            [num_blocks, block_size, r + 4*r/128 + 2*dR] in FlashMLA's fp8 sparse layout.
        block_table: [B, max_blocks] int32; cache_seqlens: [B] int32 context lengths including
            the new tokens; new_lens: [B] int32 new tokens per request.
        w_uk: [H, dC, r] and w_uv: [H, dV, r] up-projections (kv_b_proj split per head).
        scale: the model's softmax scale, 1/sqrt(dC + dR).
        path: "expand", "expand_chunked", "absorb", "auto", or one of the first three per request;
            with topk_indices also "sparse_absorb" (for all, or per request).
        chunk: prefix tokens per step of expand_chunked.
        kv_scale: for an fp8 cache, float or 1-element tensor; real value = stored * kv_scale.
        backend: "triton" (kernels) or "torch" (the twins).
        policy: for "auto", a callable (new, prefix) -> path names, instead of AutoPolicy.
        return_paths: also return the path each request ran.
        topk_indices: [T_q, topk] int32, for sparse_absorb: the context positions each query
            token attends (0 .. its context length - 1, as a DSA indexer returns them; -1: none).

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
    sparse = topk_indices is not None
    if topk_indices is not None:
        check_tensor("topk_indices", topk_indices, 2, (torch.int32,), contiguous=False)
        if topk_indices.shape[0] != q_nope.shape[0]:
            raise ValueError(
                f"topk_indices has {topk_indices.shape[0]} rows but there are {q_nope.shape[0]} query tokens"
            )
    chosen = _paths_for(path, news, ctxs, policy, (q_nope, kv_cache, w_uk, w_uv), sparse)
    if kv_cache.dtype == torch.uint8 and any(p != SPARSE_PATH for p, n in zip(chosen, news) if n):
        raise ValueError("a uint8 kv_cache (FlashMLA's fp8 sparse layout) is read by the sparse_absorb path only")
    if kv_scale is not None and SPARSE_PATH in chosen:
        raise ValueError(
            "kv_scale does not apply to sparse_absorb: its cache is in q's dtype, or FlashMLA's fp8 layout "
            "whose scales are in each row"
        )
    T, H, _ = q_nope.shape
    out = torch.empty((T, H, w_uv.shape[1]), dtype=q_nope.dtype, device=q_nope.device)
    starts = [0]
    for n in news:
        starts.append(starts[-1] + n)
    device = q_nope.device
    rows: slice | torch.Tensor  # the packed query rows of the requests on path p

    for p in (*PATHS, SPARSE_PATH):
        requests = [b for b, c in enumerate(chosen) if c == p and news[b] > 0]
        if not requests:
            continue
        if len(requests) == len(news):  # the whole batch on one path: no gathers
            rows, table, lens, new = slice(None), block_table, cache_seqlens, new_lens
        else:
            rows = _token_rows(requests, starts, news, device)
            sub = torch.tensor(requests, dtype=torch.long, device=device)
            table, lens, new = block_table[sub], cache_seqlens[sub], new_lens[sub]
        if p == SPARSE_PATH:
            assert topk_indices is not None  # _paths_for admits the path only with indices
            per_token = torch.repeat_interleave(torch.arange(len(requests), device=device), new)
            positions = topk_indices[rows]
            bad = (positions < -1) | (positions >= lens[per_token].to(positions.dtype)[:, None])
            if bool(bad.any()):  # one device sync; a position past the context has no cache row
                raise ValueError("topk_indices hold positions outside [-1, the token's context length)")
            out[rows] = _sparse_absorb(
                q_nope[rows],
                q_rope[rows],
                kv_cache,
                table[per_token],
                positions,
                w_uk,
                w_uv,
                scale,
                r,
                backend,
            )
            continue
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


def _sparse_absorb(q_nope, q_rope, kv_cache, token_table, positions, w_uk, w_uv, scale, r, backend):
    """The sparse absorb path for packed tokens: each token is its own one-query request of the
    sparse kernel, its positions turned into cache slots through its request's block table."""
    from mlactl.kernels.sparse_decode_naive import mla_sparse_decode_naive, positions_to_slots

    q_latent = torch.einsum("thd,hdr->thr", q_nope, w_uk)  # q_absorb: [T, H, r]
    q = torch.cat([q_latent, q_rope], dim=-1)[:, None]  # [T, 1, H, r + dR]
    block_size = kv_cache.shape[1]
    slots = positions_to_slots(positions[:, None, :], token_table, block_size)  # [T, 1, topk]
    if backend == "triton":
        from mlactl.kernels.sparse_decode import mla_sparse_decode

        o, _ = mla_sparse_decode(q, kv_cache, slots, scale, r=r)
    else:
        o, _ = mla_sparse_decode_naive(q, kv_cache, slots, scale, r=r)
    return torch.einsum("thr,hvr->thv", o[:, 0], w_uv)  # out_absorb: [T, H, dV]
