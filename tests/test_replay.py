"""`mlactl replay`: the exact semantics of the scheduler, the prefix cache and the paired
comparison, pinned on hand-made traces; the clock; the sweep; the report; the CLI and its errors.

Hand-derived references come from elsewhere in mlactl, never from the replay's own pricing:
`mlactl analyze --layers all` for a one-request step (the best path's time of that shape), and
the engines' rules as docs/engines.md states them, each test naming the version it derives:

* SGLang (attention_backend_handler.py, fa3 on an H200): an extend batch whose summed prefix is
  0 or at least 8192 runs MHA, one-shot while the summed sequence is at most 131072, else MLA;
  sglang@0.5.23 first runs MLA for any extend batch of at most 2048 new tokens (the piecewise
  prefill CUDA graph, on by default there; off in sglang@0.5.14).
* vLLM (vllm/v1/attention/backends/utils.py): each step reordered (decodes first, no-context
  prefills last) and split; a request of at most the threshold runs the decode pathway. On an
  H200 with a bf16 cache both vllm@0014ca6b and vllm@0.33.0 pick FLASH_ATTN_MLA (VARLEN,
  threshold 512: flashattn_mla.py); `vllm.backend=flashmla` gives FLASHMLA (UNIFORM, 128).
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from conftest import mooncake, run

from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.cache import TokenPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.pricing import rows_of
from mlactl.decide.replay.replay import ReplaySettings, _sweep, kv_pool, replay, retimed
from mlactl.decide.replay.scheduler import scheduler_for
from mlactl.decide.replay.shipped import Shipped
from mlactl.decide.replay.traces import read_trace
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, WeightCost
from mlactl.model.weights import from_name as weights_of

V3 = from_name("deepseek-v3").with_tp(8)
H200 = hardware.resolve("h200")
ALL = ("sglang", "sglang-triton", "sglang-trtllm", "vllm")
# Each backend's page on an H200 as the engines ship it, read by hand from their sources
# (docs/replay.md): SGLang's page_size 1, 64 for trtllm_mla; vLLM's block_size 16 (FLASH_ATTN_MLA),
# 64 for FlashMLA
PAGE = {"fa3": 1, "triton": 1, "trtllm_mla": 64, "FLASH_ATTN_MLA": 16, "FLASHMLA": 64}


def schedule(
    trace_path,
    engine="vllm",
    max_batch_tokens=8192,
    max_running=256,
    blocks=100_000,
    caching=True,
    options=(),
    page=None,
):
    """One engine's schedule of a trace, from the scheduler alone (the clock at DeepSeek-V3, TP 8,
    H200), a pool of `blocks` x 512 tokens, at the engine's own page unless `page` is given."""
    cost = CostModel(V3)
    clock = Clock(cost, H200, WeightCost(V3, weights_of("deepseek-v3")), rules.paths())
    e = parse(engine, options)
    t = read_trace(trace_path)
    tokens = blocks * 512
    if page is None:
        page = PAGE[e.params.backend]
    s = scheduler_for(e)(t, e, TokenPool(tokens, caching), clock, Shipped(max_batch_tokens, max_running, page))
    return s.run()


def parse(engine, options=()):
    """One engine's rule as replay resolves it for DeepSeek-V3 at TP 8 on an H200, bf16 cache."""
    return rules.parse(engine, list(options), V3, H200)[0]


def step_rows(s, step):
    """(new, prefix, decode) of every row of one step: the decodes of its decode count (each
    request's span that covers it), then its chunks."""
    rows = []
    d = int(s.decode[step])
    if d >= 0:
        for k in np.argsort(s.span_req, kind="stable"):
            if s.span_start[k] <= d < s.span_end[k]:
                rows.append((1, int(s.span_c0[k] + d - s.span_d0[k]), True))
    at = s.chunk_step == step
    rows += [(int(n), int(p), False) for n, p in zip(s.chunk_new[at], s.chunk_prefix[at])]
    return rows


def analyze_best(new, prefix, tp=8):
    """The best path's time of one request (new, prefix) on every layer, as `mlactl analyze` says."""
    out = run(
        "analyze", "--tp", tp, "--hardware", "h200", "--layers", "all", "--new", new, "--prefix", prefix, "-f", "json"
    )
    row = json.loads(out.stdout)["rows"][0]
    return row["paths"][row["best"]]["time_s"], row


def report(trace, *args):
    return json.loads(run("replay", trace, "-f", "json", *args).stdout)


# -- one request, a long prompt, a shared prefix, a continuation: worked by hand --------------------


def test_one_request_three_steps_best_is_analyzes(tmp_path):
    # input 4096, output 3: its prefill, then 3 - 1 = 2 decodes after 4096 and 4097 tokens
    trace = mooncake(tmp_path / "t.jsonl", [(0, 4096, 3, [])])
    for engine in ALL:
        s = schedule(trace, engine)
        assert [step_rows(s, k) for k in range(len(s))] == [[(4096, 0, False)], [(1, 4096, True)], [(1, 4097, True)]]
    expected = sum(analyze_best(n, p)[0] for n, p in ((4096, 0), (1, 4096), (1, 4097)))
    data = report(trace, "--no-prefix-cache")
    assert data["requests"] == 1
    assert data["tokens"] == {"prefill_computed": 4096, "prefill_cached": 0, "decode": 2}
    for e in data["engines"]:
        assert e["steps"] == 3
        assert e["best_time_s"] == pytest.approx(expected, rel=1e-12), e["name"]


def test_one_long_prompt_in_chunks(tmp_path):
    # 10000 tokens through a 4096-token budget: 4096, 4096 and the 1808 left, each after the others
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10000, 1, [])])
    for engine in ALL:
        s = schedule(trace, engine, max_batch_tokens=4096)
        assert list(zip(s.chunk_new, s.chunk_prefix)) == [(4096, 0), (4096, 4096), (1808, 8192)]
        assert list(s.chunk_step) == [0, 1, 2] and len(s) == 3
        assert list(s.chunk_last) == [0, 0, 1]


def test_second_request_finds_the_shared_blocks_cached(tmp_path):
    # three leading blocks shared; the second arrives 10 s later, long after the first's prefill.
    # It is shorter than the first (1900 < 2000 tokens), so it is no continuation of it: the
    # three hash ids are all it finds
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (10_000, 1900, 5, [1, 2, 3, 7])])
    for engine in ALL:
        s = schedule(trace, engine)
        assert list(s.cached) == [0, 1536]
        assert list(zip(s.chunk_new, s.chunk_prefix)) == [(2000, 0), (1900 - 1536, 1536)]
    data = report(trace)
    assert data["tokens"] == {"prefill_computed": 2000 + 364, "prefill_cached": 1536, "decode": 8}
    assert data["trace"]["continued"] == 0


@pytest.mark.parametrize(
    "engine, want",
    [
        # the first stores 2000 + 5 - 1 = 2004 tokens: its 3 full blocks (1536) and 468 of its own
        pytest.param("sglang", 2004, id="sglang-fa3-page1"),
        pytest.param("sglang-triton", 2004, id="sglang-triton-page1"),
        pytest.param("vllm", 2000, id="vllm-block16"),  # 125 blocks of 16
        pytest.param("sglang-trtllm", 1984, id="sglang-trtllm-page64"),  # 31 pages of 64
    ],
)
def test_a_continuation_finds_the_earlier_prompt_and_output(tmp_path, engine, want):
    # the second extends all of the first's full blocks and is longer: taken as its next turn
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (10_000, 3000, 5, [1, 2, 3, 7, 8, 9])])
    t = read_trace(trace)
    assert t.parent.tolist() == [-1, 0] and t.continued == 1
    s = schedule(trace, engine)
    assert list(s.cached) == [0, want]
    assert list(zip(s.chunk_new, s.chunk_prefix))[1] == (3000 - want, want)


