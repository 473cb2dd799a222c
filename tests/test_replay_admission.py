"""Admission as each engine runs it, on hand-made traces whose outcome is worked out by hand.

vLLM (vllm-project/vllm@00024d31 vllm/v1/core/sched/scheduler.py, Scheduler.schedule) allocates a
request's slots as it computes them and, out of them, preempts the newest running request
(recompute). SGLang (sgl-project/sglang@00550cd1 schedule_policy.py PrefillAdder.add_one_req,
@000eaffa schedule_batch.py retract_decode, @0003215c environ.py) admits a request when its prompt
and output fit beside new_token_ratio of the running requests' outputs still to come (0.7,
decaying by (0.7 - 0.098) / 600 a decode step), and retracts the decoder with the fewest output
tokens when the next decode does not fit. DeepSeek-V3 at TP 8 on an H200, prefix caching off,
pools of a few hundred tokens.
"""

from __future__ import annotations

import pytest
from test_replay import H200, PAGE, V3, mooncake, parse

from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.cache import TokenPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.scheduler import scheduler_for
from mlactl.decide.replay.shipped import Shipped
from mlactl.decide.replay.traces import read_trace
from mlactl.model.cost import CostModel, WeightCost
from mlactl.model.weights import from_name as weights_of


def scheduler(trace_path, engine, tokens, conservativeness=1.0):
    e = parse(engine)
    clock = Clock(CostModel(V3), H200, WeightCost(V3, weights_of("deepseek-v3")), rules.paths())
    settings = Shipped(8192, 256, PAGE[e.params.backend], conservativeness=conservativeness)
    return scheduler_for(e)(read_trace(trace_path), e, TokenPool(tokens, caching=False), clock, settings)


def run(trace_path, engine, tokens, conservativeness=1.0):
    sched = scheduler(trace_path, engine, tokens, conservativeness)
    return sched, sched.run()


def chunks(s):
    return list(zip(s.chunk_req.tolist(), s.chunk_new.tolist(), s.chunk_prefix.tolist(), s.chunk_step.tolist()))


def decodes_of(s, i):
    return int(sum(b - a for r, a, b in zip(s.span_req, s.span_start, s.span_end) if r == i))


