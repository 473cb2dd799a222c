"""`mlactl replay`: the exact semantics of the scheduler, the prefix cache and the paired
comparison, pinned on hand-made traces; the clock; the sweep; the report; the CLI and its errors.

Hand-derived references come from elsewhere in mlactl, never from the replay's own pricing:
`mlactl analyze --layers all` for a one-request step (the best path's time of that shape), and
the engines' rules as docs/engines.md states them (SGLang: an extend batch whose summed prefix
is 0 or at least 8192 runs MHA, one-shot while the summed sequence is at most 131072; vLLM: a
request of at most 128 new tokens runs the decode pathway).
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide.replay import rules
from mlactl.decide.replay.cache import BlockPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.replay import ReplaySettings, capacity, replay
from mlactl.decide.replay.scheduler import Settings, scheduler_for
from mlactl.decide.replay.traces import read_trace
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, WeightCost
from mlactl.model.weights import from_name as weights_of

runner = CliRunner()
V3 = from_name("deepseek-v3").with_tp(8)
H200 = hardware.resolve("h200")
ALL = ("sglang", "sglang-triton", "sglang-trtllm", "vllm")


def run(*args, ok=True):
    result = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def mooncake(path, rows) -> str:
    """rows: (timestamp ms, input, output, hash_ids)."""
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": list(h)}) + "\n"
            for t, i, o, h in rows
        )
    )
    return str(path)


def schedule(
    trace_path, engine="vllm", max_batch_tokens=8192, max_running=256, blocks=100_000, caching=True, options=()
):
    """One engine's schedule of a trace, from the scheduler alone (the clock at DeepSeek-V3, TP 8, H200)."""
    cost = CostModel(V3)
    clock = Clock(cost, H200, WeightCost(V3, weights_of("deepseek-v3")), rules.paths())
    e = rules.parse(engine, list(options))[0]
    t = read_trace(trace_path)
    s = scheduler_for(e)(t, e, BlockPool(blocks, caching), clock, Settings(max_batch_tokens, max_running, 512))
    return s.run()


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


# -- the four cases of the issue ------------------------------------------------------------------


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
    # three leading blocks shared; the second arrives 10 s later, long after the first's prefill
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (10_000, 3000, 5, [1, 2, 3, 7, 8, 9])])
    for engine in ALL:
        s = schedule(trace, engine)
        assert list(s.cached) == [0, 1536]
        assert list(zip(s.chunk_new, s.chunk_prefix)) == [(2000, 0), (3000 - 1536, 1536)]
    data = report(trace)
    assert data["tokens"] == {"prefill_computed": 2000 + 1464, "prefill_cached": 1536, "decode": 8}


def test_blocks_are_cached_only_once_their_prefill_ran(tmp_path):
    # both arrive at once: they are admitted into the same step, before either block is computed
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (0, 3000, 5, [1, 2, 3, 7, 8, 9])])
    for engine in ALL:
        assert list(schedule(trace, engine).cached) == [0, 0]


def decode_meets_prompt(tmp_path):
    """A (input 6000) decodes when B and C arrive together; each shares A's first 10 blocks (5120
    tokens) and has 1000 of its own: summed, their cached prefixes are 10240 >= 8192."""
    a = list(range(100, 112))
    return mooncake(
        tmp_path / "t.jsonl",
        [(0, 6000, 200, a), (100, 6120, 50, a[:10] + [200, 201]), (100, 6120, 50, a[:10] + [300, 301])],
    )


def test_vllm_runs_the_decode_and_the_new_prompts_in_one_step(tmp_path):
    trace = decode_meets_prompt(tmp_path)
    s = schedule(trace, "vllm")
    step = int(s.chunk_step[1])
    assert step == int(s.chunk_step[2])  # B and C together
    rows = step_rows(s, step)
    assert sorted(rows) == sorted([(1, int(rows[0][1]), True), (1000, 5120, False), (1000, 5120, False)])
    assert rows[0][2] and rows[0][1] > 6000  # A's decode, after its prompt and some output
    e = rules.parse("vllm")[0]
    new, prefix, decode = (np.array(c) for c in zip(*rows))
    paths = rules.step_paths(e, new, prefix, np.zeros(3, int), decode, 1).tolist()
    # per request: the decode (1 <= 128) absorbs; 1000 new tokens after 5120 cached: prefill with context
    assert paths == ["absorb", "expand_chunked", "expand_chunked"]


