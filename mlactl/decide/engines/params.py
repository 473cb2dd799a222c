"""`--engines` and `--engine-option` into resolved rules: which rule set, which backend on this
GPU and cache dtype, every option's value, and why.

Every name of an engine (`sglang`, `vllm@0.33.0`, a forced-backend shorthand such as
`sglang-triton`, `@VERSION` on any of them, an engine named as `--policy`) goes through
`ruleset_for` and `resolve`, and every option through `parse_engines`: one path. A resolved rule
is an `EngineParams` of its engine's own type (`SGLangParams`, sglang.py; `VLLMParams`, vllm.py),
built from three things: a rule set (rulesets.py), the user's options (checked here, each one
bounded and typed, against that rule set's own options), and the context the engine runs in
(`Context`: GPU architecture, cache dtype, and the model, whose attention kind, dense MLA or DSA,
each rule set consults). The path functions (paths.py) ask the resolved rule itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import ClassVar, NamedTuple

import numpy as np

from mlactl.decide.engines.rulesets import ARCH_BY_NAME, NEWEST, RULESETS, SHORTHANDS, Option, RuleSet
from mlactl.util.defaults import ENGINES
from mlactl.util.errors import MlactlError

DEFAULT_ENGINES = ("sglang", "vllm")
# Context lengths (max_position_embeddings) of the presets, for vLLM's workspace; 163,840 for
# DeepSeek-V2/V3 (config.json), 131,072 for Kimi K2. Any value >= 8,192 gives the 64K cap.
MAX_MODEL_LEN = {"kimi-k2": 131072}
DEFAULT_MAX_MODEL_LEN = 163840
PATH_NAMES = ("absorb", "expand", "expand_chunked")
DSA_PATH_NAMES = ("sparse_absorb", "dense_expand", "masked_expand")  # a DSA model's, in the same roles
KIND_NAMES = {"mla": "dense MLA", "dsa": "DSA (sparse MLA)"}
_UINT = re.compile(r"^[0-9]+([kKmM]?)$", re.ASCII)
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2}


@dataclass(frozen=True)
class Context:
    """What a rule sees besides the batch: the GPU, the cache dtype and the model."""

    hardware: str = "h800"
    arch: str | None = "sm90"  # sm80 | sm89 | sm90 | sm100 | sm120 | rocm | None (unknown)
    kv_dtype: str = "bf16"
    model: str = "deepseek-v3"
    model_kind: str = "mla"  # mla (dense) | dsa (DeepSeek-V3.2's sparse attention)
    model_arch: str = "DeepseekV3ForCausalLM"
    qk_nope_head_dim: int = 128
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    # what the DSA rules read besides: index_topk, the TP size and heads per GPU, the other dims
    index_topk: int = 0
    tp: int = 1
    heads: int = 128  # attention heads per GPU
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128

    @property
    def where(self) -> str:
        """`on h200 (sm90), bf16 cache`: how a resolved rule's first line names the context."""
        return f"on {self.hardware} ({self.arch or 'architecture unknown'}), {self.kv_dtype} cache"


def arch_of(hw) -> str | None:
    """The GPU architecture of a hardware profile: its `arch`, else the one its name or display
    names (ARCH_BY_NAME), or None."""
    if getattr(hw, "arch", None):
        return hw.arch
    text = f"{getattr(hw, 'name', '')} {getattr(hw, 'display', '')}".upper()
    return next((arch for key, arch in ARCH_BY_NAME if key in text), None)