@pytest.mark.parametrize(
    "engine, want",
    [
        # P (1000 in, 100 out) stores 1099 tokens: hash 1 and two blocks of its own (512 + 75).
        # A (1600) continues P: hash 1, then P's own full block and 75 of its partial one = 1099;
        # A stores 1699 (its hashes 1, 3, 4 and 163 of its own 4th block). B (2200) continues A:
        # hash 1; hash 3, which A took from P's own block; hash 4; 163 of A's own = 1699.
        pytest.param("sglang", (1099, 1699), id="sglang-fa3-page1"),
        pytest.param("vllm", (1088, 1696), id="vllm-block16"),  # floored to 16
        pytest.param("sglang-trtllm", (1088, 1664), id="sglang-trtllm-page64"),  # floored to 64
    ],
)
def test_a_third_turn_finds_what_the_second_took_from_the_first(tmp_path, engine, want):
    trace = mooncake(
        tmp_path / "t.jsonl",
        [(0, 1000, 100, [1, 2]), (100_000, 1600, 100, [1, 3, 4, 5]), (200_000, 2200, 10, [1, 3, 4, 6, 7])],
    )
    t = read_trace(trace)
    assert t.parent.tolist() == [-1, 0, 1]
    s = schedule(trace, engine)
    # without filing P's block under A's hash 3, B would stop after hash 1 (512)
    assert list(s.cached) == [0, *want]


def test_tpot_and_throughput_follow_from_the_decode_steps(tmp_path):
    # a lone request of 5 output tokens: its first comes with the prefill, then 4 decode steps,
    # so its TPOT is the mean of those steps' times; a second request of 1 output token, much
    # later, has no TPOT but adds its token to the throughput over the whole span
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1000, 5, [1, 2]), (1_000_000, 300, 1, [9])])
    s = schedule(trace, "vllm")
    decodes = s.time[s.decode >= 0]
    assert len(decodes) == 4
    data = report(trace, "--engines", "vllm", "--hardware", "h200", "--tp", "8")
    latency = data["engines"][0]["latency_s"]
    tpot = latency["per_output_token"]
    assert tpot["p50"] == pytest.approx(decodes.mean(), rel=1e-9)
    assert tpot["p99"] == pytest.approx(tpot["p50"], rel=1e-12)  # one request has a TPOT
    # first arrival 0 s, last finish the second request's: 1000 s after its arrival, plus its prefill
    assert latency["output_tokens_per_s"] == pytest.approx(6 / float(s.finished[1]), rel=1e-9)
    assert 1000.0 < s.finished[1] < 1001.0


def test_retiming_a_schedule_with_its_own_attention_gives_back_its_clock(tmp_path):
    # requests that queue (two run at once), one that arrives to an idle engine and prompts
    # that span chunks: the only waits are for arrivals, so the recurrence gives back every start
    rows = [(0, 9000, 40, [1]), (0, 3000, 60, [2]), (5, 500, 20, [3]), (10, 7000, 5, [4]), (60_000, 2000, 30, [5])]
    trace = mooncake(tmp_path / "t.jsonl", rows)
    arrival = read_trace(trace).arrival
    for engine in ("vllm", "sglang"):
        s = schedule(trace, engine, max_batch_tokens=4096, max_running=2)
        start, end = retimed(s, arrival, s.attention)
        assert start == pytest.approx(s.start, rel=1e-12, abs=1e-12)
        assert end[s.finished_step] == pytest.approx(s.finished, rel=1e-12)
        assert end[s.first_token_step] == pytest.approx(s.first_token, rel=1e-12)
        assert start[s.admitted_step] == pytest.approx(s.admitted, rel=1e-12)
        assert start[s.admitted_step[-1]] == pytest.approx(60.0, rel=1e-12)  # it found the engine idle


def test_latency_under_the_best_path_by_hand(tmp_path):
    # A: 10000 in, 3 out, through a 4096-token budget: chunks of 4096, 4096 (after 4096) and 1808
    # (after 8192), then decodes after 10000 and 10001 tokens. SGLang runs its two later chunks
    # on MLA (a summed prefix under 8192), which is not their best path; on the best path each
    # step takes the rest of its forward (the clock's) plus the best path's attention as
    # `mlactl analyze` gives it. B, 4096 in and 1 out, arrives 100 s later to an idle engine: on
    # the best path too it waits for its arrival, then takes one prefill.
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10000, 3, []), (100_000, 4096, 1, [])])
    s = schedule(trace, "sglang", max_batch_tokens=4096)
    shapes = ((4096, 0), (4096, 4096), (1808, 8192), (1, 10000), (1, 10001), (4096, 0))
    assert [step_rows(s, k) for k in range(len(s))] == [[(n, p, n == 1)] for n, p in shapes]
    best = np.array([analyze_best(n, p)[0] for n, p in shapes])
    assert s.attention[1] > 2 * best[1] and s.attention[2] > 2 * best[2]  # the rule's chunks are off their best
    rest = s.time - s.attention
    args = ("--engines", "sglang", "--hardware", "h200", "--tp", "8", "--no-prefix-cache", "--max-batch-tokens", "4096")
    data = report(trace, *args)
    rule, on_best = data["engines"][0]["latency_s"], data["engines"][0]["latency_best_path_s"]
    ttft = np.array([(rest[:3] + best[:3]).sum(), rest[5] + best[5]])
    want = np.percentile(ttft, [50, 90, 99])
    got = [on_best["first_token"][k] for k in ("p50", "p90", "p99")]
    assert got == pytest.approx(want, rel=1e-9)
    assert rule["first_token"]["p50"] == pytest.approx(np.mean([s.time[:3].sum(), s.time[5]]), rel=1e-9)
    tpot = (rest[3] + best[3] + rest[4] + best[4]) / 2  # A's two tokens after its first; B has one token
    assert on_best["per_output_token"]["p50"] == pytest.approx(tpot, rel=1e-9)
    assert on_best["queue"]["p99"] == 0.0
    # 4 output tokens from 0 s to B's first (and only) token, one prefill after 100 s
    assert on_best["output_tokens_per_s"] == pytest.approx(4 / (100.0 + ttft[1]), rel=1e-9)


def test_blocks_are_cached_only_once_their_prefill_ran(tmp_path):
    # both arrive at once: they are admitted into the same step, before either block is computed
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (0, 3000, 5, [1, 2, 3, 7, 8, 9])])
    for engine in ALL:
        assert list(schedule(trace, engine).cached) == [0, 0]


def decode_meets_prompt(tmp_path):
    """A (input 6000, its prefill ~0.1 s on the whole-forward clock) decodes when B and C arrive
    together at 0.3 s; each shares A's first 10 blocks (5120
    tokens) and has 1000 of its own: summed, their cached prefixes are 10240 >= 8192."""
    a = list(range(100, 112))
    return mooncake(
        tmp_path / "t.jsonl",
        [(0, 6000, 200, a), (300, 6120, 50, a[:10] + [200, 201]), (300, 6120, 50, a[:10] + [300, 301])],
    )


def replay_paths(s, e, step):
    """The rule's path of every row of one step, as replay prices it (pricing.rows_of's rows)."""
    rows = rows_of(s, step, step + 1)
    got = rules.step_codes(e, rows.new, rows.prefix, rows.step, rows.decode, rows.steps)
    return list(zip(rows.new.tolist(), rows.prefix.tolist(), np.asarray(rules.paths())[got].tolist()))


