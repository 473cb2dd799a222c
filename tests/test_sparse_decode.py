"""Sparse absorb decode (DSA): the torch twin and the Triton kernel against an fp64 reference written
as loops over each query's selected rows (CPU interpreter: odd shapes, fp16/fp32 queries, a
bf16-free cache or FlashMLA's fp8 layout), the fp8 layout's bytes, the indexer's selection, bad
inputs, and DeepSeek-V3.2 shapes on a GPU (bf16, fp8)."""

import math

import pytest
import torch

from mlactl.kernels import sparse_decode
from mlactl.kernels.sparse_decode import heuristic_config, mla_sparse_decode
from mlactl.kernels.sparse_decode_naive import (
    dequantize_sparse_fp8,
    dsa_indexer_naive,
    mla_sparse_decode_naive,
    positions_to_slots,
    quantize_sparse_fp8,
    sparse_fp8_row_bytes,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = 0.11
F32 = dict(atol=2e-5, rtol=2e-5, lse=2e-5)
F16 = dict(atol=3e-3, rtol=4e-3, lse=2e-4)
BF16 = dict(atol=1.5e-2, rtol=2e-2, lse=2e-3)


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the launcher allocates starts as NaN: an element never written fails."""

    def empty(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(sparse_decode, "_empty", empty)


def sparse_case(B, S_q, H, r, dR, blocks, page, topk, dtype, fp8=False, seed=0, invalid=0.2, device=DEVICE):
    """Random queries, a paged cache and per-query slots: some -1, some repeated across queries."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S_q, H, r + dR, generator=g).to(dtype)
    rows = torch.randn(blocks, page, r + dR, generator=g)
    slots = torch.randint(0, blocks * page, (B, S_q, topk), generator=g, dtype=torch.int32)
    slots[torch.rand(B, S_q, topk, generator=g) < invalid] = -1
    cache = quantize_sparse_fp8(rows, r) if fp8 else rows.to(dtype)
    return q.to(device), cache.to(device), slots.to(device)


def reference(q, cache, slots, scale, r):
    """fp64, one query and head at a time, over that query's valid slots, in plain loops."""
    if cache.dtype == torch.uint8:
        rows = dequantize_sparse_fp8(cache.reshape(-1, cache.shape[-1]).cpu(), r).double()
    else:
        rows = cache.reshape(-1, cache.shape[-1]).cpu().double()
    q = q.cpu().double()
    B, S_q, H, _ = q.shape
    out = torch.zeros(B, S_q, H, r, dtype=torch.float64)
    lse = torch.full((B, S_q, H), -math.inf, dtype=torch.float64)
    for b in range(B):
        for s in range(S_q):
            picked = [int(i) for i in slots[b, s].tolist() if 0 <= i < rows.shape[0]]
            if not picked:
                continue
            keys = rows[picked]  # [n, r + dR]
            for h in range(H):
                scores = (keys @ q[b, s, h]) * scale
                top = scores.max()
                w = torch.exp(scores - top)
                lse[b, s, h] = top + torch.log(w.sum())
                out[b, s, h] = (w / w.sum()) @ keys[:, :r]
    return out, lse


def assert_close(got, want, tol):
    out, lse = got
    want_out, want_lse = want
    assert lse.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double(), want_out, atol=tol["atol"], rtol=tol["rtol"])
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=tol["lse"], rtol=tol["lse"])


# -- FlashMLA's fp8 sparse layout ----------------------------------------------------------------------


def test_fp8_row_is_656_bytes_for_deepseek_v32():
    # 512 e4m3 values + 4 fp32 scales (one per 128) + 64 bf16 RoPE values
    assert sparse_fp8_row_bytes(512, 64) == 512 + 16 + 128 == 656


