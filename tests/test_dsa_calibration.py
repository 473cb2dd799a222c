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