VLLM_BOTH = [
    # (engine, options, backend, decode threshold): H200, bf16 cache; cuda.py's sm90 priorities
    # pick FLASH_ATTN_MLA (flashattn_mla.py: reorder_batch_threshold 512, VARLEN) in both versions
    pytest.param("vllm@0014ca6b", (), "FLASH_ATTN_MLA", 512, id="0014ca6b"),
    pytest.param("vllm@0.33.0", (), "FLASH_ATTN_MLA", 512, id="0.33.0"),
    # FLASHMLA (flashmla.py: 128, UNIFORM)
    pytest.param("vllm@0014ca6b", ("vllm.backend=flashmla",), "FLASHMLA", 128, id="0014ca6b-flashmla"),
    pytest.param("vllm@0.33.0", ("vllm.backend=flashmla",), "FLASHMLA", 128, id="0.33.0-flashmla"),
]


@pytest.mark.parametrize("engine, options, backend, threshold", VLLM_BOTH)
def test_vllm_runs_the_decode_and_the_new_prompts_in_one_step(tmp_path, engine, options, backend, threshold):
    trace = decode_meets_prompt(tmp_path)
    s = schedule(trace, engine, options=options)
    e = parse(engine, options)
    assert (e.params.backend, e.params.threshold) == (backend, threshold)
    step = int(s.chunk_step[1])
    assert step == int(s.chunk_step[2])  # B and C together
    rows = step_rows(s, step)
    assert rows[0][2] and rows[0][1] > 6000  # A's decode, after its prompt and some output
    assert rows[1:] == [(1000, 5120, False), (1000, 5120, False)]
    # the reorder keeps A first (a decode: region 0), B and C after it (1000 > t tokens with context:
    # the extends); the split takes A (one token; VARLEN: at most t; UNIFORM: the first's length) and
    # stops at B: A absorbs, B and C prefill with context
    want = [(1, rows[0][1], "absorb"), (1000, 5120, "expand_chunked"), (1000, 5120, "expand_chunked")]
    assert replay_paths(s, e, step) == want


def decode_meets_short_prompts(tmp_path):
    """A (input 6000) decodes when B and C arrive: B shares A's first 10 blocks and has 80 tokens
    of its own (a short extend with context), C is 300 tokens of its own (no context)."""
    a = list(range(100, 112))
    return mooncake(tmp_path / "t.jsonl", [(0, 6000, 200, a), (100, 5200, 50, a[:10] + [200]), (100, 300, 50, [300])])


@pytest.mark.parametrize("engine, options, backend, threshold", VLLM_BOTH)
def test_vllm_split_of_a_decode_and_short_prompts(tmp_path, engine, options, backend, threshold):
    trace = decode_meets_short_prompts(tmp_path)
    s = schedule(trace, engine, options=options)
    e = parse(engine, options)
    step = int(s.chunk_step[1])
    assert step == int(s.chunk_step[2])
    rows = step_rows(s, step)
    assert [r[0] for r in rows] == [1, 80, 300] and rows[1][1] == 5120 and rows[2][1] == 0
    if backend == "FLASH_ATTN_MLA":
        # VARLEN, 512: the longest query (300) is within it, so split_decodes_and_prefills takes
        # every request as a decode, even C without context
        want = ["absorb", "absorb", "absorb"]
    else:
        # UNIFORM, 128: reordered A (decode), B (80 <= 128 with context), C (no context, last);
        # the decodes are the leading requests as long as the first's (1 token): A only
        want = ["absorb", "expand_chunked", "expand"]
    assert [p for _, _, p in replay_paths(s, e, step)] == want


def test_sglang_runs_the_new_prompts_as_their_own_extend_step(tmp_path):
    trace = decode_meets_prompt(tmp_path)
    for engine in ("sglang@0.5.14", "sglang@0.5.23"):
        s = schedule(trace, engine)
        step = int(s.chunk_step[1])
        rows = step_rows(s, step)
        assert rows == [(1000, 5120, False), (1000, 5120, False)]  # no decode in the extend batch
        # the decode step after it runs all three decodes (A's, and B's and C's first)
        assert [r[2] for r in step_rows(s, step + 1)] == [True, True, True]
        paths = [p for _, _, p in replay_paths(s, parse(engine), step)]
        if engine == "sglang@0.5.14":
            # fa3: the summed prefix 10240 >= 8192 and the summed sequence 12240 <= 131072: MHA one shot
            assert paths == ["expand", "expand"]
        else:
            # 0.5.23: the batch's 2000 new tokens are within the prefill graph's 2048: MLA
            assert paths == ["absorb", "absorb"]
    # each alone (5120 < 8192) would run MLA, in either version
    for engine in ("sglang@0.5.14", "sglang@0.5.23"):
        alone = rules.step_paths(parse(engine), [1000], [5120], [0], [False], 1).tolist()
        assert alone == ["absorb"]
    # 0.5.23 with a graph of at most 1024 tokens: the sum decides again
    small = parse("sglang@0.5.23", ["sglang.piecewise_cuda_graph_max_tokens=1024"])
    assert rules.step_paths(small, [1000, 1000], [5120, 5120], [0, 0], [False, False], 1).tolist() == ["expand"] * 2


def test_sglang_mixed_chunk_puts_the_decode_in_the_extend_batch(tmp_path):
    trace = decode_meets_prompt(tmp_path)
    for engine in ("sglang@0.5.14", "sglang@0.5.23"):
        options = ("sglang.enable_mixed_chunk=true",)
        s = schedule(trace, engine, options=options)
        step = int(s.chunk_step[1])
        rows = step_rows(s, step)
        assert [r[2] for r in rows] == [True, False, False]
        paths = [p for _, _, p in replay_paths(s, parse(engine, ["enable_mixed_chunk=1"]), step)]
        if engine == "sglang@0.5.14":
            # one extend batch, the decode included: its prefix joins the sum, so all three run MHA
            assert paths == ["expand", "expand", "expand"]
        else:
            # 1 + 2000 new tokens: inside the prefill graph, all three run MLA
            assert paths == ["absorb", "absorb", "absorb"]


# -- the scheduler ----------------------------------------------------------------------------------


def test_vllm_budget_counts_the_running_decodes(tmp_path):
    # a budget of 100: A decodes (1 token) and B's 250 prompt tokens come 99, 99, 52
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10, 50, []), (1, 250, 2, [])])
    s = schedule(trace, "vllm", max_batch_tokens=100)
    b = s.chunk_req == 1
    assert list(s.chunk_new[b]) == [99, 99, 52] and list(s.chunk_prefix[b]) == [0, 99, 198]
    for step in s.chunk_step[b]:
        assert sum(1 for r in step_rows(s, int(step)) if r[2]) == 1


def test_sglang_extend_steps_stall_the_decodes(tmp_path):
    # the same trace: B's chunks take the whole budget of their extend steps, A waits
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10, 50, []), (1, 250, 2, [])])
    s = schedule(trace, "sglang", max_batch_tokens=100)
    b = s.chunk_req == 1
    assert list(s.chunk_new[b]) == [100, 100, 50]
    for step in s.chunk_step[b]:
        assert not any(r[2] for r in step_rows(s, int(step)))


def test_max_running_holds_the_third_request(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 10, []), (0, 100, 20, []), (0, 100, 5, [])])
    for engine in ALL:
        s = schedule(trace, engine, max_running=2)
        first_done = min(s.finished[0], s.finished[1])
        assert s.admitted[2] >= first_done  # FCFS: the third runs once the first finished
        assert s.admitted[0] == s.admitted[1] == 0.0


def test_fcfs_head_of_line_waits_for_room(tmp_path):
    # a pool of 1536 tokens: A holds 1024 (1023 in blocks of 16); B needs as many and waits; C
    # (112) may not jump ahead
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1000, 24, []), (0, 1000, 24, []), (0, 100, 2, [])])
    s = schedule(trace, "vllm", blocks=3)
    assert s.admitted[1] >= s.finished[0]
    assert s.admitted[2] >= s.admitted[1]