def context_for(cfg=None, hw=None, kv_dtype: str = "bf16") -> Context:
    """The context of a model config and hardware profile (either may be None: defaults)."""
    out = Context(kv_dtype=kv_dtype)
    if hw is not None:
        out = Context(hardware=hw.name, arch=arch_of(hw), kv_dtype=kv_dtype)
    if cfg is None:
        return out
    name = str(cfg.name)
    dsa = bool(getattr(cfg, "is_dsa", False))
    v2 = name.lower().startswith("deepseek-v2")
    return replace(
        out,
        model=name,
        model_kind="dsa" if dsa else "mla",
        model_arch="DeepseekV32ForCausalLM" if dsa else ("DeepseekV2ForCausalLM" if v2 else "DeepseekV3ForCausalLM"),
        qk_nope_head_dim=int(cfg.dC),
        max_model_len=MAX_MODEL_LEN.get(name, DEFAULT_MAX_MODEL_LEN),
        index_topk=int(cfg.topk) if dsa else 0,
        tp=int(cfg.tp),
        heads=int(cfg.H),
        kv_lora_rank=int(cfg.r),
        qk_rope_head_dim=int(cfg.dR),
        v_head_dim=int(cfg.dV),
    )


class Swept(NamedTuple):
    """The threshold a rule reads, as a sweep moves it."""

    option: str  # under the engine's own name
    value: int  # in force
    maximum: int | None  # the most it takes (None: no bound)
    against: str  # what it is compared with: summed_prefix, longest_sequence or query_len
    compares: str  # the same, in words


# The params type of each engine family, filled in as each subclass is defined (sglang.py, vllm.py).
FAMILIES: dict[str, type[EngineParams]] = {}


@dataclass(frozen=True)
class EngineParams:
    """One engine's rule, resolved for a context: what every engine's has. Each family's type
    (`SGLangParams`, `VLLMParams`) adds its own fields and answers the path questions
    (`grid_paths`, `step_counts`, `chunk_sizes`) by its engine's rule."""

    name: str  # as the user selected it: sglang, sglang@0.5.14, sglang-triton, vllm@0.33.0
    ruleset: RuleSet
    values: dict = field(compare=False)  # every option's value, defaults filled in
    given: tuple[str, ...]  # the options the user set
    ctx: Context
    why: tuple[str, ...] = field(compare=False)
    backend: str = ""  # the backend that runs the batch (SGLang: of extend batches)
    threshold: int = 0  # the threshold in force (SGLang: summed prefix; vLLM: the decode threshold)
    # the path names this rule assigns, in the order absorb-like, one-shot, chunked: MLA's, or a
    # DSA model's (sparse_absorb, dense_expand, masked_expand)
    paths: tuple[str, str, str] = PATH_NAMES
    topk: int = 0  # a DSA model's index_topk
    dense_indexer: str = "key"  # what the engine's dense MHA runs of the indexer (cost.py)
    json_backends: ClassVar[tuple[str, ...]] = ("backend",)  # the backend fields to_json reports

    def __init_subclass__(cls, family: str = "", **kw):
        super().__init_subclass__(**kw)
        if family:
            FAMILIES[family] = cls

    @classmethod
    def build(cls, name: str, rs: RuleSet, values: dict, given: tuple[str, ...], ctx: Context, fixed: dict):
        """The rule of rule set `rs` with these option values, in `ctx` (each family's own)."""
        raise NotImplementedError

    @property
    def engine(self) -> str:
        """The key under which this rule's paths and losses are reported."""
        return self.name

    @property
    def family(self) -> str:
        return self.ruleset.engine

    @property
    def kind(self) -> str:
        """The model's attention: mla (dense) or dsa; the rule set's rule for it is resolved."""
        return self.ctx.model_kind

    @property
    def is_dsa(self) -> bool:
        """The rule of a DSA model (its paths are sparse_absorb, dense_expand, masked_expand)."""
        return self.kind == "dsa"

    @property
    def dsa(self):
        """The rule set's DSA data (SGLangDSA, VLLMDSA: rulesets.py)."""
        return self.ruleset.dsa

    @property
    def version(self) -> str:
        return self.ruleset.version

    def opt(self, key: str):
        return self.values[key]

    @property
    def label(self) -> str:
        """The engine and the options the user set, e.g. `sglang(enable_mixed_chunk=true)`."""
        shown = [f"{k}={_show(self.values[k])}" for k in self.given]
        return self.name + (f"({','.join(shown)})" if shown else "")

    @property
    def citation(self) -> str:
        s = self.ruleset.source
        if self.is_dsa:  # the DSA rule's own files
            return f"{self.ruleset.name} (DSA): {s.short} {self.dsa.source.split(';')[0]}"
        return f"{self.ruleset.name}: {s.short} {s.files[0][0]}"

    @property
    def backend_info(self):
        """The backend's data: SGLangBackend or VLLMBackend (rulesets.py)."""
        return self.ruleset.backends[self.backend]

    @property
    def resolved(self) -> str:
        """The first why line: `vllm@0.33.0 on h200 (sm90), bf16 cache → FLASH_ATTN_MLA (threshold 512)`."""
        return self.why[0]

    describe = resolved

    @property
    def decode_path(self) -> str:
        """The path of a step of decodes only."""
        return self.paths[0]

    @property
    def chunked_path(self) -> str:
        """The path that expands the context in chunks (expand_chunked; a DSA model's masked_expand)."""
        return self.paths[2]

    @property
    def swept(self) -> Swept:
        """The threshold a sweep of this rule moves: its option, value in force, bound, and what it
        is compared with."""
        raise NotImplementedError

    def with_threshold(self, t) -> EngineParams:
        """This rule with its swept threshold at `t` (a number, or an array compared element-wise)."""
        return replace(self, threshold=t)

    @property
    def reads_threshold(self) -> bool:
        """Whether the swept threshold can change a path at all."""
        return True

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "engine": self.family,
            "version": self.version,
            "label": self.label,
            "source": self.citation,
            **{k: getattr(self, k) for k in self.json_backends},
            "threshold": self.threshold,
            **({"dsa": self.dsa_json()} if self.is_dsa else {}),
            "options": {k: self.values[k] for k in self.ruleset.options},
            "options_set": list(self.given),
            "why": list(self.why),
        }

    def dsa_json(self) -> dict:
        """What the DSA rule resolved to."""
        raise NotImplementedError

    def grid_paths(self, batch, new, prefix) -> np.ndarray:
        """The path at each grid point, each a step of `batch` alike requests."""
        raise NotImplementedError

    def step_counts(self, new, prefix, count, step, decode) -> np.ndarray:
        """[R, 3]: how many of each row's `count` requests run each of `paths` (rows as_rows gives)."""
        raise NotImplementedError

    def chunk_sizes(self, prefills_with_context) -> np.ndarray | None:
        """Context tokens per chunk of the engine's own chunked path, or None where mlactl's
        `--chunk` stands in."""
        return None


