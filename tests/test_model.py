import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlactl.model import config
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


# -- bounds on every dimension ---------------------------------------------------------------------

V32 = {
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_hidden_layers": 61,
    "index_topk": 2048,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "max_position_embeddings": 163840,
}  # fmt: skip  (deepseek-ai/DeepSeek-V3.2-Exp config.json)
FIELD_OF = {**config.HF_FIELDS, **config.DSA_HF_FIELDS}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("index_topk", 0, "index_topk must be a positive integer, got 0"),
        ("index_topk", -1, "index_topk must be a positive integer, got -1"),
        ("index_topk", 200_000, "index_topk 200000 is above 163,840, the model's context"),
        ("index_topk", None, "but not index_topk"),
        ("index_n_heads", 10**9, "index_n_heads 1000000000 is above 4,096"),
        ("index_head_dim", True, "index_head_dim must be a positive integer, got True"),
        ("v_head_dim", 1 << 20, "v_head_dim 1048576 is above 4,096, more than any real model has"),
        ("num_hidden_layers", 10**30, "is above 4,096"),
        ("max_position_embeddings", 0, "max_position_embeddings must be a positive integer"),
    ],
)
def test_config_dimensions_are_bounded(tmp_path, field, value, message):
    data = dict(V32, **{field: value})
    if value is None:
        del data[field]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MlactlError, match=re.escape(message)):
        config.from_hf_config(path)


DIM_VALUE = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 4096, 4097, 1 << 17, 163840, True, None, "64", 1.5])
)


@settings(deadline=None)
@given(changes=st.dictionaries(st.sampled_from(sorted(V32)), DIM_VALUE, max_size=4))
def test_guard_every_dimension_is_held_to_its_bound(tmp_path_factory, changes):
    """Whatever a config holds, it loads with every dimension from 1 to its bound (index_topk to
    the model's context), or is one line naming the field."""
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps({k: v for k, v in dict(V32, **changes).items() if v is not None}))
    try:
        cfg = config.from_hf_config(path)
    except MlactlError as exc:
        assert "\n" not in str(exc) and any(f in str(exc) for f in [*V32, "MLA model config"]), str(exc)
        return
    for key, most in config.DIM_MAX.items():
        value = getattr(cfg, key)
        assert value is None or 1 <= value <= most, (key, value)
    if cfg.is_dsa:
        assert 1 <= cfg.topk <= (cfg.max_context or config.MAX_CONTEXT)


def test_a_prompt_beyond_the_context_is_warned_about_once(tmp_path):
    """DeepSeek-V3 serves 163,840 tokens (max_position_embeddings); a 200K prompt is costed and
    told; one within it says nothing."""
    from typer.testing import CliRunner

    from mlactl.cli import app

    runner = CliRunner()
    long = runner.invoke(app, ["analyze", "--new", "1", "--prefix", "0,200K", "-f", "json"])
    assert long.exit_code == 0
    warnings_ = [line for line in long.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings_ == [
        "Warning: 1 shape(s) have a context of up to 204,801 tokens, beyond the 163,840 that deepseek-v3 "
        "serves (max_position_embeddings): they are costed as asked"
    ]
    short = runner.invoke(app, ["analyze", "--new", "1", "--prefix", "163839", "-f", "json"])
    assert short.exit_code == 0 and "Warning" not in short.stderr
    requests = tmp_path / "r.csv"
    requests.write_text("new,prefix\n1,200000\n")
    assert "beyond the 163,840" in runner.invoke(app, ["batch", str(requests), "-f", "json"]).stderr


def test_the_attention_kind_is_asked_of_the_model():
    """What the layers above ask instead of testing for DSA, pinned by hand for each kind."""
    from mlactl.model.cost import CostModel

    v3, v32 = model.from_name("deepseek-v3"), model.from_name("deepseek-v3.2")
    assert (v3.attention, v32.attention) == ("MLA", "DSA")
    assert v3.attention_note() is None and v3.index_dims() is None
    assert v32.index_dims() == "2048/64/128"  # index_topk, index_n_heads, index_head_dim of DeepSeek-V3.2
    assert "top-2048 sparse attention with a 64-head indexer" in v32.attention_note()
    assert v3.measurable and not v32.measurable  # tune paths runs the MLA kernels only
    mla, dsa = CostModel(v3), CostModel(v32)
    assert mla.strategies == ("per_request", "all_expand", "all_expand_chunked", "all_absorb")
    assert dsa.strategies == ("per_request", "all_sparse_absorb", "all_masked_expand", "all_dense_expand")
    assert (mla.restricted, dsa.restricted) == ((), ("dense_expand",))
    assert (mla.windows, dsa.windows) == (False, True)