def test_cached_tokens_leave_one_token_to_compute(tmp_path):
    # the same 1024-token prompt twice: both blocks cached (and 2 output tokens of the first, its
    # continuation's), yet one token is computed
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1024, 3, [5, 6]), (5000, 1024, 3, [5, 6])])
    s = schedule(trace, "sglang")
    assert list(s.cached) == [0, 1023]
    assert list(zip(s.chunk_new, s.chunk_prefix))[1] == (1, 1023)


def test_no_prefix_cache(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (10_000, 3000, 5, [1, 2, 3, 7, 8, 9])])
    assert list(schedule(trace, "vllm", caching=False).cached) == [0, 0]


def test_lru_evicts_the_least_recently_used(tmp_path):
    # 2048 tokens of room, each request's 1024 tokens (one output: nothing past the prompt is
    # stored) two segments. A [1,2] runs and finishes; B [3,4] likewise; C [5,6] takes A's, the
    # least recently used (cache: 3,4,5,6); D [1,2] finds nothing and takes B's (cache: 5,6,1,2);
    # E [5,6,11] finds C's two (it continues C, which stored nothing past them) and evicts 1
    rows = [(0, 1024, 1, [1, 2]), (10_000, 1024, 1, [3, 4]), (20_000, 1024, 1, [5, 6])]
    rows += [(30_000, 1024, 1, [1, 2]), (40_000, 1025, 1, [5, 6, 11]), (50_000, 1024, 1, [3, 4])]
    trace = mooncake(tmp_path / "t.jsonl", rows)
    for engine in ALL:
        s = schedule(trace, engine, blocks=4)
        assert list(s.cached) == [0, 0, 0, 0, 1024, 0]


def test_session_turn_finds_the_last_turns_prompt_and_output(tmp_path):
    # turn 1: 1000 prompt + 100 output = 1099 tokens of KV (the last token's is never computed;
    # SGLang caches kv_committed_len = input + output - 1 of them). Turn 2 extends it (1100 + 400
    # new): SGLang at page 1 finds all 1099
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,input_tokens,output_tokens,session\n0,1000,100,chat-1\n100,1500,10,chat-1\n150,900,1,\n")
    s = schedule(str(f), "sglang")
    assert list(s.cached) == [0, 1099, 0]  # the lone 900-token prompt shares nothing


@pytest.mark.parametrize(
    "engine, hardware, want",
    [
        # 1099 tokens stored: SGLang fa3 at page 1 takes all; vLLM's blocks of 16 take 68 of them
        # (1088) and trtllm_mla's pages of 64 take 17 (1088)
        pytest.param("sglang", "h200", 1099, id="sglang-fa3-h200"),
        pytest.param("vllm", "h200", 1088, id="vllm-flash-attn-mla-h200"),
        pytest.param("sglang-trtllm", "b200", 1088, id="sglang-trtllm-b200"),
        pytest.param("sglang", "b200", 1088, id="sglang-b200-default-trtllm"),
    ],
)
def test_two_turn_session_caches_at_each_engines_page(tmp_path, engine, hardware, want):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,input_tokens,output_tokens,session\n0,1000,100,a\n100,1600,10,a\n")
    data = json.loads(run("replay", f, "--hardware", hardware, "--engines", engine, "-f", "json").output)
    e = data["engines"][0]
    assert e["tokens"]["prefill_cached"] == want
    assert e["tokens"]["prefill_computed"] == 1000 + 1600 - want


def test_reported_cached_tokens_are_taken_as_given(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,input_tokens,output_tokens,cached_tokens\n0,1000,2,600\n1,500,2,500\n2,800,2,\n")
    s = schedule(str(f), "vllm")
    assert list(s.cached) == [600, 499, 0]  # capped at input - 1; an empty cell: the cache decides


def test_decode_steps_follow_each_other(tmp_path):
    # one request alone: every decode step's row is one token after all the earlier ones
    trace = mooncake(tmp_path / "t.jsonl", [(0, 300, 40, [])])
    s = schedule(trace, "sglang")
    assert len(s) == 40
    assert [step_rows(s, k)[0][1] for k in range(1, 40)] == list(range(300, 339))


# -- the clock ----------------------------------------------------------------------------------------


def test_clock_is_the_exact_engine_time_plus_weights_and_overhead(tmp_path):
    lines = [
        (int(t), int(i), int(o), [])
        for t, i, o in zip(np.arange(0, 6000, 150), np.arange(500, 40500, 1000), np.arange(3, 43))
    ]
    trace = mooncake(tmp_path / "t.jsonl", lines)
    t = read_trace(trace)
    settings = ReplaySettings(step_overhead_s=0.002)
    out = replay(t, V3, weights_of("deepseek-v3"), H200, rules.parse(None), settings, keep_steps=True)
    for e in out.engines:
        step = e.per_step
        np.testing.assert_allclose(step["clock_attention_s"], step["attention_s"], rtol=1e-9)
        other = step["step_time_s"] - step["attention_s"] - 0.002
        assert (other > 0).all()
        # the steps follow each other: each starts when the one before ends (or at an arrival)
        ends = step["start_s"][:-1] + step["step_time_s"][:-1]
        assert (step["start_s"][1:] >= ends - 1e-9).all()


def test_weights_time_by_hand():
    # DeepSeek-V3 at TP 8, a step of one decode token: 8 routed experts hit in each of 58 MoE layers
    w = WeightCost(V3, weights_of("deepseek-v3"))
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 128 * 128 * 7168  # q_a, q_b, kv_a, o per layer
    dense = 61 * attn + 3 * 3 * 7168 * 18432 + 58 * 1 * 3 * 7168 * 2048  # + 3 dense MLPs + shared experts
    routed = 58 * 8 * 3 * 7168 * 2048
    router = 58 * 7168 * 256
    assert w.dense_flops(1) == pytest.approx(2 * (dense + router + routed) / 8, rel=1e-15)
    assert w.dense_bytes(1) == pytest.approx(((dense + routed) * 1 + router * 2) / 8, rel=1e-15)
    assert w.experts_hit(1) == pytest.approx(8.0) and w.experts_hit(1e6) == pytest.approx(256.0)


# -- the sweep ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang@0.5.14", "sglang@0.5.23"])
def test_sglang_sweep_by_hand(tmp_path, engine):
    # one 10000-token prompt through 4096-token steps: extends after 0, 4096 and 8192 tokens. SGLang
    # on fa3 runs MHA (one shot) where the summed prefix is 0 or >= t, else MLA: the threshold
    # changes a path only at 4097 (the second step) and 8193 (the third). sglang@0.5.23 runs the
    # third (1808 new tokens <= 2048) inside its prefill graph, MLA at any threshold: no 8193 there
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10000, 1, [])])
    steps = [(4096, 0), (4096, 4096), (1808, 8192)]
    best = {}
    for n, p in steps:
        _, row = analyze_best(n, p)
        best[(n, p)] = {k: v["time_s"] for k, v in row["paths"].items()}
    expand = [best[s]["expand"] for s in steps]
    absorb = [best[s]["absorb"] for s in steps]
    if engine == "sglang@0.5.14":
        at = {1: sum(expand), 4097: expand[0] + absorb[1] + expand[2], 8193: expand[0] + absorb[1] + absorb[2]}
    else:
        at = {1: expand[0] + expand[1] + absorb[2], 4097: expand[0] + absorb[1] + absorb[2]}
    data = report(trace, "--engines", engine, "--max-batch-tokens", "4096")
    sweep = data["engines"][0]["sweep"]
    assert sweep["option"] == "chunked_prefix_cache_threshold"
    curve = {c["threshold"]: c["time_s"] for c in sweep["curve"]}
    assert sorted(curve) == sorted(at)
    for t, v in at.items():
        assert curve[t] == pytest.approx(v, rel=1e-12)
    # the default 8192 lies in [4097, 8192] (or from 4097 up): its time is at[4097], which the engine reports
    assert sweep["current"] == 8192
    assert sweep["current_time_s"] == pytest.approx(at[4097], rel=1e-12)
    assert data["engines"][0]["time_s"] == pytest.approx(at[4097], rel=1e-12)
    want = min(at, key=at.get)
    assert sweep["best"] == want
    assert data["engines"][0]["best_threshold"] == want


