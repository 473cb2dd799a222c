"""`mlactl replay` on a DSA model (DeepSeek-V3.2): the engines' DSA rules step by step, the
clock's top-k sums, the dense-threshold sweep, the indexer's weights and cache in the KV pool.

Hand-derived references come from elsewhere in mlactl, never from replay's own pricing:
`mlactl analyze --model deepseek-v3.2` for a one-request step, and the DSA rules as
docs/engines.md ("DeepSeek-V3.2 (DSA)") states them:

* SGLang (sglang@0.5.23, backend dsa): an extend batch whose longest sequence is at most the
  dense threshold (index_topk, 2048, when not set) runs dense MHA (dense_expand), every other
  batch and every decode the sparse MQA (sparse_absorb); with the piecewise prefill CUDA graph
  on (0.5.23's default) an extend batch of at most 2048 new tokens runs sparse.
* vLLM (vllm@0.33.0 on a B200, FLASHMLA_SPARSE): decodes sparse; a step's prefills dense MHA
  when their longest sequence is at most 2048, masked MHA when their longest query reaches the
  TP-8 table's value for their longest sequence (1024 up to 8192 tokens), else sparse; its dense
  MHA runs the whole indexer (engine_cost).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run

from mlactl.decide.calibration.steps import PathLaunches
from mlactl.decide.engines import steps as rules
from mlactl.decide.replay.cache import TokenPool
from mlactl.decide.replay.clock import Clock
from mlactl.decide.replay.replay import ReplaySettings, kv_pool, replay
from mlactl.decide.replay.scheduler import scheduler_for
from mlactl.decide.replay.shipped import Shipped
from mlactl.decide.replay.traces import read_trace
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, WeightCost, sparse_pairs
from mlactl.model.linear import features, linear_ops, row_features
from mlactl.model.weights import from_name as weights_of

V32 = from_name("deepseek-v3.2").with_tp(8)
B200 = hardware.resolve("b200")
H200 = hardware.resolve("h200")
NO_GRAPH = "sglang.disable_piecewise_cuda_graph=true"  # sglang@0.5.23's prefill graph off: dense can run


def mooncake(path, rows) -> str:
    """rows: (timestamp ms, input, output); no block shared between requests."""
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [10**6 * k]}) + "\n"
            for k, (t, i, o) in enumerate(rows)
        )
    )
    return str(path)


def analyze_paths(new, prefix, hw="b200"):
    """Every path's time of one request (new, prefix) on every layer, as `mlactl analyze` says."""
    out = run(
        "analyze", "--model", "deepseek-v3.2", "--tp", 8, "--hardware", hw, "--layers", "all",
        "--new", new, "--prefix", prefix, "-f", "json",
    )  # fmt: skip
    row = json.loads(out.stdout)["rows"][0]
    return {k: v["time_s"] for k, v in row["paths"].items()}


def report(trace, *args):
    return json.loads(run("replay", trace, "--model", "deepseek-v3.2", "--tp", 8, "-f", "json", *args).stdout)


def parse(engine, options=(), hw=B200):
    return rules.parse(engine, list(options), V32, hw)[0]


# -- hand-checked steps ---------------------------------------------------------------------------


def test_one_request_by_hand_on_each_engines_dsa_rule(tmp_path):
    # SGLang, graph off: the 1000-token prompt is an extend batch of longest sequence 1000 <= 2048:
    # dense MHA; its 2 decodes sparse. vLLM on a B200: a 5000-token prompt (no context) has query
    # 5000 >= 1024 (sequence <= 8192): masked MHA; its decodes sparse
    trace = mooncake(tmp_path / "s.jsonl", [(0, 1000, 3)])
    data = report(trace, "--hardware", "b200", "--engines", "sglang", "--engine-option", NO_GRAPH)
    steps = [analyze_paths(1000, 0), analyze_paths(1, 1000), analyze_paths(1, 1001)]
    want = steps[0]["dense_expand"] + steps[1]["sparse_absorb"] + steps[2]["sparse_absorb"]
    e = data["engines"][0]
    assert e["steps"] == 3 and e["time_s"] == pytest.approx(want, rel=1e-12)
    assert set(e["paths"]) == {"sparse_absorb", "masked_expand", "dense_expand"}
    assert e["paths"]["dense_expand"]["tokens"] == pytest.approx(1000 / 1002)
    trace = mooncake(tmp_path / "v.jsonl", [(0, 5000, 3)])
    data = report(trace, "--hardware", "b200", "--engines", "vllm")
    steps = [analyze_paths(5000, 0), analyze_paths(1, 5000), analyze_paths(1, 5001)]
    want = steps[0]["masked_expand"] + steps[1]["sparse_absorb"] + steps[2]["sparse_absorb"]
    e = data["engines"][0]
    assert e["time_s"] == pytest.approx(want, rel=1e-12)
    # the best: dense MHA is cheaper still but cannot run past index_topk (its answer would differ)
    assert steps[0]["dense_expand"] < steps[0]["masked_expand"]
    best = steps[0]["masked_expand"] + sum(min(s.values()) for s in steps[1:])
    assert e["best_time_s"] == pytest.approx(best, rel=1e-12)