def test_sglang_runs_the_new_prompts_as_their_own_extend_step(tmp_path):
    trace = decode_meets_prompt(tmp_path)
    s = schedule(trace, "sglang")
    step = int(s.chunk_step[1])
    rows = step_rows(s, step)
    assert rows == [(1000, 5120, False), (1000, 5120, False)]  # no decode in the extend batch
    e = rules.parse("sglang")[0]
    new, prefix, decode = (np.array(c) for c in zip(*rows))
    # the summed prefix 10240 >= 8192 and the summed sequence 12240 <= 131072: MHA one shot; each
    # alone (5120 < 8192) would run MLA
    assert rules.step_paths(e, new, prefix, np.zeros(2, int), decode, 1).tolist() == ["expand", "expand"]
    alone = rules.step_paths(e, new[:1], prefix[:1], np.zeros(1, int), decode[:1], 1).tolist()
    assert alone == ["absorb"]
    # the decode step after it runs all three decodes (A's, and B's and C's first)
    assert [r[2] for r in step_rows(s, step + 1)] == [True, True, True]


def test_sglang_mixed_chunk_puts_the_decode_in_the_extend_batch(tmp_path):
    trace = decode_meets_prompt(tmp_path)
    s = schedule(trace, "sglang", options=["sglang.enable_mixed_chunk=true"])
    step = int(s.chunk_step[1])
    rows = step_rows(s, step)
    assert [r[2] for r in rows] == [True, False, False]
    e = rules.parse("sglang", ["enable_mixed_chunk=1"])[0]
    new, prefix, decode = (np.array(c) for c in zip(*rows))
    # one extend batch, the decode included: its prefix joins the sum, so all three run MHA
    paths = rules.step_paths(e, new, prefix, np.zeros(3, int), decode, 1).tolist()
    assert paths == ["expand", "expand", "expand"]


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
    # a pool of 3 blocks: A holds 2; B needs 2 and waits; C (1 block) may not jump ahead
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1000, 24, []), (0, 1000, 24, []), (0, 100, 2, [])])
    s = schedule(trace, "vllm", blocks=3)
    assert s.admitted[1] >= s.finished[0]
    assert s.admitted[2] >= s.admitted[1]


def test_cached_tokens_leave_one_token_to_compute(tmp_path):
    # the same 1024-token prompt twice: both blocks cached, yet one token is computed
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1024, 3, [5, 6]), (5000, 1024, 3, [5, 6])])
    s = schedule(trace, "sglang")
    assert list(s.cached) == [0, 1023]
    assert list(zip(s.chunk_new, s.chunk_prefix))[1] == (1, 1023)


def test_no_prefix_cache(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2000, 5, [1, 2, 3, 4]), (10_000, 3000, 5, [1, 2, 3, 7, 8, 9])])
    assert list(schedule(trace, "vllm", caching=False).cached) == [0, 0]


def test_lru_evicts_the_least_recently_used(tmp_path):
    # 4 blocks of room, each request's 1024 tokens two of them. A [1,2] runs and finishes; B [3,4]
    # likewise; C [5,6] takes A's, the least recently used (cache: 3,4,5,6); D [1,2] finds
    # nothing and takes B's (cache: 5,6,1,2); E [5,6,11] finds C's two and takes 1 for its third
    rows = [(0, 1024, 1, [1, 2]), (10_000, 1024, 1, [3, 4]), (20_000, 1024, 1, [5, 6])]
    rows += [(30_000, 1024, 1, [1, 2]), (40_000, 1025, 1, [5, 6, 11]), (50_000, 1024, 1, [3, 4])]
    trace = mooncake(tmp_path / "t.jsonl", rows)
    for engine in ALL:
        s = schedule(trace, engine, blocks=4)
        assert list(s.cached) == [0, 0, 0, 0, 1024, 0]


def test_session_turn_finds_the_last_turns_prompt_and_output(tmp_path):
    # turn 1: 1000 prompt + 100 output = 1099 tokens of KV (the last token's is never computed):
    # two full blocks (1024 tokens). Turn 2 extends it (1100 + 400 new): it finds 1024 cached
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,input_tokens,output_tokens,session\n0,1000,100,chat-1\n100,1500,10,chat-1\n150,900,1,\n")
    s = schedule(str(f), "sglang")
    assert list(s.cached) == [0, 1024, 0]  # the lone 900-token prompt shares nothing


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


