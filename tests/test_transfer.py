"""`mlactl calibrate transfer`: a calibration carried to another GPU (mlactl.decide.calibration.
transfer), the times it gives there worked out by hand, the kernel terms it drops and where, its
widened intervals, and the consumers that take it for the target and say its times are
transferred."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import error_line, run

from mlactl.decide.calibration import store
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.time import op_seconds
from mlactl.decide.calibration.transfer import bias_factor, kernel_of, scaled, transfer, transfer_fit, widen
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel
from mlactl.util.errors import MlactlError


def error_line_w(result) -> str:
    return error_line(result, warnings=True)  # a transferred calibration warns beside its error


H, R, DR, DC, DV = 128, 512, 64, 128, 128  # DeepSeek-V3
FIXTURE = Path(__file__).parent / "data" / "aiconfigurator"
# a hand-made target: 2,000 TFLOP/s bf16, 8 TB/s, 100 SMs, 100 MiB of L2
TARGET_TOML = """name = "handmade"
display = "Hand-made GPU"
memory_gb = 100
bandwidth_tbs = 8.0
sm_count = 100
l2_mib = 100
sources = ["made up for a test"]

[peak_tflops]
bf16 = 2000
"""
T_PEAK, T_BW, T_SMS = 2000e12, 8e12, 100


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "handmade.toml"
    path.write_text(TARGET_TOML)
    return hardware.load_profile(path)


def calibration(fits, hardware_name="h200", framework="sglang") -> dict:
    hw = hardware.from_name(hardware_name)
    return {
        "schema": "mlactl.calibration",
        "schema_version": 1,
        "name": "hand",
        "hardware": hw.name,
        "ceilings": {"peak_flops": hw.peak_flops("bf16"), "bandwidth_bytes_per_s": hw.bandwidth,
                     "sm_count": hw.sm_count, "dtype": "bf16"},
        "source": {"kind": "aiconfigurator", "system": "h200_sxm", "framework": framework, "version": "0.5.14"},
        "fits": fits,
    }  # fmt: skip


DECODE = {
    "op": "absorb_attention", "source": "sglang-0.5.14:flash_attention:decode", "dtype": "bf16",
    "terms": ["fixed"], "params": {"t_fixed_s": 5e-6, "eta_c": 0.5, "eta_m": 0.8},
}  # fmt: skip
GEMM = {
    "op": "kv_expand", "source": "sglang-0.5.14:sglang_torch_linear", "dtype": "bf16",
    "terms": ["fixed", "pad", "waves"], "params": {"t_fixed_s": 3e-6, "eta_c": 0.05, "eta_m": 1.0},
}  # fmt: skip


def carried(fits, target_hw, source="h200", framework="sglang"):
    cal = store.validate(calibration(fits, source, framework), "hand")
    return store.validate(transfer(cal, hardware.from_name(source), target_hw, errors={}), "moved")


def test_a_hand_made_calibration_carried_to_a_hand_made_gpu_gives_the_times_worked_by_hand(target):
    moved = carried([DECODE, GEMM], target)
    cost = CostModel(from_name("deepseek-v3"))
    assert moved.hardware == "handmade" and moved.transferred["from"]["hardware"] == "h200"
    assert moved.data["ceilings"] == {"peak_flops": T_PEAK, "bandwidth_bytes_per_s": T_BW, "sm_count": T_SMS,
                                      "dtype": "bf16"}  # fmt: skip
    # decode, batch 4, 8,191 cached + 1 new: 8,192 keys a request
    # FLOPs 4 * 8192 * (2*128*576 + 2*128*512) = 9,126,805,504; bytes 4 * (8192*576*2 + 128*576*2 + 128*512*2)
    # = 38,862,848. Compute 9.1268e9 / (0.5 * 2e15) = 9.1268 us; memory 38,862,848 / (0.8 * 8e12) = 6.0723 us
    flops = 4 * 8192 * (2 * H * (R + DR) + 2 * H * R)
    nbytes = 4 * (8192 * (R + DR) * 2 + H * (R + DR) * 2 + H * R * 2)
    assert (flops, nbytes) == (9_126_805_504, 38_862_848)
    t = op_seconds(cost, target, moved, "absorb_attention", np.array([4.0]), np.array([1.0]), np.array([8191.0]))
    assert t[0] == pytest.approx(5e-6 + 9_126_805_504 / (0.5 * T_PEAK))  # 14.1268 us: compute-bound here
    # on the H200 (989 TFLOP/s, 4.8 TB/s) the same fit gives 5 + 18.457 us
    h200 = hardware.from_name("h200")
    own = store.validate(calibration([DECODE, GEMM]), "hand")
    t0 = op_seconds(cost, h200, own, "absorb_attention", np.array([4.0]), np.array([1.0]), np.array([8191.0]))
    assert t0[0] == pytest.approx(5e-6 + 9_126_805_504 / (0.5 * 989e12))
    # kv_expand of 64 tokens: 2*64*512*128*256 = 2,147,483,648 FLOPs; 1 x 256 CTAs of 64 x 128 (128 heads
    # x 256 columns): 3 waves on 100 SMs, 256 / 300 busy; compute 2.1475e9 / (0.05 * 2e15) / (256/300)
    # = 25.166 us over memory (37,814,272 bytes / 8e12 = 4.73 us); on the H200's 132 SMs 2 waves, 256/264
    t = op_seconds(cost, target, moved, "kv_expand", np.array([1.0]), np.array([64.0]), np.array([0.0]))
    assert t[0] == pytest.approx(3e-6 + 2_147_483_648 / (0.05 * T_PEAK) / (256 / 300))
    t0 = op_seconds(cost, h200, own, "kv_expand", np.array([1.0]), np.array([64.0]), np.array([0.0]))
    assert t0[0] == pytest.approx(3e-6 + 2_147_483_648 / (0.05 * 989e12) / (256 / 264))


def test_an_l2_fit_takes_the_target_l2(target):
    fit = dict(GEMM, terms=["fixed", "l2"], params={"t_fixed_s": 3e-6, "eta_c": 0.5, "eta_m": 0.8,
                                                     "l2_gain": 2.0, "l2_bytes": 60 * 2**20})  # fmt: skip
    moved = carried([fit], target)
    assert moved.fits[0].params["l2_bytes"] == 100 * 2**20 and moved.fits[0].params["l2_gain"] == 2.0


def test_a_chunk_fit_takes_the_target_logits_budget(target):
    # the top-k's `chunk`: t_seq is the kernel's (kept), the workspace a fifth of the GPU's memory
    fit = {"op": "topk", "source": "sglang-0.5.14:fast_topk_transform_fused", "dtype": "fp32",
           "terms": ["fixed", "serial", "chunk"],
           "params": {"t_fixed_s": 2e-6, "eta_c": 0.1, "eta_m": 0.4, "t_iter_s": 1e-8, "t_seq_s": 7e-11,
                      "logits_budget_bytes": 28.2e9}}  # fmt: skip
    moved = carried([fit], hardware.from_name("b200"))
    assert moved.fits[0].params["logits_budget_bytes"] == pytest.approx(0.2 * 180e9)
    assert moved.fits[0].params["t_seq_s"] == 7e-11
    # a calibration file whose budget is not a positive number is refused, naming the field
    bad = dict(fit, params=dict(fit["params"], logits_budget_bytes=-1.0))
    with pytest.raises(MlactlError, match="logits_budget_bytes"):
        store.validate(calibration([bad]), "hand")


def test_a_sparse_attention_fit_takes_the_target_kernel_blocks(target):
    # `hblock`: FlashMLA's sparse prefill computes 64 heads by 64 keys a step on Hopper, 128 by 128
    # over a CTA pair on Blackwell; the fitted efficiencies travel, the blocks are the target's
    fit = {"op": "sparse_attention", "source": "sglang-0.5.14:flash_mla_sparse_fwd", "dtype": "bf16",
           "terms": ["fixed", "pad", "waves", "serial", "slots", "reuse", "hblock"],
           "params": {"t_fixed_s": 0.0, "eta_c": 0.6, "eta_m": 1.0, "t_iter_s": 1e-6,
                      "head_block": 64, "key_block": 64}}  # fmt: skip
    moved = carried([fit], hardware.from_name("b200"))
    params = moved.fits[0].params
    assert (params["head_block"], params["key_block"]) == (128, 128)
    assert (params["eta_c"], params["t_iter_s"]) == (0.6, 1e-6)
    # Hopper's kernel reads a request's shared rows once (`reuse`), Blackwell's each selection:
    # the term is the target architecture's, both ways
    assert "reuse" not in moved.fits[0].terms
    assert moved.fits[0].transfer["adapted"] == ["128 heads x 128 keys a step", "each selection read"]
    blackwell = dict(fit, terms=[t for t in fit["terms"] if t != "reuse"],
                     params=dict(fit["params"], head_block=128, key_block=128))  # fmt: skip
    back = carried([blackwell], hardware.from_name("h100-sxm"), source="b200").fits[0]
    assert "reuse" in back.terms and (back.params["head_block"], back.params["key_block"]) == (64, 64)
    assert back.transfer["adapted"] == ["64 heads x 64 keys a step", "shared rows read once"]
    # a GPU whose architecture has no known blocks: none (the term then does nothing), its terms as fitted
    other = carried([fit], target).fits[0]
    assert other.params["head_block"] is None and "reuse" in other.terms
    # a Hopper fit made without the term (an older file) takes Hopper's blocks, the same times
    # there at 64 heads, and the target's on the way
    old = dict(fit, terms=[t for t in fit["terms"] if t != "hblock"],
               params={k: v for k, v in fit["params"].items() if k not in ("head_block", "key_block")})  # fmt: skip
    aged = carried([old], hardware.from_name("b200")).fits[0]
    assert "hblock" in aged.terms and (aged.params["head_block"], aged.params["key_block"]) == (128, 128)
    assert aged.transfer["adapted"][-1] == "its source's blocks (fitted without hblock)"
    # a Blackwell fit without the term: as it is
    assert "hblock" not in carried([old], hardware.from_name("gb200"), source="b200").fits[0].terms
    # a block that is not a whole positive number is refused, naming the field
    for bad in (0, 100.5, 4096):
        with pytest.raises(MlactlError, match="head_block"):
            store.validate(calibration([dict(fit, params=dict(fit["params"], head_block=bad))]), "hand")


def test_the_indexers_step_follows_the_sms_flop_rate_and_the_top_ks_does_not():
    # the indexer's t_iter is one 128 x 128 x 128 MMA on an SM: on a B200 (2,250 TFLOP/s, 148 SMs)
    # it takes (989/132) / (2250/148) = 0.49284 of the H200's (989 TFLOP/s, 132 SMs). The top-k's
    # step is a walk, not an MMA: its seconds travel as they are
    walk = {"t_fixed_s": 3e-6, "eta_c": 1.0, "eta_m": 1.2, "t_iter_s": 2.6e-7, "t_cta_s": 1.1e-6}
    indexer = {
        "op": "indexer",
        "source": "sglang-0.5.14:deep_gemm.fp8_mqa_logits",
        "dtype": "fp8",
        "terms": ["fixed", "pad", "waves", "serial", "ctawave"],
        "params": walk,
        "members": [{"terms": ["fixed", "pad", "waves", "serial"], "params": dict(walk, t_iter_s=3e-7)}],
    }
    topk = {"op": "topk", "source": "sglang-0.5.14:fast_topk_transform_fused", "dtype": "fp32",
            "terms": ["fixed", "serial", "ctawave"], "params": walk}  # fmt: skip
    moved = carried([indexer, topk], hardware.from_name("b200"))
    ratio = (989 / 132) / (2250 / 148)
    assert ratio == pytest.approx(0.49284, abs=1e-5)
    fit = moved.fits[0]
    assert fit.params["t_iter_s"] == pytest.approx(2.6e-7 * ratio)
    assert fit.entry["members"][0]["params"]["t_iter_s"] == pytest.approx(3e-7 * ratio)
    assert fit.params["t_cta_s"] == 1.1e-6 and fit.params["t_fixed_s"] == 3e-6  # a setup's latency travels
    assert fit.transfer["step"] == pytest.approx(ratio, abs=1e-6)
    assert moved.fits[1].params["t_iter_s"] == 2.6e-7 and moved.fits[1].transfer["step"] == 1.0
    assert fit.transfer["adapted"] == ["step x0.49"] and moved.fits[1].transfer["adapted"] == []


def test_the_top_ks_memory_keeps_its_rate_a_sm_toward_less_bandwidth_a_sm():
    # SGLang's top-k reads its logits in a loop of one CTA an SM: its memory rate follows the SMs,
    # not the HBM, where the target has less bandwidth a SM. H200 -> H100 (4.8 -> 3.35 TB/s, 132
    # SMs each): eta_m x 4.8 / 3.35 = 1.43284, the memory side at 0.5 x 4.8 TB/s on both. Toward
    # more bandwidth a SM (H200 -> B200: 36.4 -> 54.1 GB/s a SM) eta_m stays a fraction of the
    # target's bandwidth, and so does the indexer's everywhere
    params = {"t_fixed_s": 3e-6, "eta_c": 1.0, "eta_m": 0.5, "t_iter_s": 2.6e-8, "t_cta_s": 1.1e-6}
    topk = {"op": "topk", "source": "sglang-0.5.14:fast_topk_transform_fused", "dtype": "fp32",
            "terms": ["fixed", "serial", "ctawave"], "params": params,
            "members": [{"terms": ["fixed", "serial"], "params": dict(params, eta_m=0.4)}]}  # fmt: skip
    indexer = {"op": "indexer", "source": "sglang-0.5.14:deep_gemm.fp8_mqa_logits", "dtype": "fp8",
               "terms": ["fixed", "serial"], "params": params}  # fmt: skip
    moved = carried([topk, indexer], hardware.from_name("h100-sxm"))
    scale = 4.8 / 3.35
    assert scale == pytest.approx(1.43284, abs=1e-5)
    fit = moved.fits[0]
    assert fit.params["eta_m"] == pytest.approx(0.5 * scale)
    assert fit.entry["members"][0]["params"]["eta_m"] == pytest.approx(0.4 * scale)
    assert fit.params["eta_m"] * 3.35e12 == pytest.approx(0.5 * 4.8e12)
    assert fit.transfer["memory"] == pytest.approx(scale, abs=1e-6)
    assert fit.transfer["adapted"] == ["eta_m x1.43 (the memory rate a SM)"]
    assert moved.fits[1].params["eta_m"] == 0.5 and moved.fits[1].transfer["memory"] == 1.0
    wider = carried([topk], hardware.from_name("b200")).fits[0]
    assert wider.params["eta_m"] == 0.5 and wider.transfer["memory"] == 1.0
    # B200 -> H100: (8.0 / 148) / (3.35 / 132) = 2.1299, which would take 1.0 past fp32's 1.2
    fast = dict(topk, params=dict(params, eta_m=1.0), members=[])
    back = carried([fast], hardware.from_name("h100-sxm"), source="b200").fits[0]
    assert (8.0 / 148) / (3.35 / 132) == pytest.approx(2.1299, abs=1e-4)
    assert back.params["eta_m"] == pytest.approx(1.2)


FA3 = {
    "op": "absorb_attention", "source": "sglang-0.5.14:flash_attention:decode", "dtype": "fp8",
    "terms": ["fixed", "split", "kvpad", "serial", "fa3split", "kvcast"],
    "params": {"t_fixed_s": 1e-5, "eta_c": 0.6, "eta_m": 0.9, "t_iter_s": 3e-7, "eta_x": 0.4},
    "members": [
        {"terms": ["fixed", "split", "kvpad", "serial", "kvcast"],
         "params": {"t_fixed_s": 1e-5, "eta_c": 0.6, "eta_m": 0.9, "t_iter_s": 3e-7, "eta_x": 0.4}},
        {"terms": ["fixed", "split", "kvpad", "serial"],
         "params": {"t_fixed_s": 2e-5, "eta_c": 0.5, "eta_m": 0.7, "t_iter_s": 4e-7}},
    ],
}  # fmt: skip
DEEPGEMM = {
    "op": "kv_expand", "source": "sglang-0.5.14:sglang_deepgemm_gemm_nt_f8f8bf16", "dtype": "fp8_block",
    "terms": ["fixed", "pad", "waves", "dgtile", "pipe"], "params": {"t_fixed_s": 3e-6, "eta_c": 0.6, "eta_m": 0.9},
}  # fmt: skip


@pytest.mark.parametrize(
    "fit, framework, target_name, dropped, kernel",
    [
        # SGLang's default on Hopper is fa3 (FA3's kernel, flash_attention): every term travels
        pytest.param(FA3, "sglang", "h100-sxm", [], "flash_attention", id="fa3-to-h100"),
        # on sm100 SGLang runs trtllm_mla: FA3's split and fp8-cache pass stay behind
        pytest.param(FA3, "sglang", "b200", ["fa3split", "kvcast"], "trtllm_mla", id="fa3-to-b200"),
        pytest.param(FA3, "sglang", "b300", ["fa3split", "kvcast"], "trtllm_mla", id="fa3-to-b300"),
        # neither Hopper nor sm100 (Ada's L40S, sm120's RTX PRO 6000): SGLang's MLA default is triton
        pytest.param(FA3, "sglang", "l40s", ["fa3split", "kvcast"], "triton", id="fa3-to-l40s"),
        pytest.param(FA3, "sglang", "rtx-pro-6000", ["fa3split", "kvcast"], "triton", id="fa3-to-rtx-pro-6000"),
        pytest.param(DEEPGEMM, "sglang", "l40s", ["dgtile"], "sglang_deepgemm_gemm_nt_f8f8bf16", id="dgtile-sm89"),
        # TRT-LLM's decode selected fa3split as its own kernel's split count; no rule names another kernel
        pytest.param(
            dict(FA3, source="trtllm-1.3.0rc20:default:decode"),
            "trtllm",
            "b200",
            [],
            "default",
            id="trtllm-keeps-its-terms",
        ),  # fmt: skip
        # DeepGEMM's tile heuristic is its SM90 one: kept on an H100, dropped on a B200 (same kernel)
        pytest.param(DEEPGEMM, "sglang", "h100-sxm", [], "sglang_deepgemm_gemm_nt_f8f8bf16", id="dgtile-sm90"),
        pytest.param(DEEPGEMM, "sglang", "b200", ["dgtile"], "sglang_deepgemm_gemm_nt_f8f8bf16", id="dgtile-sm100"),
    ],
)
def test_kernel_terms_are_dropped_exactly_where_the_target_runs_another_kernel(
    fit, framework, target_name, dropped, kernel
):
    h200, tgt = hardware.from_name("h200"), hardware.from_name(target_name)
    moved = transfer_fit(fit, framework, h200, tgt, errors={})
    record = moved["transfer"]
    assert record["dropped"] == dropped and record["kernel"]["target"] == kernel
    assert not set(dropped) & set(moved["terms"])
    assert all(not set(dropped) & set(m["terms"]) for m in moved["members"])
    if not dropped:
        assert moved["terms"] == fit["terms"] and moved["params"] == fit["params"]
    if fit is FA3 and dropped:
        # the first member that needs neither term, with its own parameters, is what the target gets
        assert moved["terms"] == ["fixed", "split", "kvpad", "serial"] and moved["params"]["t_fixed_s"] == 2e-5
        assert record["rests_on"].startswith(f"another kernel's fit (flash_attention measured, {kernel} on")
        assert "best member" in record["rests_on"]


def test_a_fit_without_a_clean_member_drops_the_terms_from_its_own_parameters():
    fit = dict(FA3, members=[])
    moved = transfer_fit(fit, "sglang", hardware.from_name("h200"), hardware.from_name("b200"), errors={})
    assert moved["terms"] == ["fixed", "split", "kvpad", "serial"] and moved["params"]["t_fixed_s"] == 1e-5
    assert "dropped terms left out" in moved["transfer"]["rests_on"]


def test_kernel_of_reads_aiconfigurator_sources():
    assert kernel_of({"source": "sglang-0.5.14:flash_attention:decode"}) == "flash_attention"
    assert kernel_of({"source": "sglang-0.5.14:sglang_torch_linear"}) == "sglang_torch_linear"
    assert kernel_of({"source": "results"}) == "results"


def test_intervals_are_widened_to_the_transfer_error_level_by_level():
    levels = len(u.LEVELS)
    own = [0.01 * (i - levels // 2) for i in range(levels)]  # -0.09 .. +0.09, 0 at the median
    error = {"n": 50, "quantiles": [0.05 * (i - levels // 2) for i in range(levels)]}  # five times wider
    iv = {"levels": list(u.LEVELS), "random": own, "blocked": None, "scale": 2.0}
    out = widen(iv, error)
    # own residuals scaled by 2 (-0.18 .. 0.18) against the transfer's (-0.45 .. 0.45): the transfer's wins
    assert out["random"] == pytest.approx(error["quantiles"]) and out["scale"] == 1.0 and out["blocked"] is None
    narrow = {"n": 50, "quantiles": [0.001 * (i - levels // 2) for i in range(levels)]}
    assert widen(iv, narrow)["random"] == pytest.approx([2 * v for v in own])  # the fit's own, scaled, wins
    assert widen(iv, None) is iv and widen(None, error) is None


@pytest.fixture(scope="module")
def bench_transfer():
    """benchmarks/bench_transfer.py, the script that writes the shipped transfer error model."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_transfer.py"
    spec = importlib.util.spec_from_file_location("bench_transfer", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(target: str, residuals, source: str = "h200_sxm") -> dict:
    return {"op": "q_absorb", "crossing": "sm90>sm100", "dtype": "bf16", "other": False, "kernel": "k",
            "pair": f"{source}>{target}:sglang", "gpus": (source, target),
            "log_residual": np.asarray(residuals, dtype=np.float64)}  # fmt: skip


def test_the_error_model_holds_how_far_one_targets_median_lies_from_the_others(bench_transfer, monkeypatch):
    # 20 errors of 0 on one Blackwell GPU, 20 of 0.4 on the other: the median taken out is 0.2.
    # Each target about the other's median: -0.4 and +0.4, plus 0.2: -0.2 and 0.6 (by hand), where
    # the pooled errors (0 and 0.4) would leave a new GPU 0.2 off either way inside the 10-90% range
    records = [_record("b200_sxm", [0.0] * 20), _record("gb200", [0.4] * 20)]
    entry = bench_transfer.error_model(records)["q_absorb/sm90>sm100"]
    q = dict(zip(u.LEVELS, entry["quantiles"]))
    assert entry["shift"] == pytest.approx(0.2) and entry["n"] == 40
    assert (q[0.1], q[0.5], q[0.9]) == pytest.approx((-0.2, 0.2, 0.6))
    monkeypatch.setattr(bench_transfer, "POOLED", [True])  # --pooled: the errors as they are
    q = dict(zip(u.LEVELS, bench_transfer.error_model(records)["q_absorb/sm90>sm100"]["quantiles"]))
    assert (q[0.1], q[0.9]) == pytest.approx((0.0, 0.4))


def test_an_error_key_with_one_target_keeps_its_errors_as_pooled(bench_transfer):
    # two sources, one target: nothing to hold the target against, the 40 errors as measured
    records = [_record("b200_sxm", [0.0] * 20), _record("b200_sxm", [0.4] * 20, source="h100_sxm")]
    entry = bench_transfer.error_model(records)["q_absorb/sm90>sm100"]
    q = dict(zip(u.LEVELS, entry["quantiles"]))
    assert entry["shift"] == pytest.approx(0.2) and len(entry["pairs"]) == 2
    assert (q[0.1], q[0.9]) == pytest.approx((0.0, 0.4))


def test_target_shifts_are_each_target_gpus_median_error(bench_transfer):
    # two pairs into the B200 (errors 0.1 and 0.3: median 0.2 of the 40) and one into the GB200
    records = [_record("b200_sxm", [0.1] * 20), _record("b200_sxm", [0.3] * 20, source="h100_sxm")]
    records.append(_record("gb200", [0.5] * 10))
    assert bench_transfer.target_shifts(records) == {"q_absorb": {"sm90>sm100": {"b200_sxm": 0.2, "gb200": 0.5}}}


def test_transfer_refuses_its_own_gpu_and_a_transferred_calibration(target):
    cal = store.validate(calibration([DECODE]), "hand")
    with pytest.raises(Exception, match="fitted on h200 already"):
        transfer(cal, hardware.from_name("h200"), hardware.from_name("h200"))
    moved = carried([DECODE], target)
    with pytest.raises(Exception, match="is itself transferred"):
        transfer(moved, target, hardware.from_name("b200"))


def test_a_bad_transfer_record_is_one_line():
    data = calibration([DECODE])
    data["transfer"] = {"from": {"hardware": ""}, "to": "b200"}
    with pytest.raises(Exception, match="transfer.from.hardware"):
        store.validate(data, "bad")


# -- the CLI ---------------------------------------------------------------------------------------


def fixture_calibration(name="fx"):
    run("calibrate", "--from", "aiconfigurator", "--system", "h200_sxm", "--framework", "sglang",
        "--data-dir", FIXTURE, "--name", name, "--terms", "fixed,pad,waves,split,kvpad,serial,fa3split")  # fmt: skip
    return name


@pytest.mark.slow
def test_calibrate_transfer_and_every_consumer_take_it_for_the_target(home, tmp_path):
    name = fixture_calibration()
    out = json.loads(run("calibrate", "transfer", name, "--hardware", "b300", "-f", "json").stdout)
    assert out["calibration"]["name"] == "b300-from-fx" and out["calibration"]["hardware"] == "b300"
    att = [f for f in out["fits"] if f["op"] == "absorb_attention"]
    assert att and all(f["transfer"]["dropped"] == ["fa3split"] for f in att)
    assert "trtllm_mla" in run("calibrate", "transfer", name, "--hardware", "b300", "--name", "again").stdout
    moved = "b300-from-fx"
    for args in (
        ("analyze", "--new", "1,256", "--prefix", "0,32K"),
        ("crossover", "--prefix", "0,4K"),
        ("engines", "--new", "1,256", "--prefix", "0,32K"),
    ):
        result = run(*args, "--calibration", moved)
        assert "are transferred: fitted on h200 (fx), carried to b300's ceilings" in result.output, args
        assert "hardware b300: calibration b300-from-fx was transferred to it from h200" in result.output, args
        data = json.loads(run(*args, "--calibration", moved, "-f", "json").stdout)
        assert "'transferred': {'from': 'h200', 'calibration': 'fx', 'to': 'b300'}" in str(data), args
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,1000,10\n0.1,2000,5\n")
    result = run("replay", trace, "--calibration", moved)
    assert "are transferred: fitted on h200 (fx)" in result.output
    replayed = json.loads(run("replay", trace, "--calibration", moved, "-f", "json").stdout)
    assert replayed["calibration"]["transferred"] == {"from": "h200", "calibration": "fx", "to": "b300"}
    result = run("plot", "crossover", "--calibration", moved, "--prefix", "0", "--output", tmp_path / "c.png")
    assert "are transferred" in result.output and (tmp_path / "c.png").stat().st_size > 0
    # on another GPU: one line that names the transfer command from the calibration fitted
    line = error_line_w(run("analyze", "--calibration", moved, "--hardware", "b200", ok=False))
    assert "carried by transfer to hardware 'b300', not 'b200'" in line
    assert "`mlactl calibrate transfer fx --hardware b200`" in line
    # on the GPU it was fitted on there is nothing to carry: the line names the calibration fitted
    line = error_line_w(run("analyze", "--calibration", moved, "--hardware", "h200", ok=False))
    assert line.endswith("or use the one it was carried from, --calibration fx") and "transfer fx" not in line


def test_calibrate_transfer_bad_input_is_one_error_line(home):
    assert "needs --hardware" in error_line_w(run("calibrate", "transfer", "nope", ok=False))
    assert "no calibration named 'nope'" in error_line_w(run("calibrate", "transfer", "nope", "-g", "b200", ok=False))
    store.write(calibration([DECODE]))
    assert "fitted on h200 already" in error_line_w(run("calibrate", "transfer", "hand", "-g", "h200", ok=False))
    assert "unknown hardware" in error_line_w(run("calibrate", "transfer", "hand", "-g", "tpu", ok=False))


def write_csv(path: Path, rows, header="op,batch,new,prefix,time_s") -> Path:
    path.write_text(header + "\n" + "".join(",".join(str(v) for v in r) + "\n" for r in rows))
    return path


def test_score_refuses_the_wrong_ceilings_and_scores_a_transferred_calibration_at_the_target(home, tmp_path):
    store.write(calibration([DECODE]))
    # aiconfigurator's tables of a B200 (the fixture laid out as b200_sxm) with an H200 calibration
    data = tmp_path / "ac"
    shutil.copytree(FIXTURE / "h200_sxm", data / "b200_sxm")
    args = ("calibrate", "score", "--calibration", "hand", "--from", "aiconfigurator", "--system", "b200_sxm",
            "--framework", "sglang", "--data-dir", data)  # fmt: skip
    line = error_line_w(run(*args, ok=False))
    assert "was fitted on h200, and b200_sxm/sglang was measured on b200" in line
    assert "`mlactl calibrate transfer hand --hardware b200`" in line
    # a CSV measured on a B200: --hardware says so, and is refused the same way
    rows = [("absorb_attention", 4, 1, 8191, 1.0)]
    csv = write_csv(tmp_path / "m.csv", rows)
    line = error_line_w(
        run("calibrate", "score", "--calibration", "hand", "--from", "csv", csv, "-g", "b200", ok=False)
    )
    assert "calibrate transfer hand --hardware b200" in line
    # transferred, and scored on the GPU it was carried from: the calibration to score is its source
    run("calibrate", "transfer", "hand", "--hardware", "b200")
    args = ("calibrate", "score", "--calibration", "b200-from-hand", "--from", "aiconfigurator", "--system",
            "h200_sxm", "--framework", "sglang", "--data-dir", FIXTURE)  # fmt: skip
    line = error_line_w(run(*args, ok=False))
    assert "was carried to b200, and h200_sxm/sglang was measured on h200" in line
    assert line.endswith("Score the calibration it was carried from instead: hand")
    # transferred to the B200, it scores there at the B200's ceilings: measured = 1.1 x the fit's time
    # at 2.25 PFLOP/s and 8 TB/s (5 us + 9.1268e9 / (0.5 * 2.25e15) = 13.112 us): error 1 - 1/1.1
    run("calibrate", "transfer", "hand", "--hardware", "b200")
    # times the factor the shipped transfer error model took its median out with (recorded in the fit)
    factor = store.resolve("b200-from-hand").fits[0].transfer["factor"]
    t = factor * (5e-6 + 9_126_805_504 / (0.5 * 2250e12))
    write_csv(csv, [("absorb_attention", 4, 1, 8191, 1.1 * t)])
    out = run("calibrate", "score", "--calibration", "b200-from-hand", "--from", "csv", csv, "-g", "b200", "-f", "json")
    s = json.loads(out.stdout)["scores"][0]
    # (the factor is recorded to 6 significant digits)
    assert s["median"] == pytest.approx(1 - 1 / 1.1, rel=1e-5) and s["bias"] == pytest.approx(1 / 1.1 - 1, rel=1e-5)
    assert json.loads(out.stdout)["calibration"]["transferred"]["from"] == "h200"


def test_score_never_uses_another_dtypes_fit(home, tmp_path):
    store.write(calibration([dict(GEMM, dtype="fp8")]))
    rows = [("kv_expand", 1, 64, 0, 1e-5, "sglang_flashinfer_cutedsl_nvfp4", "nvfp4"),
            ("kv_expand", 1, 128, 0, 2e-5, "sglang_flashinfer_cutedsl_nvfp4", "nvfp4")]  # fmt: skip
    csv = write_csv(tmp_path / "n.csv", rows, "op,batch,new,prefix,time_s,source,dtype")
    out = run("calibrate", "score", "--calibration", "hand", "--from", "csv", csv, "-f", "json")
    s = json.loads(out.stdout)["scores"][0]
    assert s["dtype"] == "nvfp4" and s["fit"] is None and s["median"] is None
    assert s["note"] == "no nvfp4 fit of kv_expand (the calibration's are fp8)"
    table = run("calibrate", "score", "--calibration", "hand", "--from", "csv", csv).stdout
    assert "not covered" in table and "no nvfp4 fit of kv_expand" in table


def test_the_transfer_models_median_error_is_taken_out_exactly(target):
    # a model whose median log error says the H200 fit runs exp(0.25) = 1.284x slower on the target:
    # every time in seconds x1.284 and every efficiency /1.284 make the predicted time 1.284x, exactly
    levels = len(u.LEVELS)
    q = [0.25 + 0.02 * (i - levels // 2) for i in range(levels)]
    errors = {
        "absorb_attention/sm90>?": {"n": 100, "pairs": ["a", "b"], "quantiles": q, "shift": 0.25},
        "*/sm90>?": {"n": 900, "pairs": ["a", "b", "c"], "quantiles": [0.0] * levels, "shift": 0.0},
    }
    fit = dict(DECODE, interval={"levels": list(u.LEVELS), "random": [0.0] * levels, "blocked": None, "scale": 1.0})
    moved = transfer_fit(fit, "sglang", hardware.from_name("h200"), target, errors=errors)
    assert (
        moved["transfer"]["error"]["key"] == "absorb_attention/sm90>?"
    )  # h200 (sm90) to a GPU of no known architecture
    assert moved["transfer"]["factor"] == pytest.approx(np.exp(0.25), rel=1e-6)
    assert moved["params"] == pytest.approx({"t_fixed_s": 5e-6 * np.exp(0.25), "eta_c": 0.5 / np.exp(0.25),
                                             "eta_m": 0.8 / np.exp(0.25)})  # fmt: skip
    # the residuals re-centred on the corrected time: the transfer's quantiles less 0.25
    assert moved["interval"]["random"] == pytest.approx([v - 0.25 for v in q], abs=1e-6)
    cost = CostModel(from_name("deepseek-v3"))
    cal = store.validate(dict(calibration([DECODE]), fits=[moved], hardware="handmade",
                              ceilings={"peak_flops": T_PEAK, "bandwidth_bytes_per_s": T_BW, "sm_count": T_SMS,
                                        "dtype": "bf16"}), "moved")  # fmt: skip
    t = op_seconds(cost, target, cal, "absorb_attention", np.array([4.0]), np.array([1.0]), np.array([8191.0]))
    assert t[0] == pytest.approx(np.exp(0.25) * (5e-6 + 9_126_805_504 / (0.5 * T_PEAK)))
    # one pair only: not enough for its own key; the pooled one (shift 0) is used
    errors["absorb_attention/sm90>?"]["pairs"] = ["a"]
    moved = transfer_fit(fit, "sglang", hardware.from_name("h200"), target, errors=errors)
    assert moved["transfer"]["error"]["key"] == "*/sm90>?" and moved["transfer"]["factor"] == 1.0


def test_a_correction_never_takes_an_efficiency_past_its_limit():
    # shift log(0.5): times halved would need eta_m 0.8 / 0.5 = 1.6 > 1.2 (store.ETA_PHYSICAL for bf16);
    # held at 0.8 / 1.2 = 0.667, which puts eta_m at the limit exactly
    assert bias_factor([DECODE], float(np.log(0.5)), "bf16") == pytest.approx(0.8 / 1.2)
    assert bias_factor([DECODE], float(np.log(2.0)), "bf16") == pytest.approx(2.0)
    assert scaled(DECODE, 2.0)["params"] == {"t_fixed_s": 1e-5, "eta_c": 0.25, "eta_m": 0.4}


def test_the_same_default_backend_on_both_gpus_keeps_the_measured_kernel():
    # B200 -> B300: SGLang runs trtllm_mla on both (sm100), so its fit keeps the fa3split it selected
    fit = dict(FA3, source="sglang-0.5.14:trtllm_mla:decode")
    moved = transfer_fit(fit, "sglang", hardware.from_name("b200"), hardware.from_name("b300"), errors={})
    assert moved["transfer"]["dropped"] == [] and moved["transfer"]["kernel"]["target"] == "trtllm_mla"
    # a DSA model's sparse attention: SGLang's dsa backend on Hopper and Blackwell alike
    sparse = {"op": "sparse_attention", "source": "sglang-0.5.14:flash_mla_sparse_fwd", "dtype": "bf16",
              "terms": ["fixed"], "params": {"t_fixed_s": 1e-5, "eta_c": 0.5, "eta_m": 0.5}}  # fmt: skip
    moved = transfer_fit(sparse, "sglang", hardware.from_name("h200"), hardware.from_name("b300"), errors={})
    assert moved["transfer"]["kernel"]["target"] == "flash_mla_sparse_fwd"
    assert "dsa on h200 and b300" in moved["transfer"]["kernel"]["decided"]


def test_an_fp8_cache_fit_on_a_kernel_the_target_does_not_run_takes_the_bf16_fit():
    bf16 = dict(DECODE)  # flash_attention decode, bf16 cache: t_fixed 5 us, eta_c 0.5, eta_m 0.8
    cal = store.validate(calibration([FA3, bf16]), "hand")
    on_b200 = transfer(cal, hardware.from_name("h200"), hardware.from_name("b200"), errors={})
    fp8 = next(f for f in on_b200["fits"] if f["dtype"] == "fp8")
    assert fp8["terms"] == ["fixed"] and fp8["params"] == {"t_fixed_s": 5e-6, "eta_c": 0.5, "eta_m": 0.8}
    assert fp8["transfer"]["fallback"] == "bf16 fit" and fp8["source"] == FA3["source"]
    # a bf16 fit with a key-block step walks the fp8 cache's blocks, half the bytes: half the step
    stepped = dict(bf16, terms=["fixed", "kvpad", "serial"], params=dict(bf16["params"], t_iter_s=2e-6))
    cal = store.validate(calibration([FA3, stepped]), "hand")
    on_b200 = transfer(cal, hardware.from_name("h200"), hardware.from_name("b200"), errors={})
    fp8 = next(f for f in on_b200["fits"] if f["dtype"] == "fp8")
    assert fp8["params"]["t_iter_s"] == pytest.approx(1e-6)
    assert fp8["transfer"]["adapted"] == ["fp8 cache blocks, step x0.50"]
    assert next(f for f in on_b200["fits"] if f["dtype"] == "bf16")["params"]["t_iter_s"] == 2e-6
    # on an H100 SGLang runs FA3 too: the fp8 fit itself, every term with it
    on_h100 = transfer(cal, hardware.from_name("h200"), hardware.from_name("h100-sxm"), errors={})
    fp8 = next(f for f in on_h100["fits"] if f["dtype"] == "fp8")
    assert fp8["terms"] == FA3["terms"] and fp8["transfer"]["fallback"] is None


@pytest.mark.slow
def test_plot_transfer_draws_a_transferred_calibration_on_its_gpus_tables(home, tmp_path):
    name = fixture_calibration()
    data = tmp_path / "ac"
    shutil.copytree(FIXTURE / "h200_sxm", data / "b200_sxm")  # the fixture's tables, read as a B200's
    args = ("--system", "b200_sxm", "--framework", "sglang", "--data-dir", data)
    line = error_line_w(run("plot", "transfer", "--calibration", name, *args, "-o", tmp_path / "x.png", ok=False))
    assert "calibrate transfer fx --hardware b200" in line and not (tmp_path / "x.png").exists()
    run("calibrate", "transfer", name, "--hardware", "b200")
    out = run("plot", "transfer", "--calibration", "b200-from-fx", *args, "-o", tmp_path / "t.png")
    assert "Wrote" in out.output and (tmp_path / "t.png").stat().st_size > 10_000


def test_score_panels_pool_each_op_class_with_the_roofline_beside_it(target):
    # one decode point measured at 1.1 x the carried fit's time; the roofline at the target's ceilings
    from mlactl.decide.calibration.model import Points
    from mlactl.decide.calibration.score import panels

    moved = carried([DECODE], target)
    t = 5e-6 + 9_126_805_504 / (0.5 * T_PEAK)
    pts = Points("absorb_attention", np.array([9_126_805_504.0]), np.array([38_862_848.0]), np.array([4.0]),
                 np.array([1.0]), np.array([8192.0]), np.array([128.0]), np.array([512.0]),
                 np.array([4 * 8192 * 576 * 2.0]), time_s=np.array([1.1 * t]))  # fmt: skip
    (p,) = panels(moved, {("absorb_attention", "sglang-0.5.14:flash_attention:decode", "bf16"): pts})
    assert p["op"] == "absorb_attention" and p["n"] == 1 and p["median"] == pytest.approx(1 - 1 / 1.1)
    # roofline: max(9.1268e9 / 2e15 = 4.5634 us, 38,862,848 / 8e12 = 4.8579 us), the bytes', against
    # 1.1 x 14.1268 us measured
    assert p["roofline_s"][0] == pytest.approx(38_862_848 / T_BW)
    assert p["roofline_median"] == pytest.approx(1 - (38_862_848 / T_BW) / (1.1 * t))
