"""`--engines` and `--engine-option` into resolved rules: which rule set, which backend on this
GPU and cache dtype, every option's value, and why.

A resolved rule (`EngineParams`) is what the rule functions (sglang.py, vllm.py) read. It is
built from three things: a rule set (rulesets.py), the user's options (checked here, each one
bounded and typed), and the context the engine runs in (`Context`: GPU architecture, cache
dtype, model kind and architecture). The context is part of what a rule sees, so a model-
dependent rule (DeepSeek-V3.2's sparse attention) goes in beside the dense one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mlactl.decide.engines.rulesets import (
    ARCH_BY_NAME,
    NEWEST,
    RULESETS,
    SHORTHANDS,
    VLLMDSA,
    Option,
    RuleSet,
    SGLangBackend,
    SGLangDSA,
    VLLMBackend,
)
from mlactl.util.errors import MlactlError

DEFAULT_ENGINES = ("sglang", "vllm")
# vLLM's determine_chunked_prefill_workspace_size caps the context workspace at 64K tokens.
VLLM_WORKSPACE_CAP = 64 * 1024
# Context lengths (max_position_embeddings) of the presets, for vLLM's workspace; 163,840 for
# DeepSeek-V2/V3 (config.json), 131,072 for Kimi K2. Any value >= 8,192 gives the 64K cap.
MAX_MODEL_LEN = {"kimi-k2": 131072}
DEFAULT_MAX_MODEL_LEN = 163840
_UINT = re.compile(r"^[0-9]+([kKmM]?)$", re.ASCII)
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2}


@dataclass(frozen=True)
class Context:
    """What a rule sees besides the batch: the GPU, the cache dtype and the model."""

    hardware: str = "h800"
    arch: str | None = "sm90"  # sm80 | sm90 | sm100 | rocm | None (unknown)
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


def arch_of(hw) -> str | None:
    """The GPU architecture a hardware profile names (by its name or display), or None."""
    text = f"{getattr(hw, 'name', '')} {getattr(hw, 'display', '')}".upper()
    for key, arch in ARCH_BY_NAME:
        if key in text:
            return arch
    return None


def context_for(cfg=None, hw=None, kv_dtype: str = "bf16") -> Context:
    """The context of a model config and hardware profile (either may be None: defaults)."""
    out = Context(kv_dtype=kv_dtype)
    if hw is not None:
        out = Context(hardware=hw.name, arch=arch_of(hw), kv_dtype=kv_dtype)
    if cfg is not None:
        name = str(cfg.name)
        v2 = name.lower().startswith("deepseek-v2")
        dsa = bool(getattr(cfg, "is_dsa", False))
        out = Context(
            hardware=out.hardware,
            arch=out.arch,
            kv_dtype=kv_dtype,
            model=name,
            model_kind="dsa" if dsa else "mla",
            model_arch="DeepseekV32ForCausalLM"
            if dsa
            else ("DeepseekV2ForCausalLM" if v2 else "DeepseekV3ForCausalLM"),
            qk_nope_head_dim=int(cfg.dC),
            max_model_len=MAX_MODEL_LEN.get(name, DEFAULT_MAX_MODEL_LEN),
            index_topk=int(cfg.topk) if dsa else 0,
            tp=int(cfg.tp),
            heads=int(cfg.H),
            kv_lora_rank=int(cfg.r),
            qk_rope_head_dim=int(cfg.dR),
            v_head_dim=int(cfg.dV),
        )
    return out


@dataclass(frozen=True)
class EngineParams:
    """One engine's rule, resolved for a context: the backends it runs and each option's value."""

    name: str  # as the user selected it: sglang, sglang@0.5.14, sglang-triton, vllm@0.33.0
    ruleset: RuleSet
    values: dict = field(compare=False)  # every option's value, defaults filled in
    given: tuple[str, ...]  # the options the user set
    ctx: Context
    why: tuple[str, ...] = field(compare=False)
    backend: str = ""  # sglang: the prefill (extend) backend; vllm: the backend
    decode_backend: str = ""  # sglang: the backend of decode batches
    threshold: int = 0  # sglang: summed-prefix threshold; vllm: the decode threshold in force
    capacity: int = 0  # sglang: most summed tokens of a one-shot expand
    chunked_prefix_cache: bool = True  # sglang
    graph_max_tokens: int = 0  # sglang: 0 when the piecewise graph is off
    query_len: str = ""  # vllm: single | uniform | varlen
    workspace: int = 0  # vllm: context tokens expanded at once, over all prefills with context
    block: int = 0  # vllm: KV block, the unit the context chunk rounds down to
    short_extends_as_decodes: bool = True  # vllm: False under prefill context parallelism
    # the path names this rule assigns, in the order absorb-like, one-shot, chunked: MLA's, or a
    # DSA model's (sparse_absorb, dense_expand, masked_expand)
    paths: tuple[str, str, str] = ("absorb", "expand", "expand_chunked")
    # DSA, SGLang: dense MHA for an extend batch whose longest sequence is at most dense_threshold
    # (and the conditions dense_ok folds in: architecture, cache dtype, no DSA prefill CP)
    dense_threshold: int = 0
    dense_ok: bool = False
    # DSA, vLLM: prefills may run MHA (dense up to topk, masked from the table's row)
    mha: bool = False
    masked_row: tuple | None = None  # least query length per bucket (None: never), or no row
    masked_ok: bool = False  # masked MHA available here (architecture, cache dtype, dims, no DCP)
    topk: int = 0
    dense_indexer: str = "key"  # what the engine's dense MHA runs of the indexer (cost.py)

    @property
    def engine(self) -> str:
        """The key under which this rule's paths and losses are reported."""
        return self.name

    @property
    def family(self) -> str:
        return self.ruleset.engine

    @property
    def is_dsa(self) -> bool:
        """The rule of a DSA model (its paths are sparse_absorb, dense_expand, masked_expand)."""
        return self.ctx.model_kind == "dsa"

    @property
    def sglang_dsa(self) -> SGLangDSA:
        """The SGLang rule set's DSA data."""
        assert isinstance(self.ruleset.dsa, SGLangDSA), self.ruleset.name
        return self.ruleset.dsa

    @property
    def vllm_dsa(self) -> VLLMDSA:
        """The vLLM rule set's DSA data."""
        assert isinstance(self.ruleset.dsa, VLLMDSA), self.ruleset.name
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
            dsa = self.sglang_dsa if self.family == "sglang" else self.vllm_dsa
            return f"{self.ruleset.name} (DSA): {s.short} {dsa.source.split(';')[0]}"
        return f"{self.ruleset.name}: {s.short} {s.files[0][0]}"

    @property
    def backend_info(self):
        """The backend's data: SGLangBackend or VLLMBackend (rulesets.py)."""
        return self.ruleset.backends[self.backend]

    @property
    def decode_info(self) -> SGLangBackend:
        return self.ruleset.backends[self.decode_backend or self.backend]

    @property
    def resolved(self) -> str:
        """The first why line: `vllm@0.33.0 on h200 (sm90), bf16 cache → FLASH_ATTN_MLA (threshold 512)`."""
        return self.why[0]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "engine": self.family,
            "version": self.version,
            "label": self.label,
            "source": self.citation,
            "backend": self.backend,
            **({"decode_backend": self.decode_backend} if self.family == "sglang" else {}),
            "threshold": self.threshold,
            **({"dsa": self.dsa_json()} if self.is_dsa else {}),
            "options": {k: self.values[k] for k in self.ruleset.options},
            "options_set": list(self.given),
            "why": list(self.why),
        }

    def dsa_json(self) -> dict:
        """What the DSA rule resolved to: SGLang's dense threshold; vLLM's dense and masked MHA."""
        if self.family == "sglang":
            return {"dense_threshold": self.dense_threshold, "dense_possible": self.dense_ok}
        return {
            "mha": self.mha,
            "dense_up_to": self.topk if self.mha else None,
            "masked_available": self.masked_ok,
            "masked_min_query_len": list(self.masked_row) if self.masked_row is not None else None,
            "masked_buckets": list(self.vllm_dsa.buckets) if self.masked_row is not None else None,
        }


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