def test_sglang_sweep_by_hand(tmp_path):
    # one 10000-token prompt through 4096-token steps: extends after 0, 4096 and 8192 tokens. SGLang
    # runs MHA (one shot) where the summed prefix is 0 or >= t, else MLA: the threshold changes a
    # path only at 4097 (the second step) and 8193 (the third)
    trace = mooncake(tmp_path / "t.jsonl", [(0, 10000, 1, [])])
    steps = [(4096, 0), (4096, 4096), (1808, 8192)]
    best = {}
    for n, p in steps:
        _, row = analyze_best(n, p)
        best[(n, p)] = {k: v["time_s"] for k, v in row["paths"].items()}
    expand = [best[s]["expand"] for s in steps]
    absorb = [best[s]["absorb"] for s in steps]
    at = {1: sum(expand), 4097: expand[0] + absorb[1] + expand[2], 8193: expand[0] + absorb[1] + absorb[2]}
    data = report(trace, "--engines", "sglang", "--max-batch-tokens", "4096")
    sweep = data["engines"][0]["sweep"]
    curve = {c["threshold"]: c["time_s"] for c in sweep["curve"]}
    assert sorted(curve) == [1, 4097, 8193]
    for t, v in at.items():
        assert curve[t] == pytest.approx(v, rel=1e-12)
    # the default 8192 lies in [4097, 8192]: its time is at[4097], which the engine reports
    assert sweep["current_time_s"] == pytest.approx(at[4097], rel=1e-12)
    assert data["engines"][0]["time_s"] == pytest.approx(at[4097], rel=1e-12)
    want = min(at, key=at.get)
    assert sweep["best"] == want
    assert data["engines"][0]["best_threshold"] == want


def test_vllm_sweep_changes_at_each_query_length(tmp_path):
    # prompts of 100 and 300 tokens at different times: at t < 100 both prefill (expand), from
    # 100 the first absorbs, from 300 both do
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 1, []), (5000, 300, 1, [])])
    data = report(trace, "--engines", "vllm")
    sweep = data["engines"][0]["sweep"]
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
    assert sweep["current"] == 128 and sweep["current_time_s"] == pytest.approx(curve[100], rel=1e-12)


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
    assert [e["best_threshold"] is None for e in data["engines"]] == [False, True, True, False]


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
    assert "sglang's threshold" in out and "vllm's threshold" in out
    assert "Where each engine loses, by step type" in out


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
    assert capacity(w, CostModel(V3), H200, ReplaySettings()) == want
    assert 600_000 < want < 620_000


# -- errors ---------------------------------------------------------------------------------------


def test_the_report_never_replaces_the_trace(tmp_path):
    trace = mooncake(tmp_path / "t.json", [(0, 100, 2, [])])
    before = (tmp_path / "t.json").read_bytes()
    line = run("replay", trace, "-o", trace, ok=False).output.strip()
    assert line.startswith("Error: --output") and "is the trace being read" in line
    assert (tmp_path / "t.json").read_bytes() == before
    run("replay", trace, "-o", tmp_path / "r.json")
    line = run("plot", "replay", tmp_path / "r.json", "--data", tmp_path / "r.json", ok=False).output.strip()
    assert "is the report being read" in line


def test_a_trace_too_big_for_the_memory_budget_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_MAX_MEMORY", "4K")
    trace = mooncake(tmp_path / "t.jsonl", [(0, 100, 2, [])] * 2)
    line = run("replay", trace, ok=False).output.strip()
    assert line.startswith("Error: replaying 2 requests") and "would need about" in line and "split the trace" in line


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--mem-fraction", "1.5"], "--mem-fraction must be a number above 0 and at most 1", id="mem"),
        pytest.param(["--mem-fraction", "nan"], "--mem-fraction must be a number", id="mem-nan"),
        pytest.param(["--step-overhead-ms", "-1"], "--step-overhead-ms must be a number of at least 0", id="overhead"),
        pytest.param(["--max-running", "0"], "--max-running", id="running"),
        pytest.param(["--engines", "tgi"], "unknown engine 'tgi'", id="engine"),
        pytest.param(["--engine-option", "vllm.enable_mixed_chunk=1"], "vllm has no SGLang scheduler", id="mixed-vllm"),
        pytest.param(["--engine-option", "enable_mixed_chunk=maybe"], "expected true or false", id="mixed-value"),
        pytest.param(["--weight-dtype", "int4"], "--weight-dtype must be one of", id="wdtype"),
        pytest.param(["--tp", "1"], "leave no room for the KV cache", id="weights-too-big"),
        pytest.param(
            ["--hardware", "a100-sxm"], "has no fp8 peak (it has: bf16, fp16, fp32); give --weight-dtype", id="fp8"
        ),
        pytest.param(["--cache-tokens", "1000"], "does not fit the KV cache's 512 tokens", id="pool-too-small"),
    ],
)
def test_bad_options_are_one_error_line(tmp_path, args, message):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 4096, 3, [])])
    result = run("replay", trace, *args, ok=False)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.output