def test_the_default_engines_are_the_two_with_dsa_rules(tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 3000, 4), (100, 200, 3)])
    data = report(trace, "--hardware", "h200")
    assert [e["name"] for e in data["engines"]] == ["sglang", "vllm"]
    for e in data["engines"]:
        assert set(e["paths"]) == {"sparse_absorb", "masked_expand", "dense_expand"}


def test_vllms_dense_mha_runs_the_whole_indexer(tmp_path):
    # a 1500-token prompt: vLLM's prefills are dense (sequence <= 2048), priced with the indexer in
    # full; the model's own dense_expand (analyze's, SGLang's) writes only each new token's key
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1500, 1)])
    e = report(trace, "--hardware", "b200", "--engines", "vllm")["engines"][0]
    full = CostModel(V32, dense_indexer="full")
    want = PathLaunches(full, B200, None, "dense_expand", np.array([1500]), np.array([0]), 61).seconds(np.array([0]))
    assert e["time_s"] == pytest.approx(float(want[0]), rel=1e-12)
    assert e["time_s"] > analyze_paths(1500, 0)["dense_expand"]


# -- the clock --------------------------------------------------------------------------------------


def crossing_trace(tmp_path):
    """Decodes whose prefixes cross index_topk (2048) mid-run, prompts long and short, some alone."""
    rng = np.random.default_rng(5)
    rows = [(0, 2000, 120), (10, 2030, 60), (20, 1500, 700), (30, 40, 90)]
    rows += [(int(t), int(i), int(o)) for t, i, o in zip(range(50, 6050, 200), rng.integers(20, 9000, 30),
                                                         rng.integers(1, 80, 30))]  # fmt: skip
    return mooncake(tmp_path / "t.jsonl", rows)


@pytest.mark.parametrize("hw", [B200, H200], ids=["b200", "h200"])
@pytest.mark.parametrize("options", [[], [NO_GRAPH, "sglang.enable_mixed_chunk=true"]], ids=["default", "mixed"])
def test_clock_is_the_exact_engine_time_on_dsa_steps(tmp_path, hw, options):
    t = read_trace(crossing_trace(tmp_path))
    engines = rules.parse(None, options, V32, hw)
    settings = ReplaySettings(step_overhead_s=0.001, max_batch_tokens=4096)
    out = replay(t, V32, weights_of("deepseek-v3.2"), hw, engines, settings, keep_steps=True)
    for e in out.engines:
        step = e.per_step
        np.testing.assert_allclose(step["clock_attention_s"], step["attention_s"], rtol=1e-9)


def test_clock_features_are_the_linear_forms_features():
    cost = CostModel(V32)
    clock = Clock(cost, B200, WeightCost(V32, weights_of("deepseek-v3.2")), rules.paths(parse("vllm")))
    assert clock.dsa and clock.topk == 2048 and len(features(cost)) == 7
    new = np.array([1, 1, 7, 3000, 2048, 1, 500])
    prefix = np.array([0, 2047, 2040, 0, 100, 90000, 1600])
    x = row_features(cost, new, prefix)
    for k in range(len(new)):
        got = clock.features(int(new[k]), int(prefix[k]))
        np.testing.assert_allclose(got, x[:-1, k], rtol=1e-15)
        np.testing.assert_allclose(clock.partials(int(prefix[k])), x[-1, k], rtol=1e-15)
        assert got[5] == float(sparse_pairs(int(new[k]), int(prefix[k]), 2048))
    # decodes: the selected pairs summed, min(p + 1, topk) each
    p = [0, 2046, 2047, 2048, 90000]
    assert clock.decode_selected(p) == 1 + 2047 + 2048 + 2048 + 2048
    ones = np.ones(len(p), dtype=int)
    sums = row_features(cost, ones, np.array(p))[:-1].sum(axis=1)
    got = clock.decode_features(len(p), sum(p), clock.decode_selected(p))
    keep = [0, 1, 2, 5]  # the partials and the mask are left 0: only masked_expand reads them,
    np.testing.assert_allclose(np.array(got)[keep], sums[keep], rtol=1e-15)
    assert got[3:5] == [0.0, 0.0] and got[6] == 0.0
    assert clock.partial_paths == {"masked_expand"}  # ... and the clock prices it row by row
    for path in clock.linear:
        assert linear_ops(cost, path).names  # every DSA path has a linear form