# -- selecting engines ----------------------------------------------------------------------------


def known_names() -> list[str]:
    return [*NEWEST, *SHORTHANDS, *RULESETS]


def is_engine(name: str) -> bool:
    """Whether a policy name names an engine's rule (`sglang`, `vllm@0.33.0`, `sglang-triton@0.5.14`)."""
    family = name.partition("@")[0]
    return name in known_names() or family in NEWEST or family in SHORTHANDS


def ruleset_for(name: str) -> tuple[RuleSet, dict]:
    """The rule set a selected name means, and the options the name itself fixes."""
    if name in RULESETS:
        return RULESETS[name], {}
    if name in NEWEST:
        return RULESETS[NEWEST[name]], {}
    family, at, version = name.partition("@")
    if family in SHORTHANDS:  # a forced backend, of the newest rule set or of the version named
        base, fixed = SHORTHANDS[family]
        wanted = f"{base}@{version}" if at else NEWEST[base]
        if wanted not in RULESETS:
            have = ", ".join(r.version for r in RULESETS.values() if r.engine == base)
            raise MlactlError(f"no rule set for {name}; {base} versions: {have} (see `mlactl engines --list`)")
        return RULESETS[wanted], dict(fixed)
    if at and family in NEWEST:
        have = ", ".join(r.version for r in RULESETS.values() if r.engine == family)
        raise MlactlError(f"no rule set for {name}; {family} versions: {have} (see `mlactl engines --list`)")
    raise MlactlError(f"unknown engine {name!r}; choose from {', '.join(known_names())}")


