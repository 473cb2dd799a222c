"""DeepSeek-V3.2's sparse MLA (DSA): the model, its caches and every op's FLOPs and bytes, against
figures worked out by hand and against a plain second implementation (loops over queries and
an inventory of each op's tensors, one request at a time).

DeepSeek-V3.2: H = 128, r = 512, dC = 128, dR = 64, dV = 128, hidden = 7168, q_lora = 1536,
topk = 2048, Hi = 64 index heads of di = 128 (deepseek-ai/DeepSeek-V3.2-Exp
inference/config_671B_v3.2.json).
"""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.model import config as model
from mlactl.model.cost import CostModel, causal_pairs, sparse_pairs
from mlactl.util.errors import MlactlError

V32 = model.from_name("deepseek-v3.2")


# -- the model -----------------------------------------------------------------------------------


def test_preset_fields():
    assert (V32.hidden, V32.H, V32.q_lora_rank, V32.r, V32.dC, V32.dR, V32.dV, V32.layers) == (
        7168, 128, 1536, 512, 128, 64, 128, 61
    )  # fmt: skip
    assert (V32.topk, V32.index_heads, V32.index_dim) == (2048, 64, 128)
    assert V32.is_dsa and not model.from_name("deepseek-v3").is_dsa
    assert model.from_name("deepseek-v3.2-exp") == V32


def test_tp_splits_heads_not_the_indexer():
    tp8 = V32.with_tp(8)
    assert (tp8.H, tp8.index_heads, tp8.topk) == (16, 64, 2048)
    full, split = CostModel(V32), CostModel(tp8)
    # the indexer is replicated: the same FLOPs per pair on every GPU
    assert split.index_pair_flops() == full.index_pair_flops() == 16_384
    # the sparse attention's heads are split: 2*16*(576 + 512) = 34,816 per pair
    assert split.pair_flops("sparse_absorb") == 34_816


HF_V32 = {
    "model_type": "deepseek_v32",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_hidden_layers": 61,
    "index_topk": 2048,
    "index_n_heads": 64,
    "index_head_dim": 128,
}


def test_hf_config_with_the_three_index_fields_is_dsa(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_V32))
    cfg = model.from_hf_config(path)
    assert cfg.is_dsa
    assert (cfg.topk, cfg.index_heads, cfg.index_dim) == (2048, 64, 128)
    assert (cfg.H, cfg.r) == (128, 512)


def test_hf_config_without_index_fields_is_dense(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in HF_V32.items() if not k.startswith("index_")}))
    assert not model.from_hf_config(path).is_dsa


@pytest.mark.parametrize(
    "drop, missing",
    [
        pytest.param(("index_topk",), "index_topk", id="no-topk"),
        pytest.param(("index_n_heads", "index_head_dim"), "index_n_heads, index_head_dim", id="only-topk"),
        pytest.param(("index_topk", "index_head_dim"), "index_topk, index_head_dim", id="only-heads"),
    ],
)
def test_hf_config_with_some_index_fields_is_refused(tmp_path, drop, missing):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in HF_V32.items() if k not in drop}))
    with pytest.raises(MlactlError) as err:
        model.from_hf_config(path)
    assert f"but not {missing}:" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "2048"])
def test_hf_config_bad_index_value(tmp_path, bad):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(HF_V32, index_topk=bad)))
    with pytest.raises(MlactlError, match="index_topk must be a positive integer"):
        model.from_hf_config(path)


def test_hf_dsa_config_needs_q_lora_rank(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(HF_V32, q_lora_rank=None)))
    with pytest.raises(MlactlError, match="needs q_lora_rank"):
        model.from_hf_config(path)


