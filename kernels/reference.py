"""A tiny but complete MLA layer in plain torch: the executable statement of the math in
docs/design.md ("The math").

One sequence, decoupled RoPE, both attention paths:

* expand: up-project every context latent c into per-head k_nope = W_UK c and v = W_UV c, then
  ordinary multi-head attention with qk dim dC+dR (q_nope.k_nope + q_rope.k_rope) and v dim dV;
* absorb: q~ = W_UK^T q_nope moves each query into latent space, then one MQA against the cache
  rows [c | k_r] (key r+dR, value r, shared by all heads), then W_UV maps the latent output back.

Both use scale = 1/sqrt(dC+dR) and give the same output to rounding (tests/test_reference.py
checks 1e-10 in fp64). Meant for fp32/fp64 on a CPU: every tensor is materialised.

Layer (DeepSeek-V2 paper, section 2.1, without the MoE and residual around it)::

    c_q  = RMSNorm(W_DQ x)                      (q_lora_rank; skipped when W_DQ is None: c_q = x)
    q_n  = W_UQ_nope c_q       [H, dC]          q_r = RoPE(W_UQ_rope c_q)   [H, dR]
    c    = RMSNorm(W_DKV x)    [r]              k_r = RoPE(W_KR x)          [dR]  (the cache row)
    o[h] = attention of (q_n, q_r) over the context       [H, dV]
    y    = W_O concat_h(o[h])  [hidden]

RoPE is the rotate-half ("neox") form on the last dR features, base 10000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _dim(weight: str, axis: int) -> property:
    """A read-only attribute: `weight`'s size along `axis`."""
    return property(lambda self: int(getattr(self, weight).shape[axis]))


@dataclass
class MLAWeights:
    """Weights of one MLA layer; every projection is stored [out, in] like nn.Linear.weight."""

    w_uq_nope: torch.Tensor  # [H, dC, q_in]   q_in = q_lora_rank, or hidden without W_DQ
    w_uq_rope: torch.Tensor  # [H, dR, q_in]
    w_dkv: torch.Tensor  # [r, hidden]
    kv_norm: torch.Tensor  # [r]             RMSNorm weight of the latent
    w_kr: torch.Tensor  # [dR, hidden]
    w_uk: torch.Tensor  # [H, dC, r]
    w_uv: torch.Tensor  # [H, dV, r]
    w_o: torch.Tensor  # [hidden, H*dV]
    w_dq: torch.Tensor | None = None  # [q_lora_rank, hidden]
    q_norm: torch.Tensor | None = None  # [q_lora_rank]
    rope_base: float = 10000.0
    eps: float = 1e-6

    # the MLA dims, read off the weights' shapes
    H = _dim("w_uk", 0)
    r = _dim("w_uk", 2)
    dR = _dim("w_kr", 0)
    dC = _dim("w_uk", 1)
    dV = _dim("w_uv", 1)
    hidden = _dim("w_dkv", 1)

    @property
    def scale(self) -> float:
        """Softmax scale of both paths: 1/sqrt(dC + dR), the qk dim of the expand path."""
        return 1.0 / math.sqrt(self.dC + self.dR)


