"""kernels/merge.py: merging partial attention by lse, kernel against twin against the whole."""

import math

import pytest
import torch

from mlactl.kernels.merge import merge_attn_states, merge_attn_states_naive
from mlactl.kernels.prefill_naive import mla_prefill_naive

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF = float("inf")
TOL = {
    torch.float32: dict(atol=1e-6, rtol=1e-6),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
}


def partials(T, H, D, dtype, seed=0, empty_a=0.0, empty_b=0.0, device=DEVICE):
    """Two random partials; a fraction of rows on each side is empty (lse -inf, o garbage NaN)."""
    g = torch.Generator().manual_seed(seed)
    o_a = torch.randn(T, H, D, generator=g)
    o_b = torch.randn(T, H, D, generator=g)
    lse_a = 3 * torch.randn(T, H, generator=g)
    lse_b = 3 * torch.randn(T, H, generator=g)
    gone_a = torch.rand(T, H, generator=g) < empty_a
    gone_b = torch.rand(T, H, generator=g) < empty_b
    lse_a[gone_a] = -INF
    lse_b[gone_b] = -INF
    o_a[gone_a] = float("nan")  # an empty side's o must not matter, whatever it holds
    o_b[gone_b] = float("nan")
    return [x.to(device) for x in (o_a.to(dtype), lse_a, o_b.to(dtype), lse_b)]


