"""kernels/reference.py: the expand and absorb paths of a whole MLA layer agree (fp64, 1e-10)."""

import math

import pytest
import torch

from mlactl.kernels import reference as R

# (H, r, dR, dC, dV, hidden, q_lora_rank, T, prefix_len)
SHAPES = [
    pytest.param(1, 8, 4, 8, 8, 16, None, 1, 0, id="H1-r8-T1-prefill"),
    pytest.param(2, 32, 16, 32, 32, 48, 24, 17, 0, id="H2-r32-T17-prefill-qlora"),
    pytest.param(4, 64, 16, 32, 24, 64, None, 40, 33, id="H4-r64-T40-prefix33"),
    pytest.param(3, 48, 8, 16, 40, 32, 16, 23, 22, id="H3-r48-T23-decode"),
]


@pytest.mark.parametrize("H, r, dR, dC, dV, hidden, q_lora, T, prefix", SHAPES)
def test_expand_equals_absorb(H, r, dR, dC, dV, hidden, q_lora, T, prefix):
    w = R.random_weights(H, r, dR, dC, dV, hidden, q_lora_rank=q_lora, seed=H + r)
    x = torch.randn(T, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
    y_e, lse_e = R.mla_forward(w, x, prefix, path="expand", return_lse=True)
    y_a, lse_a = R.mla_forward(w, x, prefix, path="absorb", return_lse=True)
    assert y_e.shape == (T - prefix, hidden)
    assert lse_e.shape == (T - prefix, H)
    torch.testing.assert_close(y_e, y_a, rtol=0, atol=1e-10)
    torch.testing.assert_close(lse_e, lse_a, rtol=0, atol=1e-10)
    assert y_e.abs().max() > 1e-3  # not trivially zero


@pytest.mark.parametrize("path", ["expand", "absorb"])
def test_scale_is_one_over_sqrt_dC_plus_dR(path):
    H, r, dR, dC, dV, hidden, T, prefix = 2, 16, 8, 24, 16, 32, 9, 4
    w = R.random_weights(H, r, dR, dC, dV, hidden, seed=3)
    assert w.scale == 1 / math.sqrt(dC + dR)
    x = torch.randn(T, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _, lse = R.mla_forward(w, x, prefix, path=path, return_lse=True)
    # independent: scores from the explicit per-head keys, scaled by 1/sqrt(dC+dR)
    q_nope, q_rope, c, k_r = R.project(w, x, prefix)
    for i in range(T - prefix):
        for h in range(H):
            scores = [
                (q_nope[i, h] @ (w.w_uk[h] @ c[j]) + q_rope[i, h] @ k_r[j]).item() / math.sqrt(dC + dR)
                for j in range(prefix + i + 1)
            ]
            expected = math.log(sum(math.exp(s) for s in scores))
            assert abs(lse[i, h].item() - expected) < 1e-10


def test_new_tokens_only_see_their_past():
    w = R.random_weights(2, 16, 8, 16, 16, 24, seed=5)
    x = torch.randn(12, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = R.mla_forward(w, x, prefix_len=4)
    x2 = x.clone()
    x2[-1] += 1.0  # changing the last token must not change the earlier outputs
    y2 = R.mla_forward(w, x2, prefix_len=4)
    torch.testing.assert_close(y[:-1], y2[:-1], rtol=0, atol=0)
    assert not torch.allclose(y[-1], y2[-1])
    # and prefill of the whole context reproduces the new tokens' rows
    torch.testing.assert_close(R.mla_forward(w, x, prefix_len=0)[4:], y, rtol=0, atol=1e-12)


def test_rope_is_a_rotation_with_relative_positions():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 3, 16, dtype=torch.float64, generator=g)
    k = torch.randn(1, 16, dtype=torch.float64, generator=g)
    rq = R.rope(q, torch.tensor([5]))
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    dots = [
        (R.rope(q, torch.tensor([m])) * R.rope(k, torch.tensor([n]))[:, None]).sum(-1)
        for m, n in [(5, 2), (13, 10), (3, 0)]
    ]
    torch.testing.assert_close(dots[0], dots[1])
    torch.testing.assert_close(dots[0], dots[2])
    torch.testing.assert_close(R.rope(q, torch.tensor([0])), q)


def test_build_paged_cache_places_rows():
    rows = [torch.arange(7 * 3, dtype=torch.float32).view(7, 3), torch.zeros(0, 3), torch.ones(4, 3)]
    kv, table, lens = R.build_paged_cache(rows, block_size=2)
    assert lens.tolist() == [7, 0, 4]
    for b, x in enumerate(rows):
        for p in range(x.shape[0]):
            torch.testing.assert_close(kv[table[b, p // 2], p % 2], x[p])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param({"path": "fused"}, "path", id="bad-path"),
        pytest.param({"prefix_len": 6}, "prefix_len", id="prefix-past-end"),
        pytest.param({"prefix_len": -1}, "prefix_len", id="negative-prefix"),
    ],
)
def test_bad_arguments(kwargs, match):
    w = R.random_weights(1, 8, 4, 8, 8, 16)
    with pytest.raises(ValueError, match=match):
        R.mla_forward(w, torch.zeros(5, 16, dtype=torch.float64), **kwargs)


def test_odd_rope_dim_refused():
    with pytest.raises(ValueError, match="dR"):
        R.random_weights(1, 8, 5, 8, 8, 16)


def test_decode_path_agrees_with_the_decode_twin():
    """Cross-check with kernels/decode_naive.py (another author's statement of the absorb math):
    its latent attention over a paged cache, projected by W_UV, is reference.py's absorb path."""
    decode_naive = pytest.importorskip("mlactl.kernels.decode_naive")
    H, r, dR, dC, dV, hidden, T, prefix = 2, 32, 16, 16, 24, 40, 19, 12
    w = R.random_weights(H, r, dR, dC, dV, hidden, q_lora_rank=20, seed=11)
    x = torch.randn(T, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    q_nope, q_rope, c, k_r = R.project(w, x, prefix)
    ref_o, ref_lse = R.attend_absorb(q_nope, q_rope, c, k_r, w.w_uk, w.w_uv, w.scale)
    kv, table, lens = R.build_paged_cache([torch.cat([c, k_r], -1).float()], block_size=4)
    q_lat = torch.einsum("qhc,hcr->qhr", q_nope, w.w_uk)  # [n, H, r]
    q = torch.cat([q_lat, q_rope], -1).float()[None]  # [1, n, H, r+dR]
    o_lat, lse = decode_naive.mla_decode_naive(q, kv, table, lens, w.scale, causal=True, r=r)
    o = torch.einsum("qhr,hvr->qhv", o_lat[0].double(), w.w_uv)  # [n, H, dV]
    torch.testing.assert_close(o, ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[0].double(), ref_lse, atol=1e-5, rtol=1e-5)