@pytest.mark.parametrize(
    "engine, options, current",
    [
        pytest.param("vllm@0.33.0", [], 512, id="0.33.0-flash_attn_mla"),
        pytest.param("vllm@0014ca6b", [], 512, id="0014ca6b-flash_attn_mla"),
        pytest.param("vllm@0.33.0", ["--engine-option", "vllm.backend=flashmla"], 128, id="0.33.0-flashmla"),
        pytest.param("vllm@0014ca6b", ["--engine-option", "vllm.backend=flashmla"], 128, id="0014ca6b-flashmla"),
    ],
)
def test_vllm_sweep_changes_at_each_query_length(tmp_path, engine, options, current):
    # prompts of 100 and 300 tokens without context, each alone in its step: a request of at most
    # t tokens is a decode (VARLEN: the longest query is within t; UNIFORM: the first request is
    # within t and all are as long), else a prefill. At t < 100 both prefill (expand), from 100
    # the first absorbs, from 300 both do
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 1, []), (5000, 300, 1, [])])
    data = report(trace, "--engines", engine, *options)
    sweep = data["engines"][0]["sweep"]
    assert sweep["option"] == "reorder_batch_threshold"
    t = {c["threshold"] for c in sweep["curve"]}
    assert t == {1, 100, 300}
    times = {}
    for n in (100, 300):
        _, row = analyze_best(n, 0)
        times[n] = {k: v["time_s"] for k, v in row["paths"].items()}
    curve = {c["threshold"]: c["time_s"] for c in sweep["curve"]}
    assert curve[1] == pytest.approx(times[100]["expand"] + times[300]["expand"], rel=1e-12)
    assert curve[100] == pytest.approx(times[100]["absorb"] + times[300]["expand"], rel=1e-12)
    assert curve[300] == pytest.approx(times[100]["absorb"] + times[300]["absorb"], rel=1e-12)
    # the threshold in force: FLASH_ATTN_MLA's 512 (from 300 up), FLASHMLA's 128 (from 100 to 299)
    assert sweep["current"] == current
    assert sweep["current_time_s"] == pytest.approx(curve[300 if current >= 300 else 100], rel=1e-12)


SWEPT_RULES = [
    # every vLLM backend and version (PCP: short extends still prefilling are prefills) ...
    *[("vllm@" + v, ["backend=" + b]) for v in ("0014ca6b", "0.33.0") for b in ("flash_attn_mla", "flashmla")],
    ("vllm@0.33.0", ["backend=flashmla", "prefill_context_parallel_size=2"]),
    ("vllm@0.33.0", ["backend=flash_attn_mla", "prefill_context_parallel_size=2"]),
    ("vllm@0.33.0", ["backend=triton_mla"]),
    # ... and SGLang's summed prefix, with mixed chunk, the prefill graph and without it
    ("sglang@0.5.14", []),
    ("sglang@0.5.14", ["enable_mixed_chunk=true"]),
    ("sglang@0.5.23", []),
    ("sglang@0.5.23", ["enable_mixed_chunk=true", "piecewise_cuda_graph_max_tokens=600"]),
]


@pytest.mark.parametrize("engine, options", SWEPT_RULES, ids=lambda x: x if isinstance(x, str) else ",".join(x))
def test_sweep_values_cover_every_change_and_the_arrays_match_one_threshold_at_a_time(engine, options):
    """The sweep prices each step at its breakpoints only: at any threshold t a step must run
    what it runs at its largest breakpoint not above t (or at 1). Checked by asking the rule at
    every t near a value of the step (and at random ones), one threshold at a time; and the
    sweep's one call over many steps, each at its own threshold, must give the same paths."""
    e = parse(engine, options)
    rng = np.random.default_rng(7)
    steps = []
    for _ in range(60):  # scheduler-like steps: decodes first, then chunks (some of one token)
        d = int(rng.integers(0, 4))
        c = int(rng.integers(1, 4))
        new = [1] * d + rng.choice([1, 2, 3, 80, 128, 129, 300, 512, 513, 700, 3000], c).tolist()
        prefix = rng.integers(1, 9000, d).tolist() + rng.choice([0, 0, 1, 100, 4000, 8191, 8192], c).tolist()
        steps.append((np.array(new), np.array(prefix), np.array([True] * d + [False] * c)))
    regimes_step, regimes_t = [], []
    for k, (new, prefix, dec) in enumerate(steps):
        zero = np.zeros(len(new), dtype=np.int64)
        _, values = rules.breakpoints(e, new, prefix, zero, dec, 1)
        values = np.sort(np.append(values, 1))
        sums = [int(prefix[~dec].sum()), int(prefix.sum())]
        near = {1, 2, 3, *new.tolist(), *(int(q) + 1 for q in new), *sums, *(v + 1 for v in sums)}
        near |= {v - 1 for v in near if v > 1} | set(rng.integers(1, 20000, 30).tolist())
        near = {v for v in near if v >= 1}  # a threshold is at least 1
        at_values = {int(v): rules.step_paths(e.with_threshold(int(v)), new, prefix, zero, dec, 1) for v in values}
        for t in sorted(near):
            under = int(values[np.searchsorted(values, t, side="right") - 1])
            got = rules.step_paths(e.with_threshold(t), new, prefix, zero, dec, 1)
            assert got.tolist() == at_values[under].tolist(), (new, prefix, dec, t, under)
        regimes_step += [k] * len(values)
        regimes_t += values.tolist()
    # the sweep's way: every (step, threshold) regime as a group of its own, in one call
    counts = [len(steps[k][0]) for k in regimes_step]
    group = np.repeat(np.arange(len(regimes_step)), counts)
    new = np.concatenate([steps[k][0] for k in regimes_step])
    prefix = np.concatenate([steps[k][1] for k in regimes_step])
    dec = np.concatenate([steps[k][2] for k in regimes_step])
    got = rules.step_codes(e, new, prefix, group, dec, len(counts), np.repeat(regimes_t, counts))
    want = np.concatenate(
        [
            rules.codes(
                rules.step_paths(e.with_threshold(t), *steps[k][:2], np.zeros(len(steps[k][0]), int), steps[k][2], 1)
            )
            for k, t in zip(regimes_step, regimes_t)
        ]
    )
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "engine, options",
    [
        *SWEPT_RULES,
        ("sglang-triton", []),
        ("sglang-trtllm", ["enable_mixed_chunk=true"]),
        ("vllm", ["backend=flashmla"]),
    ],
    ids=lambda x: x if isinstance(x, str) else ",".join(x),
)
def test_the_clocks_one_step_answer_is_the_whole_steps(engine, options):
    """The scheduler's clock asks the rule about one step by its sums (SGLang) or with one decode
    row and context as there or not (vLLM), remembering answers: the same paths as the whole step."""
    e = parse(engine, options)
    one = rules.OneStep(e)
    rng = np.random.default_rng(11)
    for _ in range(300):
        B = int(rng.choice([0, 0, 1, 3, 40]))
        c = int(rng.integers(0 if B else 1, 4))
        new = rng.choice([1, 2, 80, 128, 129, 300, 512, 513, 1900, 3000], c).tolist()
        prefix = rng.choice([0, 1, 100, 4000, 8191, 8192, 20000], c).tolist()
        decodes = rng.integers(1, 12000, B).tolist()
        dec, rest = one.paths(B, sum(decodes), new, prefix)
        rows = ([1] * B + new, decodes + prefix, [True] * B + [False] * c)
        if not c and e.family == "sglang" and B:  # a decode-only step: SGLang's decode batch
            assert dec == rules.decode_path(e)
            continue
        whole = rules.step_paths(e, *(np.array(r) for r in rows[:2]), np.zeros(B + c, int), np.array(rows[2]), 1)
        assert [dec] * B + rest == whole.tolist(), (B, decodes, new, prefix)


