"""Random inputs for the kernels and paths, made on the device that will run them.

Values are normal random numbers (never zeros: zeros hide unwritten outputs and run faster than
real data on some GPUs), scaled so that softmax and the projections stay in a realistic range.
Paged caches get their blocks in a shuffled order, as an engine's allocator leaves them.

torch (and the kernel modules, which import it) load when inputs are first made, not with this
module: `mlactl.tune.space` and `sweep` import it, and a Ray worker imports those before it sets
TRITON_INTERPRET, while `mlactl tune` without torch must still end in its one-line hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlactl.util.defaults import KV_PAGE

if TYPE_CHECKING:
    import torch

PAGE = KV_PAGE
FP8_SCALE = 0.05  # per-tensor scale of an fp8 cache: N(0,1) values / 0.05 stay inside e4m3's range


def torch_dtype(name: str) -> torch.dtype:
    from mlactl.kernels._checks import TORCH_DTYPES

    return TORCH_DTYPES[name]


def _start(device, seed: int, dtype: str):
    """(torch device, a generator seeded on it, the torch dtype): what every input maker starts from."""
    import torch

    device = torch.device(device)
    return device, torch.Generator(device=device).manual_seed(seed), torch_dtype(dtype)


@dataclass
class PagedBatch:
    """A uniform batch: every request has `new` new tokens after `prefix` cached ones."""

    q_nope: torch.Tensor  # [B*new, H, dC]
    q_rope: torch.Tensor  # [B*new, H, dR]
    kv_cache: torch.Tensor  # [num_blocks, PAGE, r + dR]
    block_table: torch.Tensor  # [B, blocks per request] int32
    cache_seqlens: torch.Tensor  # [B] int32
    new_lens: torch.Tensor  # [B] int32
    w_uk: torch.Tensor  # [H, dC, r]
    w_uv: torch.Tensor  # [H, dV, r]
    kv_scale: float | None
    scale: float

    def attention_args(self) -> dict:
        return dict(
            q_nope=self.q_nope,
            q_rope=self.q_rope,
            kv_cache=self.kv_cache,
            block_table=self.block_table,
            cache_seqlens=self.cache_seqlens,
            new_lens=self.new_lens,
            w_uk=self.w_uk,
            w_uv=self.w_uv,
            scale=self.scale,
            kv_scale=self.kv_scale,
        )


def paged_cache(
    B: int,
    context: int,
    width: int,
    kv_dtype: str,
    dtype: torch.dtype,
    device,
    generator: torch.Generator,
    page: int = PAGE,
):
    """(kv_cache [num_blocks, page, width], block_table [B, n] int32, kv_scale or None): `B`
    requests of `context` random rows each, laid out by reference.build_paged_cache."""
    import torch

    from mlactl.kernels.reference import build_paged_cache

    rows = torch.randn(B, context, width, device=device, generator=generator, dtype=torch.float32)
    kv_scale = None
    if kv_dtype == "fp8":
        kv_scale = FP8_SCALE
        rows = (rows * (0.5 / kv_scale)).to(torch.float8_e4m3fn)  # values ~N(0, 0.5) once scaled back
    else:
        rows = rows.to(dtype)
    cache, table, _ = build_paged_cache(rows, page, generator=generator)
    return cache, table, kv_scale


def paged_batch(
    cfg, B: int, new: int, prefix: int, kv_dtype: str, dtype: str, device, seed: int = 0, page: int = PAGE
) -> PagedBatch:
    import torch

    device, g, dt = _start(device, seed, dtype)
    context = prefix + new
    kv_cache, table, kv_scale = paged_cache(B, context, cfg.r + cfg.dR, kv_dtype, dt, device, g, page)
    T = B * new

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=g, dtype=torch.float32) * scale).to(dt)

    return PagedBatch(
        q_nope=randn(T, cfg.H, cfg.dC),
        q_rope=randn(T, cfg.H, cfg.dR),
        kv_cache=kv_cache,
        block_table=table,
        cache_seqlens=torch.full((B,), context, dtype=torch.int32, device=device),
        new_lens=torch.full((B,), new, dtype=torch.int32, device=device),
        w_uk=randn(cfg.H, cfg.dC, cfg.r, scale=cfg.r**-0.5),
        w_uv=randn(cfg.H, cfg.dV, cfg.r, scale=cfg.r**-0.5),
        kv_scale=kv_scale,
        scale=cfg.softmax_scale,
    )


def decode_inputs(
    cfg, B: int, S_q: int, context: int, kv_dtype: str, dtype: str, device, seed: int = 0, page: int = PAGE
) -> dict:
    """Arguments of mla_decode: q [B, S_q, H, r + dR] and a paged cache of `context` tokens."""
    import torch

    device, g, dt = _start(device, seed, dtype)
    kv_cache, table, kv_scale = paged_cache(B, context, cfg.r + cfg.dR, kv_dtype, dt, device, g, page)
    q = (torch.randn(B, S_q, cfg.H, cfg.r + cfg.dR, device=device, generator=g) * 0.5).to(dt)
    return dict(
        q=q,
        kv_cache=kv_cache,
        block_table=table,
        cache_seqlens=torch.full((B,), context, dtype=torch.int32, device=device),
        scale=cfg.softmax_scale,
        causal=True,
        kv_scale=kv_scale,
        r=cfg.r,
    )


def prefill_inputs(cfg, L: int, dtype: str, device, seed: int = 0) -> dict:
    """Arguments of mla_prefill: one causal sequence of L tokens, expanded K/V."""
    import torch

    device, g, dt = _start(device, seed, dtype)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g).to(dt)

    cu = torch.tensor([0, L], dtype=torch.int32, device=device)
    return dict(
        q=randn(L, cfg.H, cfg.dC + cfg.dR),
        k_nope=randn(L, cfg.H, cfg.dC),
        k_rope=randn(L, cfg.dR),
        v=randn(L, cfg.H, cfg.dV),
        cu_seqlens_q=cu,
        cu_seqlens_k=cu,
        scale=cfg.softmax_scale,
        causal=True,
        max_seqlen_q=L,
        max_seqlen_k=L,
    )


def merge_inputs(T: int, H: int, D: int, dtype: str, device, seed: int = 0) -> dict:
    import torch

    device, g, dt = _start(device, seed, dtype)
    return dict(
        o_a=torch.randn(T, H, D, device=device, generator=g).to(dt),
        lse_a=torch.randn(T, H, device=device, generator=g),
        o_b=torch.randn(T, H, D, device=device, generator=g).to(dt),
        lse_b=torch.randn(T, H, device=device, generator=g),
    )


def sparse_decode_inputs(
    cfg, B: int, S_q: int, topk: int, context: int, kv_dtype: str, dtype: str, device, seed: int = 0, page: int = PAGE
) -> dict:
    """Arguments of mla_sparse_decode: q [B, S_q, H, r + dR], a paged cache of `context` tokens a
    request (fp8: FlashMLA's sparse layout, whose scales are in the rows) and each query's
    `topk` slots, drawn without repeats from its own request's pages."""
    import torch

    from mlactl.kernels.reference import build_paged_cache
    from mlactl.kernels.sparse_decode_naive import quantize_sparse_fp8

    device, g, dt = _start(device, seed, dtype)
    rows = torch.randn(B, context, cfg.r + cfg.dR, device=device, generator=g) * 0.5
    cache, table, _ = build_paged_cache(rows.to(dt) if kv_dtype != "fp8" else rows, page, generator=g)
    if kv_dtype == "fp8":
        cache = quantize_sparse_fp8(cache, cfg.r)
    pos = torch.argsort(torch.rand(B * S_q, context, device=device, generator=g), dim=1)[:, :topk]  # [B*S_q, topk]
    pos = pos.reshape(B, S_q, -1)
    pages = torch.gather(table.long(), 1, (pos // page).reshape(B, -1)).reshape(pos.shape)
    slots = (pages * page + pos % page).to(torch.int32)
    q = (torch.randn(B, S_q, cfg.H, cfg.r + cfg.dR, device=device, generator=g) * 0.5).to(dt)
    return dict(q=q, kv_cache=cache, indices=slots, scale=cfg.softmax_scale, r=cfg.r)
