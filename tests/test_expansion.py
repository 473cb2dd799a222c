"""kernels/expansion.py: paged gather, latent expansion, and the chunked == unchunked == reference
expand path (with the Triton kernels and with the torch twins)."""

import pytest
import torch

from mlactl.kernels import reference as R
from mlactl.kernels._checks import FP8_DTYPES
from mlactl.kernels.expansion import expand_kv, gather_latents, mla_prefill_chunked, mla_prefill_expand
from mlactl.kernels.merge import merge_attn_states_naive
from mlactl.kernels.prefill_naive import mla_prefill_naive

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
BACKENDS = {"kernel": dict(), "twin": dict(attn=mla_prefill_naive, merge=merge_attn_states_naive)}


# ---- expand_kv --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "T, H, r, dC, dV",
    [pytest.param(1, 1, 32, 32, 32, id="T1-H1-r32"), pytest.param(17, 3, 64, 32, 24, id="T17-H3-r64-dV24")],
)
def test_expand_kv_is_the_per_head_projection(T, H, r, dC, dV, dtype):
    g = torch.Generator().manual_seed(T)
    latent, w_uk, w_uv = (torch.randn(*s, generator=g).to(DEVICE, dtype) for s in ((T, r), (H, dC, r), (H, dV, r)))
    k_nope, v = expand_kv(latent, w_uk, w_uv)
    assert k_nope.shape == (T, H, dC) and v.shape == (T, H, dV) and k_nope.dtype == dtype
    for h in range(H):  # k_nope[t, h] = W_UK[h] @ c[t]
        torch.testing.assert_close(k_nope[:, h].float(), latent.float() @ w_uk[h].float().T, **TOL[dtype])
        torch.testing.assert_close(v[:, h].float(), latent.float() @ w_uv[h].float().T, **TOL[dtype])


@pytest.mark.parametrize(
    "args, match",
    [
        pytest.param(((4, 8, 2), (2, 16, 8), (2, 16, 8)), "latent must have 2", id="latent-3d"),
        pytest.param(((4, 8), (2, 16, 4), (2, 16, 8)), r"w_uv.shape\[2\]", id="r-mismatch"),
        pytest.param(((4, 8), (2, 16, 4), (2, 16, 4)), r"w_uk.shape\[2\]", id="latent-r"),
        pytest.param(((4, 8), (2, 16, 8), (3, 16, 8)), "heads", id="heads"),
    ],
)
def test_expand_kv_bad_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        expand_kv(*(torch.zeros(*s) for s in args))


def test_expand_kv_dtype_mismatch():
    with pytest.raises(ValueError, match="latent has dtype"):
        expand_kv(torch.zeros(4, 8, dtype=torch.float16), torch.zeros(2, 16, 8), torch.zeros(2, 16, 8))


# ---- gather_latents ---------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_gather_latents_reads_each_context_in_order(block_size):
    g = torch.Generator().manual_seed(block_size)
    rows = [torch.randn(n, 48, generator=g) for n in (13, 0, 1, 40)]
    kv, table, lens = R.build_paged_cache([x.to(DEVICE) for x in rows], block_size)
    latent, k_rope, cu = gather_latents(kv, table, lens, r=32)
    assert cu.tolist() == [0, 13, 13, 14, 54] and cu.dtype == torch.int32
    torch.testing.assert_close(torch.cat([latent, k_rope], -1).cpu(), torch.cat(rows))


def test_gather_latents_default_r_only_for_deepseek_rows():
    kv, table, lens = R.build_paged_cache([torch.randn(3, 576).to(DEVICE)], 4)
    latent, k_rope, _ = gather_latents(kv, table, lens)
    assert latent.shape == (3, 512) and k_rope.shape == (3, 64)
    kv, table, lens = R.build_paged_cache([torch.randn(3, 96).to(DEVICE)], 4)
    with pytest.raises(ValueError, match="pass r="):
        gather_latents(kv, table, lens)


def test_gather_latents_applies_kv_scale_to_any_cache():
    rows = torch.randn(9, 48).to(DEVICE)
    kv, table, lens = R.build_paged_cache([rows], 4)
    latent, k_rope, _ = gather_latents(kv, table, lens, kv_scale=0.5, r=32)
    torch.testing.assert_close(torch.cat([latent, k_rope], -1), rows * 0.5)