def _families(names) -> dict[str, str]:
    return {n: ruleset_for(n)[0].engine for n in names}


def parse_engines(engines, options: list[str] | None = None, ctx: Context | None = None) -> list[EngineParams]:
    """`--engines a,b` and `--engine-option [ENGINE.]KEY=VALUE` into one resolved rule each.

    ENGINE is a selected name (`sglang@0.5.14`) or a family (`sglang`: every selected SGLang
    rule). A bare KEY goes to every selected engine that has it; when engines of two families
    have it, the engine must be named. Raises MlactlError (one line) on anything it cannot take.
    """
    ctx = ctx or Context()
    if isinstance(engines, (list, tuple)):
        engines = ",".join(engines)
    names = [e.strip() for e in (engines if engines is not None else ",".join(DEFAULT_ENGINES)).split(",")]
    names = [n for n in names if n]
    if not names:
        raise MlactlError(f"--engines names no engine; choose from {', '.join(known_names())}")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise MlactlError(f"--engines names {dup} twice")
    family = _families(names)  # raises on an unknown engine
    given: dict[str, dict] = {n: {} for n in names}
    for text in options or []:
        key, eq, value = text.partition("=")
        if not eq or not key.strip():
            raise MlactlError(f"--engine-option takes [ENGINE.]KEY=VALUE, got {text!r}")
        engine, dot, key = key.strip().rpartition(".")
        if dot:
            targets = [n for n in names if n == engine or family[n] == engine]
            if not targets:
                ruleset_for(engine)  # an unknown engine says so, listing the known ones
                raise MlactlError(f"--engine-option {text!r}: {engine} is not among --engines ({', '.join(names)})")
        else:
            targets = [n for n in names if _canonical(ruleset_for(n)[0], key) is not None]
            fams = sorted({family[n] for n in targets})
            if len(fams) > 1:
                raise MlactlError(
                    f"--engine-option {text!r}: {key} belongs to {' and '.join(fams)}; "
                    f"name one, e.g. {fams[0]}.{key}={value}"
                )
            if not targets:
                valid = "; ".join(
                    f"valid keys for {ruleset_for(n)[0].name}: {', '.join(ruleset_for(n)[0].options)}" for n in names
                )
                where = ruleset_for(names[0])[0].name if len(names) == 1 else "no selected engine"
                raise MlactlError(f"--engine-option {text!r}: {where} has no option {key!r}; {valid}")
        for n in targets:
            rs, fixed = ruleset_for(n)
            canon = _canonical(rs, key)
            if canon is None:
                raise MlactlError(
                    f"--engine-option {text!r}: {rs.name} has no option {key!r}; valid keys for {rs.name}: "
                    f"{', '.join(rs.options)}"
                )
            if canon in fixed:
                raise MlactlError(
                    f"--engine-option {text!r}: {n} fixes {canon}={fixed[canon]}; select {rs.engine} instead"
                )
            given[n][canon] = parse_value(rs.options[canon], value, f"--engine-option {text!r}")
    return [resolve(n, given[n], ctx) for n in names]


def parse_policy(policy: str, engines, options: list[str] | None = None, ctx: Context | None = None) -> EngineParams:
    """The rule an engine named as a policy (`--policy vllm@0014ca6b`) means: resolved exactly as
    if it were one more of `--engines`, so every `--engine-option` that would reach it there
    (`vllm.backend=flashmla`, a bare key it has) reaches it here too."""
    if isinstance(engines, (list, tuple)):
        engines = ",".join(engines)
    names = [e.strip() for e in (engines if engines is not None else ",".join(DEFAULT_ENGINES)).split(",")]
    names = [n for n in names if n]
    if policy in names:
        return parse_engines(names, options, ctx)[names.index(policy)]
    return parse_engines([*names, policy], options, ctx)[-1]


def _canonical(rs: RuleSet, key: str) -> str | None:
    key = key.strip()
    if key in rs.options:
        return key
    alias = rs.aliases.get(key)
    return alias if alias in rs.options else None


def default_params(name: str, ctx: Context | None = None) -> EngineParams:
    """The rule `name` with its defaults in `ctx` (default context: DeepSeek-V3 on an H800, bf16)."""
    return resolve(name, {}, ctx or Context())


# -- resolving a rule in its context ----------------------------------------------------------------


def _where(ctx: Context) -> str:
    arch = ctx.arch or "architecture unknown"
    return f"on {ctx.hardware} ({arch}), {ctx.kv_dtype} cache"


KIND_NAMES = {"mla": "dense MLA", "dsa": "DSA (sparse MLA)"}
DSA_PATHS = ("sparse_absorb", "dense_expand", "masked_expand")


