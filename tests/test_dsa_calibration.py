"""Calibration from aiconfigurator's DSA kernel tables (GLM-5 dims), and calibrated time on a DSA
model: which table is which op, the op's FLOPs at each row worked out here, and the time function
using the fits for those ops only."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide.calibration import aiconfigurator as ac
from mlactl.decide.calibration import store
from mlactl.decide.calibration.time import missing_ops, path_times
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel

pytest.importorskip("pyarrow")
FIXTURE = Path(__file__).parent / "data" / "aiconfigurator-dsa"
runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def tables():
    return {t.name: t for t in ac.find_tables(FIXTURE, "h200_sxm", "sglang")}


def test_the_three_dsa_tables_are_found():
    assert set(tables()) == set(ac.DSA_TABLES)


def test_indexer_rows():
    t = tables()["sparse_attention/glm5_mqa_logits_module_perf"]
    frame = ac.read_table(t.path, "sparse_attention")
    pts = ac.table_points(t)[("indexer", "deep_gemm.fp8_mqa_logits", "fp8")]
    row = frame.iloc[0]
    b, n, p = int(row["batch_size"]), int(row["isl"]), int(row["step"])
    # GLM-5's indexer: 32 heads of 128 -> 2*32*128 = 8192 FLOPs a causal pair; token i sees p + i keys
    pairs = b * sum(p + i for i in range(1, n + 1))
    assert pts.flops[0] == 8192 * pairs
    assert pts.index_heads[0] == 32  # 128 rows a CTA: 4 tokens
    assert pts.time_s[0] == pytest.approx(row["latency"] * 1e-3)
    assert len(pts) == len(frame)


def test_topk_rows_are_the_top_last_mix():
    t = tables()["sparse_attention/glm5_topk_module_perf"]
    pts = ac.table_points(t)[("topk", "fast_topk_transform_fused", "fp32")]
    frame = ac.read_table(t.path, "sparse_attention")
    assert len(pts) == (frame["score_mode"] == "top_last").sum()
    assert np.all(pts.context > 2048)  # a context of at most top-k has nothing to select


def test_sparse_attention_rows_read_topk_rows_per_query():
    t = tables()["sparse_attention/glm5_dsa_attn_module_perf"]
    frame = ac.read_table(t.path, "sparse_attention")
    pts = ac.table_points(t)[("sparse_attention", "flash_mla_sparse_fwd", "bf16")]
    row = frame.iloc[0]
    b, n, p, h = int(row["batch_size"]), int(row["isl"]), int(row["step"]), int(row["num_heads"])
    assert h == 64
    keys = min(2048, p + n)  # the collector gives every query min(topk, context) rows
    # 2*64*(576 + 512) FLOPs a pair; rows of 576 bf16 numbers, q of 64*576 and out of 64*512 bf16
    assert pts.flops[0] == b * n * keys * 2 * 64 * 1088
    assert pts.bytes[0] == b * n * keys * 1152 + b * n * 64 * (576 + 512) * 2
    # the kernel walks all 2,048 top-k slots (`slots`) and its queries share the request's p + n rows
    assert pts.slots[0] == 2048 and pts.pool[0] == p + n


def test_calibrate_and_use_on_deepseek_v32(home):
    result = runner.invoke(app, ["calibrate", "--from", "aiconfigurator", "--system", "h200_sxm", "--framework",
                                 "sglang", "--data-dir", str(FIXTURE), "-f", "json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    fits = json.loads(result.stdout)["fits"]
    assert {f["op"] for f in fits} == {"indexer", "topk", "sparse_attention"}
    cal = store.resolve("h200-aiconfigurator-sglang-0.5.14")
    cost = CostModel(model.from_name("deepseek-v3.2"))
    hw = hardware.from_name("h200")
    assert missing_ops(cal, cost.choices) == [
        "indexer_proj", "q_absorb", "out_absorb", "kv_expand", "masked_attention", "lse_merge", "indexer_key",
        "expand_attention",
    ]  # fmt: skip
    roof = path_times(cost, hw, None, 1, 1, 32768)["sparse_absorb"]
    timed = path_times(cost, hw, cal, 1, 1, 32768)["sparse_absorb"]
    by_name = {r.name: (r, c) for r, c in zip(roof.ops, timed.ops)}
    for name in ("indexer_proj", "q_absorb", "out_absorb"):  # no fit: roofline time kept
        assert float(by_name[name][1].time_s) == float(by_name[name][0].time_s)
    for name in ("indexer", "topk", "attention"):  # fitted
        assert float(by_name[name][1].time_s) != float(by_name[name][0].time_s)
    # and analyze takes it
    out = runner.invoke(app, ["analyze", "-m", "deepseek-v3.2", "-g", "h200", "--calibration",
                              "h200-aiconfigurator-sglang-0.5.14", "-f", "json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["time"] == "calibrated"
    # past top-k keys dense MHA does not run: its cell is n/a, with no interval beside it
    out = runner.invoke(app, ["analyze", "-m", "deepseek-v3.2", "-g", "h200", "--calibration",
                              "h200-aiconfigurator-sglang-0.5.14", "--new", "1", "--prefix", "65536"])  # fmt: skip
    assert out.exit_code == 0, out.output
    row = next(line for line in out.stdout.splitlines() if "65536" in line)
    dense = row.split("│")[6].strip()
    assert dense == "n/a", row


def test_calibrated_windows_carry_their_ends_intervals(home, monkeypatch):
    """A DSA model's calibrated windows: each end's 80% interval over the draws, as a plain scan of
    every count draw by draw gives it (order statistics of the first and last winning count), and
    in the crossover JSON holding the point ends (or null where the draws too often find none)."""
    from mlactl.decide.calibration import estimate
    from mlactl.decide.calibration import uncertainty as u

    result = runner.invoke(app, ["calibrate", "--from", "aiconfigurator", "--system", "h200_sxm", "--framework",
                                 "sglang", "--data-dir", str(FIXTURE), "-f", "json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    cal = store.resolve("h200-aiconfigurator-sglang-0.5.14")
    cost = CostModel(model.from_name("deepseek-v3.2"))
    hw = hardware.from_name("h200")
    monkeypatch.setattr(estimate, "WINDOW_EXACT", 4096)  # every count: the scan below's grid
    (got,) = estimate.window_intervals(cost, hw, cal, [1024], path="masked_expand", max_new=3000)
    n = np.arange(1, 3001, dtype=np.float64)
    est = estimate.estimates(cost, hw, cal, 1, n, np.full_like(n, 1024.0), ("masked_expand", "sparse_absorb"))
    wins = est["masked_expand"].scenarios() < est["sparse_absorb"].scenarios()  # [S, 3000]
    found = wins.any(axis=1)
    if found.mean() < 1 - u.LOW:
        assert got is None
    else:
        first = np.array([n[row.argmax()] for row in wins[found]])
        last = np.array([n[len(row) - 1 - row[::-1].argmax()] for row in wins[found]])
        want = (
            (int(np.quantile(first, u.LOW, method="lower")), int(np.quantile(first, u.HIGH, method="higher"))),
            (int(np.quantile(last, u.LOW, method="lower")), int(np.quantile(last, u.HIGH, method="higher"))),
        )
        assert got == want
    out = runner.invoke(app, ["crossover", "-m", "deepseek-v3.2", "-g", "h200", "--prefix", "0,1K", "--calibration",
                              "h200-aiconfigurator-sglang-0.5.14", "-f", "json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    for row in json.loads(out.stdout)["crossover"]["by_prefix"]:
        w = row["masked_expand"]["by_time"]
        if w is not None and w["first_interval"] is not None:
            assert w["first_interval"][0] <= w["first"] <= w["first_interval"][1]
            assert w["last_interval"][0] <= w["last"] <= w["last_interval"][1]


# -- the kernel-shaped terms of DSA's ops (model.py: slots, reuse; the indexer's and top-k's CTAs) --

PEAK, BW, SMS = 1e15, 4e12, 132


def _sparse_point(batch, new, keys, pool, slots=2048.0, row=656.0, other=1000.0, flops=1e9):
    from mlactl.decide.calibration.model import Points

    one = lambda v: np.array([float(v)])  # noqa: E731
    cache = batch * new * keys * row
    return Points(
        "sparse_attention", one(flops), one(cache + other), one(batch), one(new), one(keys), one(64), one(512),
        one(cache), slots=one(slots), pool=one(pool),
    )  # fmt: skip


def test_slots_term_counts_every_topk_slot():
    # 128 keys a query, 2,048 slots: the kernel does 16x cost.py's pair FLOPs; compute-bound here
    # (1e9 FLOPs at 1e15: 1 us; x16: 16 us); at or above 2,048 keys nothing changes
    from mlactl.decide.calibration.model import predict

    params = {"t_fixed_s": 0.0, "eta_c": 1.0, "eta_m": 1.0}
    short = _sparse_point(1, 4, 128, pool=4, row=0.0, other=0.0)
    assert float(predict(params, ("slots",), short, PEAK, BW, SMS)[0]) == pytest.approx(16e-6)
    assert float(predict(params, (), short, PEAK, BW, SMS)[0]) == pytest.approx(1e-6)
    full = _sparse_point(1, 4, 4096, pool=8000, row=0.0, other=0.0)
    assert float(predict(params, ("slots",), full, PEAK, BW, SMS)[0]) == pytest.approx(1e-6)


def test_reuse_term_reads_a_requests_rows_once():
    # 2 requests of 8 queries, each query selecting 2,048 of its request's 2,100 rows of 656 bytes:
    # cost.py counts 2*8*2048 = 32,768 row reads (21,495,808 bytes), the request's distinct rows are
    # 2*2100 = 4,200 (2,755,200 bytes); plus 1,000 bytes of q and out. Memory-bound (no FLOPs).
    from mlactl.decide.calibration.model import predict

    params = {"t_fixed_s": 0.0, "eta_c": 1.0, "eta_m": 1.0}
    pt = _sparse_point(2, 8, 2048, pool=2100, flops=0.0)
    assert float(predict(params, (), pt, PEAK, BW, SMS)[0]) == pytest.approx((21_495_808 + 1000) / BW)
    assert float(predict(params, ("reuse",), pt, PEAK, BW, SMS)[0]) == pytest.approx((2_755_200 + 1000) / BW)
    # a query that selects fewer rows than its request holds: the selections bound the reads
    few = _sparse_point(1, 1, 100, pool=5000, flops=0.0)
    assert float(predict(params, ("reuse",), few, PEAK, BW, SMS)[0]) == pytest.approx((100 * 656 + 1000) / BW)


def _headed(pt, heads):
    from dataclasses import replace

    return replace(pt, heads=np.array([float(heads)]))


def test_hblock_pads_the_heads_to_the_gpus_head_block():
    # FlashMLA's sparse prefill on Blackwell computes 128 heads (two CTAs of 64): a 64-head launch
    # of 8 tokens is 16 CTAs, not 8, doing twice cost.py's 1e9 FLOPs. On 4 SMs at 1e12 FLOP/s,
    # compute-bound (2,048 slots, nothing else): 16 CTAs are 4 whole waves, 2e9 / 1e12 = 2 ms;
    # without the term 8 CTAs are 2 whole waves, 1 ms. Hopper's 64-head block changes nothing
    from mlactl.decide.calibration.model import predict

    terms = ("fixed", "pad", "waves", "slots", "hblock")
    pt = _sparse_point(1, 8, 2048, pool=2048, row=0.0, other=0.0)
    blackwell = {"t_fixed_s": 0.0, "eta_c": 1.0, "eta_m": 1.0, "head_block": 128, "key_block": 128}
    hopper = dict(blackwell, head_block=64, key_block=64)
    assert float(predict(blackwell, terms, pt, 1e12, 1e18, 4)[0]) == pytest.approx(2e-3)
    assert float(predict(hopper, terms, pt, 1e12, 1e18, 4)[0]) == pytest.approx(1e-3)
    assert float(predict(blackwell, terms[:-1], pt, 1e12, 1e18, 4)[0]) == pytest.approx(1e-3)
    # an unknown GPU's blocks (None): as without the term
    unknown = dict(blackwell, head_block=None, key_block=None)
    assert float(predict(unknown, terms, pt, 1e12, 1e18, 4)[0]) == pytest.approx(1e-3)
    # 128 heads are whole blocks on both: nothing padded
    assert float(predict(blackwell, terms, _headed(pt, 128), 1e12, 1e18, 4)[0]) == pytest.approx(1e-3)


def test_hblock_walks_the_gpus_key_block_a_step():
    # serial-bound (no FLOPs, no bytes): 8 tokens of 128 heads are 16 CTAs on 4 SMs, 4 waves; 256
    # slots are 2 steps of 128 keys on Blackwell (8 t_iter), 4 of 64 on Hopper and without the term
    from mlactl.decide.calibration.model import predict

    terms = ("fixed", "serial", "slots", "hblock")
    pt = _headed(_sparse_point(1, 8, 256, pool=256, slots=256.0, row=0.0, other=0.0, flops=0.0), 128)
    blackwell = {"t_fixed_s": 0.0, "eta_c": 1.0, "eta_m": 1.0, "t_iter_s": 1e-6, "head_block": 128, "key_block": 128}
    assert float(predict(blackwell, terms, pt, 1e12, 1e18, 4)[0]) == pytest.approx(8e-6)
    hopper = dict(blackwell, head_block=64, key_block=64)
    assert float(predict(hopper, terms, pt, 1e12, 1e18, 4)[0]) == pytest.approx(16e-6)
    assert float(predict(blackwell, terms[:-1], pt, 1e12, 1e18, 4)[0]) == pytest.approx(16e-6)


def test_hblock_blocks_are_the_gpus_own():
    # a fit keeps the blocks of the GPU it was fitted on (not fitted); a GPU whose architecture
    # has no known blocks does not try the term
    from mlactl.decide.calibration.fit import Machine, with_sizes
    from mlactl.decide.calibration.run import machine_for
    from mlactl.decide.calibration.selection import op_tries

    terms = ("fixed", "pad", "waves", "slots", "hblock")
    h200, b200 = machine_for(hardware.from_name("h200")), machine_for(hardware.from_name("b200"))
    assert (h200.arch, b200.arch) == ("sm90", "sm100")
    assert with_sizes({}, terms, h200) == {"head_block": 64, "key_block": 64}
    assert with_sizes({}, terms, b200) == {"head_block": 128, "key_block": 128}
    assert "head_block" not in with_sizes({}, ("fixed",), b200)
    assert op_tries("sparse_attention", terms, b200) and not op_tries("sparse_attention", terms, Machine(PEAK, BW, SMS))
    assert not op_tries("absorb_attention", terms, b200)


def test_sparse_terms_are_tried_on_sparse_attention_only():
    from mlactl.decide.calibration.model import SPARSE_TERMS, relevant_terms
    from mlactl.decide.calibration.selection import CANDIDATE_TERMS, op_tries

    sparse_sets = [t for t in CANDIDATE_TERMS if set(SPARSE_TERMS) & set(t)]
    assert sparse_sets and all(op_tries("sparse_attention", t) for t in sparse_sets)
    assert not any(op_tries("absorb_attention", t) for t in sparse_sets)
    assert relevant_terms("absorb_attention", ("fixed", "slots", "reuse")) == ("fixed",)
    assert relevant_terms("sparse_attention", ("fixed", "slots", "reuse")) == ("fixed", "slots", "reuse")


def test_indexer_ctas_walk_the_keys_of_every_request_they_hold():
    # DeepGEMM's fp8_mqa_logits: 128 rows a CTA, the batch's tokens packed; DeepSeek-V3.2 has 64
    # index heads, so 2 tokens a CTA. One token of each of 4 requests (context 16,384): 2 CTAs,
    # each holding 2 requests and walking 2 x 16,384 keys, 256 blocks of 128; 4 tokens of one
    # request: 2 CTAs of 128 blocks each (GLM-5's 32 heads on an H200: 257 against 65 us, 4 a CTA)
    from mlactl.decide.calibration.model import predict
    from mlactl.decide.calibration.sources import points_for

    cost = CostModel(model.from_name("deepseek-v3.2"))
    assert cost.cfg.index().heads == 64
    params = {"t_fixed_s": 0.0, "eta_c": 1000.0, "eta_m": 1000.0, "t_iter_s": 1e-6}
    spread = points_for(cost, "indexer", [4], [1], [16383], None)
    packed = points_for(cost, "indexer", [1], [4], [16380], None)
    assert float(predict(params, ("serial",), packed, PEAK, BW, SMS)[0]) == pytest.approx(128e-6)
    assert float(predict(params, ("serial",), spread, PEAK, BW, SMS)[0]) == pytest.approx(256e-6)
    # 132 requests of 2 tokens: 132 CTAs, one wave; 133: two waves
    one = points_for(cost, "indexer", [132], [2], [16382], None)
    two = points_for(cost, "indexer", [133], [2], [16382], None)
    assert float(predict(params, ("serial",), one, PEAK, BW, SMS)[0]) == pytest.approx(128e-6)
    assert float(predict(params, ("serial",), two, PEAK, BW, SMS)[0]) == pytest.approx(256e-6)


def test_topk_gives_each_query_row_a_cta():
    # one CTA per query row, its keys in blocks of 64: 200 rows on 132 SMs are two waves, 6,400
    # keys 100 blocks: t_iter x 200
    from mlactl.decide.calibration.model import predict
    from mlactl.decide.calibration.sources import points_for

    cost = CostModel(model.from_name("deepseek-v3.2"))
    params = {"t_fixed_s": 0.0, "eta_c": 1000.0, "eta_m": 1000.0, "t_iter_s": 1e-7}
    pts = points_for(cost, "topk", [1], [200], [6200], None)
    assert float(predict(params, ("serial",), pts, PEAK, BW, SMS)[0]) == pytest.approx(1e-7 * 2 * 100)


def _topk_setup(eta_m: float):
    """DeepSeek-V3.2's cost model and a top-k fit: 0.1 us a key block, 1 us a wave's setup, 0.5 us
    a wave of rows writing, compute free, memory at eta_m."""
    params = {"t_fixed_s": 0.0, "eta_c": 1000.0, "eta_m": eta_m, "t_iter_s": 1e-7, "t_cta_s": 1e-6,
              "t_rowwave_s": 5e-7}  # fmt: skip
    return CostModel(model.from_name("deepseek-v3.2")), params


def test_topk_walks_only_its_selecting_rows_and_every_row_writes():
    # `rowsel`, `ctawave`, `rowwave`, by hand. DeepSeek-V3.2 keeps 2,048 keys a query. One request
    # of 300 new tokens after 1,900 cached: query i (1..300) sees 1,900 + i keys, so queries 1..148
    # keep all theirs and 152 select, seeing 2,049..2,200 keys, 2,124.5 on average: 2 waves of
    # selecting CTAs on 132 SMs, ceil(2,124.5 / 64) = 34 key blocks each, and 3 waves of all 300
    # rows writing their indices
    from mlactl.decide.calibration.model import predict
    from mlactl.decide.calibration.sources import points_for

    cost, params = _topk_setup(eta_m=1000.0)
    terms = ("serial", "rowsel", "ctawave", "rowwave")

    def t(b, n, p):
        return float(predict(params, terms, points_for(cost, "topk", [b], [n], [p], None), PEAK, BW, SMS)[0])

    assert t(1, 300, 1900) == pytest.approx(2 * (34 * 1e-7 + 1e-6) + 3 * 5e-7)
    # nothing selects (100 tokens, no cache): the one wave of rows writing
    assert t(1, 100, 0) == pytest.approx(5e-7)
    # one decode token after 4,095 cached: one CTA walking 4,096 keys, 64 blocks
    assert t(1, 1, 4095) == pytest.approx(64 * 1e-7 + 1e-6 + 5e-7)
    # without rowsel every row is a CTA walking the whole context (2,200 keys: 35 blocks)
    plain = predict(params, ("serial",), points_for(cost, "topk", [1], [300], [1900], None), PEAK, BW, SMS)
    assert float(plain[0]) == pytest.approx(3 * 35 * 1e-7)


def test_topk_setup_and_index_writes_apart_from_the_walk():
    # `apart`, by hand: the setup and index writes are added to the larger of the walk and the
    # memory time, not taken under it. One decode token after 4,095 cached (one CTA, 64 key
    # blocks): cost.py's top-k reads 4,096 fp32 logits and writes 2,048 int32 indices, 24,576
    # bytes, so at eta_m = 1 and 1 GB/s its memory time is 24.576 us, over the walk's 6.4 us and
    # the setup's and writes' 1.5
    from mlactl.decide.calibration.model import added_seconds, predict, relevant_terms
    from mlactl.decide.calibration.sources import points_for

    cost, params = _topk_setup(eta_m=1.0)
    terms = ("serial", "rowsel", "ctawave", "rowwave")
    pts = points_for(cost, "topk", [1], [1], [4095], None)
    memory = 24_576 / 1e9
    assert float(np.asarray(pts.bytes)[0]) == 24_576
    under = float(predict(params, terms, pts, PEAK, 1e9, SMS)[0])
    apart = float(predict(params, (*terms, "apart"), pts, PEAK, 1e9, SMS)[0])
    assert under == pytest.approx(max(memory, 64 * 1e-7 + 1e-6 + 5e-7))  # hidden under the memory
    assert apart == pytest.approx(max(memory, 64 * 1e-7) + 1e-6 + 5e-7)
    # 300 new tokens after 1,900 cached (the test above): 2 waves of selecting CTAs, 3 of rows
    many = points_for(cost, "topk", [1], [300], [1900], None)
    added = added_seconds(params, (*terms, "apart"), many, 1e9, SMS)
    assert float(added[0]) == pytest.approx(2 * 1e-6 + 3 * 5e-7)
    # at a bandwidth that leaves the walk the bound, apart or not is the same sum
    fast = [float(predict(params, t, many, PEAK, 1e18, SMS)[0]) for t in (terms, (*terms, "apart"))]
    assert fast[0] == pytest.approx(fast[1]) == pytest.approx(2 * (34 * 1e-7 + 1e-6) + 3 * 5e-7)
    # the term needs `serial` (no walk, no setup to keep apart)
    assert "apart" not in relevant_terms("topk", ("fixed", "apart"))


def test_topk_rows_past_the_l1_are_read_from_memory_twice():
    # `reread`, by hand: a top-k CTA reads its row's fp32 logits twice, the second time from its
    # SM's L1 where the row fits in the 92 KiB (94,208 bytes) the kernel's shared memory leaves:
    # 23,552 keys. One decode token after 23,551 cached sees 23,552 keys (94,208 bytes: one pass);
    # after 23,552 cached, 23,553 (94,212 bytes: two). cost.py's bytes are the logits once and
    # 2,048 int32 indices (8,192 bytes); at eta_m = 1 and 1 GB/s the second pass adds 94.212 us
    from mlactl.decide.calibration.model import predict, topk_passes
    from mlactl.decide.calibration.sources import points_for

    cost, params = _topk_setup(eta_m=1.0)
    fits = points_for(cost, "topk", [1], [1], [23_551], None)
    past = points_for(cost, "topk", [1], [1], [23_552], None)
    assert float(topk_passes(fits)[0]) == 1.0 and float(topk_passes(past)[0]) == 2.0
    assert float(np.asarray(past.bytes)[0]) == 94_212 + 8_192

    def t(pts, terms):
        return float(predict(params, terms, pts, 1e18, 1e9, SMS)[0])  # compute free: memory the bound

    assert t(fits, ("reread",)) == pytest.approx(t(fits, ())) == pytest.approx(102_400 / 1e9)
    assert t(past, ("reread",)) == pytest.approx((2 * 94_212 + 8_192) / 1e9)
    # with `rowsel` the row is the selecting rows' mean: 2,048 new tokens after 22,528 cached see
    # 22,529..24,576 keys, 23,552.5 on average (past the L1); after 22,527, 23,551.5 (within it)
    assert float(topk_passes(points_for(cost, "topk", [1], [2048], [22_528], None), ("rowsel",))[0]) == 2.0
    assert float(topk_passes(points_for(cost, "topk", [1], [2048], [22_527], None), ("rowsel",))[0]) == 1.0


def test_topk_logits_resident_in_l2_are_walked_and_read_faster():
    # `l2` on a top-k, by hand: aiconfigurator replays each launch on the same logits, so a launch
    # whose logits fit in the GPU's L2 walks them and reads them at l2_gain. One decode token
    # after 6,399 cached: one CTA walks 6,400 keys (100 blocks of 0.1 us, 10 us); its logits and
    # indices are 25,600 + 8,192 = 33,792 bytes
    from mlactl.decide.calibration.model import logits_budget, predict, topk_l2_gain
    from mlactl.decide.calibration.sources import points_for

    cost, params = _topk_setup(eta_m=1000.0)
    pts = points_for(cost, "topk", [1], [1], [6399], None)
    assert float(np.asarray(pts.bytes)[0]) == 33_792

    def t(l2_bytes, terms=("serial", "l2"), bw=BW):
        p = {**params, "l2_gain": 2.0, "l2_bytes": l2_bytes}
        return float(predict(p, terms, pts, PEAK, bw, SMS)[0])

    assert t(33_792) == pytest.approx(100 * 1e-7 / 2)  # resident: the walk at twice the speed
    assert t(33_791) == pytest.approx(100 * 1e-7)  # one byte over: from memory
    assert t(33_792, ("serial",)) == pytest.approx(100 * 1e-7)  # without the term
    # the memory side too: at eta_m = 1000 and 1 kB/s (1 MB/s) the 33,792 bytes take 33.792 ms,
    # 16.896 ms resident
    assert t(33_792, ("l2",), 1e3) == pytest.approx(16.896e-3)
    # a chunked launch is replayed chunk by chunk, so one chunk's bytes are what must fit: 32
    # requests of 2,048 new tokens after 2,048 cached (two chunks on an H200: the `chunk` test
    # below) read 32 x (2,048 x 2,048 + 2,048 x 2,049 / 2) = 201,359,360 logits (805,437,440
    # bytes) and write 32 x 2,048 x 2,048 indices (536,870,912 bytes): 671,154,176 bytes a chunk
    big = points_for(cost, "topk", [32], [2048], [2048], None)
    budget = {"l2_gain": 2.0, "logits_budget_bytes": logits_budget(141e9)}
    gain = [
        float(topk_l2_gain({**budget, "l2_bytes": b}, ("l2", "chunk"), big, big.bytes)[0])
        for b in (671_154_176, 671_154_175)
    ]
    assert gain == [2.0, 1.0]


def test_indexer_ctas_pay_a_setup_a_wave():
    # `ctawave` on the indexer: 133 requests of 2 tokens are 133 CTAs, two waves of 128 blocks each
    from mlactl.decide.calibration.model import predict
    from mlactl.decide.calibration.sources import points_for

    cost = CostModel(model.from_name("deepseek-v3.2"))
    params = {"t_fixed_s": 0.0, "eta_c": 1000.0, "eta_m": 1000.0, "t_iter_s": 1e-6, "t_cta_s": 3e-6}
    two = points_for(cost, "indexer", [133], [2], [16382], None)
    assert float(predict(params, ("serial", "ctawave"), two, PEAK, BW, SMS)[0]) == pytest.approx(2 * (128e-6 + 3e-6))


def test_walker_terms_are_tried_on_the_walkers_only():
    from mlactl.decide.calibration.selection import CANDIDATE_TERMS, op_tries
    from mlactl.decide.calibration.terms import WALKER_TERMS

    assert set(WALKER_TERMS) == {"rowsel", "ctawave", "rowwave", "chunk", "reread", "apart"}
    walker_sets = [t for t in CANDIDATE_TERMS if set(WALKER_TERMS) & set(t)]
    assert walker_sets and all(op_tries("topk", t) for t in walker_sets)
    assert not any(op_tries(op, t) for t in walker_sets for op in ("absorb_attention", "sparse_attention", "kv_expand"))


def test_topk_logits_past_the_workspace_run_in_row_chunks():
    # `chunk`, worked by hand: 32 requests of 2,048 new tokens after 2,048 cached hold fp32 logits
    # of 65,536 rows x 131,072 keys (32 x 4,096) = 2^35 bytes. An H200's budget, 0.2 x 141 GB =
    # 28.2 GB, holds floor(28.2e9 / (131,072 x 4)) = 53,787 rows: two chunks, of 53,787 and 11,749
    # rows, each row its own sequence: 53,787^2 + 11,749^2 = 3,031,080,370 row-sequence pairs
    from mlactl.decide.calibration.model import logit_chunks, logits_budget, predict
    from mlactl.decide.calibration.sources import points_for

    cost = CostModel(model.from_name("deepseek-v3.2"))
    budget = logits_budget(141e9)
    assert budget == pytest.approx(28.2e9)
    big = points_for(cost, "topk", [32], [2048], [2048], None)
    per, chunks = logit_chunks(big, budget)
    assert (float(per[0]), float(chunks[0])) == (53787.0, 2.0)
    params = {"t_fixed_s": 2e-6, "eta_c": 1000.0, "eta_m": 1000.0, "t_seq_s": 1e-10, "logits_budget_bytes": budget}
    tiny = {**params, "eta_c": 1e6, "eta_m": 1e6}  # the roofline's part out of the way
    with_chunks = float(predict(tiny, ("fixed", "chunk"), big, PEAK, BW, SMS)[0])
    without = float(predict(tiny, ("fixed",), big, PEAK, BW, SMS)[0])
    assert with_chunks - without == pytest.approx(3_031_080_370 * 1e-10 / SMS + 2e-6)
    # one chunk: 16 requests of 16 new tokens after 2,048 (8.5M logits, 34 MB) keep their 16
    # sequences: 256 rows x 16; below 8M logits nothing chunks whatever the budget
    small = points_for(cost, "topk", [16], [16], [2048], None)
    assert float(logit_chunks(small, budget)[1][0]) == 1.0
    one = float(predict(tiny, ("fixed", "chunk"), small, PEAK, BW, SMS)[0])
    assert one - float(predict(tiny, ("fixed",), small, PEAK, BW, SMS)[0]) == pytest.approx(256 * 16 * 1e-10 / SMS)
    lone = points_for(cost, "topk", [1], [4], [1000], None)
    assert float(logit_chunks(lone, 1.0)[1][0]) == 1.0
    # a budget of one byte: every row its own chunk (the shortest chunk still holds a row)
    assert float(logit_chunks(small, 1.0)[1][0]) == 256.0


def test_chunk_budget_is_the_gpus_own():
    # a fit keeps the budget of the GPU it was fitted on (not fitted), a fifth of its memory
    from mlactl.decide.calibration.fit import Machine, with_sizes
    from mlactl.decide.calibration.run import machine_for

    machine = machine_for(hardware.from_name("h100-sxm"))
    assert machine.memory_bytes == 80e9
    assert with_sizes({}, ("fixed", "chunk"), machine)["logits_budget_bytes"] == pytest.approx(16e9)
    assert "logits_budget_bytes" not in with_sizes({}, ("fixed",), machine)
    assert with_sizes({}, ("chunk",), Machine(PEAK, BW, SMS))["logits_budget_bytes"] is None


def test_every_parameter_belongs_to_one_term():
    # two terms naming one parameter would share its starts and bounds (the last one's): a term
    # added with another's name silently changes the other's fits
    from mlactl.decide.calibration.terms import BASE_PARAMS, TERM_LIST

    names = [p.name for p in BASE_PARAMS] + [p.name for t in TERM_LIST for p in t.params]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