def test_cli_refuses_a_partial_dsa_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in HF_V32.items() if k != "index_n_heads"}))
    result = CliRunner().invoke(app, ["analyze", "--model", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().startswith("Error:")
    assert "index_n_heads" in result.output
    assert len(result.output.strip().splitlines()) == 1


# -- caches --------------------------------------------------------------------------------------


def test_cache_rows():
    # FlashMLA's fp8 sparse row: 512 fp8 + 4 fp32 scales (16 B) + 64 bf16 RoPE (128 B) = 656
    assert CostModel(V32, kv_dtype="fp8").latent_row_bytes() == 656
    # bf16: 576 numbers * 2 B
    assert CostModel(V32).latent_row_bytes() == 1_152
    # the indexer's row: 128 fp8 + one fp32 scale
    assert CostModel(V32).index_row_bytes() == 132
    # a dense MLA model's fp8 cache keeps its per-tensor scale: 576 B
    assert CostModel(model.from_name("deepseek-v3"), kv_dtype="fp8").latent_row_bytes() == 576
    # what a token costs in cache, per layer, with both
    assert CostModel(V32, kv_dtype="fp8").cache_row_bytes() == 656 + 132
    assert float(CostModel(V32, kv_dtype="fp8").kv_cache_bytes(2, 1, 999)) == 2 * 1000 * 788


# -- per pair and per token ----------------------------------------------------------------------


def test_per_pair_and_per_token_flops():
    cost = CostModel(V32)
    assert cost.index_pair_flops() == 2 * 64 * 128 == 16_384
    assert cost.pair_flops("sparse_absorb") == 2 * 128 * (576 + 512) == 278_528
    assert cost.pair_flops("masked_expand") == cost.pair_flops("dense_expand") == 81_920
    # wq_b 1536x8192 + wk 7168x128 + weights_proj 7168x64 = 12,582,912 + 917,504 + 458,752
    assert cost.index_proj_flops() == 2 * 13_959_168 == 27_918_336


# -- sparse pairs ----------------------------------------------------------------------------------


def plain_sparse_pairs(n: int, p: int, k: int) -> int:
    return sum(min(p + i, k) for i in range(1, n + 1))


@pytest.mark.parametrize(
    "n, p, k",
    [
        pytest.param(1, 32768, 2048, id="decode-32K"),
        pytest.param(1, 100, 2048, id="decode-short"),
        pytest.param(4096, 0, 2048, id="prefill-4K"),
        pytest.param(3000, 1000, 2048, id="extend-crosses-k"),
        pytest.param(7, 3, 5, id="tiny-odd"),
        pytest.param(1, 0, 1, id="one"),
    ],
)
def test_sparse_pairs_against_a_loop(n, p, k):
    assert float(sparse_pairs(n, p, k)) == plain_sparse_pairs(n, p, k)


def test_sparse_pairs_by_hand():
    # 4096 new, no prefix: 1 + 2 + ... + 2048, then 2048 queries of 2048
    assert float(sparse_pairs(4096, 0, 2048)) == 2048 * 2049 // 2 + 2048 * 2048 == 6_292_480
    # 3000 new after 1000: the first 1048 queries read 1001..2048, the other 1952 read 2048
    assert float(sparse_pairs(3000, 1000, 2048)) == 1_048_000 + 549_676 + 1952 * 2048 == 5_595_372


# -- decode after 32K at 128 heads, counted by hand -----------------------------------------------------


def test_decode_after_32k_by_hand():
    """One new token after 32,768 cached ones (context 32,769), bf16 cache."""
    ops = {op.name: op for op in CostModel(V32).ops("sparse_absorb", 1, 1, 32_768)}
    assert list(ops) == ["indexer_proj", "indexer", "topk", "q_absorb", "attention", "out_absorb"]
    # sparse attention: 278,528 * 2048 selected
    assert float(ops["attention"].flops) == 570_425_344
    # 2048 rows * 1152 B + q 128*576*2 + out 128*512*2
    assert float(ops["attention"].bytes) == 2_359_296 + 147_456 + 131_072
    # indexer: 16,384 per pair over all 32,769 keys
    assert float(ops["indexer"].flops) == 16_384 * 32_769 == 536_887_296
    # 32,769 index rows * 132 B + fp8 q and fp32 head weights 64*(128+4) + one fp32 logit a key
    assert float(ops["indexer"].bytes) == 4_325_508 + 8_448 + 131_076
    # top-k: one compare a logit; read the logits, write 2048 int32 indices
    assert float(ops["topk"].flops) == 32_769
    assert float(ops["topk"].bytes) == 131_076 + 8_192
    # projections: read x (7168) and the query latent (1536) in bf16, the weights once; write
    # the fp8 index query, its 64 fp32 head weights and the 132-byte index row
    assert float(ops["indexer_proj"].flops) == 27_918_336
    assert float(ops["indexer_proj"].bytes) == 17_408 + 27_918_336 + 8_192 + 256 + 132
    assert float(ops["indexer_proj"].weight_bytes) == 27_918_336


def test_decode_fp8_reads_flashmla_rows():
    att = CostModel(V32, kv_dtype="fp8").ops("sparse_absorb", 1, 1, 32_768)[4]
    assert float(att.bytes) == 2048 * 656 + 147_456 + 131_072


# -- a plain second implementation of every op -----------------------------------------------------


def inventory(path: str, n: int, p: int, kv: str = "bf16", chunk: int = 8192) -> dict[str, tuple[int, int]]:
    """FLOPs and bytes of each op of one request, from its matmuls and tensors listed one by one."""
    c = V32
    a = 2
    row = {"bf16": 1152, "fp8": 656}[kv]
    rope = {"bf16": 128, "fp8": 128}[kv]  # the RoPE part of a row: bf16 either way
    lat = {"bf16": 1024, "fp8": 512 + 16}[kv]  # the latent values of a row (fp8: and their 4 scales)
    ctx = n + p
    pairs = sum(p + i for i in range(1, n + 1))
    sel = sum(min(p + i, c.topk) for i in range(1, n + 1))
    w_proj = (1536 * 8192 + 7168 * 128 + 7168 * 64) * a
    ops = {}
    proj_in = n * (1536 + 7168) * a
    proj_out = n * (8192 + 64 * 4 + 132)
    ops["indexer_proj"] = (2 * n * (1536 * 8192 + 7168 * 128 + 7168 * 64), proj_in + w_proj + proj_out)
    ops["indexer"] = (pairs * 2 * 64 * 128, ctx * 132 + n * 64 * 132 + pairs * 4)
    ops["topk"] = (pairs, pairs * 4 + sel * 4)
    w_kv = 128 * 256 * 512 * a
    if path == "sparse_absorb":
        ops["q_absorb"] = (n * 128 * 2 * 128 * 512, n * 128 * 128 * a + 128 * 128 * 512 * a + n * 128 * 512 * a)
        ops["attention"] = (sel * 2 * 128 * (576 + 512), sel * row + n * 128 * 576 * a + n * 128 * 512 * a)
        ops["out_absorb"] = (n * 128 * 2 * 512 * 128, n * 128 * 512 * a + 128 * 512 * 128 * a + n * 128 * 128 * a)
        return ops
    parts = 1 if p == 0 else -(-p // chunk) + 1
    expand = ctx * 2 * 512 * 128 * 256
    kv_bytes = ctx * lat + parts * w_kv + ctx * 128 * 256 * a
    if path == "dense_expand":
        ops = {"kv_expand": (expand, ctx * lat + w_kv + ctx * 128 * 256 * a)}
        ops["indexer_key"] = (n * 2 * 7168 * 128, n * 7168 * a + 7168 * 128 * a + n * 132)
        out = n * 128 * 128 * a
        ops["attention"] = (pairs * 81_920, n * 128 * 192 * a + ctx * 128 * 256 * a + ctx * rope + out)
        return ops
    ops["kv_expand"] = (expand, kv_bytes)
    outs = parts * n * 128 * (128 * a + 4) if parts > 1 else n * 128 * 128 * a
    mask = 2 * -(-pairs // 8)
    q = parts * n * 128 * 192 * a
    ops["attention"] = (pairs * 81_920, q + ctx * 128 * 256 * a + ctx * rope + outs + mask)
    rows = (parts - 1) * n * 128
    ops["lse_merge"] = (rows * 3 * 128, rows * 3 * (128 * a + 4))
    return ops


SHAPES = [
    pytest.param(1, 32_768, id="decode-32K"),
    pytest.param(1, 17, id="decode-17"),
    pytest.param(300, 0, id="prefill-300"),
    pytest.param(2500, 0, id="prefill-2500"),
    pytest.param(777, 1000, id="extend-777-after-1000"),
    pytest.param(64, 20_000, id="extend-after-20K-3-chunks"),
]


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("path", ["sparse_absorb", "masked_expand", "dense_expand"])
@pytest.mark.parametrize("n, p", SHAPES)
def test_ops_against_inventory(path, n, p, kv):
    cost = CostModel(V32, kv_dtype=kv)
    want = inventory(path, n, p, kv)
    got = {op.name: (float(op.flops), float(op.bytes)) for op in cost.ops(path, 1, n, p)}
    assert set(got) == set(want)
    for name, (flops, nbytes) in want.items():
        assert got[name] == (flops, nbytes), name


def test_batch_shares_weights():
    """Two alike requests: everything doubles but the projections' weights, read once."""
    cost = CostModel(V32)
    one = {op.name: op for op in cost.ops("sparse_absorb", 1, 5, 3000)}
    two = {op.name: op for op in cost.ops("sparse_absorb", 2, 5, 3000)}
    for name in one:
        w = float(one[name].weight_bytes)
        assert float(two[name].flops) == 2 * float(one[name].flops)
        assert float(two[name].bytes) == 2 * float(one[name].bytes) - w


# -- which paths, where ------------------------------------------------------------------------------


def test_paths_of_each_kind():
    assert CostModel(V32).paths == CostModel(V32).choices == ("sparse_absorb", "masked_expand", "dense_expand")
    v3 = CostModel(model.from_name("deepseek-v3"))
    assert v3.choices == ("expand", "expand_chunked", "absorb")
    with pytest.raises(MlactlError, match="unknown path 'absorb' for the DSA model"):
        CostModel(V32).ops("absorb", 1, 1, 0)
    with pytest.raises(MlactlError, match="unknown path 'sparse_absorb' for the MLA model"):
        v3.ops("sparse_absorb", 1, 1, 0)


def test_dense_expand_only_up_to_topk():
    cost = CostModel(V32)
    ok = cost.applicable("dense_expand", 1, np.array([1, 1, 2048, 1000, 1000]), np.array([2047, 2048, 0, 1048, 1049]))
    assert ok.tolist() == [True, False, True, True, False]
    assert cost.applicable("masked_expand", 1, 1, 10**6).all()


def test_peak_expanded():
    cost = CostModel(V32, chunk=8192)
    per_token = 128 * 256 * 2
    assert float(cost.peak_expanded_bytes("dense_expand", 1, 100, 900)) == 1000 * per_token
    # masked MHA holds the new tokens' or one chunk's K/V at a time
    assert float(cost.peak_expanded_bytes("masked_expand", 1, 100, 20_000)) == 8192 * per_token
    assert float(cost.peak_expanded_bytes("sparse_absorb", 1, 100, 20_000)) == 0


# -- the crossover by FLOPs, and the window per prefix -------------------------------------------------


def total_flops(path: str, n: int, p: int) -> float:
    return sum(float(op.flops) for op in CostModel(V32).ops(path, 1, n, p))


def test_masked_beats_sparse_up_to_12812_new_tokens():
    """With no prefix, masked MHA takes fewer FLOPs than sparse absorb up to 12,812 new tokens and
    sparse absorb wins from 12,813 (docs/design.md's figure; plain_window below finds the same
    run with a plain integer loop), summing every op of both paths."""
    for n in (1, 2048, 12_812):
        assert total_flops("masked_expand", n, 0) < total_flops("sparse_absorb", n, 0), n
    for n in (12_813, 20_000):
        assert total_flops("masked_expand", n, 0) > total_flops("sparse_absorb", n, 0), n
    assert CostModel(V32).masked_window_by_flops(0) == (1, 12_812)


def plain_window(p: int, k: int = 2048, upto: int = 20_000):
    """Integer loop over n: masked MHA wins where its FLOPs are fewer -- expanding the p prefix
    tokens (33,554,432 each) and 81,920 a causal pair, against 278,528 a selected pair; the
    indexer, top-k and the new tokens' expansion (= absorb's projections) are the same on both."""
    wins = []
    sel = pairs = 0
    for n in range(1, upto + 1):
        sel += min(p + n, k)
        pairs += p + n
        if 81_920 * pairs + 33_554_432 * p < 278_528 * sel:
            wins.append(n)
    return (wins[0], wins[-1]) if wins else None


@pytest.mark.parametrize("p", [0, 1, 170, 1000, 2047, 2048, 4096, 6000, 6962, 6963, 8192])
def test_window_by_flops_against_a_loop(p):
    assert CostModel(V32).masked_window_by_flops(p) == plain_window(p)


def test_window_closes_for_long_prefixes():
    # a prefix of 8K: expanding it costs more than any run of new tokens saves
    assert CostModel(V32).masked_window_by_flops(8192) is None
    assert CostModel(V32).masked_window_by_flops(32_768) is None


def test_mla_model_has_no_dsa_figures():
    v3 = CostModel(model.from_name("deepseek-v3"))
    with pytest.raises(MlactlError, match="not a DSA model"):
        v3.index_row_bytes()
    assert CostModel(V32).asymptotic_crossover() is None
    assert CostModel(V32).crossover_by_flops(4096) is None


def test_causal_pairs_unchanged():
    assert float(causal_pairs(3, 10)) == 11 + 12 + 13


def test_dense_expand_with_the_whole_indexer():
    """vLLM runs the indexer in full on its dense MHA (dense_indexer="full"): 512 new tokens, no
    prefix: the indexer's projections 27,918,336 FLOPs a token, 16,384 a causal pair
    (512 x 513 / 2 = 131,328 pairs), one comparison per pair for the top-k; kv_expand and the
    attention as with the key only, and no indexer_key."""
    key = {o.name: o for o in CostModel(V32).ops("dense_expand", 1, 512, 0)}
    full = {o.name: o for o in CostModel(V32, dense_indexer="full").ops("dense_expand", 1, 512, 0)}
    assert list(key) == ["kv_expand", "indexer_key", "attention"]
    assert list(full) == ["kv_expand", "indexer_proj", "indexer", "topk", "attention"]
    assert float(full["indexer_proj"].flops) == 27_918_336 * 512
    assert float(full["indexer"].flops) == 16_384 * 131_328
    assert float(full["topk"].flops) == 131_328
    for name in ("kv_expand", "attention"):
        assert float(full[name].flops) == float(key[name].flops) and float(full[name].bytes) == float(key[name].bytes)
    with pytest.raises(MlactlError, match="dense_indexer must be one of key, full"):
        CostModel(V32, dense_indexer="half")