def test_vllm_preempts_the_newest_when_decode_slots_run_out(tmp_path):
    """A and B (prompt 200, output 100) arrive together; 512 tokens, vLLM's 16-token blocks.

    Step 0 prefills both, each allocating its prompt's 13 blocks (208 slots): 416 of 512. Decode
    count D writes the token after 200 + D, so a request needs a block more at D = 8, 24, 40
    (224, 240, 256 slots each: 512, full) and at D = 56 (272): A, first in the running list, finds
    none and preempts the newest, B, which frees its 256 slots; A takes its block and decodes alone.
    B had sampled 57 tokens (its first and 56 decodes): it comes back with a prompt of 257
    (vLLM's num_tokens) and 43 to go, needs 17 blocks (272) while A holds at least 272 of 512, so
    waits until A finishes (its 99 decodes), then recomputes its 257 tokens and decodes 42.
    Whole-context reservation would have run B after A without a preemption."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 200, 100, [1]), (0, 200, 100, [2])])
    sched, s = run(trace, "vllm", 512)
    assert s.preempted == 1 and s.recomputed == 257
    rows = chunks(s)
    assert [r[:3] for r in rows] == [(0, 200, 0), (1, 200, 0), (1, 257, 0)]
    assert rows[0][3] == rows[1][3] == 0
    assert decodes_of(s, 0) == 99 and decodes_of(s, 1) == 56 + 42
    assert s.decode_rows == 197  # one decode fewer than without the preemption: the resumed prefill samples it
    assert s.start[rows[2][3]] >= s.finished[0]  # B comes back once A is done
    assert s.first_token[1] == pytest.approx(s.start[0] + s.time[0])  # its first token stays its first
    assert sched.pool.private == 0 and sched.pool.used == 0  # every slot given back


def test_vllm_admits_on_the_first_chunk_only(tmp_path):
    """A (prompt 100, output 1600) decodes; B (prompt 500, output 2) arrives during A's prefill.
    In 1,712 tokens (107 blocks: A's whole context, 1,699 tokens, takes 1,712) vLLM admits B in the
    next step: its first chunk, 500 tokens (32 blocks, 512 slots), fits beside A's 112."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 1600, [1]), (1, 500, 2, [2])])
    _, s = run(trace, "vllm", 1712)
    assert [r[:3] for r in chunks(s)] == [(0, 100, 0), (1, 500, 0)]
    assert chunks(s)[1][3] == 1 and s.preempted == 0


def test_sglang_admits_when_its_output_estimate_has_decayed(tmp_path):
    """The same trace on SGLang (page 1). B asks for its prompt, its output and a page,
    500 + 2 + 1 = 503 tokens, beside new_token_ratio of A's decodes to come.

    After A's prefill (A holds 100 of 1,700) and k decode steps: free 1600 - k, A's decodes
    left 1599 - k, ratio 0.7 - k * 0.602 / 600. At k = 17: 1583 - 0.682943 * 1582 = 502.58 < 503,
    refused; at k = 18: 1582 - 0.681940 * 1581 = 503.85, admitted. So B's prefill is step 19
    (step 0 is A's prefill, steps 1-18 A's decodes 0-17)."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 1600, [1]), (1, 500, 2, [2])])
    sched, s = run(trace, "sglang", 1700)
    assert [r[:3] for r in chunks(s)] == [(0, 100, 0), (1, 500, 0)]
    assert chunks(s)[1][3] == 19
    assert s.decode[1:19].tolist() == list(range(18))
    assert 0.7 - 18 * sched.ratio_decay == pytest.approx(0.681940, abs=1e-6)
    assert s.preempted == 0
    # schedule_conservativeness 0.5: the ratio starts at 0.35, so at step 1 (no decode yet) 1600 -
    # 0.35 * 1599 = 1040.35 >= 503 and B is admitted at once
    sched, s = run(trace, "sglang", 1700, conservativeness=0.5)
    assert chunks(s)[1][:3] == (1, 500, 0) and chunks(s)[1][3] == 1


def test_sglang_ratio_floor(tmp_path):
    # init min(0.7 c, 1), floor min(init x 0.14, 1), decay (init - floor) / 600 steps
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 3, [1])])
    for c, init in ((1.0, 0.7), (0.5, 0.35), (2.0, 1.0)):
        sched = scheduler(trace, "sglang", 1000, c)
        assert sched.ratio == pytest.approx(init) and sched.min_ratio == pytest.approx(init * 0.14)
        assert sched.ratio_decay == pytest.approx(init * 0.86 / 600)


def test_sglang_retracts_the_decoder_with_fewest_outputs(tmp_path):
    """A (prompt 100, output 1000) decodes alone until B (prompt 100, output 400) arrives at
    0.5 s; by then A's estimate has decayed, and B's 100 + 400 + 1 tokens fit in 1,300 beside
    it: B is admitted. Both then take a slot a step until their prefixes fill the pool
    (A's + B's = 1,300); the next decode does not fit, and SGLang retracts the decoder with the
    fewest output tokens, B. B comes back with its prompt and its output so far as its prompt
    (prefix + 1 tokens) and recomputes them; it decodes one token fewer than it would have (its
    resumed prefill samples one), A all 999 of its own."""
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 1000, [1]), (500, 100, 400, [2])])
    sched, s = run(trace, "sglang", 1300)
    assert s.preempted == 1
    rows = chunks(s)
    assert [r[:2] for r in rows[:2]] == [(0, 100), (1, 100)]
    b_first = [
        (a, b, c0, d0) for r, a, b, c0, d0 in zip(s.span_req, s.span_start, s.span_end, s.span_c0, s.span_d0) if r == 1
    ]
    a_span = [
        (a, b, c0, d0) for r, a, b, c0, d0 in zip(s.span_req, s.span_start, s.span_end, s.span_c0, s.span_d0) if r == 0
    ]
    start, end, c0, d0 = b_first[0]
    b_prefix = c0 + end - d0  # B's prefix when it was retracted
    a_prefix = a_span[0][2] + end - a_span[0][3]  # A's, at the same decode count
    assert a_prefix + b_prefix == 1300  # the pool full
    assert rows[2][:3] == (1, b_prefix + 1, 0)  # prompt + output so far, recomputed
    assert s.recomputed == b_prefix + 1
    assert decodes_of(s, 0) == 999 and decodes_of(s, 1) == 398
    assert s.decode_rows == 999 + 398
    assert s.start[rows[2][3]] >= s.finished[0]  # B's 455 + 45 + 1 tokens fit only once A is done
    assert sched.pool.private == 0
