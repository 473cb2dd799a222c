"""MLA model shapes: one dataclass, a plain registry of presets, and a Hugging Face config loader.

Names follow docs/design.md ("The math"): H heads, r = kv_lora_rank, dC = qk_nope_head_dim,
dR = qk_rope_head_dim, dV = v_head_dim. A DeepSeek Sparse Attention (DSA) model, DeepSeek-V3.2,
adds three: topk = index_topk (tokens each query attends), Hi = index_n_heads and di =
index_head_dim (the lightning indexer's heads and their width); `is_dsa` says which kind a
config is. A Hugging Face config carrying all three index fields is DSA; one with some of them
is refused, naming what is missing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from mlactl.util import safe
from mlactl.util.errors import MlactlError
from mlactl.util.io import MAX_CONFIG_BYTES, read_json


class Index(NamedTuple):
    """A DSA model's indexer and selection, as plain ints (MLAConfig.index)."""

    topk: int  # tokens each query's sparse attention reads
    heads: int  # Hi, index heads (all of them on every GPU)
    dim: int  # di, width of an index head
    q_lora: int  # q_lora_rank: the query latent the indexer's wq_b projects


@dataclass(frozen=True)
class MLAConfig:
    name: str
    hidden: int  # hidden_size
    H: int  # attention heads (per GPU once tensor parallelism is applied)
    q_lora_rank: int | None  # None: queries come straight from the hidden state
    r: int  # kv_lora_rank: the latent each token caches
    dC: int  # qk_nope_head_dim
    dR: int  # qk_rope_head_dim: the RoPE key, one per token, shared by all heads
    dV: int  # v_head_dim
    layers: int  # num_hidden_layers
    tp: int = 1  # tensor-parallel degree already applied to H
    # DSA (DeepSeek-V3.2): None on a dense MLA model, all three set on a DSA one
    topk: int | None = None  # index_topk: tokens each query's sparse attention reads
    index_heads: int | None = None  # index_n_heads (Hi): replicated on every GPU, never split by --tp
    index_dim: int | None = None  # index_head_dim (di)
    # max_position_embeddings: the longest context the model serves (None: not known); a longer
    # one is warned about (model.shapes.check_context), not refused. Not part of the shape.
    max_context: int | None = field(default=None, compare=False)

    @property
    def is_dsa(self) -> bool:
        """DeepSeek Sparse Attention: a lightning indexer picks `topk` tokens per query."""
        return self.topk is not None

    @property
    def attention(self) -> str:
        """The kind of attention, as users read it: "DSA" or "MLA"."""
        return "DSA" if self.is_dsa else "MLA"

    @property
    def measurable(self) -> bool:
        """Whether `mlactl tune paths` measures this model's paths: it runs the MLA kernels, not
        DSA's sparse ones."""
        return not self.is_dsa

    def attention_note(self) -> str | None:
        """What a reader of this model's figures must know about its attention (None: nothing)."""
        if not self.is_dsa:
            return None
        return (
            f"DSA model: top-{self.topk} sparse attention with a {self.index_heads}-head indexer (replicated on "
            f"every GPU); dense_expand runs only where the context is at most {self.topk} tokens"
        )

    def index_dims(self) -> str | None:
        """The indexer's top-k, heads and width as `topk/Hi/di` (None: the model has no indexer)."""
        return f"{self.topk}/{self.index_heads}/{self.index_dim}" if self.is_dsa else None

    def index(self) -> Index:
        """The DSA fields; an error on a dense MLA model (or a DSA one missing any of them)."""
        if self.topk is None or self.index_heads is None or self.index_dim is None or self.q_lora_rank is None:
            raise MlactlError(f"{self.name} is not a DSA model: it has no indexer")
        return Index(self.topk, self.index_heads, self.index_dim, self.q_lora_rank)

    @property
    def softmax_scale(self) -> float:
        """The model's scale, 1/sqrt(dC + dR); the same on both paths."""
        return 1.0 / math.sqrt(self.dC + self.dR)

    def with_tp(self, tp: int) -> MLAConfig:
        """Heads per GPU under tensor parallelism; the latent cache is replicated, not split, and
        so is a DSA model's indexer (its projections are ReplicatedLinear in SGLang's
        nsa_indexer.py and plain Linear in DeepSeek's inference/model.py: every GPU runs all Hi
        index heads)."""
        if not isinstance(tp, int) or tp < 1:
            raise MlactlError(f"--tp must be a positive integer, got {tp!r}")
        if self.H % tp:
            raise MlactlError(f"--tp {tp} does not divide the {self.H} heads of {self.name}")
        return replace(self, H=self.H // tp, tp=self.tp * tp)

    def to_dict(self) -> dict:
        """The shape fields (what the JSON outputs record as `model`)."""
        out = asdict(self)
        out.pop("max_context")
        return out


PRESETS: dict[str, MLAConfig] = {
    # Public config.json facts of each model.
    # (max_position_embeddings: 163840 in deepseek-ai/DeepSeek-V3, -V2 and -V2-Lite config.json;
    # 131072 in moonshotai/Kimi-K2-Instruct config.json)
    "deepseek-v3": MLAConfig("deepseek-v3", 7168, 128, 1536, 512, 128, 64, 128, 61, max_context=163840),
    "deepseek-v2": MLAConfig("deepseek-v2", 5120, 128, 1536, 512, 128, 64, 128, 60, max_context=163840),
    "deepseek-v2-lite": MLAConfig("deepseek-v2-lite", 2048, 16, None, 512, 128, 64, 128, 27, max_context=163840),
    "kimi-k2": MLAConfig("kimi-k2", 7168, 64, 1536, 512, 128, 64, 128, 61, max_context=131072),
    # DeepSeek-V3.2(-Exp): V3's MLA dims and 61 layers plus the indexer (index_n_heads 64,
    # index_head_dim 128, index_topk 2048), from deepseek-ai/DeepSeek-V3.2-Exp
    # inference/config_671B_v3.2.json (docs/design.md, "DSA: DeepSeek-V3.2's sparse MLA", cites it).
    "deepseek-v3.2": MLAConfig(
        "deepseek-v3.2",
        7168,
        128,
        1536,
        512,
        128,
        64,
        128,
        61,
        topk=2048,
        index_heads=64,
        index_dim=128,
        max_context=163840,
    ),
    # Round numbers for teaching and tests.
    "teaching": MLAConfig("teaching", 4096, 32, 1024, 512, 128, 64, 128, 1),
}
ALIASES = {"deepseek-r1": "deepseek-v3", "deepseek-v3.2-exp": "deepseek-v3.2"}

HF_FIELDS = {
    "hidden": "hidden_size",
    "H": "num_attention_heads",
    "q_lora_rank": "q_lora_rank",
    "r": "kv_lora_rank",
    "dC": "qk_nope_head_dim",
    "dR": "qk_rope_head_dim",
    "dV": "v_head_dim",
    "layers": "num_hidden_layers",
}
# The most any real model has of each dimension, with room (DeepSeek-V3: hidden 7168, 128 heads,
# q_lora_rank 1536, kv_lora_rank 512, head dims 128/64/128, 61 layers; the widest dense models
# reach hidden 16384 and 126 layers): a config past these is a typo or an attack, and its
# products would leave int64. Every dimension is held to its bound, the index fields too.
DIM_MAX = {
    "hidden": 1 << 17,
    "H": 4096,
    "q_lora_rank": 1 << 17,
    "r": 1 << 16,
    "dC": 4096,
    "dR": 4096,
    "dV": 4096,
    "layers": 4096,
    "index_heads": 4096,
    "index_dim": 4096,
}
# The longest context mlactl takes a model to serve (index_topk at most this, or the model's own
# max_position_embeddings when given): 16M tokens, 100x any MLA model today.
MAX_CONTEXT = 1 << 24

# A config with all three is a DSA model (DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM).
DSA_HF_FIELDS = {"topk": "index_topk", "index_heads": "index_n_heads", "index_dim": "index_head_dim"}


def preset_names() -> list[str]:
    return sorted(PRESETS) + sorted(ALIASES)


def from_name(name: str) -> MLAConfig:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise MlactlError(
            f"unknown model {name!r}; presets: {', '.join(preset_names())} "
            "(or give the path of a Hugging Face config.json)"
        )
    return PRESETS[key]


def read_hf_config(path: str | Path) -> tuple[Path, dict]:
    """A Hugging Face config.json (or a folder holding one): its path and its language model's
    fields (multimodal wrappers, e.g. Kimi-VL, keep them under text_config)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = read_json(path, "model config", limit=MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise MlactlError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if "kv_lora_rank" not in data and isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    return path, data


def from_hf_config(path: str | Path) -> MLAConfig:
    """Read an MLA model from a Hugging Face config.json (or a folder holding one)."""
    path, data = read_hf_config(path)
    missing = [hf for key, hf in HF_FIELDS.items() if hf not in data and key != "q_lora_rank"]
    if missing:
        raise MlactlError(f"{path} is not an MLA model config: missing {', '.join(missing)}")
    values: dict[str, Any] = {}  # int, or None for an absent q_lora_rank
    for key, hf in HF_FIELDS.items():
        value = data.get(hf)
        if key == "q_lora_rank" and value is None:
            values[key] = None
            continue
        values[key] = _dimension(value, hf, path, DIM_MAX[key])
    values["max_context"] = _max_context(data, path)
    values.update(_dsa_values(data, path, values))
    name = data.get("_name_or_path") or data.get("model_type") or path.parent.name or "custom"
    # a name from a file: printable from here on (markup and mathtext are escaped where drawn)
    return MLAConfig(name=safe.text(name), **values)


def _dimension(value, hf: str, path: Path, most: int, why: str = "") -> int:
    """One dimension of a config: a whole number from 1 to `most` (DIM_MAX), or one line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = safe.text(repr(value), 40)
        raise MlactlError(f"{safe.text(path)}: {hf} must be a positive integer, got {shown}")
    if value > most:
        shown = safe.text(value, 24)
        raise MlactlError(f"{safe.text(path)}: {hf} {shown} is above {most:,}, {why or 'more than any real model has'}")
    return value


def _max_context(data: dict, path: Path) -> int | None:
    """max_position_embeddings, when the config gives it (None otherwise)."""
    value = data.get("max_position_embeddings")
    return None if value is None else _dimension(value, "max_position_embeddings", path, MAX_CONTEXT)


def _dsa_values(data: dict, path: Path, values: dict) -> dict:
    """The DSA fields of a config: all three or none; some but not all is an error naming the
    missing ones (a config cut short would otherwise pass as a dense MLA model)."""
    present = [hf for hf in DSA_HF_FIELDS.values() if data.get(hf) is not None]
    if not present:
        return {}
    missing = [hf for hf in DSA_HF_FIELDS.values() if data.get(hf) is None]
    if missing:
        raise MlactlError(
            f"{path} has {', '.join(present)} but not {', '.join(missing)}: a DSA (sparse attention) "
            "config needs index_topk, index_n_heads and index_head_dim"
        )
    out = {}
    for key, hf in DSA_HF_FIELDS.items():
        most = DIM_MAX.get(key) or values.get("max_context") or MAX_CONTEXT  # topk: at most the context
        out[key] = _dimension(data[hf], hf, path, most, "the model's context" if key == "topk" else "")
    if values.get("q_lora_rank") is None:
        raise MlactlError(f"{path}: a DSA config needs q_lora_rank (the indexer's wq_b projects the query latent)")
    return out


def resolve(spec: str) -> MLAConfig:
    """A preset name, or a path to a config.json / a model folder."""
    looks_like_path = spec.endswith(".json") or "/" in spec or Path(spec).exists()
    if looks_like_path:
        return from_hf_config(spec)
    return from_name(spec)