def test_fp8_layout_bytes_by_hand():
    """One row: latent values all 448 in the first tile (scale 1), 0.5 in the others; RoPE 1.0."""
    row = torch.zeros(1, 576)
    row[0, :128] = 448.0
    row[0, 128:512] = 0.5
    row[0, 512:] = 1.0
    out = quantize_sparse_fp8(row, 512)[0]
    assert out.dtype == torch.uint8 and out.shape == (656,)
    scales = out[512:528].view(torch.float32).tolist()
    # tile 0: amax 448 -> scale 448/448 = 1; tiles 1-3: 0.5/448 rounded up to a power of two = 2^-9
    assert scales == [1.0, 2.0**-9, 2.0**-9, 2.0**-9]
    assert out[:128].view(torch.float8_e4m3fn).float().eq(448.0).all()
    assert out[128:512].view(torch.float8_e4m3fn).float().eq(256.0).all()  # 0.5 / 2^-9
    assert out[528:].view(torch.bfloat16).float().eq(1.0).all()
    torch.testing.assert_close(dequantize_sparse_fp8(out[None], 512)[0], row[0])


# -- the twin -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [False, True], ids=["f32-cache", "fp8-layout"])
def test_twin_matches_reference(fp8):
    q, cache, slots = sparse_case(2, 3, 5, 128, 32, 7, 16, 45, torch.float32, fp8=fp8, device="cpu")
    assert_close(mla_sparse_decode_naive(q, cache, slots, SCALE, r=128), reference(q, cache, slots, SCALE, 128), F32)


# -- the kernel, under the interpreter on a CPU (or on a GPU) --------------------------------------------

KERNEL_CASES = [  # (B, S_q, H, r, dR, blocks, page, topk, dtype, fp8, num_splits, tol)
    pytest.param(2, 3, 5, 128, 32, 7, 16, 45, torch.float32, False, None, F32, id="B2-Sq3-H5-topk45-f32"),
    pytest.param(1, 1, 3, 64, 16, 5, 8, 33, torch.float16, False, 3, F16, id="B1-H3-topk33-f16-split3"),
    pytest.param(3, 1, 17, 32, 16, 3, 16, 20, torch.float32, False, 2, F32, id="B3-H17-rows2tiles-split2"),
    pytest.param(2, 2, 7, 128, 32, 6, 16, 37, torch.float32, True, None, F32, id="B2-Sq2-H7-fp8-layout"),
    pytest.param(1, 3, 4, 256, 64, 4, 16, 29, torch.float16, True, 2, F16, id="B1-Sq3-H4-r256-fp8-f16-split2"),
    # odd head counts (3 head tiles side by side in the grid), pages of 17 and 24, S_q 3-4
    pytest.param(2, 3, 33, 32, 16, 5, 17, 41, torch.float32, False, 3, F32, id="B2-Sq3-H33-page17-split3"),
    pytest.param(1, 4, 40, 32, 16, 4, 24, 50, torch.float16, False, None, F16, id="B1-Sq4-H40-page24"),
    pytest.param(2, 3, 20, 128, 32, 3, 17, 35, torch.float32, True, 2, F32, id="B2-Sq3-H20-page17-fp8-split2"),
]


@pytest.mark.parametrize("B, S_q, H, r, dR, blocks, page, topk, dtype, fp8, splits, tol", KERNEL_CASES)
def test_kernel_matches_reference(poisoned, B, S_q, H, r, dR, blocks, page, topk, dtype, fp8, splits, tol):
    q, cache, slots = sparse_case(B, S_q, H, r, dR, blocks, page, topk, dtype, fp8=fp8)
    got = mla_sparse_decode(q, cache, slots, SCALE, r=r, num_splits=splits)
    want = reference(q, cache, slots, SCALE, r)
    assert got[0].dtype == dtype
    assert_close(got, want, tol)
    assert_close(mla_sparse_decode_naive(q, cache, slots, SCALE, r=r), want, tol)


def test_query_without_valid_index_gets_zero_and_minus_inf(poisoned):
    q, cache, slots = sparse_case(2, 1, 3, 32, 16, 4, 8, 9, torch.float32)
    slots[1] = -1
    out, lse = mla_sparse_decode(q, cache, slots, SCALE, r=32, num_splits=2)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)
    assert torch.isfinite(lse[0]).all()