# -- the rule one step at a time, and the sweep ---------------------------------------------------------

DSA_RULES = [
    ("sglang", [], B200),
    ("sglang", [NO_GRAPH], B200),
    ("sglang", [NO_GRAPH, "sglang.enable_mixed_chunk=true"], H200),
    ("sglang@0.5.14", ["sglang.enable_mixed_chunk=true"], H200),
    ("vllm", [], B200),
    ("vllm", [], H200),
    ("vllm@0014ca6b", [], B200),
]


@pytest.mark.parametrize("engine, options, hw", DSA_RULES, ids=lambda x: x if isinstance(x, str) else None)
def test_the_clocks_one_step_answer_is_the_whole_steps_dsa(engine, options, hw):
    e = parse(engine, options, hw)
    one = rules.OneStep(e)
    rng = np.random.default_rng(13)
    for _ in range(300):
        B = int(rng.choice([0, 0, 1, 3, 40]))
        c = int(rng.integers(0 if B else 1, 4))
        new = rng.choice([1, 2, 80, 128, 129, 513, 1024, 1900, 2048, 3000, 9000], c).tolist()
        prefix = rng.choice([0, 1, 100, 1000, 2047, 4000, 20000, 70000], c).tolist()
        decodes = rng.integers(1, 12000, B).tolist()
        dec, rest = one.paths(B, sum(decodes), new, prefix, max(decodes) if decodes else 0)
        rows = ([1] * B + new, decodes + prefix, [True] * B + [False] * c)
        if not c and e.family == "sglang" and B:  # a decode-only step: SGLang's decode batch
            assert dec == rules.decode_path(e)
            continue
        whole = rules.step_paths(e, *(np.array(r) for r in rows[:2]), np.zeros(B + c, int), np.array(rows[2]), 1)
        assert [dec] * B + rest == whole.tolist(), (B, decodes, new, prefix)


@pytest.mark.parametrize("engine, options, hw", DSA_RULES, ids=lambda x: x if isinstance(x, str) else None)
def test_dsa_sweep_values_cover_every_change(engine, options, hw):
    """At any threshold t a step runs what it runs at its largest breakpoint not above t (or at 1),
    up to the most the option takes (SGLang's dense threshold: index_topk)."""
    e = parse(engine, options, hw)
    rng = np.random.default_rng(17)
    top = e.threshold_max or 20000
    for _ in range(60):
        d = int(rng.integers(0, 4))
        c = int(rng.integers(1, 4))
        new = [1] * d + rng.choice([1, 2, 3, 80, 128, 129, 300, 513, 1024, 1500, 2048, 3000], c).tolist()
        prefix = rng.integers(1, 3000, d).tolist() + rng.choice([0, 0, 1, 100, 500, 1900, 8192], c).tolist()
        new, prefix, dec = np.array(new), np.array(prefix), np.array([True] * d + [False] * c)
        zero = np.zeros(len(new), dtype=np.int64)
        _, values = rules.breakpoints(e, new, prefix, zero, dec, 1)
        assert (values <= top).all()
        values = np.sort(np.append(values, 1))
        near = {1, 2, 3, top, *new.tolist(), *(new + prefix).tolist(), *(int(q) + 1 for q in new + prefix)}
        near |= {v - 1 for v in near} | set(rng.integers(1, top + 1, 20).tolist())
        near = {v for v in near if 1 <= v <= top}
        at = {int(v): rules.step_paths(e.with_threshold(int(v)), new, prefix, zero, dec, 1).tolist() for v in values}
        for t in sorted(near):
            under = int(values[np.searchsorted(values, t, side="right") - 1])
            got = rules.step_paths(e.with_threshold(t), new, prefix, zero, dec, 1).tolist()
            assert got == at[under], (new, prefix, dec, t, under)