SHAPES = [
    pytest.param(1, 1, 32, id="T1-H1-D32"),
    pytest.param(17, 3, 48, id="T17-H3-D48"),
    pytest.param(100, 2, 512, id="T100-H2-D512"),
    pytest.param(5, 130, 16, id="T5-H130-D16"),
    pytest.param(3, 33, 40, id="T3-H33-D40"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "empty",
    [(0.0, 0.0), (0.3, 0.0), (0.0, 0.3), (0.4, 0.4), (1.0, 1.0)],
    ids=["none-empty", "a-empty", "b-empty", "both-some", "all-empty"],
)
@pytest.mark.parametrize("T, H, D", SHAPES)
def test_kernel_matches_twin(T, H, D, empty, dtype):
    o_a, lse_a, o_b, lse_b = partials(T, H, D, dtype, seed=T + H, empty_a=empty[0], empty_b=empty[1])
    out = torch.full_like(o_a, float("nan"))
    o, lse = merge_attn_states(o_a, lse_a, o_b, lse_b, out=out)
    ref_o, ref_lse = merge_attn_states_naive(o_a, lse_a, o_b, lse_b)
    assert o.data_ptr() == out.data_ptr()
    assert not o.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(o, ref_o, **TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)
    both = (lse_a == -INF) & (lse_b == -INF)
    assert (o[both] == 0).all() and (lse[both] == -INF).all()


@pytest.mark.parametrize("fn", [merge_attn_states, merge_attn_states_naive], ids=["kernel", "twin"])
def test_one_empty_side_passes_the_other_through(fn):
    o_a, lse_a, o_b, lse_b = partials(9, 2, 32, torch.float32, seed=1)
    lse_b[:] = -INF
    o_b[:] = float("nan")
    o, lse = fn(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o, o_a, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, lse_a, atol=1e-6, rtol=1e-6)
    o, lse = fn(o_b, lse_b, o_a, lse_a)  # and the mirror image
    torch.testing.assert_close(o, o_a, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("fn", [merge_attn_states, merge_attn_states_naive], ids=["kernel", "twin"])
def test_merging_two_key_halves_gives_attention_over_all_keys(fn):
    """Independent of both: attention over keys [0, 40) == merge of [0, 13) and [13, 40)."""
    g = torch.Generator().manual_seed(3)
    H, dC, dR, dV = 2, 16, 16, 24
    q = torch.randn(7, H, dC + dR, generator=g).to(DEVICE)
    kn, kr, v = (
        torch.randn(40, H, dC, generator=g).to(DEVICE),
        torch.randn(40, dR, generator=g).to(DEVICE),
        torch.randn(40, H, dV, generator=g).to(DEVICE),
    )

    def attend(a, b):
        cu_q = torch.tensor([0, 7], dtype=torch.int32, device=DEVICE)
        cu_k = torch.tensor([0, b - a], dtype=torch.int32, device=DEVICE)
        return mla_prefill_naive(q, kn[a:b], kr[a:b], v[a:b], cu_q, cu_k, 0.2, causal=False)

    whole_o, whole_lse = attend(0, 40)
    o, lse = fn(*attend(0, 13), *attend(13, 40))
    torch.testing.assert_close(o, whole_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, whole_lse, atol=1e-5, rtol=1e-5)


def test_twin_against_a_scalar_formula():
    o_a, lse_a, o_b, lse_b = partials(3, 2, 4, torch.float32, seed=5, device="cpu")
    o, lse = merge_attn_states_naive(o_a, lse_a, o_b, lse_b)
    for t in range(3):
        for h in range(2):
            la, lb = lse_a[t, h].item(), lse_b[t, h].item()
            z = math.exp(la) + math.exp(lb)
            assert abs(lse[t, h].item() - math.log(z)) < 1e-5
            for d in range(4):
                want = (math.exp(la) * o_a[t, h, d].item() + math.exp(lb) * o_b[t, h, d].item()) / z
                assert abs(o[t, h, d].item() - want) < 1e-5


@pytest.mark.parametrize("fn", [merge_attn_states, merge_attn_states_naive], ids=["kernel", "twin"])
def test_in_place_mixed_dtypes_and_strided(fn):
    """out may be o_a itself; o_b may be another dtype; row/head strides are free."""
    o_a, lse_a, o_b, lse_b = partials(11, 3, 32, torch.float32, seed=2, empty_a=0.2)
    big = torch.randn(11, 3, 64, device=DEVICE, dtype=torch.float16)
    big[..., :32] = o_b.half()
    o_b16 = big[..., :32]
    ref_o, ref_lse = merge_attn_states_naive(o_a.clone(), lse_a, o_b16.contiguous(), lse_b)
    o, lse = fn(o_a, lse_a.t().contiguous().t(), o_b16, lse_b, out=o_a)
    assert o.data_ptr() == o_a.data_ptr() and o.dtype == torch.float32
    torch.testing.assert_close(o, ref_o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, ref_lse)


def test_no_tokens():
    o, lse = merge_attn_states(*partials(0, 2, 32, torch.float32))
    assert o.shape == (0, 2, 32) and lse.shape == (0, 2)


BAD = {
    "o_a-2d": (lambda a: a.update(o_a=a["o_a"][:, 0]), "o_a must have 3 dimensions"),
    "o_b-shape": (lambda a: a.update(o_b=a["o_b"][:, :, :16]), "o_b has shape"),
    "o_a-int": (lambda a: a.update(o_a=a["o_a"].to(torch.int32)), "o_a has dtype"),
    "lse_a-fp16": (lambda a: a.update(lse_a=a["lse_a"].half()), "lse_a has dtype"),
    "lse_b-shape": (lambda a: a.update(lse_b=a["lse_b"][:, :1]), "lse_b has shape"),
    "lse_b-3d": (lambda a: a.update(lse_b=a["lse_b"][..., None]), "lse_b must have 2"),
    "o_b-inner-stride": (
        lambda a: a.update(o_b=a["o_b"].transpose(1, 2).contiguous().transpose(1, 2)),
        "o_b must have unit stride",
    ),
    "out-shape": (lambda a: a.update(out=torch.empty(4, 2, 8, device=DEVICE)), "out has shape"),
    "devices": (lambda a: a.update(lse_b=a["lse_b"].to("meta")), "different devices"),
}


@pytest.mark.parametrize("fn", [merge_attn_states, merge_attn_states_naive], ids=["kernel", "twin"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs_name_the_argument(case, fn):
    o_a, lse_a, o_b, lse_b = partials(4, 2, 32, torch.float32)
    args = dict(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    mutate, match = BAD[case]
    mutate(args)
    with pytest.raises(ValueError, match=match):
        fn(**args)


def test_cpu_tensors_refused_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="need CUDA tensors"):
        merge_attn_states(*partials(4, 2, 32, torch.float32, device="cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("D", [128, 512], ids=["D128-expand", "D512-absorb-latent"])
def test_gpu_deepseek_bf16(D):
    o_a, lse_a, o_b, lse_b = partials(8192, 128, D, torch.bfloat16, empty_a=0.05, empty_b=0.05, device="cuda")
    o, lse = merge_attn_states(o_a, lse_a, o_b, lse_b)
    ref_o, ref_lse = merge_attn_states_naive(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o, ref_o, **TOL[torch.bfloat16])
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)
