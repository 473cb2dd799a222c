"""The model's weights (mlactl/model/weights.py): the presets against their published parameter
counts, and a Hugging Face config.json read."""

from __future__ import annotations

import json

import pytest

from mlactl.model import weights as weights_mod
from mlactl.model.config import from_name
from mlactl.model.cost import WeightCost


@pytest.mark.parametrize(
    "name, hidden, layers, vocab, inter, moe_inter, experts, shared, top_k, dense, dtype, billions",
    [
        # config.json of deepseek-ai/DeepSeek-V3: 671B parameters (the paper's; MTP apart)
        pytest.param("deepseek-v3", 7168, 61, 129280, 18432, 2048, 256, 1, 8, 3, "fp8", 671.0, id="v3"),
        # DeepSeek-V3.2-Exp inference/config_671B_v3.2.json: V3's weights and the indexer (0.85B)
        pytest.param("deepseek-v3.2", 7168, 61, 129280, 18432, 2048, 256, 1, 8, 3, "fp8", 671.9, id="v3.2"),
        # deepseek-ai/DeepSeek-V2: 236B; DeepSeek-V2-Lite 15.7B
        pytest.param("deepseek-v2", 5120, 60, 102400, 12288, 1536, 160, 2, 6, 1, "bf16", 236, id="v2"),
        pytest.param("deepseek-v2-lite", 2048, 27, 102400, 10944, 1408, 64, 2, 6, 1, "bf16", 15.7, id="v2-lite"),
        # moonshotai/Kimi-K2-Instruct: "1 trillion total parameters" (rounded: within 3%)
        pytest.param("kimi-k2", 7168, 61, 163840, 18432, 2048, 384, 1, 8, 1, "fp8", 1000, id="k2"),
    ],
)
def test_presets_match_public_configs(
    name, hidden, layers, vocab, inter, moe_inter, experts, shared, top_k, dense, dtype, billions
):
    w = weights_mod.from_name(name)
    assert (w.hidden, w.layers, w.vocab, w.intermediate, w.moe_intermediate) == (
        hidden,
        layers,
        vocab,
        inter,
        moe_inter,
    )
    assert (w.experts, w.shared_experts, w.top_k, w.first_dense, w.dtype) == (experts, shared, top_k, dense, dtype)
    total = WeightCost(from_name(name), w).total_params / 1e9
    assert total == pytest.approx(billions, rel=0.03 if name == "kimi-k2" else 0.01)


def test_weights_from_a_config_json(tmp_path):
    cfg = {
        "hidden_size": 1024, "num_hidden_layers": 4, "vocab_size": 5000, "intermediate_size": 4096,
        "moe_intermediate_size": 256, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "moe_layer_freq": 2, "quantization_config": {"quant_method": "fp8"},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w = weights_mod.resolve(str(tmp_path / "config.json"))
    assert w.dtype == "fp8" and w.moe_layers == 1 and w.dense_layers == 3  # layer 2 only: >= 1 and even
    assert weights_mod.resolve(str(tmp_path / "config.json"), "bf16").dtype == "bf16"
    del cfg["n_routed_experts"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert weights_mod.resolve(str(tmp_path)).moe_layers == 0  # dense