def is_decode(new, prefix) -> np.ndarray:
    """One new token after a cached prefix: mlactl's convention for a decode."""
    return (np.asarray(new) == 1) & (np.asarray(prefix) > 0)


def as_rows(new, prefix, count=None, step=None, decode=None) -> tuple[np.ndarray, ...]:
    """Rows of many steps as arrays: new and cached tokens, the alike requests each row stands
    for (default 1), its step (default: all one step), whether it is a decode (default:
    is_decode; vLLM: done prefilling)."""
    new, prefix = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    count = np.ones(len(new), dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)
    step = np.zeros(len(new), dtype=np.int64) if step is None else np.asarray(step, dtype=np.int64)
    decode = is_decode(new, prefix) if decode is None else np.asarray(decode, dtype=bool)
    return new, prefix, count, step, decode


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# -- option values -----------------------------------------------------------------------------------


def parse_value(opt: Option, text: str, where: str):
    """One option value of the option's kind, bounded; one clear error otherwise."""
    text = text.strip()
    if opt.kind is bool:
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise MlactlError(f"{where}: {opt.name} takes true or false, got {text!r}")
    if opt.kind is int:
        match = _UINT.match(text)
        if not match:
            raise MlactlError(
                f"{where}: {opt.name} takes a whole number from {opt.minimum} to {opt.maximum:,} "
                f"(digits, optionally K or M), got {text!r}"
            )
        digits = text[: len(text) - len(match.group(1))]
        value = int(digits) * _SUFFIX[match.group(1).lower()] if len(digits) <= 19 else opt.maximum + 1
        if not opt.minimum <= value <= opt.maximum:
            raise MlactlError(f"{where}: {opt.name} must be from {opt.minimum} to {opt.maximum:,}, got {text!r}")
        return value
    choices = {c.lower(): c for c in opt.choices}
    if text.lower() not in choices:
        raise MlactlError(f"{where}: {opt.name} must be one of {', '.join(opt.choices)}, got {text!r}")
    return choices[text.lower()]


