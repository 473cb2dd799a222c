"""`mlactl analyze --scope model` (mlactl/decide/forward.py): each row's whole forward pass, by
hand and against replay's clock, which prices a step's forward its own way (linear terms
recovered from ForwardCost, summed in plain floats)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from conftest import error_line, run

from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.clock import Clock
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, WeightCost
from mlactl.model.weights import from_name as weights_of


def forward_rows(*args):
    out = run("analyze", "--scope", "model", "-f", "json", *args)
    return json.loads(out.stdout)


def test_deepseek_v3_one_token_is_2_flops_per_activated_weight_by_hand():
    """Batch 1, one new token, no prefix, TP 1, one layer analysed (the forward takes all 61).

    Weights a token passes through (tests/test_cost.py counts them): 36,624,596,992 less W_UK and
    W_UV, which are the attention paths' (2 x 512 x 128 x 128 = 16,777,216 a layer): 2 FLOPs
    each, 73,249,193,984 - 2 x 16,777,216 x 61 = 71,202,373,632. Attention by the best path,
    expand (no prefix): kv_expand of one token 2 x 512 x 128 x (128 + 128) = 33,554,432 and its
    one pair 2 x 128 x 192 + 2 x 128 x 128 = 81,920, over 61 layers 2,051,817,472.
    Total 73,254,191,104: 2 x DeepSeek-V3's 37B activated parameters, within 1%."""
    data = forward_rows("--new", "1", "--prefix", "0", "--hardware", "h200")
    row = data["rows"][0]
    assert row["best"] == "expand"
    f = row["forward"]
    assert f["flops"] == 73_254_191_104
    assert f["flops"] / 74e9 == pytest.approx(1.0, abs=0.03)
    names = [o["name"] for o in f["ops"]]
    assert names == [
        "qkv_a_proj", "q_proj", "o_proj", "dense_mlp", "router", "shared_experts", "routed_experts", "all_reduce",
        "lm_head", "logits_gather",
    ]  # fmt: skip
    assert {o["name"]: o["count"] for o in f["ops"]}["all_reduce"] == 122  # two a layer
    assert data["forward"]["collectives"] == "tp 1: no collectives"
    # attention is the best path's own time, every layer: 61 x the one layer analysed
    one_layer = row["paths"]["expand"]["time_s"]
    assert f["attention_s"] == pytest.approx(61 * one_layer, rel=1e-12)
    assert f["time_s"] == pytest.approx(f["attention_s"] + sum(o["time_s"] for o in f["ops"]), rel=1e-12)


@pytest.mark.parametrize(
    "tokens, sampled",
    [pytest.param(1, 1, id="decode-1"), pytest.param(64, 64, id="decode-64"), pytest.param(8192, 1, id="chunk-8K")],
)
def test_the_rest_of_the_forward_is_what_the_replay_clock_charges(tokens, sampled):
    """The ops outside attention, at TP 8 on an H200 (NVLink 900 GB/s): analyze prices them on
    arrays from ForwardCost.ops; replay's Clock from linear terms it recovered itself."""
    cfg = from_name("deepseek-v3").with_tp(8)
    h200 = hardware.resolve("h200")
    clock = Clock(CostModel(cfg), h200, WeightCost(cfg, weights_of("deepseek-v3")), rules.paths())
    want = clock.forward_parts(tokens, sampled)
    batch, new = (tokens, 1) if tokens == sampled else (1, tokens)
    data = forward_rows("--tp", "8", "--hardware", "h200", "--batch", str(batch), "--new", str(new), "--prefix", "0")
    got = {o["name"]: o["time_s"] for o in data["rows"][0]["forward"]["ops"]}
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-9), name
    assert data["forward"]["collectives"].startswith("roofline: NVLink 900 GB/s")


def test_the_csv_and_the_table_carry_the_forward():
    text = run("analyze", "--scope", "model", "-f", "csv", "--new", "1,4096", "--prefix", "8K").stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2
    assert float(rows[1]["forward.time_s"]) > float(rows[0]["forward.time_s"]) > 0
    assert float(rows[0]["forward.routed_experts.time_s"]) > 0
    table = run("analyze", "--scope", "model", "--new", "1", "--prefix", "8K").stdout
    assert "forward" in table and "attn)" in table


def test_without_scope_model_there_is_no_forward():
    data = json.loads(run("analyze", "-f", "json", "--new", "1", "--prefix", "0").stdout)
    assert "forward" not in data and "forward" not in data["rows"][0]


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--scope", "layer"], "--scope must be one of attention, model", id="scope"),
        pytest.param(["--weight-dtype", "fp8"], "--weight-dtype goes with --scope model", id="weights-alone"),
        pytest.param(["--scope", "model", "--weight-dtype", "int4"], "int4", id="weight-dtype"),
    ],
)
def test_bad_scope_options_are_one_line(args, message):
    assert message in error_line(run("analyze", *args, ok=False))