def test_sglang_dense_threshold_sweep_by_hand(tmp_path):
    # prompts of 1500 and 1800 tokens, each alone in its extend batch (graph off): dense MHA where
    # the longest sequence is within t. At t < 1500 both sparse, from 1500 the first dense, from
    # 1800 both; the option takes at most index_topk = 2048, the default (2048: both dense)
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1500, 1), (5000, 1800, 1)])
    data = report(trace, "--hardware", "b200", "--engines", "sglang", "--engine-option", NO_GRAPH)
    sweep = data["engines"][0]["sweep"]
    assert sweep["option"] == parse("sglang").params.sglang_dsa.threshold_option
    a, b = analyze_paths(1500, 0), analyze_paths(1800, 0)
    want = {
        1: a["sparse_absorb"] + b["sparse_absorb"],
        1500: a["dense_expand"] + b["sparse_absorb"],
        1800: a["dense_expand"] + b["dense_expand"],
    }
    curve = {c["threshold"]: c["time_s"] for c in sweep["curve"]}
    assert sorted(curve) == sorted(want)
    for t, v in want.items():
        assert curve[t] == pytest.approx(v, rel=1e-12)
    assert sweep["current"] == 2048 and sweep["best"] == 1800
    assert sweep["best_range"] == [1800, 2048]  # no higher threshold exists
    assert data["engines"][0]["time_s"] == pytest.approx(want[1800], rel=1e-12)


def test_sglangs_prefill_graph_leaves_no_dense_threshold_to_sweep_on_short_batches(tmp_path):
    # graph on (0.5.23's default): batches of <= 2048 new tokens run sparse whatever the threshold
    trace = mooncake(tmp_path / "t.jsonl", [(0, 1500, 1), (5000, 1800, 1)])
    sweep = report(trace, "--hardware", "b200", "--engines", "sglang")["engines"][0]["sweep"]
    assert [c["threshold"] for c in sweep["curve"]] == [1]


# -- the KV pool ------------------------------------------------------------------------------------------


def test_kv_pool_holds_the_index_row_and_every_gpu_the_whole_indexer():
    w = WeightCost(V32, weights_of("deepseek-v3.2"))
    v3 = WeightCost(from_name("deepseek-v3").with_tp(8), weights_of("deepseek-v3"))
    # the indexer per layer: wq_b 1536 x 64*128 (fp8), wk 7168 x 128 and weights_proj 7168 x 64 (bf16)
    wq_b, wk_w = 61 * 1536 * 64 * 128, 61 * 7168 * (128 + 64)
    assert w.indexer_params == (wq_b, wk_w)
    assert w.total_params == v3.total_params + wq_b + wk_w
    assert w.model_bytes == pytest.approx(v3.model_bytes + wq_b * 1 + wk_w * 2, rel=1e-15)
    for kv, row in (("bf16", (512 + 64) * 2 + 132), ("fp8", 656 + 132)):  # latent + the fp8 index row
        per_token = row * 61
        want = int((180e9 * 0.9 - w.model_bytes) // per_token)
        assert kv_pool(w, CostModel(V32, kv_dtype=kv), B200, ReplaySettings())(0.9) == want


def test_a_dsa_schedule_decodes_across_topk_with_the_scheduler_alone(tmp_path):
    # the scheduler's own clock: one request decoding from 2040 to past 2048, alone
    trace = mooncake(tmp_path / "t.jsonl", [(0, 2040, 20)])
    cost = CostModel(V32)
    clock = Clock(cost, B200, WeightCost(V32, weights_of("deepseek-v3.2")), rules.paths(parse("vllm")))
    e = parse("vllm")
    s = scheduler_for(e)(read_trace(trace), e, TokenPool(51_200_000, True), clock, Shipped(8192, 256, 64)).run()
    assert len(s) == 20
    for k in range(1, 20):  # decode k after 2040 + k - 1 tokens: min(2040 + k, 2048) keys selected
        p = 2040 + k - 1
        want = clock.launch("sparse_absorb", clock.features(1, p, partials=False), 1.0)
        assert s.attention[k] == pytest.approx(want, rel=1e-12)


def test_calibrated_dsa_replay(tmp_path, monkeypatch):
    # a fit for the sparse attention (fixed 10 us a launch): every decode step's attention is
    # sparse_absorb's, so the calibrated time is at least 19 decodes x 61 layers x 10 us
    from mlactl.decide.calibration import store

    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    params = {"t_fixed_s": 1e-5, "eta_c": 0.5, "eta_m": 0.7}
    fit = {"op": "sparse_attention", "source": "test", "dtype": "bf16", "terms": ["fixed"], "params": params}
    store.write({"schema": "mlactl.calibration", "schema_version": 1, "name": "t", "hardware": "b200", "fits": [fit]})
    trace = mooncake(tmp_path / "t.jsonl", [(0, 3000, 20), (5, 1500, 4)])
    args = ("--hardware", "b200", "--engines", "sglang,vllm")
    roof, cal = report(trace, *args), report(trace, *args, "--calibration", "t")
    assert roof["time"] == "roofline" and cal["time"] == "calibrated"
    for r, c in zip(roof["engines"], cal["engines"]):
        assert c["time_s"] > r["time_s"] and c["time_s"] >= 19 * 61 * 1e-5
        assert c["best_time_s"] <= c["time_s"] * (1 + 1e-12)
