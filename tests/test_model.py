import json

import pytest

from mlactl.model import config as model
from mlactl.util.errors import MlactlError


@pytest.mark.parametrize(
    "name, fields",
    [
        ("deepseek-v3", (7168, 128, 1536, 512, 128, 64, 128, 61)),
        ("deepseek-r1", (7168, 128, 1536, 512, 128, 64, 128, 61)),
        ("deepseek-v2", (5120, 128, 1536, 512, 128, 64, 128, 60)),
        ("deepseek-v2-lite", (2048, 16, None, 512, 128, 64, 128, 27)),
        ("kimi-k2", (7168, 64, 1536, 512, 128, 64, 128, 61)),
        ("teaching", (4096, 32, 1024, 512, 128, 64, 128, 1)),
    ],
)
def test_presets_match_public_configs(name, fields):
    cfg = model.from_name(name)
    assert (cfg.hidden, cfg.H, cfg.q_lora_rank, cfg.r, cfg.dC, cfg.dR, cfg.dV, cfg.layers) == fields


def test_softmax_scale_is_the_models():
    assert model.from_name("deepseek-v3").softmax_scale == pytest.approx(1 / 192**0.5)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(MlactlError, match="unknown model 'gpt-4'.*deepseek-v3.*kimi-k2"):
        model.from_name("gpt-4")


def test_tp():
    assert model.from_name("deepseek-v3").with_tp(8).H == 16
    with pytest.raises(MlactlError, match="--tp 3 does not divide the 128 heads"):
        model.from_name("deepseek-v3").with_tp(3)
    with pytest.raises(MlactlError, match="positive integer"):
        model.from_name("deepseek-v3").with_tp(0)


HF_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_hidden_layers": 61,
    "vocab_size": 129280,
}


def test_hf_config_loader(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_V3))
    cfg = model.resolve(str(path))
    preset = model.from_name("deepseek-v3")
    assert (cfg.hidden, cfg.H, cfg.q_lora_rank, cfg.r, cfg.dC, cfg.dR, cfg.dV, cfg.layers) == (
        preset.hidden,
        preset.H,
        preset.q_lora_rank,
        preset.r,
        preset.dC,
        preset.dR,
        preset.dV,
        preset.layers,
    )
    assert model.resolve(str(tmp_path)).r == 512  # a model folder works too


def test_hf_config_null_q_lora_rank(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(HF_V3, q_lora_rank=None)))
    assert model.from_hf_config(path).q_lora_rank is None


def test_hf_config_not_mla_names_missing_fields(tmp_path):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32}))
    with pytest.raises(
        MlactlError,
        match="not an MLA model config: missing kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
    ):
        model.resolve(str(path))


def test_hf_config_malformed_json_says_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n "hidden_size": 7168,\n "kv_lora_rank": ,\n}')
    with pytest.raises(MlactlError, match=r"config.json: line 3: not valid JSON"):
        model.resolve(str(path))


def test_hf_config_bad_value(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(HF_V3, kv_lora_rank=0)))
    with pytest.raises(MlactlError, match="kv_lora_rank must be a positive integer, got 0"):
        model.resolve(str(path))


def test_missing_file():
    with pytest.raises(MlactlError, match="cannot read model config"):
        model.resolve("/nonexistent/config.json")