def test_unvalidated_out_of_range_slots_are_skipped(poisoned):
    q, cache, slots = sparse_case(1, 2, 3, 32, 16, 4, 8, 11, torch.float32)
    wild = slots.clone()
    wild[0, 0, :3] = torch.tensor([10_000, -7, 2**30], dtype=torch.int32)  # outside the cache
    clean = wild.clone()
    clean[0, 0, :3] = -1
    got = mla_sparse_decode(q, cache, wild, SCALE, r=32, validate=False)
    assert_close(got, reference(q, cache, clean, SCALE, 32), F32)


def test_4d_cache_and_out_buffer(poisoned):
    q, cache, slots = sparse_case(2, 1, 4, 32, 16, 3, 8, 10, torch.float16)
    out = torch.full((2, 1, 4, 32), float("nan"), dtype=torch.float16, device=DEVICE)
    got = mla_sparse_decode(q, cache.unsqueeze(2), slots, SCALE, r=32, out=out)
    assert got[0] is out
    assert_close(got, reference(q, cache, slots, SCALE, 32), F16)


def test_positions_to_slots_and_indexer_select_what_the_twin_reads():
    """The pipeline an engine runs: indexer positions -> slots through the block table -> attention."""
    g = torch.Generator().manual_seed(3)
    B, S_q, L, Hi, di, page = 2, 2, 21, 3, 16, 8
    index_keys = torch.randn(B, L, di, generator=g)
    q_index = torch.randn(B, S_q, Hi, di, generator=g)
    weights = torch.rand(B, S_q, Hi, generator=g)
    lens = torch.tensor([21, 7])
    pos = dsa_indexer_naive(q_index, weights, index_keys, lens, topk=6)
    assert pos.shape == (B, S_q, 6)
    # request 1, query 0 sees positions 0..5 only (context 7, 2 new): 6 keys, nothing past 5
    assert sorted(pos[1, 0].tolist()) == [0, 1, 2, 3, 4, 5]
    # the best key by hand for request 0, query 1 (sees 0..20)
    score = (torch.einsum("hd,td->ht", q_index[0, 1], index_keys[0]).relu() * weights[0, 1][:, None]).sum(0)
    assert int(pos[0, 1, 0]) == int(score.argmax())
    table = torch.tensor([[5, 0, 3], [2, 4, -1]], dtype=torch.int32)
    slots = positions_to_slots(pos, table, page)
    p = int(pos[0, 1, 0])
    assert int(slots[0, 1, 0]) == int(table[0, p // page]) * page + p % page


def test_heuristic_for_deepseek_v32():
    # decode of 64 requests at 128 heads on 132 SMs: 4 head tiles of 32 each, 256 programs:
    # round(2 * 132 / 256) = 1 split
    cfg = heuristic_config(64, 128, 2048, "bf16", 132)
    assert (cfg["BLOCK_H"], cfg["num_splits"]) == (32, 1)
    assert (cfg["BLOCK_N"], cfg["num_stages"], cfg["num_warps"]) == (32, 3, 8)
    # 16 requests: 64 programs -> round(264 / 64) = 4 splits
    assert heuristic_config(16, 128, 2048, "fp8", 132)["num_splits"] == 4
    # one request: 4 programs; splits capped by topk / 256 = 8; fp8 pipelined at 3 stages now
    fp8 = heuristic_config(1, 128, 2048, "fp8", 132)
    assert fp8["num_splits"] == 8 and (fp8["BLOCK_H"], fp8["BLOCK_N"], fp8["num_stages"]) == (32, 32, 3)
    # 16 heads (TP 8): 16-row tiles, the narrow table
    narrow = heuristic_config(1, 16, 2048, "bf16", 132)
    assert (narrow["BLOCK_H"], narrow["BLOCK_N"], narrow["num_stages"]) == (16, 64, 3)


# -- mla_attention's sparse path ------------------------------------------------------------------------


def expand_form(q_nope, q_rope, rows_of_token, w_uk, w_uv, scale):
    """fp64 expand-form attention of one token over given latent rows [n, r + dR]: k_nope = W_UK c,
    v = W_UV c per head, scores = q_nope . k_nope + q_rope . k_r (docs/design.md, "The math")."""
    r = w_uk.shape[2]
    c, k_r = rows_of_token[:, :r], rows_of_token[:, r:]
    k_nope = torch.einsum("hdr,nr->hnd", w_uk, c)  # [H, n, dC]
    v = torch.einsum("hvr,nr->hnv", w_uv, c)  # [H, n, dV]
    s = (torch.einsum("hd,hnd->hn", q_nope, k_nope) + torch.einsum("hd,nd->hn", q_rope, k_r)) * scale
    return torch.einsum("hn,hnv->hv", torch.softmax(s, dim=-1), v)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("fp8", [False, True], ids=["f32-cache", "fp8-layout"])
def test_mla_attention_sparse_path(backend, fp8):
    from mlactl.kernels.attention import mla_attention
    from mlactl.kernels.reference import build_paged_cache

    g = torch.Generator().manual_seed(5)
    H, dC, dR, dV, r, page, topk = 3, 16, 16, 16, 128, 8, 7
    lens, news = [19, 6], [3, 2]  # two requests: 3 new tokens after 16, 2 after 4
    latents = torch.randn(2, max(lens), r + dR, generator=g)
    cache, table, _ = build_paged_cache(latents, page, generator=g)
    T = sum(news)
    q_nope = torch.randn(T, H, dC, generator=g)
    q_rope = torch.randn(T, H, dR, generator=g)
    w_uk = torch.randn(H, dC, r, generator=g) * r**-0.5
    w_uv = torch.randn(H, dV, r, generator=g) * r**-0.5
    # each token's positions: causal, some -1, repeats allowed across tokens
    positions = torch.full((T, topk), -1, dtype=torch.int32)
    t = 0
    for b in range(2):
        for i in range(news[b]):
            seen = lens[b] - news[b] + i + 1
            pick = torch.randperm(seen, generator=g)[: min(topk - 1, seen)]
            positions[t, : len(pick)] = pick.to(torch.int32)
            t += 1
    if fp8:
        cache = quantize_sparse_fp8(cache, r)
        rows = dequantize_sparse_fp8(cache, r).double()  # what the kernel reads, exactly
    else:
        rows = cache.double()
    lens_t = torch.tensor(lens, dtype=torch.int32)
    out = mla_attention(
        q_nope, q_rope, cache, table, lens_t, torch.tensor(news, dtype=torch.int32), w_uk, w_uv, SCALE,
        path="sparse_absorb", topk_indices=positions, backend=backend,
    )  # fmt: skip
    t = 0
    for b in range(2):
        for _ in range(news[b]):
            pos = [p for p in positions[t].tolist() if p >= 0]
            phys = [int(table[b, p // page]) * page + p % page for p in pos]
            want = expand_form(
                q_nope[t].double(), q_rope[t].double(), rows.reshape(-1, rows.shape[-1])[phys],
                w_uk.double(), w_uv.double(), SCALE,
            )  # fmt: skip
            torch.testing.assert_close(out[t].double(), want, atol=1e-5, rtol=1e-5)
            t += 1


def test_mla_attention_sparse_path_refusals():
    from mlactl.kernels.attention import mla_attention

    H, dC, dR, dV, r = 2, 16, 16, 16, 128
    args = dict(
        q_nope=torch.zeros(2, H, dC), q_rope=torch.zeros(2, H, dR), kv_cache=torch.zeros(2, 8, r + dR),
        block_table=torch.tensor([[0, 1]], dtype=torch.int32), cache_seqlens=torch.tensor([9], dtype=torch.int32),
        new_lens=torch.tensor([2], dtype=torch.int32), w_uk=torch.zeros(H, dC, r), w_uv=torch.zeros(H, dV, r),
        scale=SCALE,
    )  # fmt: skip
    with pytest.raises(ValueError, match="needs topk_indices"):
        mla_attention(**args, path="sparse_absorb")
    far = torch.tensor([[0, 9], [1, -1]], dtype=torch.int32)  # position 9 is past the 9-token context
    with pytest.raises(ValueError, match="outside"):
        mla_attention(**args, path="sparse_absorb", topk_indices=far)
    fp8_args = dict(args, kv_cache=torch.zeros(2, 8, sparse_fp8_row_bytes(r, dR), dtype=torch.uint8))
    ok = torch.tensor([[0, 1], [1, -1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="sparse_absorb path only"):
        mla_attention(**fp8_args, path="absorb", topk_indices=ok)


# -- bad inputs: one ValueError each, before any launch ---------------------------------------------------


def _valid():
    q, cache, slots = sparse_case(1, 2, 3, 32, 16, 4, 8, 9, torch.float16)
    return dict(q=q, kv_cache=cache, indices=slots, scale=SCALE, r=32)


def _with(**changes):
    def make():
        args = _valid()
        for key, value in changes.items():
            args[key] = value(args) if callable(value) else value
        return args

    return make


BAD = [
    pytest.param(_with(indices=lambda a: a["indices"].long()), "indices has dtype int64", id="indices-int64"),
    pytest.param(_with(indices=lambda a: a["indices"][:, :1]), r"indices is \(1, 1, 9\)", id="indices-shape"),
    pytest.param(
        _with(indices=lambda a: a["indices"].clone().fill_(4 * 8)), r"outside \[-1, 32\)", id="indices-past-end"
    ),
    pytest.param(_with(indices=lambda a: a["indices"].clone().fill_(-2)), "outside", id="indices-below-minus-1"),
    pytest.param(_with(kv_cache=lambda a: a["kv_cache"].float()), "kv_cache has dtype .*float32 but q", id="kv-dtype"),
    pytest.param(_with(kv_cache=lambda a: a["kv_cache"][..., :40]), "rows hold 40 numbers", id="kv-row"),
    pytest.param(
        _with(kv_cache=lambda a: torch.zeros(4, 8, 100, dtype=torch.uint8, device=a["q"].device), r=32),
        "needs r a power-of-two multiple of 128",
        id="fp8-small-r",
    ),
    pytest.param(_with(scale=0.0), "softmax scale must be a positive", id="scale-zero"),
    pytest.param(_with(q=lambda a: a["q"][0]), "q must have 4 dimensions", id="q-rank3"),
]


@pytest.mark.parametrize("make, message", BAD)
def test_bad_input_raises(monkeypatch, make, message):
    def no_launch(*args, **kwargs):
        raise AssertionError("launched despite bad input")

    monkeypatch.setattr(sparse_decode, "_launch", no_launch)
    with pytest.raises(ValueError, match=message):
        mla_sparse_decode(**make())


def test_fp8_layout_width_checked(monkeypatch):
    monkeypatch.setattr(sparse_decode, "_launch", lambda *a, **k: None)
    q = torch.zeros(1, 1, 2, 576, dtype=torch.float16, device=DEVICE)
    cache = torch.zeros(2, 64, 640, dtype=torch.uint8, device=DEVICE)
    slots = torch.zeros(1, 1, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="640 bytes but FlashMLA's fp8 sparse layout for r=512, dR=64 has 656"):
        mla_sparse_decode(q, cache, slots, SCALE)


# -- GPU: DeepSeek-V3.2 shapes (r=512, dR=64, page 64, top-2048) -------------------------------------------

DSV32_SCALE = 1 / math.sqrt(192)
GPU_CASES = [  # (B, S_q, H, dtype, fp8, num_splits, tol)
    pytest.param(4, 1, 128, torch.bfloat16, False, None, BF16, id="B4-H128-bf16"),
    pytest.param(4, 1, 128, torch.bfloat16, True, None, BF16, id="B4-H128-fp8"),
    pytest.param(33, 1, 16, torch.bfloat16, True, None, BF16, id="B33-H16-fp8-tp8"),
    pytest.param(2, 2, 64, torch.float16, False, 5, F16, id="B2-Sq2-H64-fp16-split5"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("B, S_q, H, dtype, fp8, splits, tol", GPU_CASES)
def test_gpu_deepseek_v32(poisoned, B, S_q, H, dtype, fp8, splits, tol):
    q, cache, slots = sparse_case(B, S_q, H, 512, 64, 600, 64, 2048, dtype, fp8=fp8, invalid=0.05)
    got = mla_sparse_decode(q, cache, slots, DSV32_SCALE, num_splits=splits)
    torch.cuda.synchronize()
    want = mla_sparse_decode_naive(q, cache, slots, DSV32_SCALE)
    out, lse = got
    torch.testing.assert_close(out.float(), want[0].float(), atol=tol["atol"], rtol=tol["rtol"])
    torch.testing.assert_close(lse, want[1], atol=tol["lse"], rtol=tol["lse"])


# -- mlactl tune: the sparse kernel registered, checked against its twin -------------------------------


def test_tune_kernels_sparse_decode_under_the_interpreter(tmp_path, monkeypatch):
    import json
    from dataclasses import replace

    from typer.testing import CliRunner

    from mlactl.cli import app
    from mlactl.model.config import resolve
    from mlactl.results import store as results
    from mlactl.tune import space

    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    tiny = {
        "model_type": "tiny-dsa", "hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 32,
        "kv_lora_rank": 128, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
        "num_hidden_layers": 1, "index_topk": 32, "index_n_heads": 2, "index_head_dim": 16,
    }  # fmt: skip
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(tiny))
    cfg = resolve(str(model))
    assert "mla_sparse_decode" in space.default_kernels(cfg)
    assert "mla_sparse_decode" not in space.default_kernels(replace(cfg, topk=None))
    grid = tmp_path / "space.json"
    grid.write_text(json.dumps([{"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}]))
    out = tmp_path / "run.json"
    args = ["tune", "kernels", "--interpret", "--model", str(model), "--kernel", "mla_sparse_decode"]
    result = CliRunner().invoke(app, [*args, "--space", str(grid), "--dtype", "fp32", "--results-file", str(out)])
    assert result.exit_code == 0, result.output
    (entry,) = results.load(out)["kernels"]
    assert entry["kernel"] == "mla_sparse_decode" and entry["shape"] == {"B": 2, "H": 2, "S_q": 1, "topk": 32}
    assert [c["status"] for c in entry["configs"]] == ["ok"]  # matched the twin
    # FLOPs from cost.py: 2 queries x 32 rows x (2*2*(128 + 16) + 2*2*128)
    assert entry["flops"] == 2 * 32 * (2 * 2 * 144 + 2 * 2 * 128)


# -- the grid and the compiles a serving run sees -------------------------------------------------------


def test_head_tiles_adjacent_and_one_compile_across_batches(monkeypatch):
    """A token's head tiles are adjacent programs (grid axis 0 = head tiles x tokens, so they run
    together and share the token's rows in L2), and batches of 1-7 tokens with 1-5 splits reuse
    one stage-1 and one merge compile (Triton's cache key, as tests/test_decode.py computes it)."""
    from test_decode import jit_cache_keys

    seen = []

    def record(name):
        real = getattr(sparse_decode, name)

        class Record:
            arg_names = real.arg_names

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    seen.append((name, real, args, kwargs, grid))
                    return real[grid](*args, **kwargs)

                return launch

        monkeypatch.setattr(sparse_decode, name, Record())

    record("_sparse_decode_kernel")
    record("_sparse_merge_kernel")
    H = 40  # 2 tiles of 32 heads (a 16/32-bit cache), the second 8 heads full
    for B, splits in ((1, 1), (3, 2), (7, 5), (2, 3)):
        q, cache, slots = sparse_case(B, 1, H, 32, 16, 4, 16, 40, torch.float16, seed=B, device="cpu")
        got = mla_sparse_decode(q, cache, slots, SCALE, r=32, num_splits=splits)
        assert_close(got, reference(q, cache, slots, SCALE, 32), F16)
        stage1 = [s for s in seen if s[0] == "_sparse_decode_kernel"][-1]
        assert stage1[4] == (2 * B, splits)  # (head tiles x tokens, splits)
    keys = jit_cache_keys([s[:4] for s in seen])
    # stage 1: q's dtype out with one split, fp32 partials with several (two keys, each compiled once)
    assert {name: len(k) for name, k in keys.items()} == {"_sparse_decode_kernel": 2, "_sparse_merge_kernel": 1}