def resolve(name: str, given: dict, ctx: Context) -> EngineParams:
    rs, fixed = ruleset_for(name)
    if ctx.model_kind not in rs.model_kinds:
        having = [r.name for r in RULESETS.values() if r.engine == rs.engine and ctx.model_kind in r.model_kinds]
        raise MlactlError(
            f"{rs.name} has no rule for {KIND_NAMES.get(ctx.model_kind, ctx.model_kind)} models such as {ctx.model}"
            + (f"; rule sets with one: {', '.join(having)}" if having else "")
            + " (docs/engines.md)"
        )
    values = {k: o.default for k, o in rs.options.items()}
    values.update(fixed)
    values.update(given)
    set_keys = tuple(k for k in rs.options if k in given)
    if rs.engine == "sglang":
        if ctx.model_kind == "dsa":
            return _resolve_sglang_dsa(name, rs, values, set_keys, ctx, fixed)
        return _resolve_sglang(name, rs, values, set_keys, ctx)
    if ctx.model_kind == "dsa":
        return _resolve_vllm_dsa(name, rs, values, set_keys, ctx)
    return _resolve_vllm(name, rs, values, set_keys, ctx)


def _default(rs: RuleSet, ctx: Context):
    """The default backend for ctx's architecture and model, and a note when it is assumed."""
    arch, note = ctx.arch, ""
    if arch is None or not any(d.arch == arch for d in rs.defaults):
        note = f"no {rs.engine} default is known for {ctx.arch or 'this GPU'}; the sm90 default is assumed"
        arch = "sm90"
    for d in rs.defaults:
        if d.arch == arch and d.model_arch in (None, ctx.model_arch):
            return d, note
    raise AssertionError(f"{rs.name} has no default for {arch}")  # pragma: no cover - data


def _resolve_sglang(name, rs: RuleSet, values, set_keys, ctx: Context) -> EngineParams:
    why = []
    if values["attention_backend"] is None:
        d, note = _default(rs, ctx)
        values["attention_backend"] = d.backend
        head = f"{d.backend} (default: {d.reason})"
        if note:
            why.append(note)
        if not d.confirmed:
            why.append(f"default {d.backend} not confirmed in the source (docs/engines.md)")
    else:
        head = f"{values['attention_backend']} (set)"
    prefill = values["prefill_attention_backend"] or values["attention_backend"]
    decode = values["decode_attention_backend"] or values["attention_backend"]
    for used in {prefill, decode}:
        if rs.backends[used].handler == "dsa":
            raise MlactlError(
                f"{rs.name}: {used} is the backend of DSA models (DeepSeek-V3.2); {ctx.model} is a dense MLA model"
            )
    b: SGLangBackend = rs.backends[prefill]
    cpc = not values["disable_chunked_prefix_cache"] and b.chunked_prefix_cache
    graph_flag = next(k for k in rs.options if k.endswith("piecewise_cuda_graph"))
    graph_on = values[graph_flag] if graph_flag.startswith("enable") else not values[graph_flag]
    if graph_flag.startswith("disable") and ctx.arch == "rocm":
        graph_on = False  # on by default on CUDA; not confirmed for HIP
    if (
        graph_on
        and graph_flag.startswith("disable")
        and prefill == "trtllm_mla"
        and "disable_piecewise_cuda_graph" not in set_keys
    ):
        if ctx.model_arch == "DeepseekV3ForCausalLM":
            graph_on = False
            why.append(
                "piecewise graph off for DeepseekV3ForCausalLM on trtllm_mla (assumed; not found in server_args.py)"
            )
    max_tokens = values["piecewise_cuda_graph_max_tokens"] if graph_on else 0
    first = f"{rs.name} {_where(ctx)} → {head}"
    if prefill != values["attention_backend"] or decode != values["attention_backend"]:
        first += f"; extends on {prefill}, decodes on {decode}"
    why.insert(0, first)
    thr, cap = values["chunked_prefix_cache_threshold"], values["max_kv_chunk_capacity"]
    rule = {
        "generic": f"an extend batch whose summed prefix is 0{' or >= ' + str(thr) if cpc else ''} expands"
        + (f" (one-shot up to {cap:,} summed tokens, else chunked)" if b.one_shot else " (chunked)")
        + "; other batches absorb",
        "fa3": f"an extend batch whose summed prefix is 0{' or >= ' + str(thr) if cpc else ''} expands "
        f"(one-shot up to {cap:,} summed tokens, else chunked); other batches absorb",
        "trtllm": (
            "every extend batch runs chunked expand" if cpc else "only extend batches with prefix 0 expand (chunked)"
        )
        + "; decodes absorb",
        "fa4": "every batch runs chunked expand (handle_attention_fa4)",
        "aiter": "every extend batch runs MHA (expand, never chunked); decodes absorb",
        "triton": "an extend batch whose summed prefix is 0 expands (never chunked); others absorb",
    }[b.handler]
    why.append(f"{prefill}: {rule}")
    if not cpc and b.chunked_prefix_cache:
        why.append("chunked prefix cache off (disable_chunked_prefix_cache)")
    elif not b.chunked_prefix_cache and b.handler in ("generic", "fa3", "trtllm"):
        why.append(f"chunked prefix cache off: {prefill} is not among the backends that support it")
    if values["enable_deterministic_inference"] and b.handler in ("fa3", "triton"):
        why.append(f"deterministic inference on {prefill}: every batch absorbs")
    if values["flashinfer_mla_disable_ragged"] and b.ragged_switch:
        why.append(f"flashinfer_mla_disable_ragged on {prefill}: every extend absorbs")
    if values["enable_prefill_context_parallel"] and b.prefill_cp:
        why.append(f"prefill context parallelism on {prefill}: every extend absorbs")
    if max_tokens and (b.graph_mla or b.graph_mha):
        path = "absorb" if b.graph_mla else "expand (MHA)"
        why.append(f"piecewise CUDA graph on: extend batches of <= {max_tokens} new tokens run {path}")
    if values["enable_mixed_chunk"]:
        why.append("mixed chunk on: a step's decodes join its extend batch, their prefixes count in the sum")
    if rs.backends[decode].handler == "fa4":
        why.append(f"decodes on {decode}: chunked expand (handle_attention_fa4 returns MHA_CHUNKED_KV)")
    return EngineParams(
        name,
        rs,
        values,
        set_keys,
        ctx,
        tuple(why),
        backend=prefill,
        decode_backend=decode,
        threshold=thr,
        capacity=cap,
        chunked_prefix_cache=cpc,
        graph_max_tokens=max_tokens,
    )