def test_sweep_range_spans_every_equal_neighbour():
    # step 0: 2 s at t in [1, 9], 1 s from 10; step 1: 1 s at any t (its value 20 changes nothing).
    # Totals: 3 s on [1, 9], 2 s on [10, 19] and on [20, up): the best range is 10 up
    e = parse("sglang@0.5.14").with_threshold(15)
    parts = [(np.array([0, 0, 1, 1]), np.array([1, 10, 1, 20]), np.array([2.0, 1.0, 1.0, 1.0]))]
    s = _sweep(e, 0.0, parts)
    assert [(t, v) for t, v in s.curve] == [(1, 3.0), (10, 2.0), (20, 2.0)]
    assert (s.best, s.best_range, s.best_time_s, s.current_time_s) == (10, (10, None), 2.0, 2.0)
    s = _sweep(e.with_threshold(5), 0.0, parts)
    assert (s.best, s.best_range, s.current_time_s) == (10, (10, None), 3.0)


def test_rules_that_read_no_threshold_are_not_swept():
    # triton and trtllm_mla have no threshold; fa3 with the chunked prefix cache off, or with
    # deterministic inference, never compares the summed prefix with it (attention_backend_handler.py)
    for engine, options in [
        ("sglang-triton", []),
        ("sglang-trtllm", []),
        ("sglang", ["disable_chunked_prefix_cache=true"]),
        ("sglang", ["enable_deterministic_inference=true"]),
    ]:
        assert parse(engine, options).threshold is None, (engine, options)
    assert parse("sglang").threshold == 8192 and parse("vllm").threshold == 512
    assert parse("vllm", ["vllm.backend=flashmla"]).threshold == 128


# -- the report -------------------------------------------------------------------------------------------


def test_json_fields_and_token_sums(tmp_path):
    rng = np.random.default_rng(3)
    rows = []
    for k in range(30):
        i = int(rng.integers(3100, 9000))  # at least the 6 blocks its ids name
        shared = [1, 2, 3][: int(rng.integers(0, 4))]
        rows.append((k * 400, i, int(rng.integers(1, 60)), shared + list(range(1000 * k, 1000 * k + 3))))
    trace = mooncake(tmp_path / "t.jsonl", rows)
    data = report(trace)
    assert data["schema"] == "mlactl.replay" and data["schema_version"] == 1
    inputs = sum(r[1] for r in rows)
    decodes = sum(r[2] - 1 for r in rows)
    assert data["requests"] == 30
    for e in data["engines"]:
        tk = e["tokens"]
        assert tk["prefill_computed"] + tk["prefill_cached"] == inputs and tk["decode"] == decodes
        for key in ("name", "steps", "time_s", "best_time_s", "lost_s", "lost_pct", "best_threshold"):
            assert key in e
        assert e["lost_s"] == pytest.approx(e["time_s"] - e["best_time_s"])
        assert e["lost_s"] >= 0 and e["lost_vs_step_s"] >= 0 and e["lost_vs_request_s"] >= 0
        assert e["best_time_s"] <= min(e["best_step_time_s"], e["best_request_time_s"]) + 1e-15
        types = {t["type"]: t for t in e["by_step_type"]}
        assert sum(t["steps"] for t in types.values()) == e["steps"]
        assert sum(t["lost_s"] for t in types.values()) == pytest.approx(e["lost_s"], rel=1e-9, abs=1e-12)
        assert sum(e["timeline"]["lost_s"]) == pytest.approx(e["lost_s"], rel=1e-9, abs=1e-12)
        shares = [p["tokens"] for p in e["paths"].values()]
        assert sum(shares) == pytest.approx(1.0)
    names = [e["name"] for e in data["engines"]]
    assert names == list(ALL)
    # each rule as resolved on an H200 with a bf16 cache, as analyze's JSON gives it: SGLang's
    # server_args.py picks fa3 on Hopper, vLLM's cuda.py the first sm90 priority taking bf16
    by = {e["name"]: e for e in data["engines"]}
    assert [(by[n]["version"], by[n]["backend"]) for n in ALL] == [
        ("0.5.23", "fa3"),
        ("0.5.23", "triton"),
        ("0.5.23", "trtllm_mla"),
        ("0.33.0", "FLASH_ATTN_MLA"),
    ]
    assert by["vllm"]["threshold"] == 512 and by["sglang"]["threshold"] == 8192
    assert by["sglang"]["options"]["enable_mixed_chunk"] is False and by["sglang"]["options_set"] == []
    assert by["vllm"]["options"]["num_speculative_tokens"] == 0 and by["vllm"]["source"].startswith("vllm@0.33.0: ")
    assert by["vllm"]["why"][0].startswith("vllm@0.33.0 on h200 (sm90), bf16 cache → FLASH_ATTN_MLA (threshold 512)")
    assert [e["best_threshold"] is None for e in data["engines"]] == [False, True, True, False]


def test_versions_and_options_in_the_report(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 4096, 3, [])])
    args = ["--engines", "sglang@0.5.14,vllm@0014ca6b", "--kv-dtype", "fp8"]
    data = report(trace, *args, "--engine-option", "sglang.enable_mixed_chunk=true")
    sglang, vllm = data["engines"]
    assert (sglang["name"], sglang["version"], sglang["backend"]) == ("sglang@0.5.14", "0.5.14", "fa3")
    assert sglang["options"]["enable_mixed_chunk"] is True and sglang["options_set"] == ["enable_mixed_chunk"]
    assert sglang["label"] == "sglang@0.5.14(enable_mixed_chunk=true)"
    # FLASH_ATTN_MLA takes only 16-bit caches (flashattn_mla.py): with fp8, FLASHMLA and its 128
    assert (vllm["version"], vllm["backend"], vllm["threshold"]) == ("0014ca6b", "FLASHMLA", 128)
    assert vllm["sweep"]["current"] == 128 and vllm["sweep"]["option"] == "reorder_batch_threshold"
    assert any("FLASH_ATTN_MLA takes no fp8 cache" in line for line in vllm["why"])


def test_csv_is_one_row_per_engine_and_step(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 4096, 3, [])])
    out = run("replay", trace, "-f", "csv", "--engines", "sglang,vllm").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["engine"], r["step"], r["type"], r["tokens"]) for r in rows] == [
        ("sglang", "0", "prefill", "4096"),
        ("sglang", "1", "decode", "1"),
        ("sglang", "2", "decode", "1"),
        ("vllm", "0", "prefill", "4096"),
        ("vllm", "1", "decode", "1"),
        ("vllm", "2", "decode", "1"),
    ]


def test_table_output_names_every_engine_and_the_sweep(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10000, 4, []), (20, 3000, 8, [])])
    out = run("replay", trace, "--max-batch-tokens", "4096").stdout
    for name in ALL:
        assert name in out
    assert "sglang's chunked_prefix_cache_threshold (the summed prefix of an extend batch) 8192 on h200" in out
    assert "vllm's reorder_batch_threshold (a request's new tokens) 512 on h200" in out
    assert "sglang-triton on triton reads no threshold" in out and "sglang-trtllm on trtllm_mla reads no" in out
    assert "Where each engine loses, by step type" in out
    # the why lines: each rule's resolved backend
    text = " ".join(out.split())
    assert "vllm@0.33.0 on h200 (sm90), bf16 cache → FLASH_ATTN_MLA (threshold 512)" in text
    assert "sglang@0.5.23 on h200 (sm90), bf16 cache → fa3" in text