def canonical(rs: RuleSet, key: str) -> str | None:
    """The option of `rs` that `key` names (its own name, or an older mlactl alias), or None."""
    key = key.strip()
    if key in rs.options:
        return key
    alias = rs.aliases.get(key)
    return alias if alias in rs.options else None


# -- selecting engines ----------------------------------------------------------------------------


def known_names() -> list[str]:
    return [*NEWEST, *SHORTHANDS, *RULESETS]


def is_engine(name: str) -> bool:
    """Whether a policy name names an engine's rule (`sglang`, `vllm@0.33.0`, `sglang-triton@0.5.14`)."""
    return name in known_names() or name.partition("@")[0] in (*NEWEST, *SHORTHANDS)


def ruleset_for(name: str) -> tuple[RuleSet, dict]:
    """The rule set a selected name means, and the options the name itself fixes: a rule set's
    name, a family (its newest), or a shorthand (a forced backend), each optionally `@VERSION`."""
    if name in RULESETS:
        return RULESETS[name], {}
    family, at, version = name.partition("@")
    base, fixed = SHORTHANDS.get(family, (family, {}))
    if base in NEWEST:
        wanted = f"{base}@{version}" if at else NEWEST[base]
        if wanted in RULESETS:
            return RULESETS[wanted], dict(fixed)
        have = ", ".join(r.version for r in RULESETS.values() if r.engine == base)
        raise MlactlError(f"no rule set for {name}; {base} versions: {have} (see `mlactl engines --list`)")
    raise MlactlError(f"unknown engine {name!r}; choose from {', '.join(known_names())}")


def default_selection(cfg=None) -> tuple[str, ...]:
    """The engines judged where none are named: SGLang with each of its dense backends forced,
    and vLLM; on a DSA model (whose backends those shorthands do not run) the two as they ship."""
    return DEFAULT_ENGINES if cfg is not None and cfg.is_dsa else ENGINES


def _names(engines) -> list[str]:
    if isinstance(engines, (list, tuple)):
        engines = ",".join(engines)
    names = [e.strip() for e in (engines if engines is not None else ",".join(DEFAULT_ENGINES)).split(",")]
    return [n for n in names if n]


def _reaches(target: str, name: str, rs: RuleSet, fixed: dict) -> bool:
    """Whether `--engine-option TARGET.key` reaches the selected `name` (rule set `rs`, with the
    options its name fixes): TARGET is the name, its family, or a name of the same rule set that
    forces no option the name does not (`sglang@0.5.23` reaches `sglang` and `sglang-triton`;
    `sglang-triton` reaches `sglang-triton@0.5.23`, not `sglang`)."""
    if target in (name, rs.engine):
        return True
    try:
        other, forced = ruleset_for(target)
    except MlactlError:
        return False
    return other is rs and forced.items() <= fixed.items()