def _resolve_vllm(name, rs: RuleSet, values, set_keys, ctx: Context) -> EngineParams:
    why = []
    dcp = values["decode_context_parallel_size"]
    kv = ctx.kv_dtype
    arch = ctx.arch
    if values["backend"] is not None:
        backend = values["backend"].upper()
        b: VLLMBackend = _set_backend(rs, ctx, backend)
        head = f"{backend} (set)"
    else:
        if arch not in rs.priorities and arch != "sm100":
            why.append(f"no vllm default is known for {arch or ctx.hardware}; the sm90 priorities are assumed")
            arch = "sm90"
        if arch == "sm100" and ctx.model_kind == "mla":
            backend = "FLASHINFER_MLA" if ctx.qk_nope_head_dim == 128 and dcp == 1 else "CUTLASS_MLA"
            reason = (
                "forced on sm100 (qk_nope_head_dim 128, DCP off)"
                if backend == "FLASHINFER_MLA"
                else "sm100 with DCP or qk_nope_head_dim != 128"
            )
            d = next(d for d in rs.defaults if d.arch == "sm100")
            if not d.confirmed:
                why.append(f"sm100 default {backend} not confirmed at this commit (docs/engines.md)")
        else:
            skipped = []
            backend = ""
            for cand in rs.priorities[arch]:
                c = rs.backends[cand]
                if arch not in c.arch or c.sparse:
                    continue
                if kv not in c.kv_dtypes:
                    skipped.append(f"{cand} takes no {kv} cache")
                    continue
                backend = cand
                break
            if not backend:  # vLLM would refuse to start; show the rule it has for a 16-bit cache
                backend = next(
                    c for c in rs.priorities[arch] if arch in rs.backends[c].arch and not rs.backends[c].sparse
                )
                why.append(f"no vLLM MLA backend on {arch} takes a {kv} cache (vLLM would not start); {backend} shown")
            reason = f"first {arch} priority that takes a {kv} cache" + (f"; {', '.join(skipped)}" if skipped else "")
        b = rs.backends[backend]
        head = f"{backend}"
    notes: list[str] = []
    t = _decode_threshold(values, b, values["reorder_batch_threshold"] or b.threshold, notes)
    block = values["block_size"] or b.block
    workspace = _workspace(rs, values, ctx, block)
    pcp = values.get("prefill_context_parallel_size", 1) > 1
    if pcp:
        notes.append("prefill context parallelism: short extends still prefilling are prefills")
    first = f"{rs.name} {_where(ctx)} → {head} (threshold {t})"
    if values["backend"] is None:
        first += f": {reason}"
    why.insert(0, first)
    why += notes
    split = {
        "varlen": "requests of at most {t} new tokens with context are decodes until the first longer one",
        "uniform": "after the reorder, decodes are the leading requests whose query length equals the first's "
        "(at most {t})",
        "single": "only one-token queries are decodes",
    }[b.query_len]
    why.append(
        f"{backend} ({b.query_len}): the batch is reordered "
        + (
            "decode, short extend, long extend, no-context prefill; "
            if rs.reorder_regions == 4
            else "decode, extend, no-context prefill; "
        )
        + split.format(t=t)
        + f"; context expands in chunks of the {workspace:,}-token workspace over the prefills with context, "
        f"rounded down to the {block}-token block"
    )
    return EngineParams(
        name,
        rs,
        values,
        set_keys,
        ctx,
        tuple(why),
        backend=backend,
        threshold=t,
        query_len=b.query_len,
        workspace=workspace,
        block=block,
        short_extends_as_decodes=not pcp,
    )