def test_calibrated_replay_says_so(tmp_path, monkeypatch):
    from mlactl.decide.calibration import store

    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    params = {"t_fixed_s": 1e-5, "eta_c": 0.5, "eta_m": 0.7}
    data = {
        "schema": "mlactl.calibration",
        "schema_version": 1,
        "name": "t",
        "hardware": "h200",
        "fits": [{"op": "absorb_attention", "source": "test", "dtype": "bf16", "terms": ["fixed"], "params": params}],
    }
    store.write(data)
    trace = mooncake(tmp_path / "t.jsonl", [(0, 3000, 20, [])])
    roof, cal = report(trace, "--engines", "vllm"), report(trace, "--engines", "vllm", "--calibration", "t")
    assert roof["time"] == "roofline" and cal["time"] == "calibrated" and cal["clock"] == "roofline"
    # a decode step's attention is absorb's: 19 launches, each at least the fit's fixed 10 us a layer
    assert cal["engines"][0]["time_s"] > roof["engines"][0]["time_s"]
    assert cal["engines"][0]["time_s"] >= 19 * 61 * 1e-5


def test_kv_pool_is_what_the_weights_leave():
    w = WeightCost(V3, weights_of("deepseek-v3"))
    # 671.0 B parameters, fp8 linears and bf16 embedding, head and router: 84.12 GB a GPU at TP 8
    assert w.total_params == 671_025_397_760
    per_token = (512 + 64) * 2 * 61  # the bf16 latent and RoPE key of every layer
    want = int((141e9 * 0.9 - w.model_bytes) // per_token)
    assert kv_pool(w, CostModel(V3), H200, ReplaySettings())(0.9) == want
    assert 600_000 < want < 620_000


def test_each_engine_sizes_its_own_pool_as_it_ships(tmp_path):
    """SGLang's mem_fraction_static as memory_hook.py (sglang@031ed82d) derives it, by hand in
    MiB: the reserve is 512 + 1.5 x chunk + 1024 (TP 8) + 2 x 512 (the decode graph's batch at
    TP >= 4) + 1536 where the prefill graph is on (fa3 in 0.5.23; trtllm_mla on DeepSeek-V3 has it
    off); vLLM's gpu_memory_utilization is 0.92. The weights and the pool share the fraction."""
    w = WeightCost(V3, weights_of("deepseek-v3"))
    per_token = (512 + 64) * 2 * 61
    trace = mooncake(tmp_path / "t.jsonl", [(0, 3000, 20, [])])
    for hw, mib, chunk in (("h200", 141e9 / 2**20, 8192), ("b200", 180e9 / 2**20, 16384)):
        graph_on = round((mib - (512 + 1.5 * chunk + 1024 + 1024 + 1536)) / mib, 3)
        graph_off = round((mib - (512 + 1.5 * chunk + 1024 + 1024)) / mib, 3)
        gb = {"h200": 141e9, "b200": 180e9}[hw]
        data = report(trace, "--hardware", hw)
        got = {e["label"]: e["scheduler"] for e in data["engines"]}
        want = {"sglang-trtllm": graph_off, "vllm": 0.92, "sglang-triton": graph_on}
        want["sglang"] = graph_on if hw == "h200" else graph_off  # trtllm_mla is SGLang's default on a B200
        for label, frac in want.items():
            assert got[label]["mem_fraction"] == frac, (hw, label)
            assert got[label]["kv_cache_tokens"] == int((gb * frac - w.model_bytes) // per_token), (hw, label)
        assert data["settings"]["mem_fraction"] is None
        assert data["kv_cache_tokens"] == got["sglang"]["kv_cache_tokens"]
    # by hand on the H200: (134,468.5 - 16,384) / 134,468.5 = 0.878; on the B200 trtllm_mla (171,661.4
    # - 27,136) / 171,661.4 = 0.842
    assert (round((141e9 / 2**20 - 16384) / (141e9 / 2**20), 3), graph_off) == (0.878, 0.842)
    # set: under the engine's own name, or --mem-fraction for every engine
    data = report(trace, "--engines", "sglang,vllm", "--engine-option", "sglang.mem_fraction_static=0.8")
    assert [e["scheduler"]["mem_fraction"] for e in data["engines"]] == [0.8, 0.92]
    assert (
        "KV pool" in data["engines"][0]["scheduler"]["why"][-1] and "set" in data["engines"][0]["scheduler"]["why"][-1]
    )
    # SGLang's schedule_conservativeness as shipped (1.0) or set; vLLM has none
    data = report(trace, "--engines", "sglang,vllm", "--engine-option", "sglang.schedule_conservativeness=0.5")
    sglang, vllm = (e["scheduler"] for e in data["engines"])
    assert sglang["schedule_conservativeness"] == 0.5 and "schedule_conservativeness 0.5 (set)" in sglang["why"]
    assert "schedule_conservativeness" not in vllm
    data = report(trace, "--engines", "sglang,vllm", "--mem-fraction", "0.9")
    assert {e["scheduler"]["kv_cache_tokens"] for e in data["engines"]} == {608_732}
    assert data["settings"]["mem_fraction"] == 0.9


# -- errors ---------------------------------------------------------------------------------------


def test_the_report_never_replaces_the_trace(tmp_path):
    trace = mooncake(tmp_path / "t.json", [(0, 100, 2, [])])
    before = (tmp_path / "t.json").read_bytes()
    # the one writer's refusal (mlactl.util.io): the trace was read, so -o may not replace it
    line = run("replay", trace, "-o", trace, ok=False).output.strip()
    assert line.startswith("Error: cannot write --output") and "it is an input of this command" in line
    assert (tmp_path / "t.json").read_bytes() == before
    run("replay", trace, "-o", tmp_path / "r.json")
    line = run("plot", "replay", tmp_path / "r.json", "--data", tmp_path / "r.json", ok=False).output.strip()
    assert "it is an input of this command" in line


def test_a_trace_too_big_for_the_memory_budget_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_MAX_MEMORY", "4K")
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 2, [])] * 2)
    line = run("replay", trace, ok=False).output.strip()
    assert line.startswith("Error: replaying 2 requests") and "would need about" in line and "split the trace" in line


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--mem-fraction", "1.5"], "--mem-fraction must be a number above 0 and at most 1", id="mem"),
        # the one number parser (mlactl.util.numbers): ASCII decimal only, each value in its range
        pytest.param(["--mem-fraction", "nan"], "--mem-fraction: 'nan' is not a number", id="mem-nan"),
        pytest.param(["--step-overhead-ms", "-1"], "--step-overhead-ms must be a number from 0 to", id="overhead"),
        pytest.param(["--max-running", "0"], "--max-running", id="running"),
        pytest.param(["--engines", "tgi"], "unknown engine 'tgi'", id="engine"),
        pytest.param(["--engines", "sglang@0.4.0"], "no rule set for sglang@0.4.0; sglang versions:", id="version"),
        pytest.param(
            ["--engine-option", "vllm.enable_mixed_chunk=1"],
            "vllm@0.33.0 has no option 'enable_mixed_chunk'; valid keys for vllm@0.33.0: backend,",
            id="mixed-vllm",
        ),
        pytest.param(
            ["--engines", "vllm", "--engine-option", "enable_mixed_chunk=1"],
            "has no option 'enable_mixed_chunk'",
            id="mixed-no-sglang",
        ),
        pytest.param(
            ["--engine-option", "enable_mixed_chunk=maybe"], "enable_mixed_chunk takes true or false", id="mixed-value"
        ),
        pytest.param(
            ["--engines", "vllm", "--engine-option", "vllm.backend=cutlass_mla"],
            "CUTLASS_MLA does not run on h200 (sm90)",
            id="backend-not-here",
        ),
        pytest.param(["--weight-dtype", "int4"], "--weight-dtype must be one of", id="wdtype"),
        pytest.param(["--tp", "1"], "leave no room for the KV cache", id="weights-too-big"),
        pytest.param(
            ["--hardware", "a100-sxm"], "has no fp8 peak (it has: bf16, fp16, fp32); give --weight-dtype", id="fp8"
        ),
        pytest.param(["--cache-tokens", "1000"], "does not fit sglang's KV cache of 1,000 tokens", id="pool-too-small"),
        pytest.param(
            ["--cache-tokens", "100000", "--mem-fraction", "0.9"],
            "--mem-fraction and --cache-tokens both size the KV pool: give one",
            id="pool-twice",
        ),
        pytest.param(
            ["--cache-tokens", "100000", "--engine-option", "sglang.mem_fraction_static=0.8"],
            "sglang.mem_fraction_static and --cache-tokens both size the KV pool: give one",
            id="pool-twice-engine",
        ),
        pytest.param(
            ["--engine-option", "vllm.gpu_memory_utilization=0"],
            "'vllm.gpu_memory_utilization=0' must be a number above 0 and at most 1",
            id="fraction-zero",
        ),
        pytest.param(
            ["--engine-option", "sglang.schedule_conservativeness=-1"],
            "'sglang.schedule_conservativeness=-1' must be a number from 0 to 100",
            id="conservativeness",
        ),
        pytest.param(
            ["--engine-option", "sglang.mem_fraction_static=0.5"],
            "at a memory fraction of 0.5 leave no room for the KV cache",
            id="fraction-no-room",
        ),
    ],
)
def test_bad_options_are_one_error_line(tmp_path, args, message):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 4096, 3, [])])
    result = run("replay", trace, *args, ok=False)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.output