def random_weights(
    H: int,
    r: int,
    dR: int,
    dC: int,
    dV: int,
    hidden: int,
    q_lora_rank: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> MLAWeights:
    """Random weights scaled by 1/sqrt(fan_in), so activations stay O(1) at any size."""
    if dR % 2:
        raise ValueError(f"dR must be even for RoPE (pairs of features rotate), got {dR}")
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)

    q_in = q_lora_rank or hidden
    return MLAWeights(
        w_uq_nope=w(H, dC, q_in),
        w_uq_rope=w(H, dR, q_in),
        w_dkv=w(r, hidden),
        kv_norm=norm(r),
        w_kr=w(dR, hidden),
        w_uk=w(H, dC, r),
        w_uv=w(H, dV, r),
        w_o=w(hidden, H * dV),
        w_dq=w(q_lora_rank, hidden) if q_lora_rank else None,
        q_norm=norm(q_lora_rank) if q_lora_rank else None,
    )


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE. x: [T, ..., dR]; positions: [T]. Feature i pairs with i + dR/2."""
    dR = x.shape[-1]
    freqs = base ** (-torch.arange(0, dR, 2, dtype=torch.float64, device=x.device) / dR)  # [dR/2]
    angle = positions.to(torch.float64)[:, None] * freqs[None, :]  # [T, dR/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (dR // 2,)
    cos = angle.cos().view(shape).to(x.dtype)
    sin = angle.sin().view(shape).to(x.dtype)
    x1, x2 = x[..., : dR // 2], x[..., dR // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def project(w: MLAWeights, hidden: torch.Tensor, prefix_len: int = 0):
    """Queries of the new tokens and cache rows of all tokens.

    hidden: [T, hidden], the whole context; the last T - prefix_len tokens are new.
    returns q_nope [n, H, dC], q_rope [n, H, dR] (RoPE at positions prefix_len..T-1),
            c [T, r], k_r [T, dR] (RoPE at 0..T-1); n = T - prefix_len.
    """
    T = hidden.shape[0]
    if not 0 <= prefix_len <= T:
        raise ValueError(f"prefix_len must be in [0, {T}] (the tokens of hidden), got {prefix_len}")
    pos = torch.arange(T, device=hidden.device)
    c = rms_norm(hidden @ w.w_dkv.T, w.kv_norm, w.eps)  # [T, r]
    k_r = rope(hidden @ w.w_kr.T, pos, w.rope_base)  # [T, dR]
    x = hidden[prefix_len:]  # [n, hidden]
    c_q = x  # [n, q_in]
    if w.w_dq is not None:
        assert w.q_norm is not None, "w_dq comes with its RMSNorm weight q_norm"
        c_q = rms_norm(x @ w.w_dq.T, w.q_norm, w.eps)
    q_nope = torch.einsum("tq,hcq->thc", c_q, w.w_uq_nope)  # [n, H, dC]
    q_rope = rope(torch.einsum("tq,hdq->thd", c_q, w.w_uq_rope), pos[prefix_len:], w.rope_base)
    return q_nope, q_rope, c, k_r


def _softmax_attend(s: torch.Tensor, n: int, T: int):
    """Causal softmax of scores s [H, n, T] for the last n of T tokens: (p [H, n, T], lse [n, H])."""
    i = torch.arange(n, device=s.device)[:, None]
    j = torch.arange(T, device=s.device)[None, :]
    s = s.masked_fill(j > i + (T - n), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, n]
    return torch.exp(s - lse[..., None]), lse.transpose(0, 1)


def attend_expand(q_nope, q_rope, c, k_r, w_uk, w_uv, scale):
    """Expand path. q_nope [n, H, dC], q_rope [n, H, dR], c [T, r], k_r [T, dR],
    w_uk [H, dC, r], w_uv [H, dV, r] -> (o [n, H, dV], lse [n, H])."""
    k_nope = torch.einsum("tr,hcr->thc", c, w_uk)  # [T, H, dC]
    v = torch.einsum("tr,hvr->thv", c, w_uv)  # [T, H, dV]
    s = torch.einsum("qhc,khc->hqk", q_nope, k_nope) + torch.einsum("qhd,kd->hqk", q_rope, k_r)
    p, lse = _softmax_attend(s * scale, q_nope.shape[0], c.shape[0])
    return torch.einsum("hqk,khv->qhv", p, v), lse


def attend_absorb(q_nope, q_rope, c, k_r, w_uk, w_uv, scale):
    """Absorb path, same arguments and result as attend_expand: MQA over the latent cache."""
    q_lat = torch.einsum("qhc,hcr->qhr", q_nope, w_uk)  # [n, H, r]
    q_abs = torch.cat([q_lat, q_rope], dim=-1)  # [n, H, r+dR]
    kv = torch.cat([c, k_r], dim=-1)  # [T, r+dR]
    s = torch.einsum("qhe,ke->hqk", q_abs, kv)  # [H, n, T]
    p, lse = _softmax_attend(s * scale, q_nope.shape[0], c.shape[0])
    o_lat = torch.einsum("hqk,kr->qhr", p, c)  # [n, H, r]
    return torch.einsum("qhr,hvr->qhv", o_lat, w_uv), lse


def mla_forward(
    w: MLAWeights, hidden: torch.Tensor, prefix_len: int = 0, path: str = "expand", return_lse: bool = False
):
    """Attention output of the new tokens after a cached prefix, causal.

    hidden: [T, hidden], prefix and new tokens; returns y [T - prefix_len, hidden]
    (and lse [n, H] with return_lse). path: "expand" or "absorb".
    """
    paths = {"expand": attend_expand, "absorb": attend_absorb}
    if path not in paths:
        raise ValueError(f"path must be 'expand' or 'absorb', got {path!r}")
    q_nope, q_rope, c, k_r = project(w, hidden, prefix_len)
    o, lse = paths[path](q_nope, q_rope, c, k_r, w.w_uk, w.w_uv, w.scale)
    y = o.reshape(o.shape[0], -1) @ w.w_o.T  # [n, hidden]
    return (y, lse) if return_lse else y


def build_paged_cache(
    rows: list[torch.Tensor] | torch.Tensor,
    block_size: int,
    *,
    extra_blocks: int = 1,
    seed: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write each request's cache rows [L_b, r+dR] into a paged cache with shuffled blocks.

    The one paged-cache builder of mlactl: the tests, `mlactl tune` (mlactl/tune/inputs.py) and
    benchmarks/gpu_check.py all lay their caches out here, in blocks shuffled as an engine's
    allocator leaves them.

    rows: a list of [L_b, D] tensors, or one [B, L, D] tensor (every request L rows), any dtype
        (fp8 included) on one device.
    extra_blocks: spare blocks no request uses; unused table entries point at one of them.
    generator: shuffles the blocks (on its device); default a CPU generator seeded with `seed`.

    returns kv_cache [num_blocks, block_size, D] in the rows' dtype (blocks not written are
    zero), block_table [B, max_blocks] int32, cache_seqlens [B] int32, on the rows' device.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if extra_blocks < 1:
        raise ValueError(f"extra_blocks must be >= 1 (unused table entries point at one), got {extra_blocks}")
    D, dtype, device = rows[0].shape[-1], rows[0].dtype, rows[0].device
    need = [-(-x.shape[0] // block_size) for x in rows]
    num_blocks = sum(need) + extra_blocks
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g, device=g.device).to(device)
    kv_cache = torch.zeros(num_blocks, block_size, D, dtype=dtype, device=device)
    table = torch.full((len(rows), max(max(need), 1)), 0, dtype=torch.int32, device=device)
    table.fill_(int(perm[-1]))
    # Written as bytes: index_put has no fp8 kernel on every device, uint8 has one everywhere.
    cache_bytes = kv_cache.view(torch.uint8)  # [num_blocks, block_size, D * itemsize]
    start = 0
    for b, x in enumerate(rows):
        n = need[b]
        if n == 0:
            continue
        blocks = perm[start : start + n]
        start += n
        table[b, :n] = blocks.to(torch.int32)
        padded = torch.zeros(n * block_size, D, dtype=dtype, device=device)
        padded[: x.shape[0]] = x
        cache_bytes[blocks] = padded.view(torch.uint8).view(n, block_size, -1)
    seqlens = torch.tensor([x.shape[0] for x in rows], dtype=torch.int32, device=device)
    return kv_cache, table, seqlens
