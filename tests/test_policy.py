import numpy as np
import pytest

from mlactl.decide import analysis
from mlactl.decide.policy import AutoPolicy, measured_paths, select_paths
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel
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
