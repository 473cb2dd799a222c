"""Path policies (mlactl/decide/policy.py): an engine's judges each point as a batch; the measured
one takes the nearest measured prefix, finds what tune wrote on a CPU again (in analyze and in
the kernels' auto policy) and lets the roofline choose outside the prefixes measured, saying so;
the roofline's is analyze's best; auto's on a profiled GPU."""

import json

import numpy as np
import pytest
from conftest import SMALL, cpu_results, runner

from mlactl.cli import app
from mlactl.decide import analysis
from mlactl.decide.policy import AutoPolicy, measured_paths, select_paths
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel
from mlactl.results import store as results
from mlactl.util.errors import MlactlError

V3 = model.from_name("deepseek-v3")


def test_engine_policy_judges_each_point_as_a_batch():
    """select_paths with an engine: 64 requests of 256 cached tokens sum to 16,384 >= 8192, so
    SGLang 0.5.14 expands the whole batch; one such request alone (256 < 8192) absorbs. vLLM
    (no hardware: the sm90 default, FLASH_ATTN_MLA for a bf16 cache) decodes up to 512 tokens."""
    cost = CostModel(V3)
    assert list(select_paths(cost, None, [512], [256], batch=64, policy="sglang@0.5.14")) == ["expand"]
    assert list(select_paths(cost, None, [512], [256], batch=1, policy="sglang@0.5.14")) == ["absorb"]
    assert list(select_paths(cost, None, [512, 513], [256, 256], policy="vllm")) == ["absorb", "expand_chunked"]


def test_measured_paths_nearest_prefix():
    crossovers = {0: 1, 4096: 180, 32768: None}  # None: expand never won within what was measured
    got = measured_paths(crossovers, prefix=[0, 3000, 5000, 40000, 40000], new=[1, 179, 180, 4096, 1])
    assert list(got) == ["expand", "absorb", "expand", "absorb", "absorb"]
    with pytest.raises(MlactlError, match="run `mlactl tune paths` first"):
        measured_paths({}, [0], [1])


def test_roofline_policy_is_analyze_best():
    hw = hardware.from_name("h200")
    cost = CostModel(V3)
    new = np.array([1, 64, 171, 512, 1, 4096])
    prefix = np.array([0, 4096, 4096, 4096, 32768, 32768])
    chosen = select_paths(cost, hw, new, prefix, policy="roofline")
    result = analysis.analyze(V3, hw, np.ones_like(new), new, prefix)
    assert list(chosen) == list(result.best)
    by_flops = select_paths(cost, None, new, prefix, policy="flops")
    assert list(by_flops) == list(result.best_by_flops)


def test_auto_policy_roofline_on_a_profiled_gpu(tmp_path):
    policy = AutoPolicy(CostModel(V3.with_tp(8)), "NVIDIA H200", results_folder=tmp_path)
    assert policy.kind == "roofline" and "h200" in policy.source
    assert list(policy([1, 4096], [32768, 0])) == ["absorb", "expand"]
    unknown = AutoPolicy(CostModel(V3), "Some Accelerator", results_folder=tmp_path)
    assert unknown.kind == "flops"


def test_unknown_policy():
    with pytest.raises(MlactlError, match="unknown policy"):
        select_paths(CostModel(V3), None, [1], [0], policy="random")


# -- the measured policy on what tune wrote on a CPU -----------------------------------------------


@pytest.fixture
def cpu_run(tmp_path, home):
    """A real `mlactl tune paths --backend torch` on this CPU (a few seconds)."""
    config = tmp_path / "small-mla.json"
    config.write_text(json.dumps(SMALL))
    args = ["tune", "paths", "--backend", "torch", "--model", str(config), "--new", "1,64", "--prefix", "0"]
    out = runner.invoke(app, args + ["--budget", "600", "--repeats", "0"])
    assert out.exit_code == 0, out.output
    (path,) = (home / "results" / "cpu").glob("*.json")
    return str(config), path


def test_measured_policy_finds_cpu_results(cpu_run):
    config, path = cpu_run
    data = results.load(path)
    assert data["device"]["hardware"] is None and data["kv_dtype"] == "fp32"  # what the lookup used to miss
    assert data["crossovers"][0]["measured_status"] in ("found", "never")
    out = runner.invoke(app, ["analyze", "--model", config, "--policy", "measured", "--new", "1,64", "--prefix", "0"])
    assert out.exit_code == 0, out.output
    assert str(path) in out.output.replace("\n", "")
    assert "kv fp32" in out.output  # the file's cache dtype was taken, and it says so


def test_auto_policy_finds_cpu_results(cpu_run):
    from mlactl.kernels import attention

    config, path = cpu_run
    attention._auto_policy.cache_clear()
    # what mla_attention(path="auto") asks for fp32 tensors on a CPU
    policy = attention._auto_policy("cpu", 4, 128, 16, 16, 16, "fp32", "fp32")
    assert policy.kind == "measured" and str(path) in policy.source
    attention._auto_policy.cache_clear()


def test_measured_policy_outside_what_was_measured_falls_back_and_says_so(tmp_path, home):
    """A quick CPU tune measured prefix 0 only (crossover 16: expand from 16 new tokens). At 64 new
    tokens after a 512-token prefix its crossover was applied anyway (expand, losing what absorb
    would not); it covers prefixes 0 and 1 only now, and elsewhere the roofline chooses, as the
    roofline policy does, with one note saying so."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cpu_results()))
    args = ["analyze", "--policy", "measured", "--results", str(path), "--new", "64", "--prefix", "0,1,512,32K"]
    out = runner.invoke(app, [*args, "-f", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    measured = {row["prefix"]: row["policy"]["path"] for row in data["rows"]}
    roofline = runner.invoke(app, [*args[:1], "--policy", "roofline", *args[5:], "--model", "teaching", "--tp", "8",
                                   "--dtype", "fp32", "--kv-dtype", "fp32", "-f", "json"])  # fmt: skip
    assert roofline.exit_code == 0, roofline.output
    rl = {row["prefix"]: row["policy"]["path"] for row in json.loads(roofline.stdout)["rows"]}
    assert measured[0] == measured[1] == "expand"  # measured: 64 >= 16
    assert measured[512] == rl[512] == "absorb" and measured[32768] == rl[32768]  # was expand
    assert any(
        "2 point(s) lie outside the prefixes measured (0): the roofline chooses there" in n for n in data["notes"]
    )