@pytest.mark.skipif(not FP8_DTYPES, reason="torch without fp8")
@pytest.mark.parametrize("kv_scale", [0.05, "tensor"], ids=["float", "tensor"])
def test_gather_latents_dequantizes_fp8(kv_scale):
    rows = torch.randn(21, 48, generator=torch.Generator().manual_seed(0))
    q8 = (rows / 0.05).to(FP8_DTYPES[0]).to(DEVICE)
    kv, table, lens = R.build_paged_cache([q8], 8)
    scale = torch.tensor([0.05], device=DEVICE) if kv_scale == "tensor" else kv_scale
    latent, k_rope, _ = gather_latents(kv, table, lens, kv_scale=scale, r=32, dtype=torch.float32)
    want = q8.float() * 0.05
    torch.testing.assert_close(torch.cat([latent, k_rope], -1), want)
    torch.testing.assert_close(want.cpu(), rows, atol=0.05 * 32, rtol=0.07)  # fp8 e4m3: ~6% steps
    assert gather_latents(kv, table, lens, kv_scale=scale, r=32)[0].dtype == torch.bfloat16


def _paged():
    return R.build_paged_cache([torch.randn(10, 48).to(DEVICE), torch.randn(3, 48).to(DEVICE)], 4)


@pytest.mark.parametrize(
    "mutate, match",
    [
        pytest.param(
            lambda a: a.update(block_table=a["block_table"] + 100), "block_table holds block", id="block-out-of-range"
        ),
        pytest.param(
            lambda a: a.update(block_table=a["block_table"] - 100), "block_table holds block", id="block-negative"
        ),
        pytest.param(
            lambda a: a.update(block_table=a["block_table"].long()), "block_table has dtype", id="table-int64"
        ),
        pytest.param(
            lambda a: a.update(cache_seqlens=a["cache_seqlens"] + 100), r"cache_seqlens\[0\]", id="seqlen-too-long"
        ),
        pytest.param(
            lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), "cache_seqlens has 1 entries", id="seqlens-batch"
        ),
        pytest.param(lambda a: a.update(kv_scale=-0.5), "kv_scale", id="kv-scale-negative"),
        pytest.param(lambda a: a.update(kv_scale=torch.ones(2)), "kv_scale must be", id="kv-scale-shape"),
        pytest.param(lambda a: a.update(r=48), "r must be", id="r-whole-row"),
        pytest.param(lambda a: a.update(r=None), "pass r=", id="r-not-inferable"),
        pytest.param(lambda a: a.update(kv_cache=a["kv_cache"][0]), "kv_cache must have 3", id="cache-2d"),
    ],
)
def test_gather_latents_bad_inputs(mutate, match):
    kv, table, lens = _paged()
    args = dict(kv_cache=kv, block_table=table, cache_seqlens=lens, r=32)
    mutate(args)
    with pytest.raises(ValueError, match=match):
        gather_latents(**args)


# ---- the drivers against reference.py --------------------------------------------------------

H, r, dR, dC, dV, HIDDEN = 2, 32, 16, 32, 32, 48


def batch(ctx, new, dtype=torch.float32, block_size=8, seed=0):
    """A batch built from reference.py's layer: paged cache, packed q, the fp64 reference output."""
    w = R.random_weights(H, r, dR, dC, dV, HIDDEN, q_lora_rank=24, seed=seed)
    g = torch.Generator().manual_seed(seed)
    rows, qs, outs, lses = [], [], [], []
    for c, n in zip(ctx, new):
        x = torch.randn(c, HIDDEN, dtype=torch.float64, generator=g)
        q_nope, q_rope, lat, k_r = R.project(w, x, c - n)
        rows.append(torch.cat([lat, k_r], -1))
        qs.append(torch.cat([q_nope, q_rope], -1))
        o, lse = R.attend_expand(q_nope, q_rope, lat, k_r, w.w_uk, w.w_uv, w.scale)
        outs.append(o)
        lses.append(lse)
    kv, table, lens = R.build_paged_cache([x.to(DEVICE, dtype) for x in rows], block_size, seed=seed)
    args = dict(
        q=torch.cat(qs).to(DEVICE, dtype),
        kv_cache=kv,
        block_table=table,
        cache_seqlens=lens,
        new_lens=torch.tensor(new, dtype=torch.int32, device=DEVICE),
        w_uk=w.w_uk.to(DEVICE, dtype),
        w_uv=w.w_uv.to(DEVICE, dtype),
        scale=w.scale,
        r=r,
    )
    return args, torch.cat(outs).to(DEVICE), torch.cat(lses).to(DEVICE)


