"""The rest of an MLA model: the weights a step reads besides the attention paths' own.

MLAConfig holds the attention's dims (H, r, dC, dR, dV); ModelWeights the rest of the same
architecture, from the same config.json: the hidden size, the vocabulary, the dense MLP, the
mixture of experts (routed and shared experts, how many a token takes, which layers have them)
and the dtype the linear layers' weights are stored in. mlactl.model.cost turns them into FLOPs
and bytes (`WeightCost`); `mlactl replay` prices a step with them.

Which layers are MoE follows DeepSeek's modeling code (modeling_deepseek.py, and vLLM's
deepseek_v2.py): layer i has routed experts when n_routed_experts is set, i >=
first_k_dense_replace and i % moe_layer_freq == 0; every other layer has the dense MLP of
width intermediate_size. The presets' numbers are the models' public config.json values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from mlactl.model.config import ALIASES, read_hf_config
from mlactl.util.defaults import DTYPE_BYTES, WEIGHT_DTYPES
from mlactl.util.errors import MlactlError


@dataclass(frozen=True)
class ModelWeights:
    name: str
    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    vocab: int  # vocab_size: the embedding and the (untied) LM head
    intermediate: int  # intermediate_size: a dense layer's MLP width
    moe_intermediate: int = 0  # moe_intermediate_size: one expert's width
    experts: int = 0  # n_routed_experts (0: a dense model)
    shared_experts: int = 0  # n_shared_experts
    top_k: int = 0  # num_experts_per_tok: routed experts each token takes
    first_dense: int = 0  # first_k_dense_replace: leading layers with the dense MLP
    moe_freq: int = 1  # moe_layer_freq
    dtype: str = "bf16"  # the linear layers' weights (the embedding, LM head and router stay bf16)

    def __post_init__(self):
        if self.dtype not in WEIGHT_DTYPES:
            raise MlactlError(f"unknown weight dtype {self.dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
        if self.experts and not (0 < self.top_k <= self.experts):
            raise MlactlError(f"{self.name}: num_experts_per_tok must be between 1 and the {self.experts} experts")

    def is_moe(self, layer: int) -> bool:
        return bool(self.experts) and layer >= self.first_dense and layer % self.moe_freq == 0

    @cached_property
    def moe_layers(self) -> int:
        return sum(self.is_moe(i) for i in range(self.layers))

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def weight_bytes(self) -> int:
        """Bytes per element of the linear layers' weights."""
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS_WEIGHTS: dict[str, ModelWeights] = {
    # config.json of deepseek-ai/DeepSeek-V3 (and -R1): quantization_config fp8 e4m3, 128x128 blocks
    "deepseek-v3": ModelWeights("deepseek-v3", 7168, 61, 129280, 18432, 2048, 256, 1, 8, 3, 1, "fp8"),
    # deepseek-ai/DeepSeek-V3.2(-Exp): DeepSeek-V3's weights plus the indexer (WeightCost reads
    # it from the MLAConfig); inference/config_671B_v3.2.json, dtype fp8
    "deepseek-v3.2": ModelWeights("deepseek-v3.2", 7168, 61, 129280, 18432, 2048, 256, 1, 8, 3, 1, "fp8"),
    # deepseek-ai/DeepSeek-V2 and DeepSeek-V2-Lite: bf16
    "deepseek-v2": ModelWeights("deepseek-v2", 5120, 60, 102400, 12288, 1536, 160, 2, 6, 1, 1, "bf16"),
    "deepseek-v2-lite": ModelWeights("deepseek-v2-lite", 2048, 27, 102400, 10944, 1408, 64, 2, 6, 1, 1, "bf16"),
    # moonshotai/Kimi-K2-Instruct: fp8 blocks like DeepSeek-V3
    "kimi-k2": ModelWeights("kimi-k2", 7168, 61, 163840, 18432, 2048, 384, 1, 8, 1, 1, "fp8"),
    # round numbers, dense, for teaching and tests
    "teaching": ModelWeights("teaching", 4096, 1, 32768, 16384),
}

HF_REQUIRED = {"hidden": "hidden_size", "layers": "num_hidden_layers", "vocab": "vocab_size"}
HF_MOE = {
    "moe_intermediate": "moe_intermediate_size",
    "shared_experts": "n_shared_experts",
    "top_k": "num_experts_per_tok",
    "first_dense": "first_k_dense_replace",
    "moe_freq": "moe_layer_freq",
}


def from_name(name: str) -> ModelWeights:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in PRESETS_WEIGHTS:
        known = ", ".join(sorted(PRESETS_WEIGHTS))
        raise MlactlError(f"no weights known for model {name!r}; presets: {known} (or a config.json path)")
    return PRESETS_WEIGHTS[key]


def _count(data: dict, key: str, path, minimum: int = 0, default: int | None = None) -> int:
    value = data.get(key, default)
    if value is None and default is not None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MlactlError(f"{path}: {key} must be an integer of at least {minimum}, got {value!r}")
    return value


def from_hf_config(path: str | Path, dtype: str | None = None) -> ModelWeights:
    """The weights of a Hugging Face config.json (or a folder holding one): a dense model when it
    has no n_routed_experts; fp8 weights when its quantization_config says quant_method fp8."""
    path, data = read_hf_config(path)
    values: dict[str, Any] = {k: _count(data, hf, path, 1) for k, hf in HF_REQUIRED.items()}
    experts = data.get("n_routed_experts") or 0
    values["experts"] = _count({"n_routed_experts": experts}, "n_routed_experts", path)
    values["intermediate"] = _count(data, "intermediate_size", path, 0 if values["experts"] else 1, 0)
    if values["experts"]:
        values["moe_intermediate"] = _count(data, "moe_intermediate_size", path, 1)
        values["top_k"] = _count(data, "num_experts_per_tok", path, 1)
        values["shared_experts"] = _count(data, "n_shared_experts", path, 0, 0)
        values["first_dense"] = _count(data, "first_k_dense_replace", path, 0, 0)
        values["moe_freq"] = _count(data, "moe_layer_freq", path, 1, 1)
    quant = data.get("quantization_config")
    stored = "fp8" if isinstance(quant, dict) and quant.get("quant_method") == "fp8" else "bf16"
    name = data.get("_name_or_path") or data.get("model_type") or path.parent.name or "custom"
    return ModelWeights(name=str(name), dtype=dtype or stored, **values)


def resolve(spec: str, dtype: str | None = None) -> ModelWeights:
    """The weights of a preset name, or of a config.json / model folder (as config.resolve);
    `dtype` overrides the stored weight dtype."""
    looks_like_path = spec.endswith(".json") or "/" in spec or Path(spec).exists()
    if looks_like_path:
        return from_hf_config(spec, dtype)
    found = from_name(spec)
    return found if dtype is None else replace(found, dtype=dtype)
