"""The parts of `mlactl replay`: the trace readers and their errors, the block pool, the linear
forms of cost.py's ops, the model's weights, and `mlactl plot replay`. (A step's launches are
worked out by hand in tests/test_calibration_launches.py.)"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import run

from mlactl.decide.replay.cache import TokenPool
from mlactl.decide.replay.traces import MAX_ERRORS, read_trace
from mlactl.model import weights as weights_mod
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, WeightCost
from mlactl.model.linear import LinearOps
from mlactl.util.errors import MlactlError


def error_lines(result) -> list[str]:
    assert result.exit_code == 2, result.output
    return [line for line in result.output.splitlines() if line.strip()]


# -- traces ---------------------------------------------------------------------------------------

# Two lines of kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl (commit a2a4b18a)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, '
    "11, 12, 13]}\n"
    '{"timestamp": 3000, "input_length": 915, "output_length": 355, "hash_ids": [0, 462]}\n'
)


def test_mooncake_lines(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(MOONCAKE)
    t = read_trace(f)
    assert t.format == "mooncake" and len(t) == 2
    assert t.arrival.tolist() == [0.0, 3.0]  # milliseconds to seconds
    assert t.input.tolist() == [6758, 915] and t.output.tolist() == [500, 355]
    # 6758 + 500 - 1 tokens of KV: 13 full hash blocks, then 2 blocks of its own (its partial
    # block's 102 tokens with its output); the second's partial block is its own too
    ids, _, alts = t.stream(0)
    assert ids[:13] == list(range(13)) and len(ids) == 15 and all(b < 0 for b in ids[13:]) and alts is None
    assert t.stream(1)[0][0] == 0 and len(t.stream(1)[0]) == 3
    assert t.cached.tolist() == [-1, -1] and t.parent.tolist() == [-1, -1]


def test_mooncake_with_fewer_ids_than_blocks_gets_ids_of_its_own(tmp_path):
    # Dynamo's synthesiser writes input_length // 512 ids: the partial last block has none
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [7, 8]}\n')
    blocks = read_trace(f).stream(0)[0]
    assert blocks[:2] == [7, 8] and len(blocks) == 3 and blocks[2] < 0


def test_csv_sessions_chain_their_blocks(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "\ufeffArrival_S, input_tokens,output_tokens,session,note\n0,1000,100,a,x\n5.5,1200,4,a,y\n6,600,1,,z\n"
    )
    t = read_trace(f)
    assert t.format == "csv" and t.arrival.tolist() == [0.0, 5.5, 6.0]
    first, second = t.stream(0)[0], t.stream(1)[0]
    # one stream a session: turn 1's 1099 tokens of KV (the last output token's is never
    # computed) fill its blocks 0 to 2 (512, 512, 75), turn 2's 1203 the same three (512, 512, 179)
    assert len(first) == 3 and second == first
    assert t.stream(2)[0][0] not in first  # no session: shares nothing


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("", "empty file", id="empty"),
        pytest.param("[1, 2]\n", "a JSON array; Mooncake traces are JSON lines", id="array"),
        pytest.param("a,b\n1,2\n", "missing arrival_s, input_tokens, output_tokens", id="header"),
        pytest.param("arrival_s,input_tokens,output_tokens\n", "no requests", id="no-rows"),
    ],
)
def test_whole_file_errors(tmp_path, text, message):
    f = tmp_path / "t"
    f.write_text(text)
    with pytest.raises(MlactlError, match=message):
        read_trace(f)


def test_every_bad_line_gets_its_own_error_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
        '{"timestamp": 5, "input_length": 0, "output_length": 2, "hash_ids": []}\n'
        "\n"
        '{"timestamp": 6, "input_length": 100, "output_length": 2, "hash_ids": [1, 2]}\n'
        "not json\n"
        '{"timestamp": 1, "input_length": 100, "output_length": 2, "hash_ids": []}\n'
        '{"timestamp": 9, "input_length": 100.5, "output_length": 2, "hash_ids": ["x"]}\n'
        '{"timestamp": 9, "input_length": 100, "hash_ids": []}\n'
    )
    lines = error_lines(run("replay", f, ok=False))
    assert len(lines) == 6
    assert all(line.startswith(f"Error: {f}: line ") for line in lines)
    want = [
        ("line 2:", "input_length must be between 1"),
        ("line 4:", "2 hash_ids for 1 blocks of 512 tokens"),
        ("line 5:", "not a JSON object"),
        ("line 6:", "arrival 0.001 s is before the previous request's 0.006 s"),  # line 4's, bad as it is
        ("line 7:", "input_length must be a whole number"),
        ("line 8:", "missing output_length"),
    ]
    for line, (where, what) in zip(lines, want):
        assert where in line and what in line, line


def test_csv_bad_lines(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "arrival_s,input_tokens,output_tokens,cached_tokens,session\n"
        "0,100,2,,s\n"
        "inf,100,2,,\n"
        "1,100,2,101,\n"
        "1,100,2\n"
        "2,50,2,,s\n"
        "3,4K,2,,\n"
    )
    lines = error_lines(run("replay", f, ok=False))
    assert [line.split(": line ")[1].split(":")[0] for line in lines] == ["3", "4", "5", "6", "7"]
    assert "arrival_s 'inf' is not a number" in lines[0]  # ASCII decimal only (mlactl.util.numbers)
    assert "cached_tokens 101 is more than input_tokens 100" in lines[1]
    assert "3 fields, the header has 5" in lines[2]
    assert "shorter than the previous turn's prompt and output (102 tokens, line 2)" in lines[3]
    assert "input_tokens '4K' is not a whole number" in lines[4]


def test_reading_stops_after_so_many_bad_lines(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,input_tokens,output_tokens\n" + "x,1,1\n" * (MAX_ERRORS + 10))
    lines = error_lines(run("replay", f, ok=False))
    assert len(lines) == MAX_ERRORS + 1 and f"stopped after {MAX_ERRORS} bad lines" in lines[-1]


def test_a_long_line_is_refused(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("{" + " " * (1 << 20) + "\n")
    with pytest.raises(MlactlError, match="line 1: longer than"):
        read_trace(f)


def test_unreadable_trace(tmp_path):
    lines = error_lines(run("replay", tmp_path / "missing.jsonl", ok=False))
    assert len(lines) == 1 and "cannot read trace" in lines[0]
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00x")
    assert "not UTF-8" in error_lines(run("replay", tmp_path / "bin", ok=False))[0]


# -- the block pool -----------------------------------------------------------------------------


def test_pool_evicts_least_recently_used_unheld_segments():
    pool = TokenPool(2048)
    assert pool.admit([], 1024)
    pool.private -= 1024
    assert pool.store(1, 512, False) and pool.store(2, 512, False)
    pool.release([1, 2], 0)  # cached, evictable: 1 then 2
    assert pool.admit([], 1024)
    pool.private -= 1024
    pool.store(3, 512, False)
    pool.store(4, 512, False)
    assert pool.match([1, 2, 9]) == ([1, 2], 1024) and pool.match([9, 1]) == ([], 0)
    assert not pool.fits([], 1025)  # 3 and 4 are held: only 1 and 2 (1024 tokens) can go
    assert pool.admit([2], 100)  # holds 2 again, so 1 is evicted
    assert 1 not in pool and 2 in pool and pool.evicted == 1
    pool.release([3, 4], 0)
    pool.release([2], 100)
    assert pool.used == 1536 and list(pool.lru) == [3, 4, 2]  # most recently used last


def test_pool_grows_a_segment_and_stops_a_match_after_a_partial_one():
    pool = TokenPool(10_000)
    pool.store(7, 76, False)  # a session's block with 76 tokens so far
    assert pool.match([5, 7], 0, None) == ([], 0)
    pool.store(5, 512, False)
    assert pool.match([5, 7, 8], 0, None) == ([5, 7], 588)  # the walk ends after the partial one
    pool.store(7, 300, True)  # the same holder computed more of it: it grows
    assert pool.size[7] == 300 and pool.cached == 812
    pool.store(7, 100, False)  # a second holder of fewer tokens shares it, nothing grows
    assert pool.refs[7] == 2 and pool.cached == 812
    # the continuation's block stands in where the request's own is missing
    assert pool.match([5, 9], 1, [7]) == ([5, 7], 812)


def test_pool_without_caching_matches_nothing():
    pool = TokenPool(10, caching=False)
    assert pool.admit([], 3)
    assert not pool.store(1, 2, False)
    assert pool.match([1]) == ([], 0) and pool.private == 3
    pool.release([], 3)
    assert pool.used == 0


# -- linear forms ------------------------------------------------------------------


def test_linear_forms_refuse_a_path_that_is_not_linear(monkeypatch):
    cost = CostModel(from_name("deepseek-v3"))
    real = CostModel.ops

    def squared(self, path, batch, new, prefix):  # an op growing with new**2 per row: no linear form
        ops = real(self, path, batch, new, prefix)
        op = ops[0]
        return [replace(op, flops=op.flops + np.asarray(new, dtype=np.float64) ** 2)] + ops[1:]

    monkeypatch.setattr(CostModel, "ops", squared)
    with pytest.raises(MlactlError, match="is not linear"):
        LinearOps(cost, "absorb")


# -- the model's weights ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, hidden, layers, vocab, inter, moe_inter, experts, shared, top_k, dense, dtype, billions",
    [
        # config.json of deepseek-ai/DeepSeek-V3: 671B parameters (the paper's; MTP apart)
        pytest.param("deepseek-v3", 7168, 61, 129280, 18432, 2048, 256, 1, 8, 3, "fp8", 671.0, id="v3"),
        # DeepSeek-V3.2-Exp inference/config_671B_v3.2.json: V3's weights and the indexer (0.85B)
        pytest.param("deepseek-v3.2", 7168, 61, 129280, 18432, 2048, 256, 1, 8, 3, "fp8", 671.9, id="v3.2"),
        # deepseek-ai/DeepSeek-V2: 236B; DeepSeek-V2-Lite 15.7B
        pytest.param("deepseek-v2", 5120, 60, 102400, 12288, 1536, 160, 2, 6, 1, "bf16", 236, id="v2"),
        pytest.param("deepseek-v2-lite", 2048, 27, 102400, 10944, 1408, 64, 2, 6, 1, "bf16", 15.7, id="v2-lite"),
        # moonshotai/Kimi-K2-Instruct: "1 trillion total parameters" (rounded: within 3%)
        pytest.param("kimi-k2", 7168, 61, 163840, 18432, 2048, 384, 1, 8, 1, "fp8", 1000, id="k2"),
    ],
)
def test_presets_match_public_configs(
    name, hidden, layers, vocab, inter, moe_inter, experts, shared, top_k, dense, dtype, billions
):
    w = weights_mod.from_name(name)
    assert (w.hidden, w.layers, w.vocab, w.intermediate, w.moe_intermediate) == (
        hidden,
        layers,
        vocab,
        inter,
        moe_inter,
    )
    assert (w.experts, w.shared_experts, w.top_k, w.first_dense, w.dtype) == (experts, shared, top_k, dense, dtype)
    total = WeightCost(from_name(name), w).total_params / 1e9
    assert total == pytest.approx(billions, rel=0.03 if name == "kimi-k2" else 0.01)


def test_weights_from_a_config_json(tmp_path):
    cfg = {
        "hidden_size": 1024, "num_hidden_layers": 4, "vocab_size": 5000, "intermediate_size": 4096,
        "moe_intermediate_size": 256, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "moe_layer_freq": 2, "quantization_config": {"quant_method": "fp8"},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w = weights_mod.resolve(str(tmp_path / "config.json"))
    assert w.dtype == "fp8" and w.moe_layers == 1 and w.dense_layers == 3  # layer 2 only: >= 1 and even
    assert weights_mod.resolve(str(tmp_path / "config.json"), "bf16").dtype == "bf16"
    del cfg["n_routed_experts"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert weights_mod.resolve(str(tmp_path)).moe_layers == 0  # dense


# -- the chart --------------------------------------------------------------------------------------


def test_plot_replay_draws_the_report(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(MOONCAKE)
    rep = tmp_path / "r.json"
    run("replay", trace, "--engines", "sglang,vllm", "-o", rep)
    run("plot", "replay", rep, "-o", tmp_path / "r.svg", "--data", tmp_path / "d.json")
    drawn = json.loads((tmp_path / "d.json").read_text())
    data = json.loads(rep.read_text())
    engines = [e["label"] for e in data["engines"]]
    assert {t["engine"] for t in drawn["timeline"]} == set(engines)
    for e in data["engines"]:
        mine = [t for t in drawn["timeline"] if t["engine"] == e["label"]]
        lost = sum(t["lost_per_s"] * (t["end_s"] - t["start_s"]) for t in mine)
        assert lost == pytest.approx(e["lost_s"], rel=1e-9, abs=1e-12)
        for row in e["by_step_type"]:
            shares = [m["share"] for m in drawn["mix"] if m["engine"] == e["label"] and m["type"] == row["type"]]
            assert sum(shares) == pytest.approx(1.0)
    assert (tmp_path / "r.svg").read_text().startswith("<?xml")


def test_plot_replay_legend_gives_each_loss_and_its_interval(tmp_path):
    from mlactl.output.plot.replay import replay as chart

    line = {"label": "e", "timeline": {"edges_s": [0.0, 1.0], "lost_s": [0.5]}, "by_step_type": []}
    report = {"schema": "mlactl.replay", "schema_version": 1, "engines": [line]}
    assert chart(report)[1]["legend"] == ["e"]  # a report without totals: the label alone
    line.update(lost_s=468.07, lost_interval_s=[280.2, 468.07])
    assert chart(report)[1]["legend"] == ["e: lost 468s (280–468s)"]
    line.update(lost_s=0.0132, lost_interval_s=None)
    assert chart(report)[1]["legend"] == ["e: lost 13.2ms"]


def test_plot_replay_refuses_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "mlactl.analysis"}')
    line = error_lines(run("plot", "replay", bad, ok=False))
    assert len(line) == 1 and "is not a replay report" in line[0]
    bad.write_text('{"schema": "mlactl.replay", "schema_version": 1, "engines": [{"label": 3}]}')
    assert "engines[0].label must be a string" in error_lines(run("plot", "replay", bad, ok=False))[0]