# -- each engine's scheduler as it ships ------------------------------------------------------------


@pytest.mark.parametrize(
    "hardware, chunk, steps",
    [
        # 20,000 tokens: 16384 + 3616 on a B200 (180 GB = 167.6 GiB >= 160 GiB: both engines 16384);
        # 8192 + 8192 + 3616 on an H200 (141 GB = 131.3 GiB)
        pytest.param("b200", 16384, 2, id="b200-2-chunks"),
        pytest.param("h200", 8192, 3, id="h200-3-chunks"),
    ],
)
def test_a_long_prompt_takes_each_engines_own_chunk_for_the_gpu(tmp_path, hardware, chunk, steps):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 20_000, 1, [])])
    data = json.loads(run("replay", trace, "--hardware", hardware, "--engines", "sglang,vllm", "-f", "json").output)
    for e in data["engines"]:
        assert e["scheduler"]["max_batch_tokens"] == chunk and e["steps"] == steps


def test_default_max_running_as_the_engines_derive_it(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1000, 1, [])])

    def running(*args):
        data = json.loads(run("replay", trace, "--engines", "sglang,vllm", "-f", "json", *args).stdout)
        return [e["scheduler"]["max_running"] for e in data["engines"]]

    # SGLang: min(clamp(int(pool / 163840 * 512), 2048, 4096), pool // 2); vLLM on an H200: 1024
    assert running() == [2048, 1024]  # 608,732 tokens: int(1902.3) -> 2048
    assert running("--cache-tokens", "4000000") == [4096, 1024]  # int(12500) -> 4096
    assert running("--cache-tokens", "3000") == [1500, 1024]  # the pool's half
    assert running("--max-running", "7") == [7, 7]


@pytest.mark.parametrize(
    "engines, options, want",
    [
        pytest.param("sglang", ["sglang.chunked_prefill_size=4096"], [(4096, 1)], id="sglang-chunk"),
        pytest.param("vllm", ["vllm.max_num_batched_tokens=2048"], [(2048, 16)], id="vllm-chunk"),
        pytest.param("sglang", ["page_size=32"], [(8192, 32)], id="sglang-page-fa3"),
        pytest.param("sglang-trtllm", ["page_size=32"], [(8192, 32)], id="trtllm-keeps-32"),
        pytest.param("sglang-trtllm", ["page_size=16"], [(8192, 64)], id="trtllm-forces-64"),
        pytest.param("vllm", ["vllm.block_size=32"], [(8192, 32)], id="vllm-block"),
        pytest.param("vllm", ["vllm.backend=FLASHMLA"], [(8192, 64)], id="vllm-flashmla-64"),
    ],
)
def test_scheduler_options_under_the_engines_own_names(tmp_path, engines, options, want):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1000, 1, [])])
    args = [a for o in options for a in ("--engine-option", o)]
    data = json.loads(run("replay", trace, "--engines", engines, *args, "-f", "json").output)
    assert [(e["scheduler"]["max_batch_tokens"], e["scheduler"]["page"]) for e in data["engines"]] == want


def test_a_scheduler_option_of_the_other_engine_is_one_error_line(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1000, 1, [])])
    result = run("replay", trace, "--engines", "vllm", "--engine-option", "sglang.page_size=64", ok=False)
    assert result.exit_code == 2 and "sglang is not among --engines" in result.output
    result = run("replay", trace, "--engine-option", "vllm.chunked_prefill_size=64", ok=False)
    assert result.exit_code == 2 and "chunked_prefill_size is an option of sglang, not of vllm" in result.output


def plain_hits(rows, page):
    """Each request's hit with a cache that never evicts and every earlier request done, worked
    out plainly (a second implementation of the matching and of the continuation inference): the
    longest run of leading full blocks an earlier prompt had, or, for a request whose leading
    ids are all of an earlier request's full blocks (the most of them; its prompt no longer),
    that request's prompt and output less the last token; at most input - 1, in whole pages."""
    seen, ends, out = set(), {}, []
    for i, (_, inp, _, ids) in enumerate(rows):
        chain = ids[: min(len(ids), inp // 512)]
        shared = max([k + 1 for k in range(len(chain)) if tuple(chain[: k + 1]) in seen] + [0]) * 512
        credit = 0
        for k in range(len(ids)):
            a = ends.get(tuple(ids[: k + 1]))
            if a is not None and rows[a][1] <= inp:
                credit = rows[a][1] + rows[a][2] - 1
        out.append(min(max(shared, credit), inp - 1) // page * page)
        seen.update(tuple(chain[: k + 1]) for k in range(len(chain)))
        if chain:
            ends[tuple(chain)] = i
    return out


@pytest.mark.parametrize(
    "engine, page", [pytest.param("sglang", 1, id="sglang-page1"), pytest.param("vllm", 16, id="vllm-block16")]
)
def test_never_evicting_hits_match_a_plain_count(tmp_path, engine, page):
    rng = np.random.default_rng(7)
    rows, next_id = [], 10_000
    for i in range(60):
        roll = rng.random()
        if rows and roll < 0.3:  # a later turn: an earlier request's full blocks, its answer, more
            _, a_in, a_out, a_ids = rows[int(rng.integers(len(rows)))]
            inp = a_in + a_out + int(rng.integers(1, 2000))
            head = a_ids[: a_in // 512]
        elif rows and roll < 0.6:  # an earlier prompt's leading blocks, then its own
            _, a_in, _, a_ids = rows[int(rng.integers(len(rows)))]
            inp = int(rng.integers(100, 5000))
            head = a_ids[: int(rng.integers(0, a_in // 512 + 1))]
        else:
            inp, head = int(rng.integers(100, 5000)), []
        head = head[: -(-inp // 512) - 1] if inp % 512 else head[: inp // 512]
        own = list(range(next_id, next_id + -(-inp // 512) - len(head)))
        next_id += len(own)
        rows.append((i * 1_000_000, inp, int(rng.integers(1, 50)), head + own))
    trace = mooncake(tmp_path / "t.jsonl", rows)
    s = schedule(trace, engine, blocks=1_000_000, page=page)
    assert list(s.cached) == plain_hits(rows, page)