# prefixes 23, 0, 0, 39, 0 (62 in all); request 2 has no new token, request 4 no prefix
CTX, NEW = [30, 5, 9, 40, 12], [7, 5, 0, 1, 12]


def check(out, lse, ref_out, ref_lse, dtype):
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.double(), ref_out, **TOL[dtype])
    torch.testing.assert_close(lse.double(), ref_lse, **TOL[dtype])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_unchunked_equals_reference(backend):
    args, ref_out, ref_lse = batch(CTX, NEW)
    check(*mla_prefill_expand(**args, attn=BACKENDS[backend].get("attn")), ref_out, ref_lse, torch.float32)


# prefixes 23 and 39: chunk 1, 8 and 17 (divide neither), 13 (divides 39), 23 (divides 23),
# 1000 (more than either)
@pytest.mark.parametrize("chunk", [1, 8, 13, 17, 23, 1000])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_chunked_equals_unchunked_equals_reference(backend, chunk):
    args, ref_out, ref_lse = batch(CTX, NEW)
    out, lse = mla_prefill_chunked(**args, chunk=chunk, **BACKENDS[backend])
    check(out, lse, ref_out, ref_lse, torch.float32)
    whole_out, whole_lse = mla_prefill_expand(**args, attn=BACKENDS[backend].get("attn"))
    torch.testing.assert_close(out, whole_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, whole_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [6, 7, 24, 100])
def test_chunked_single_request_prefix_24(chunk):
    """One request, prefix 24: chunks that divide it (6, 24) and that do not (7, 100)."""
    args, ref_out, ref_lse = batch([31], [7], seed=3)
    check(*mla_prefill_chunked(**args, chunk=chunk), ref_out, ref_lse, torch.float32)


def test_chunked_fp16_with_the_kernels():
    args, ref_out, ref_lse = batch(CTX, NEW, dtype=torch.float16, block_size=16)
    check(*mla_prefill_chunked(**args, chunk=20), ref_out, ref_lse, torch.float16)


def test_expanded_kv_is_max_new_chunk_per_request():
    """The memory contract: after the new tokens, each step expands <= chunk tokens per request."""
    steps = []

    def attn(q, k_nope, k_rope, v, cu_q, cu_k, *a, **kw):
        steps.append((k_nope.shape[0], (cu_k[1:] - cu_k[:-1]).tolist()))
        return mla_prefill_naive(q, k_nope, k_rope, v, cu_q, cu_k, *a, **kw)

    args, ref_out, _ = batch(CTX, NEW)
    out, _ = mla_prefill_chunked(**args, chunk=10, attn=attn, merge=merge_attn_states_naive)
    # prefixes 23, 0, 0, 39, 0: new tokens, then ceil(39 / 10) steps over requests 0..3
    assert steps == [(sum(NEW), NEW), (20, [10, 0, 0, 10]), (20, [10, 0, 0, 10]), (13, [3, 0, 0, 10]), (9, [9])]
    torch.testing.assert_close(out.double(), ref_out, **TOL[torch.float32])


@pytest.mark.skipif(not FP8_DTYPES, reason="torch without fp8")
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_fp8_cache_with_kv_scale(backend):
    args, _, _ = batch(CTX, NEW)
    scale = 0.02
    kv8 = (args["kv_cache"] / scale).to(FP8_DTYPES[0])
    deq = dict(args, kv_cache=kv8.float() * scale)  # the same numbers, dequantized up front
    want_out, want_lse = mla_prefill_expand(**deq, attn=mla_prefill_naive)
    out, lse = mla_prefill_chunked(**dict(args, kv_cache=kv8), kv_scale=scale, chunk=25, **BACKENDS[backend])
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not FP8_DTYPES, reason="torch without fp8")
def test_fp8_cache_needs_kv_scale():
    args, _, _ = batch(CTX, NEW)
    args["kv_cache"] = args["kv_cache"].to(FP8_DTYPES[0])
    with pytest.raises(ValueError, match="kv_scale is required"):
        mla_prefill_chunked(**args, attn=mla_prefill_naive)


