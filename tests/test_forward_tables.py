"""The forward's ops outside attention timed from aiconfigurator-core's tables
(mlactl.decide.calibration.forward_tables), on hand-made tables whose every figure is known,
and on the installed tables where aiconfigurator-core is there."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import error_line, mooncake, run

from mlactl.decide.calibration import forward_tables as ft
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel, ForwardCost, WeightCost
from mlactl.model.weights import from_name as weights_of

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

V3 = from_name("deepseek-v3").with_tp(8)
W = weights_of("deepseek-v3")
H200 = hardware.resolve("h200")
FC = ForwardCost(V3, W)


def write(folder, kind, stem, rows, framework="sglang", version="0.5.14"):
    path = folder / "h200_sxm" / kind / framework / version
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path / f"{stem}.parquet")


def gemm_rows(k, n, dtype, points, kernel="deepgemm"):
    return [dict(kernel_source=kernel, gemm_dtype=dtype, m=m, n=n, k=k, latency=ms) for m, ms in points]


@pytest.fixture
def tables(tmp_path):
    """q_proj's GEMM (1536 -> 3072 at TP 8) measured at m = 1 and 101; o_proj's (2048 -> 7168)
    between grid values n 7168 and k 1024/3072; DeepSeek-V3's experts at tp 8; the all-reduce
    at 8 GPUs, graph and eager."""
    rows = gemm_rows(1536, 3072, "fp8_block", [(1, 0.010), (101, 0.030)])
    rows += gemm_rows(1024, 7168, "fp8_block", [(1, 0.010), (100, 0.020)])
    rows += gemm_rows(3072, 7168, "fp8_block", [(1, 0.030), (100, 0.060)])
    rows += gemm_rows(1536, 3072, "fp8", [(1, 0.5), (101, 0.5)], kernel="scaled_mm")  # not preferred
    write(tmp_path, "gemm", "gemm_perf", rows)
    moe = dict(
        moe_dtype="fp8_block", hidden_size=7168, inter_size=2048, topk=8, num_experts=256, moe_tp_size=8,
        moe_ep_size=1, distribution="balanced", kernel_source="fused_moe",
    )  # fmt: skip
    write(
        tmp_path,
        "moe",
        "moe_perf",
        [dict(moe, num_tokens=1, latency=0.040), dict(moe, num_tokens=64, latency=0.200)]
        + [dict(moe, moe_tp_size=4, num_tokens=1, latency=9.0)],
    )
    ar = dict(allreduce_dtype="bfloat16", num_gpus=8)
    write(
        tmp_path,
        "comm",
        "custom_allreduce_perf",
        [
            dict(ar, kernel_source="AR_graph", message_size=7168, latency=0.002),
            dict(ar, kernel_source="AR_graph", message_size=7168 * 64, latency=0.010),
            dict(ar, kernel_source="AR_eager", message_size=7168, latency=0.020),
            dict(ar, kernel_source="AR_eager", message_size=7168 * 64, latency=0.040),
        ],
    )
    return tmp_path


def test_curve_is_linear_between_points_flat_below_and_proportional_past_the_last():
    c = ft.Curve(np.array([10.0, 20.0]), np.array([1.0, 3.0]))
    assert c.at(15) == pytest.approx(2.0)
    assert c.at(1) == pytest.approx(1.0)
    assert c.at(40) == pytest.approx(6.0)  # 3 x 40 / 20


def test_hand_made_tables_give_the_times_worked_by_hand(tables):
    t = ft.load(FC, H200, "h200_sxm/sglang", tables)
    # q_proj measured exactly, fp8_block preferred over fp8: at m = 51, halfway, 20 us
    assert t.seconds("q_proj", 51, 1) == pytest.approx(20e-6)
    assert "measured" in t.basis["q_proj"] and "deepgemm" in t.basis["q_proj"]
    # o_proj k 2048 is halfway between 1024 and 3072: at m = 1, (10 + 30) / 2 = 20 us; at m = 100, 40 us
    assert t.seconds("o_proj", 1, 1) == pytest.approx(20e-6)
    assert t.seconds("o_proj", 100, 1) == pytest.approx(40e-6)
    assert "interpolated" in t.basis["o_proj"]
    # the experts at tp 8: 1 token 40 us, 64 tokens 200 us, 128 tokens twice that
    assert t.seconds("routed_experts", 128, 1) == pytest.approx(400e-6)
    # decode steps (every token samples) take the graph rows, others the eager ones
    assert t.seconds("all_reduce", 64, 64) == pytest.approx(10e-6)
    assert t.seconds("all_reduce", 64, 1) == pytest.approx(40e-6)
    # nothing measured qkv_a_proj's shape, the MLPs, the router or the LM head, or the gather
    for op in ("qkv_a_proj", "dense_mlp", "router", "shared_experts", "lm_head", "logits_gather"):
        assert t.seconds(op, 64, 1) is None and t.basis[op].startswith("roofline"), op


def test_vllms_fp8_block_rows_timed_outside_a_cuda_graph_are_passed_over(tmp_path):
    # fp8_block rows at 80 us (the host's launch path) beside per-tensor fp8 rows of 10 and 30 us:
    # vLLM's fp8 weights take the fp8 rows, 20 us at m = 51; SGLang's the fp8_block ones
    rows = gemm_rows(1536, 3072, "fp8_block", [(1, 0.080), (101, 0.080)])
    rows += gemm_rows(1536, 3072, "fp8", [(1, 0.010), (101, 0.030)], kernel="cutlass")
    for framework in ("vllm", "sglang"):
        write(tmp_path, "gemm", "gemm_perf", rows, framework, "0.24.0")
    vllm = ft.load(FC, H200, "h200_sxm/vllm", tmp_path)
    assert vllm.seconds("q_proj", 51, 1) == pytest.approx(20e-6)
    assert "cutlass" in vllm.basis["q_proj"]
    assert "vllm's fp8_block rows passed over (timed outside a CUDA graph)" in vllm.basis["q_proj"]
    sglang = ft.load(FC, H200, "h200_sxm/sglang", tmp_path)
    assert sglang.seconds("q_proj", 51, 1) == pytest.approx(80e-6)
    assert "passed over" not in sglang.basis["q_proj"]
    # o_proj has fp8_block rows only: vLLM's stays at the roofline, and says why
    write(
        tmp_path,
        "gemm",
        "gemm_perf",
        rows + gemm_rows(2048, 7168, "fp8_block", [(1, 0.08), (101, 0.08)]),
        "vllm",
        "0.24.0",
    )
    vllm = ft.load(FC, H200, "h200_sxm/vllm", tmp_path)
    assert vllm.seconds("o_proj", 51, 1) is None
    assert vllm.basis["o_proj"].startswith("roofline: no fp8 GEMM kernel measured k 2048 -> n 7168")
    assert vllm.basis["o_proj"].endswith("vllm's fp8_block rows passed over (timed outside a CUDA graph)")
    assert "passed over" not in vllm.basis["lm_head"]  # bf16: no fp8_block rows to pass over


def test_the_clock_takes_the_measured_ops_and_keeps_the_roofline_for_the_rest(tables):
    from mlactl.decide.engines import steps as rules
    from mlactl.decide.replay.clock import Clock

    cost = CostModel(V3)
    wc = WeightCost(V3, W)
    plain = Clock(cost, H200, wc, rules.paths())
    measured = Clock(cost, H200, wc, rules.paths(), tables=ft.load(FC, H200, "h200_sxm/sglang", tables))
    tokens, sampled = 64, 1
    # q_proj at its roofline, a second way: max(FLOPs / peak, bytes / bandwidth) of ForwardCost's op
    q = next(o for o in FC.ops(tokens, sampled) if o.name == "q_proj")
    roof = max(float(q.flops) / H200.peak_flops(q.dtype), float(q.bytes) / H200.bandwidth)
    a, b = plain.forward_parts(tokens, sampled), measured.forward_parts(tokens, sampled)
    assert b["q_proj"] == pytest.approx(61 * (0.010 + 0.020 * 63 / 100) * 1e-3)
    assert a["q_proj"] == pytest.approx(61 * roof)
    assert b["qkv_a_proj"] == a["qkv_a_proj"] and b["lm_head"] == a["lm_head"]
    assert b["all_reduce"] == pytest.approx(2 * 61 * 40e-6)


def test_replay_json_names_each_ops_basis(tables, tmp_path):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 3000, 4, [1, 2, 3, 4, 5, 6])])
    args = ("replay", trace, "--hardware", "h200", "--tp", "8", "--engines", "vllm", "-f", "json")
    plain = json.loads(run(*args).stdout)
    got = json.loads(run(*args, "--forward-tables", "h200_sxm/sglang", "--tables-dir", tables).stdout)
    assert got["settings"]["forward_tables"] == "h200_sxm/sglang"
    assert "interpolated" in got["forward"]["ops"]["o_proj"]
    assert got["forward"]["ops"]["lm_head"].startswith("roofline")
    assert "ops" not in plain["forward"]
    # the measured experts (40-200 us a layer) are slower than their roofline here: the GPU time grows
    assert got["engines"][0]["gpu_time_s"] > plain["engines"][0]["gpu_time_s"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--forward-tables", "h200_sxm"], "expected SYSTEM/FRAMEWORK[/VERSION]"),
        (["--forward-tables", "h300_sxm/sglang"], "unknown system 'h300_sxm'"),
        (
            ["--forward-tables", "h200_sxm/sglang", "--hardware", "b200"],
            "measured on h200, but the replay runs on b200",
        ),
        (["--forward-tables", "h200_sxm/trtllm"], "no gemm tables for trtllm"),
        (["--forward-tables", "h200_sxm/sglang/0.5.99"], "no gemm tables for sglang 0.5.99"),
    ],
)
def test_bad_tables_are_one_error_line(tables, tmp_path, args, message):
    trace = mooncake(tmp_path / "t.jsonl", [(0, 3000, 4, [1, 2, 3, 4, 5, 6])])
    line = error_line(run("replay", trace, "--tp", "8", "--hardware", "h200", *args, "--tables-dir", tables, ok=False))
    assert message in line, line


def test_installed_tables_time_q_proj_as_their_row_says():
    """aiconfigurator-core's own H200 SGLang table, read a second way: q_proj (1536 -> 3072,
    fp8 block) at the smallest m it measured is that row's latency."""
    try:
        root = ft.ac.default_data_dir()
    except Exception:
        pytest.skip("aiconfigurator-core is not installed")
    import pyarrow.parquet as pq

    frame = pq.read_table(root / "h200_sxm" / "gemm" / "sglang" / "0.5.14" / "gemm_perf.parquet").to_pandas()
    rows = frame[(frame.n == 3072) & (frame.k == 1536) & (frame.gemm_dtype == "fp8_block")].sort_values("m")
    t = ft.load(FC, H200, "h200_sxm/sglang/0.5.14")
    m, ms = int(rows.m.iloc[0]), float(rows.latency.iloc[0])
    assert t.seconds("q_proj", m, 1) == pytest.approx(ms * 1e-3)
    assert t.basis["routed_experts"].startswith("aiconfigurator-core h200_sxm/sglang 0.5.14 moe")
    assert t.basis["logits_gather"].startswith("roofline")