def _set_backend(rs: RuleSet, ctx: Context, backend: str) -> VLLMBackend:
    """The backend `--engine-option vllm.backend=...` names, refused (one line) where vLLM would
    not run it: a dense backend for a DSA model or a sparse one for a dense model, another
    architecture, a cache dtype it does not take."""
    b: VLLMBackend = rs.backends[backend]
    if b.sparse and ctx.model_kind != "dsa":
        raise MlactlError(
            f"{rs.name}: {backend} is a sparse MLA backend, for DSA models (DeepSeek-V3.2); "
            f"{ctx.model} is a dense MLA model"
        )
    if not b.sparse and ctx.model_kind == "dsa":
        sparse = ", ".join(c.name.lower() for c in rs.backends.values() if c.sparse)
        raise MlactlError(
            f"{rs.name}: {ctx.model} is a DSA model, which runs on a sparse MLA backend ({sparse}); "
            f"{backend.lower()} is not one"
        )
    if ctx.arch is not None and ctx.arch not in b.arch:
        raise MlactlError(
            f"{rs.name}: {backend} does not run on {ctx.hardware} ({ctx.arch}); it runs on {', '.join(b.arch)}"
        )
    if ctx.kv_dtype not in b.kv_dtypes:
        raise MlactlError(f"{rs.name}: {backend} takes no {ctx.kv_dtype} cache (it takes {', '.join(b.kv_dtypes)})")
    return b


def _decode_threshold(values: dict, b: VLLMBackend, t: int, notes: list[str]) -> int:
    """The decode threshold in force from `t` (the backend's or the one set): raised to hold a
    speculative step (1 + k, or 1 + 2k with parallel drafting) where the backend takes more than
    one-token queries, and 1 under DCP on a backend without DCP varlen; each change noted."""
    k = values["num_speculative_tokens"]
    if k and b.query_len != "single":
        spec = 1 + (2 if values["parallel_drafting"] else 1) * k
        if spec > t:
            notes.append(f"speculation: threshold max({t}, {spec}) = {spec}")
        t = max(t, spec)
    dcp = values["decode_context_parallel_size"]
    if dcp > 1 and not b.dcp_varlen and t != 1:
        notes.append(f"DCP {dcp} on a backend without DCP varlen: threshold 1")
        t = 1
    return t