def test_no_new_tokens_at_all():
    args, _, _ = batch([5, 3], [0, 0])
    out, lse = mla_prefill_chunked(**args, chunk=2, **BACKENDS["twin"])
    assert out.shape == (0, H, dV) and lse.shape == (0, H)


@pytest.mark.parametrize("fn", [mla_prefill_chunked, mla_prefill_expand], ids=["chunked", "expand"])
@pytest.mark.parametrize(
    "mutate, match",
    [
        pytest.param(
            lambda a: a.update(new_lens=torch.tensor([7, 5, 0, 41, 12], dtype=torch.int32, device=DEVICE)),
            r"new_lens\[3\] is 41",
            id="new-gt-context",
        ),
        pytest.param(
            lambda a: a.update(new_lens=torch.tensor([7, 5, 0, 1, 11], dtype=torch.int32, device=DEVICE)),
            "new_lens sums to 24",
            id="new-sum",
        ),
        pytest.param(lambda a: a.update(new_lens=a["new_lens"].long()), "new_lens has dtype", id="new-int64"),
        pytest.param(lambda a: a.update(q=a["q"][..., :40]), r"q.shape\[2\]", id="q-width"),
        pytest.param(lambda a: a.update(w_uk=a["w_uk"].half(), w_uv=a["w_uv"].half()), "w_uk has dtype", id="w-dtype"),
        pytest.param(lambda a: a.update(w_uk=a["w_uk"][:1]), "heads", id="w-heads"),
        pytest.param(lambda a: a.update(kv_scale=float("nan")), "kv_scale", id="kv-scale-nan"),
        pytest.param(lambda a: a.update(scale=0.0), "scale", id="scale-zero"),
        pytest.param(lambda a: a.update(scale=float("nan")), "scale", id="scale-nan"),
    ],
)
def test_driver_bad_inputs(fn, mutate, match):
    args, _, _ = batch(CTX, NEW)
    mutate(args)
    with pytest.raises(ValueError, match=match):
        fn(**args, attn=mla_prefill_naive)


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True])
def test_bad_chunk(chunk):
    args, _, _ = batch(CTX, NEW)
    with pytest.raises(ValueError, match="chunk must be"):
        mla_prefill_chunked(**args, chunk=chunk)


# ---- GPU: DeepSeek-V3 shapes, bf16 ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "ctx, new, chunk",
    [
        pytest.param([8192], [1024], 2048, id="B1-ctx8192-new1024-chunk2048"),
        pytest.param([3000, 17, 5000], [300, 17, 1], 1000, id="B3-varlen-chunk1000"),
    ],
)
def test_gpu_deepseek_chunked_bf16(ctx, new, chunk):
    Hd, rd, dRd, dCd, dVd = 128, 512, 64, 128, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = [torch.randn(c, rd + dRd, device="cuda", generator=g).bfloat16() for c in ctx]
    kv, table, lens = R.build_paged_cache(rows, 64)
    args = dict(
        q=torch.randn(sum(new), Hd, dCd + dRd, device="cuda", generator=g).bfloat16(),
        kv_cache=kv,
        block_table=table,
        cache_seqlens=lens,
        new_lens=torch.tensor(new, dtype=torch.int32, device="cuda"),
        w_uk=(torch.randn(Hd, dCd, rd, device="cuda", generator=g) / rd**0.5).bfloat16(),
        w_uv=(torch.randn(Hd, dVd, rd, device="cuda", generator=g) / rd**0.5).bfloat16(),
        scale=(dCd + dRd) ** -0.5,
    )
    out, lse = mla_prefill_chunked(**args, chunk=chunk)
    ref_out, ref_lse = mla_prefill_expand(**args, attn=mla_prefill_naive)
    torch.testing.assert_close(out.float(), ref_out.float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(lse, ref_lse, **TOL[torch.bfloat16])
