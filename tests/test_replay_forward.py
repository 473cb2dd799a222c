"""Replay's clock is the whole forward: a step's time worked out by hand, and a lone request's
time to first token against its prefill steps' forwards priced a second way (cost.py's ops on
numpy, each op at its own roofline), not through the clock's linear terms."""

from __future__ import annotations

import pytest
from test_replay import H200, V3, mooncake, schedule

from mlactl.decide.replay.clock import Clock
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, ForwardCost, WeightCost
from mlactl.model.weights import from_name as weights_of

W = weights_of("deepseek-v3")


def clock(hw=H200, cfg=V3):
    return Clock(CostModel(cfg), hw, WeightCost(cfg, W), ["absorb", "expand_chunked"])


def test_one_decode_of_batch_1_on_h200_by_hand():
    """DeepSeek-V3 at TP 8 on an H200 (4.8 TB/s, NVLink 900 GB/s: 450 GB/s each way), one
    decode token after no prefix. Every op is bound by memory at batch 1 (at most 2 FLOP a byte,
    far below the 412 of the fp8 ridge).

    The forward outside attention moves 5,594,070,208 bytes (tests/test_cost.py works them out
    by hand). Absorb, 16 heads a GPU, bf16: q_absorb W_UK 16 * 128 * 512 * 2 = 2,097,152 + q_nope
    4,096 + the latent query 16,384 = 2,117,632; attention: one latent row 576 * 2 = 1,152, the
    query 16 * 576 * 2 = 18,432, the output 16,384: 35,968; out_absorb 2,117,632 again:
    4,271,232 a layer, 260,545,152 over 61. All over the bandwidth: 5,854,615,360 / 4.8e12 s.
    The collectives: 122 all-reduces of 25,088 bytes and the logits' gather, 226,240, at 450e9."""
    c = clock()
    attention = c.launch("absorb", c.decode_features(1, 0.0))
    assert attention == pytest.approx(260_545_152 / 4.8e12, rel=1e-12)
    step = attention + c.other(1, 1)
    want = 5_854_615_360 / 4.8e12 + (122 * 25_088 + 226_240) / 450e9
    assert step == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(1.2270159e-3, rel=1e-7)
    parts = c.forward_parts(1, 1)
    assert parts["all_reduce"] == pytest.approx(122 * 25_088 / 450e9, rel=1e-12)
    assert c.comm_basis.startswith("roofline: NVLink 900")


def test_a_profile_without_nvlink_leaves_the_collectives_unpriced():
    c = clock(hardware.resolve("l40s"), from_name("deepseek-v3").with_tp(8))
    assert c.forward_parts(1024, 1)["all_reduce"] == 0.0
    assert c.comm_basis == "not priced: l40s has no nvlink_gbps"


def test_tp_1_has_no_collectives():
    c = clock(cfg=from_name("deepseek-v3"))
    assert c.forward_parts(4096, 1)["all_reduce"] == 0.0 and c.comm_basis == "tp 1: no collectives"


def forward_seconds(tokens, sampled, hw=H200, cfg=V3):
    """The forward outside attention, a second way: ForwardCost's ops on numpy arrays, each at
    its dtype's peak and the bandwidth, the collectives at half the NVLink."""
    out = 0.0
    for op in ForwardCost(cfg, W).ops(tokens, sampled):
        t = max(float(op.flops) / hw.peak_flops(op.dtype), float(op.bytes) / hw.bandwidth)
        out += op.count * (t + float(op.comm_bytes) / (hw.nvlink_gbps * 1e9 / 2))
    return out


def test_a_lone_prompt_first_token_is_its_prefill_steps_forwards(tmp_path):
    """A 20,000-token prompt alone on an H200 (vLLM: 8192-token budget): three chunks, 8192,
    8192 and 3616 tokens, the last samples; its time to first token is the three steps'
    forwards, each its attention plus the rest of the forward priced a second way."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 20_000, 2, list(range(40)))])
    s = schedule(trace, "vllm")
    assert s.chunk_new.tolist()[:3] == [8192, 8192, 3616]
    steps = s.chunk_step.tolist()[:3]
    want = 0.0
    for step in steps:
        rest = forward_seconds(int(s.tokens[step]), int(s.sampled[step]))
        assert s.time[step] - s.attention[step] == pytest.approx(rest, rel=1e-9)
        want += s.time[step]
    assert s.sampled[steps[-1]] == 1 and s.sampled[steps[0]] == 0
    assert s.first_token[0] == pytest.approx(want, rel=1e-12)
    # a full chunk's all-reduces: 122 of 2 * 7/8 * 8192 * 7168 * 2 = 205,520,896 bytes at 450 GB/s,
    # 55.7 ms, the largest op of its forward (the routed experts next, bound by the fp8 peak)
    parts = clock().forward_parts(8192, 0)
    assert parts["all_reduce"] == pytest.approx(122 * 205_520_896 / 450e9, rel=1e-12)
    assert max(parts, key=parts.get) == "all_reduce"