def _workspace(rs: RuleSet, values: dict, ctx: Context, block: int, sparse: bool = False) -> int:
    """Context tokens vLLM expands at once: MLACommonMetadataBuilder's
    determine_chunked_prefill_workspace_size (rounded up to the block from 0.33,
    align_mla_chunked_context_workspace_size), or the sparse builder's, also capped at
    max_num_seqs x index_topk (SparseMLACommonMetadataBuilder)."""
    L = values["max_model_len"] or ctx.max_model_len
    seqs = values["max_num_seqs"]
    if sparse:
        return max(min(max(8 * L, 4 * seqs * block), VLLM_WORKSPACE_CAP, seqs * ctx.index_topk), block)
    workspace = max(min(max(8 * L, 4 * seqs * block), VLLM_WORKSPACE_CAP), seqs * block)
    if rs.workspace_round_up:  # align_mla_chunked_context_workspace_size
        workspace = -(-workspace // block) * block
    return workspace


# -- DeepSeek-V3.2 (DSA) ------------------------------------------------------------------------------

# options of the dense rules that the DSA ones never read
_SGLANG_MLA_ONLY = (
    "chunked_prefix_cache_threshold",
    "disable_chunked_prefix_cache",
    "flashinfer_mla_disable_ragged",
    "enable_deterministic_inference",
    "enable_prefill_context_parallel",
)


def _resolve_sglang_dsa(name, rs: RuleSet, values, set_keys, ctx: Context, fixed) -> EngineParams:
    d: SGLangDSA = rs.dsa  # type: ignore[assignment]
    why = []
    for key in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        used = values[key]
        if used is not None and rs.backends[used].handler != "dsa":
            how = f"{name} fixes {key}={used}" if key in fixed else f"{key}={used}"
            raise MlactlError(
                f"{rs.name}: {ctx.model} is a DSA model, which SGLang runs on its dsa backend (nsa before the "
                f"rename); {how} has no sparse attention (select {rs.engine} and leave the backend to the rule)"
            )
    if values["attention_backend"] is None:
        backend = d.backend
        head = f"{backend} (default for DSA models: server_args sets it when no backend is given)"
    else:
        backend = values["attention_backend"]
        head = f"{backend} (set)"
    prefill = values["prefill_attention_backend"] or backend
    decode = values["decode_attention_backend"] or backend
    topk = ctx.index_topk
    thr = values[d.threshold_option]
    if thr is None:
        thr = topk
    elif thr > topk:
        raise MlactlError(
            f"{rs.name}: {d.threshold_option}={thr} is above {ctx.model}'s index_topk ({topk}): SGLang would run "
            "dense attention over more keys than DSA's top-k, which mlactl does not price; give at most "
            f"{topk}"
        )
    cap = values["max_kv_chunk_capacity"]
    arch = ctx.arch
    if arch is None:
        why.append("architecture unknown: taken as sm90 (SGLang checks the device's SM)")
        arch = "sm90"
    cp = values[d.cp_option]
    dense_ok = arch in d.archs and ctx.kv_dtype in d.kv_dtypes and not cp
    graph_flag = next(k for k in rs.options if k.endswith("piecewise_cuda_graph"))
    graph_on = values[graph_flag] if graph_flag.startswith("enable") else not values[graph_flag]
    if graph_flag.startswith("disable") and arch == "rocm":
        graph_on = False
    max_tokens = 0
    if graph_on and not d.graph_captures_dsa:
        if graph_flag in set_keys:
            why.append(f"{graph_flag} has no effect: the piecewise graph does not capture DSA models in this release")
    elif graph_on and d.graph_guard and not cp:  # prefill CP turns the graph off (attn_cp_size > 1)
        max_tokens = values["piecewise_cuda_graph_max_tokens"]
    where = _where(ctx)
    first = f"{rs.name} {where} → {head}"
    if prefill != backend or decode != backend:
        first += f"; extends on {prefill}, decodes on {decode}"
    why.insert(0, first)
    why.append(
        f"{prefill} (DSA): an extend batch whose longest sequence is at most {thr:,} tokens and whose summed "
        f"sequences are at most {cap:,} runs dense MHA (dense_expand: MHA_ONE_SHOT, the indexer writing only "
        "each new token's key); every other batch, and every decode, the sparse MQA (sparse_absorb)"
    )
    if values[d.threshold_option] is None:
        why.append(f"dense threshold {thr:,}: the model's index_topk ({d.threshold_option} not set)")
    if arch not in d.archs:
        why.append(f"dense MHA runs only on SM90 and SM100: every batch sparse on {arch}")
    if ctx.kv_dtype not in d.kv_dtypes:
        why.append(f"dense MHA needs a bf16 or fp8_e4m3 cache: every batch sparse with {ctx.kv_dtype}")
    if cp:
        why.append(f"{d.cp_option}: every extend runs the sparse MQA")
    if max_tokens:
        why.append(
            f"piecewise CUDA graph on: extend batches of <= {max_tokens} new tokens run sparse (MHA off in a graph)"
        )
    if values["enable_mixed_chunk"]:
        why.append(
            "mixed chunk on: a step's decodes join its extend batch; their sequences count in its longest and sum"
        )
    ignored = [k for k in _SGLANG_MLA_ONLY if k in set_keys]
    if ignored:
        why.append(f"not read by the DSA rule: {', '.join(ignored)}")
    return EngineParams(
        name,
        rs,
        values,
        set_keys,
        ctx,
        tuple(why),
        backend=prefill,
        decode_backend=decode,
        threshold=thr,
        capacity=cap,
        chunked_prefix_cache=False,
        graph_max_tokens=max_tokens,
        paths=DSA_PATHS,
        dense_threshold=thr,
        dense_ok=dense_ok,
        topk=topk,
        dense_indexer=d.dense_indexer,
    )


def sparse_threshold(b: VLLMBackend, arch: str | None, heads: int) -> int:
    """A sparse builder's decode threshold for `heads` query heads per GPU on `arch`."""
    for where, pairs, other in b.heads_thresholds:
        if where in (arch, "*"):
            return dict(pairs).get(heads, other)
    return b.threshold


def _resolve_vllm_dsa(name, rs: RuleSet, values, set_keys, ctx: Context) -> EngineParams:
    d: VLLMDSA = rs.dsa  # type: ignore[assignment]
    why = []
    kv, arch = ctx.kv_dtype, ctx.arch
    sparse = [c for c in rs.backends.values() if c.sparse]
    if values["backend"] is not None:
        backend = values["backend"].upper()
        b: VLLMBackend = _set_backend(rs, ctx, backend)
        reason = "set"
    else:
        if arch not in rs.priorities:
            why.append(f"no vllm default is known for {arch or ctx.hardware}; the sm90 priorities are assumed")
            arch = "sm90"
        cands = [rs.backends[c] for c in rs.priorities[arch] if rs.backends[c].sparse]
        fit = [c for c in cands if arch in c.arch and kv in c.kv_dtypes]
        if fit:
            b = fit[0]
            reason = f"the first sparse backend in cuda.py's {arch} priorities that runs here with a {kv} cache"
        else:  # vLLM would refuse to start; show the rule of the listed one
            b = cands[0] if cands else sparse[0]
            reason = f"no vLLM sparse MLA backend runs on {arch} with a {kv} cache (vLLM would not start); shown"
        backend = b.name
    notes: list[str] = []
    t = _decode_threshold(values, b, values["reorder_batch_threshold"] or sparse_threshold(b, arch, ctx.heads), notes)
    dcp = values["decode_context_parallel_size"]
    block = values["block_size"] or b.block
    workspace = _workspace(rs, values, ctx, block, sparse=True)
    pcp = values.get("prefill_context_parallel_size", 1) > 1
    force = values.get("sparse_mla_force_mqa", False)
    mha = d.mha and not force
    row = d.masked.get(backend, {}).get(ctx.tp)
    dims = (ctx.heads * ctx.tp, ctx.kv_lora_rank, ctx.qk_nope_head_dim, ctx.qk_rope_head_dim, ctx.v_head_dim)
    available = arch in d.masked_archs and kv in d.masked_kv_dtypes and dims == d.masked_dims
    masked_ok = mha and available and dcp <= 1 and row is not None
    first = f"{rs.name} {_where(ctx)} → {backend} ("
    first += f"threshold {t}): {reason}" if d.mha else f"every token sparse MQA): {reason}"
    why.insert(0, first)  # the backend first, any assumption after it
    why += notes
    if not d.mha:
        why.append(
            f"{backend}: every token runs the sparse MQA (sparse_absorb): MLAAttention.forward_impl sends a "
            "sparse impl's whole batch to forward_mqa"
        )
    else:
        split = {
            "varlen": "requests of at most {t} new tokens with context are decodes until the first longer one",
            "uniform": "decodes are the leading requests whose query length equals the first's (at most {t})",
            "single": "only one-token queries are decodes",
        }[b.query_len].format(t=t)
        why.append(
            f"{backend} ({b.query_len}): the batch is reordered decode, short extend, long extend, no-context "
            f"prefill; {split}; decodes run the sparse MQA (sparse_absorb)"
        )
        if force:
            why.append("sparse_mla_force_mqa: every prefill runs the sparse MQA too")
        else:
            why.append(
                f"a step's prefills run dense MHA (dense_expand) when their longest sequence is at most "
                f"{ctx.index_topk:,} (use_dense_mha), "
                + (
                    "masked MHA (masked_expand) when their longest query reaches "
                    + ", ".join(f"{'never' if m is None else m} (seq <= {s:,})" for m, s in zip(row or (), d.buckets))
                    + f" (TP {ctx.tp}) and their top-k masks fit the workspace, "
                    if masked_ok
                    else ""
                )
                + "else every token of the step runs the sparse MQA"
            )
            if not masked_ok:
                why.append("no masked MHA: " + _masked_off(d, arch, kv, dims, dcp, row, backend, ctx))
            why.append(
                f"context expands in chunks of the {workspace:,}-token workspace (the sparse builder's), "
                f"rounded down to the {block}-token block; the indexer runs in full on every path"
            )
    if pcp and d.mha:
        why.append("prefill context parallelism: short extends still prefilling are prefills")
    return EngineParams(
        name,
        rs,
        values,
        set_keys,
        ctx,
        tuple(why),
        backend=backend,
        threshold=t,
        query_len=b.query_len,
        workspace=workspace,
        block=block,
        short_extends_as_decodes=not pcp,
        paths=DSA_PATHS,
        mha=mha,
        masked_row=row if masked_ok else None,
        masked_ok=masked_ok,
        topk=ctx.index_topk,
        dense_indexer=d.dense_indexer,
    )


def _masked_off(d: VLLMDSA, arch, kv, dims, dcp, row, backend, ctx: Context) -> str:
    """Why masked MHA never fires here (the first unmet condition of forward_impl's use_masked_mha)."""
    if arch not in d.masked_archs:
        return f"it needs SM100 and FlashAttention 4 (_is_masked_mha_available), not {arch}"
    if kv not in d.masked_kv_dtypes:
        return f"it needs an unquantized cache, not {kv}"
    if dims != d.masked_dims:
        return "it needs DeepSeek-V3.2's dims (128 heads over all GPUs, 512/128/64/128)"
    if dcp > 1:
        return "decode context parallelism is on"
    return f"_DSV32_MASKED_MHA_THRESHOLDS has no row for {backend} at TP {ctx.tp}"