def parse_engines(engines, options: list[str] | None = None, ctx: Context | None = None) -> list[EngineParams]:
    """`--engines a,b` and `--engine-option [ENGINE.]KEY=VALUE` into one resolved rule each.

    ENGINE is a selected name (`sglang@0.5.14`), another name of the same rule (`sglang@0.5.23`
    for a selected `sglang`) or a family (`sglang`: every selected SGLang rule). A bare KEY goes
    to every selected engine that has it; when engines of two families have it, the engine must
    be named. Each value is checked against the option of the engine it reaches. Raises
    MlactlError (one line) on anything it cannot take.
    """
    names = _names(engines)
    if not names:
        raise MlactlError(f"--engines names no engine; choose from {', '.join(known_names())}")
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise MlactlError(f"--engines names {dup} twice")
    chosen = {n: ruleset_for(n) for n in names}  # raises on an unknown engine
    given: dict[str, dict] = {n: {} for n in names}
    for text in options or []:
        key, eq, value = text.partition("=")
        if not eq or not key.strip():
            raise MlactlError(f"--engine-option takes [ENGINE.]KEY=VALUE, got {text!r}")
        engine, dot, key = key.strip().rpartition(".")
        where = f"--engine-option {text!r}"
        if dot:
            targets = [n for n in names if _reaches(engine, n, *chosen[n])]
            if not targets:
                ruleset_for(engine)  # an unknown engine says so, listing the known ones
                raise MlactlError(f"{where}: {engine} is not among --engines ({', '.join(names)})")
        else:
            targets = [n for n in names if canonical(chosen[n][0], key) is not None]
            fams = sorted({chosen[n][0].engine for n in targets})
            if len(fams) > 1:
                raise MlactlError(
                    f"{where}: {key} belongs to {' and '.join(fams)}; name one, e.g. {fams[0]}.{key}={value}"
                )
            if not targets:
                valid = "; ".join(f"valid keys for {rs.name}: {', '.join(rs.options)}" for rs, _ in chosen.values())
                who = chosen[names[0]][0].name if len(names) == 1 else "no selected engine"
                raise MlactlError(f"{where}: {who} has no option {key!r}; {valid}")
        for n in targets:
            rs, fixed = chosen[n]
            canon = canonical(rs, key)
            if canon is None:
                raise MlactlError(
                    f"{where}: {rs.name} has no option {key!r}; valid keys for {rs.name}: {', '.join(rs.options)}"
                )
            if canon in fixed:
                raise MlactlError(f"{where}: {n} fixes {canon}={fixed[canon]}; select {rs.engine} instead")
            given[n][canon] = parse_value(rs.options[canon], value, where)
    return [resolve(n, given[n], ctx or Context()) for n in names]


def parse_policy(policy: str, engines, options: list[str] | None = None, ctx: Context | None = None) -> EngineParams:
    """The rule an engine named as a policy (`--policy vllm@0014ca6b`) means: resolved exactly as
    if it were one more of `--engines`, so every `--engine-option` that would reach it there
    (`vllm.backend=flashmla`, a bare key it has) reaches it here too."""
    names = _names(engines)
    if policy in names:
        return parse_engines(names, options, ctx)[names.index(policy)]
    return parse_engines([*names, policy], options, ctx)[-1]


def default_params(name: str, ctx: Context | None = None) -> EngineParams:
    """The rule `name` with its defaults in `ctx` (default context: DeepSeek-V3 on an H800, bf16)."""
    return resolve(name, {}, ctx or Context())


# -- resolving a rule in its context ----------------------------------------------------------------


def resolve(name: str, given: dict, ctx: Context) -> EngineParams:
    """The one resolution of every rule set: the rule set `name` means, its rule for the model's
    attention kind, the option values (defaults, what the name fixes, what was given), and the
    backend and rule for the GPU and cache dtype, built by the family's own params type."""
    rs, fixed = ruleset_for(name)
    if ctx.model_kind not in rs.model_kinds:
        having = [r.name for r in RULESETS.values() if r.engine == rs.engine and ctx.model_kind in r.model_kinds]
        raise MlactlError(
            f"{rs.name} has no rule for {KIND_NAMES.get(ctx.model_kind, ctx.model_kind)} models such as {ctx.model}"
            + (f"; rule sets with one: {', '.join(having)}" if having else "")
            + " (docs/engines.md)"
        )
    values = {k: o.default for k, o in rs.options.items()} | fixed | given
    set_keys = tuple(k for k in rs.options if k in given)
    return FAMILIES[rs.engine].build(name, rs, values, set_keys, ctx, fixed)
