"""The engines' rule sets as data: one per release, `ENGINE@VERSION`.

Each rule set names the source it was read from (repository, commit, file, lines), the
attention backends of that release and what each does to the path, the default backend per GPU
architecture and cache dtype, and the options a user may set, under the engine's own names.
The logic that reads this data is small and lives beside it (sglang.py, vllm.py). Adding a
release is a new entry here, with its citations, plus its cases in tests/test_engines.py
(CONTRIBUTING.md, "Add an engine release").

Where a fact could not be confirmed in a source, the entry says so (`confirmed=False`, with a
note); the "why" line of every resolved rule carries that note to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# -- the pieces ------------------------------------------------------------------------------------

INT_MAX = 2**31 - 1  # every integer option fits int32 as the engines store them


@dataclass(frozen=True)
class Option:
    """One setting of an engine, under the engine's own name (a server flag, an environment
    variable or a config field; `source` says which)."""

    name: str
    kind: type  # int, bool or str
    default: object  # None: resolved from the context (backend, model)
    help: str
    source: str
    choices: tuple[str, ...] = ()
    minimum: int = 0
    maximum: int = INT_MAX


@dataclass(frozen=True)
class SGLangBackend:
    """What one SGLang attention backend's handler does (attention_backend_handler.py)."""

    name: str
    handler: str  # generic | fa3 | trtllm | fa4 | aiter | triton
    one_shot: bool = False  # in MHA_ONE_SHOT_SUPPORTED_BACKENDS
    chunked_prefix_cache: bool = False  # in CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS
    ragged_switch: bool = False  # flashinfer_mla_disable_ragged applies (flashinfer, flashmla)
    graph_mla: bool = True  # the handler returns MLA inside a piecewise (prefill) CUDA graph
    graph_mha: bool = False  # ... returns MHA there (aiter in 0.5.23)
    prefill_cp: bool = False  # the handler forces MLA under prefill context parallelism


@dataclass(frozen=True)
class VLLMBackend:
    """One vLLM MLA backend: its builder's decode threshold and query-length support, the
    cache dtypes and compute capabilities it accepts, and its KV block size."""

    name: str  # AttentionBackendEnum name
    threshold: int  # reorder_batch_threshold of its metadata builder
    query_len: str  # single | uniform | varlen (QueryLenSupport)
    kv_dtypes: tuple[str, ...]  # mlactl names of the cache dtypes it takes
    arch: tuple[str, ...]  # architectures it runs on
    block: int  # tokens per KV block (page) the platform forces for it
    dcp_varlen: bool = False  # supports_dcp_with_varlen: keeps its threshold under DCP
    sparse: bool = False  # a sparse MLA backend: DSA models only, and only these take them
    # sparse builders: the decode threshold by query heads per GPU, per architecture ("sm100",
    # or "*" for the others): ((heads, threshold), ...), the threshold of any other head count
    heads_thresholds: tuple = ()


@dataclass(frozen=True)
class Default:
    """The default backend for one architecture (and optionally one cache dtype / model)."""

    arch: str
    backend: str
    reason: str
    source: str
    confirmed: bool = True
    model_arch: str | None = None  # only for this model architecture (e.g. DeepseekV3ForCausalLM)


@dataclass(frozen=True)
class Source:
    """Where a rule set's facts were read: repository, commit (or release), files and lines."""

    repo: str
    commit: str
    files: tuple[tuple[str, str], ...]  # (path with lines, what it gives)
    note: str = ""

    @property
    def short(self) -> str:
        """`repo@commit8`, or `repo@release` where the commit is not known."""
        return f"{self.repo}@{self.commit if '.' in self.commit else self.commit[:8]}"


@dataclass(frozen=True)
class SGLangDSA:
    """SGLang's rule for a DSA model (DeepSeek-V3.2). The `dsa` (alias `nsa`) backend's handler
    returns MHA_ONE_SHOT (dense_expand) when the backend's set_dsa_prefill_impl set use_mha for
    the batch, else MLA (sparse_absorb): use_mha needs an extend without speculation on SM90 or
    SM100, its longest sequence at most the threshold, a bf16 or fp8_e4m3 cache, its summed
    sequences within the chunk capacity, no DSA prefill context parallelism, and (where the
    release has the guard) the batch outside a captured prefill graph."""

    backend: str  # what server_args sets for a DSA model when no backend is given
    threshold_option: str  # the environment variable of the dense threshold (option name)
    cp_option: str  # the DSA prefill context-parallel flag (option name)
    graph_guard: bool  # use_mha is False inside a piecewise (prefill) CUDA graph
    graph_captures_dsa: bool  # the piecewise graph runs for DSA models at all
    archs: tuple[str, ...] = ("sm90", "sm100")  # device_sm == 90 or 100 <= sm < 110
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")  # token_to_kv_pool dtype bfloat16 or float8_e4m3fn
    dense_indexer: str = "key"  # dense MHA runs only the indexer's key (nsa_indexer skip_logits_computation)
    source: str = ""


@dataclass(frozen=True)
class VLLMDSA:
    """vLLM's rule for a DSA model on its sparse MLA backends. Decodes (the reorder and split of
    the dense rule, with the sparse builder's threshold) run the sparse MQA. With `mha`, the
    step's prefills run MHA when the longest prefill sequence is at most index_topk (dense) or,
    where masked MHA is available, when the longest prefill query reaches the table's minimum for
    the backend, TP size and the longest sequence's bucket and the top-k masks fit the workspace
    (masked); otherwise every token of the step runs the sparse MQA."""

    mha: bool  # False: sparse impls run forward_mqa only
    masked: dict = field(default_factory=dict)  # _DSV32_MASKED_MHA_THRESHOLDS: backend -> TP -> per bucket
    buckets: tuple[int, ...] = ()  # _DSV32_SEQ_LEN_BUCKETS: a sequence length's bucket is the first >= it
    masked_archs: tuple[str, ...] = ()  # _is_masked_mha_available: is_device_capability_family(100), FA4
    masked_kv_dtypes: tuple[str, ...] = ()  # ... and not a quantized cache
    # ... and the model's dims: heads over all GPUs, kv_lora_rank, qk_nope, qk_rope, v_head_dim
    masked_dims: tuple[int, int, int, int, int] = (128, 512, 128, 64, 128)
    mask_words: int = 0  # int32 words of the top-k mask workspace (GLOBAL_TOPK_MASK_MAX_BYTES // 4)
    dense_indexer: str = "full"  # the indexer runs in full on every path (mla.py, sparse_attn_indexer.py)
    source: str = ""


@dataclass(frozen=True)
class RuleSet:
    engine: str  # sglang | vllm
    version: str  # a release number, or a commit where the release could not be confirmed
    source: Source
    options: dict[str, Option]
    backends: dict
    defaults: tuple[Default, ...]
    notes: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)  # mlactl's older option names
    # vLLM: the MLA backend priority per architecture (platforms/cuda.py _get_backend_priorities)
    priorities: dict[str, tuple[str, ...]] = field(default_factory=dict)
    model_kinds: tuple[str, ...] = ("mla",)  # the model kinds it has rules for: mla, dsa
    dsa: SGLangDSA | VLLMDSA | None = None  # the rule for DSA models, where model_kinds has "dsa"
    # vLLM: the reorder's regions: 3 (decode, extend, prefill) or 4 (decode, short extend, long
    # extend, prefill: a short extend still prefilling goes behind the decodes)
    reorder_regions: int = 3
    # vLLM: the workspace rounded up to the block (align_mla_chunked_context_workspace_size)
    workspace_round_up: bool = False
    # vLLM: its own cuda.py read (else its sm100 default, check_and_update_config's, is taken from a later one)
    defaults_confirmed: bool = True

    @property
    def name(self) -> str:
        return f"{self.engine}@{self.version}"


# -- SGLang ----------------------------------------------------------------------------------------

SGL_REPO = "sgl-project/sglang"
HANDLER = "python/sglang/srt/models/deepseek_common/attention_backend_handler.py"
SERVER_ARGS = "python/sglang/srt/server_args.py"
ENVIRON = "python/sglang/srt/environ.py"
DSA_BACKEND = "python/sglang/srt/layers/attention/dsa_backend.py"
NSA_BACKEND = "python/sglang/srt/layers/attention/nsa_backend.py"
MODEL_CONFIG = "python/sglang/srt/configs/model_config.py"


def _sgl_backends(*, cutlass: bool, aiter_graph_mha: bool) -> dict[str, SGLangBackend]:
    one_shot = dict(one_shot=True, prefill_cp=True, chunked_prefix_cache=True)
    cpc = dict(chunked_prefix_cache=True)
    out = [
        SGLangBackend("fa3", "fa3", **one_shot),
        SGLangBackend("flashinfer", "generic", ragged_switch=True, **one_shot),
        SGLangBackend("flashmla", "generic", ragged_switch=True, **one_shot),
        SGLangBackend("fa4", "fa4", graph_mla=False, **cpc),
        SGLangBackend("trtllm_mla", "trtllm", **cpc),
        SGLangBackend("tokenspeed_mla", "trtllm", **cpc),
        SGLangBackend("aiter", "aiter", graph_mla=False, graph_mha=aiter_graph_mha),
        SGLangBackend("triton", "triton"),
        # DeepSeek-V3.2's sparse backend: registered as "dsa" with "nsa" its deprecated alias (the
        # handler at 0a8dcfa9 L207-L210); handle_attention_dsa reads the backend's use_mha
        SGLangBackend("dsa", "dsa", graph_mla=False),
        SGLangBackend("nsa", "dsa", graph_mla=False),
    ]
    if cutlass:
        out.append(SGLangBackend("cutlass_mla", "generic", prefill_cp=True, **cpc))
    return {b.name: b for b in sorted(out, key=lambda b: b.name)}


def _sgl_options(backends, graph_flag: str, dsa: SGLangDSA) -> dict[str, Option]:
    names = tuple(backends)
    graph = "on" if graph_flag.startswith("enable") else "off"
    backend_options = {
        "attention_backend": "the attention backend (default: per GPU architecture and model, see --list)",
        "prefill_attention_backend": "backend of extend batches (default: attention_backend)",
        "decode_attention_backend": "backend of decode batches (default: attention_backend)",
    }
    opts = [_server(key, help, str, None, choices=names) for key, help in backend_options.items()]
    opts += [
        _env("chunked_prefix_cache_threshold", 8192, "summed prefix from which an extend batch expands"),
        _env("max_kv_chunk_capacity", 128 * 1024, "most summed tokens a one-shot expand takes", minimum=1),
        _server(
            "disable_chunked_prefix_cache", "only prefix-0 extends expand (also forced off for backends without it)"
        ),
        _server("flashinfer_mla_disable_ragged", "flashinfer and flashmla run every extend as MLA"),
        _server("enable_deterministic_inference", "fa3 and triton run every batch as MLA"),
        _server("enable_mixed_chunk", "decodes join the step's extend batch (their prefixes count in its sum)"),
        _switch(
            "enable_prefill_context_parallel",
            "prefill context parallelism: extends on fa3/flashinfer/flashmla run MLA",
            "python/sglang/srt/layers/utils/cp_utils.py mla_use_prefill_cp",
        ),
        _server(graph_flag, f"the piecewise (prefill) CUDA graph {graph}"),
        _server(
            "piecewise_cuda_graph_max_tokens",
            "extend batches of at most this many new tokens run inside the graph (MLA)",
            int,
            2048,
            note=" (2048 for MLA models)",
            minimum=1,
        ),
        _env(
            dsa.threshold_option,
            None,
            "DSA: an extend batch whose longest sequence is at most this runs dense MHA "
            "(default: the model's index_topk)",
            note=f"; {SERVER_ARGS} sets it to index_topk unless set",
        ),
        _server(
            dsa.cp_option,
            "DSA prefill context parallelism: every extend runs the sparse MQA",
            note=" (is_dsa_enable_prefill_cp)",
        ),
    ]
    return {o.name: o for o in opts}


def _switch(name: str, help: str, source: str) -> Option:
    """A setting that is off unless turned on."""
    return Option(name, bool, False, help, source)


def _server(name: str, help: str, kind: type = bool, default=False, note: str = "", **kw) -> Option:
    """A server_args.py flag, `--name-with-dashes` (by default a switch, off)."""
    return Option(name, kind, default, help, f"{SERVER_ARGS} --{name.replace('_', '-')}{note}", **kw)


def _env(name: str, default, help: str, note: str = "", **kw) -> Option:
    """An integer of environ.py, `SGLANG_NAME`."""
    return Option(name, int, default, help, f"{ENVIRON} SGLANG_{name.upper()}{note}", **kw)


def _sgl_dsa(gen: str, **kw) -> SGLangDSA:
    """The DSA rule of a release whose sparse backend, threshold and CP flag are named `gen`
    (nsa, then dsa)."""
    return SGLangDSA(gen, f"{gen}_prefill_dense_attn_kv_len_threshold", f"enable_{gen}_prefill_context_parallel", **kw)


SGLANG_ALIASES = {
    "threshold": "chunked_prefix_cache_threshold",
    "capacity": "max_kv_chunk_capacity",
    "backend": "attention_backend",
    "cuda_graph_max_tokens": "piecewise_cuda_graph_max_tokens",
}
# the DSA names of one generation, each taking the other's (environ.py's EnvIntWithAlias reads
# SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD as the deprecated name of the DSA one)
_TO_NSA = {  # a DSA-era name given to a release that reads the NSA one
    "dsa_prefill_dense_attn_kv_len_threshold": "nsa_prefill_dense_attn_kv_len_threshold",
    "enable_dsa_prefill_context_parallel": "enable_nsa_prefill_context_parallel",
}
_TO_DSA = {v: k for k, v in _TO_NSA.items()}

_SGL_DEFAULTS_SRC = (
    f"{SERVER_ARGS} _handle_attention_backend_compatibility (MLA: fa3 on Hopper, flashinfer on "
    "sm100, aiter on HIP, else triton) and _handle_model_specific_adjustments (trtllm_mla on sm100 "
    "for DeepseekV3ForCausalLM)"
)
_SGL_DEFAULTS = tuple(
    Default(arch, backend, reason, _SGL_DEFAULTS_SRC, model_arch=model_arch)
    for arch, backend, reason, model_arch in (
        ("sm90", "fa3", "MLA models on Hopper (CUDA >= 12.3)", None),
        ("sm100", "trtllm_mla", "DeepseekV3ForCausalLM on sm100", "DeepseekV3ForCausalLM"),
        ("sm100", "flashinfer", "MLA models on sm100", None),
        ("rocm", "aiter", "MLA models on HIP", None),
        ("sm80", "triton", "MLA models elsewhere", None),
        ("sm89", "triton", "MLA models elsewhere (not Hopper, not sm100)", None),
        ("sm120", "triton", "MLA models elsewhere (not Hopper, not sm100)", None),
    )
)


def _sglang(version: str, source: Source, *, cutlass: bool, aiter_graph_mha: bool, graph_flag: str, **kw) -> RuleSet:
    """An SGLang release: its backends (with cutlass_mla or not; aiter's handler returning MHA
    inside a piecewise graph or not), its piecewise-graph flag (`enable_...`: off by default;
    `disable_...`: on), its DSA rule, and the defaults and options every release has."""
    backends = _sgl_backends(cutlass=cutlass, aiter_graph_mha=aiter_graph_mha)
    options = _sgl_options(backends, graph_flag, kw["dsa"])
    return RuleSet("sglang", version, source, options, backends, _SGL_DEFAULTS, model_kinds=("mla", "dsa"), **kw)


SGLANG_0_5_14 = _sglang(
    "0.5.14",
    Source(
        SGL_REPO,
        "0a8dcfa94b4bdbf1d41231a013714329ceb72e25",
        (
            (
                f"{HANDLER} L14 (MHA_ONE_SHOT_SUPPORTED_BACKENDS), L71-L76 (_support_mha_one_shot), "
                "L79-L109 (_handle_attention_backend)",
                "the rules",
            ),
            (
                f"{HANDLER} L116-L121, L132-L134, L137-L153",
                "fa3's deterministic switch, fa4, trtllm_mla, tokenspeed_mla",
            ),
            (f"{HANDLER} L156-L160, L177-L191; L24-L26", "aiter, triton; a backend without a handler gets triton's"),
            (SERVER_ARGS + " (version with enable_piecewise_cuda_graph = False)", "the piecewise graph is off"),
            (ENVIRON, "SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD 8192, SGLANG_MAX_KV_CHUNK_CAPACITY 128K"),
        ),
        note="release not confirmed: rules read at commit 0a8dcfa9, taken as 0.5.14",
    ),
    cutlass=True,
    aiter_graph_mha=False,
    graph_flag="enable_piecewise_cuda_graph",
    dsa=_sgl_dsa(
        "nsa",
        graph_guard=False,
        graph_captures_dsa=False,
        source=(
            f"{HANDLER} L163-L174 (handle_attention_dsa), L207-L210 (dsa, nsa registered) at 0a8dcfa9; "
            f"use_mha as in {NSA_BACKEND} set_nsa_prefill_impl (005e8bf8) and {DSA_BACKEND} "
            f"set_dsa_prefill_impl (0034a380); {MODEL_CONFIG} is_piecewise_cuda_graph_disabled_model "
            "(or is_deepseek_nsa)"
        ),
    ),
    notes=(
        "DSA: SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD is taken as this release's name (environ.py "
        "not read at 0a8dcfa9); that commit's handler already registers dsa with nsa as the deprecated "
        "alias, so both names are taken",
        "DSA: set_dsa_prefill_impl not read at 0a8dcfa9; its use_mha conditions are those of the later "
        "versions read (nsa_backend.py at 005e8bf8, dsa_backend.py at 0034a380), without their graph guard",
    ),
    aliases={**SGLANG_ALIASES, **_TO_NSA},
)

SGLANG_0_5_23 = _sglang(
    "0.5.23",
    Source(
        SGL_REPO,
        "0.5.23",
        (
            (f"{HANDLER} (the version without cutlass_mla; commit not known)", "the rules"),
            (f"{HANDLER} handle_attention_aiter", "aiter runs MHA inside a piecewise/breakable graph"),
            (SERVER_ARGS + " (version with disable_piecewise_cuda_graph = False)", "the piecewise graph is on"),
        ),
        note=(
            "release not confirmed: rules read from the newest attention_backend_handler.py found, "
            "whose commit is not known, taken as 0.5.23"
        ),
    ),
    cutlass=False,
    aiter_graph_mha=True,
    graph_flag="disable_piecewise_cuda_graph",
    dsa=_sgl_dsa(
        "dsa",
        graph_guard=True,
        graph_captures_dsa=True,
        source=(
            f"{HANDLER} handle_attention_dsa (newest read); {DSA_BACKEND} set_dsa_prefill_impl (0034a380: "
            f"MHA off inside a piecewise or breakable graph); {MODEL_CONFIG} (001adf56: DSA models no longer "
            f"among piecewise_cuda_graph_disabled_model_archs); {ENVIRON} "
            "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"
        ),
    ),
    notes=(
        "piecewise graph off for DeepSeek-V3 on trtllm_mla: assumed, not found in server_args.py",
        "DSA: the newest set_dsa_prefill_impl, model_config.py and environ.py read are taken as 0.5.23's "
        "(release not confirmed); that the prefill graph captures DSA models in 0.5.23 rests on them",
    ),
    aliases={**SGLANG_ALIASES, **_TO_DSA},
)

# -- vLLM ------------------------------------------------------------------------------------------

VLLM_REPO = "vllm-project/vllm"
MLA_ATTN = "vllm/model_executor/layers/attention/mla_attention.py"
SPARSE_ATTN = "vllm/model_executor/layers/attention/sparse_mla_attention.py"
BACKEND = "vllm/v1/attention/backend.py"
UTILS = "vllm/v1/attention/backends/utils.py"
CUDA = "vllm/platforms/cuda.py"
MLA_DIR = "vllm/v1/attention/backends/mla"

_16 = ("bf16", "fp16")
_FP8 = ("bf16", "fp16", "fp8")

# The sparse builders' decode threshold by query heads per GPU (0.33: flashmla_sparse.py
# FlashMLASparseMetadataBuilder.__init__; flashinfer_mla_sparse.py, the version whose builder
# derives from SparseMLACommonMetadataBuilder), on sm100 and on the other architectures.
_SPARSE_SM100 = ((8, 128), (16, 128), (32, 128), (64, 256), (128, 1024))
_FLASHMLA_SPARSE_HEADS = (("sm100", _SPARSE_SM100, 1024), ("*", ((16, 128), (32, 128), (64, 256), (128, 256)), 256))
_FLASHINFER_SPARSE_HEADS = (("sm100", _SPARSE_SM100, 1024),)


def _vllm_backends(*, flashinfer_dcp_varlen: bool, sparse_builders: bool) -> dict[str, VLLMBackend]:
    """A release's backends; `sparse_builders`: its sparse builders set their own threshold by
    heads and take DCP varlen (FlashInfer's sparse one VARLEN), as in 0.33."""
    new = sparse_builders
    sparse = dict(dcp_varlen=new, sparse=True)
    out = [
        VLLMBackend("FLASH_ATTN_MLA", 512, "varlen", _16, ("sm90",), 16, dcp_varlen=True),
        VLLMBackend("FLASHMLA", 128, "uniform", _FP8, ("sm90", "sm100"), 64),
        VLLMBackend("FLASHINFER_MLA", 1, "uniform", _FP8, ("sm100",), 64, dcp_varlen=flashinfer_dcp_varlen),
        VLLMBackend("CUTLASS_MLA", 1, "single", _FP8, ("sm100",), 128),
        VLLMBackend("TRITON_MLA", 1, "uniform", _FP8, ("sm80", "sm89", "sm90", "sm100", "sm120"), 16),
        # sparse MLA (DSA models): FlashMLA sparse takes bf16 and its fp8_ds_mla cache (fp8 is its
        # alias) on SM90/SM100; FlashInfer sparse bf16/fp16/fp8 on SM100; both 64-token blocks
        # (cuda.py forces 64 for a sparse model)
        VLLMBackend(
            "FLASHMLA_SPARSE",
            1,
            "uniform",
            ("bf16", "fp8"),
            ("sm90", "sm100"),
            64,
            heads_thresholds=_FLASHMLA_SPARSE_HEADS if new else (),
            **sparse,
        ),
        VLLMBackend(
            "FLASHINFER_MLA_SPARSE",
            1,
            "varlen" if new else "uniform",
            _FP8,
            ("sm100",),
            64,
            heads_thresholds=_FLASHINFER_SPARSE_HEADS if new else (),
            **sparse,
        ),
    ]
    return {b.name: b for b in out}


def _vllm_options(backends, *, pcp: bool, force_mqa: bool) -> dict[str, Option]:
    workspace = f"{MLA_ATTN} determine_chunked_prefill_workspace_size"
    opts = [
        Option(
            "backend",
            str,
            None,
            "the MLA attention backend (default: per GPU architecture and cache dtype)",
            f"{CUDA} / --attention-backend (attention_config.backend)",
            choices=tuple(b.lower() for b in backends),
        ),
        Option(
            "num_speculative_tokens",
            int,
            0,
            "speculative tokens: the decode threshold becomes max(t, 1 + k)",
            f"{BACKEND} _init_reorder_batch_threshold (speculative_config)",
            maximum=1024,
        ),
        _switch(
            "parallel_drafting",
            "parallel drafting doubles k in the threshold: max(t, 1 + 2k)",
            f"{BACKEND} _init_reorder_batch_threshold",
        ),
        _size(
            "decode_context_parallel_size",
            "DCP > 1 drops the threshold to 1 on backends without DCP varlen support",
            f"{BACKEND} _init_reorder_batch_threshold (parallel_config)",
        ),
        _count(
            "reorder_batch_threshold",
            None,
            "override the builder's decode threshold (a what-if: a class attribute, not a vLLM flag)",
            f"{MLA_DIR}/<backend>.py reorder_batch_threshold",
        ),
        _count("max_model_len", None, "sizes the context workspace (default: the model's context length)", workspace),
        _count("max_num_seqs", 256, "sizes the context workspace (at least max_num_seqs x block_size)", workspace),
        _count(
            "block_size",
            None,
            "KV block (page) size; the context chunk rounds down to it (default: the backend's)",
            f"{CUDA} check_and_update_config",
            maximum=4096,
        ),
    ]
    if force_mqa:
        opts.append(
            _switch(
                "sparse_mla_force_mqa",
                "DSA: every token of a sparse MLA backend runs the sparse MQA (no dense or masked MHA)",
                f"{MLA_ATTN} MLAAttention.forward_impl (attention_config.sparse_mla_force_mqa)",
            )
        )
    if pcp:
        opts.append(
            _size(
                "prefill_context_parallel_size",
                "PCP > 1: short extends still prefilling count as prefills (treat_short_extends_as_decodes=False)",
                f"{MLA_ATTN} MLACommonMetadataBuilder.build, {UTILS} split_decodes_and_prefills",
            )
        )
    return {o.name: o for o in opts}


def _count(name: str, default, help: str, source: str, maximum: int = INT_MAX) -> Option:
    """A whole number of at least 1 (None: the backend's, the model's)."""
    return Option(name, int, default, help, source, minimum=1, maximum=maximum)


def _size(name: str, help: str, source: str) -> Option:
    """A parallel size: 1 (off) by default, at most 1024."""
    return _count(name, 1, help, source, maximum=1024)


VLLM_ALIASES = {"threshold": "reorder_batch_threshold"}

# cuda.py _get_backend_priorities: one list for capability 10.x, one for every other; a backend
# that does not run on the architecture (supports_compute_capability) is passed over.
# FLASHMLA_SPARSE, last in both lists, is the one sparse backend there: a DSA model's default.
_NOT_SM100 = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE")
_VLLM_PRIORITY = {
    "sm90": _NOT_SM100,
    "sm100": ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA", "FLASHMLA_SPARSE"),
    "sm80": _NOT_SM100,
    "sm89": _NOT_SM100,
    "sm120": _NOT_SM100,
}


def _vllm(
    version: str,
    source: Source,
    *,
    flashinfer_dcp_varlen: bool,
    sparse_builders: bool,
    pcp: bool,
    force_mqa: bool,
    **kw,
) -> RuleSet:
    """A vLLM release: its backends, the options it has (prefill context parallelism,
    sparse_mla_force_mqa), its defaults (`defaults_confirmed`: its own cuda.py read), and the
    priorities every release has."""
    backends = _vllm_backends(flashinfer_dcp_varlen=flashinfer_dcp_varlen, sparse_builders=sparse_builders)
    options = _vllm_options(backends, pcp=pcp, force_mqa=force_mqa)
    return RuleSet(
        "vllm",
        version,
        source,
        options,
        backends,
        (),  # vLLM's default is worked out from the priorities (vllm.py _default), not listed
        aliases=VLLM_ALIASES,
        priorities=_VLLM_PRIORITY,
        model_kinds=("mla", "dsa"),
        **kw,
    )


VLLM_0014CA6B = _vllm(
    "0014ca6b",
    Source(
        VLLM_REPO,
        "0014ca6b9929614f1b72c4bb11e5238de49cba89",
        (
            (f"{MLA_ATTN} QueryLenSupport, MLACommonMetadataBuilder.__init__ and build", "the split and the chunk"),
            (f"{BACKEND} AttentionMetadataBuilder._init_reorder_batch_threshold", "speculation and DCP"),
            (f"{UTILS} split_decodes_and_prefills, reorder_batch_to_split_decodes_and_prefills", "read at 00bd1493"),
            (f"{MLA_DIR}/flashmla.py, flashattn_mla.py, flashinfer_mla.py, cutlass_mla.py", "thresholds"),
        ),
        note=(
            "release not known: the rule set is named by its commit, 0014ca6b; utils.py and cuda.py "
            "read at 00bd1493 and 002db495"
        ),
    ),
    flashinfer_dcp_varlen=False,
    sparse_builders=False,
    pcp=False,
    force_mqa=False,
    defaults_confirmed=False,
    dsa=VLLMDSA(
        mha=False,
        source=f"{MLA_ATTN} MLAAttention.forward_impl at 0014ca6b (sparse MLA impls only support forward_mqa)",
    ),
    notes=(
        "DSA: every token of a sparse backend runs the sparse MQA at 0014ca6b (MLAAttention.forward_impl), "
        "so the sparse builders' thresholds, not read at this commit, change no path",
    ),
)

VLLM_0_33_0 = _vllm(
    "0.33.0",
    Source(
        VLLM_REPO,
        "0.33.0",
        (
            (f"{CUDA} at 002db495: _get_backend_priorities, check_and_update_config", "defaults"),
            (f"{MLA_DIR}/flashinfer_mla.py at 002d68ef", "FLASHINFER_MLA: UNIFORM, threshold 1, DCP varlen"),
            (
                f"{UTILS} (newest read: split_decodes_and_prefills with treat_short_extends_as_decodes)",
                "the split, PCP",
            ),
            (
                "vllm/v1/worker reorder_batch_to_split_decodes_and_prefills (four regions)",
                "decode, short extend, long extend, prefill",
            ),
            (
                f"{MLA_ATTN} (newest read: build passes treat_short_extends_as_decodes=not use_pcp; "
                "plan_mla_context_chunks, align_mla_chunked_context_workspace_size)",
                "PCP, the packed context, the workspace rounded up to the block",
            ),
        ),
        note="release not confirmed: the newest files found (several without a known commit), taken as v0.33.0's",
    ),
    flashinfer_dcp_varlen=True,
    sparse_builders=True,
    pcp=True,
    force_mqa=True,
    defaults_confirmed=True,
    reorder_regions=4,
    workspace_round_up=True,
    dsa=VLLMDSA(
        mha=True,
        masked={  # _DSV32_MASKED_MHA_THRESHOLDS: per TP size, the least query length per bucket (None: never)
            "FLASHMLA_SPARSE": {
                1: (1536, 4096, None, None, None),
                2: (512, 1024, 4096, None, None),
                4: (512, 1024, 1536, 8192, None),
                8: (512, 512, 1024, 2048, 16384),
            },
            "FLASHINFER_MLA_SPARSE": {8: (512, 1024, 1024, 2048, 32768)},
        },
        buckets=(2048, 4096, 8192, 16384, 32768),
        masked_archs=("sm100",),
        masked_kv_dtypes=("bf16", "fp16"),
        mask_words=128 * 1024 * 1024 // 4,
        source=(
            f"{MLA_ATTN} (newest read) _DSV32_MASKED_MHA_THRESHOLDS, _use_masked_mha, MLAAttention.forward_impl; "
            f"{SPARSE_ATTN} SparseMLACommonMetadataBuilder.build (use_dense_mha), _is_masked_mha_available, "
            "_masked_mha_workspace_fits, _topk_mask_shape"
        ),
    ),
    notes=(
        "DSA: the sparse files used (mla_attention.py with the masked-MHA table, sparse_mla_attention.py with "
        "masked_mha_workspace_fits, flashmla_sparse.py at 008a0c31, a flashinfer_mla_sparse.py on the common "
        "sparse builder) are the newest found, not confirmed to be v0.33.0's",
        "DSA: masked MHA needs FlashAttention 4 (get_flash_attn_version); mlactl takes it as there on sm100",
    ),
)

# -- the registry ----------------------------------------------------------------------------------

RULESETS: dict[str, RuleSet] = {r.name: r for r in (SGLANG_0_5_14, SGLANG_0_5_23, VLLM_0014CA6B, VLLM_0_33_0)}
# A bare engine name means its newest rule set.
NEWEST = {"sglang": "sglang@0.5.23", "vllm": "vllm@0.33.0"}
# Older mlactl names: a rule set with one backend forced.
SHORTHANDS = {
    "sglang-triton": ("sglang", {"attention_backend": "triton"}),
    "sglang-trtllm": ("sglang", {"attention_backend": "trtllm_mla"}),
}
# Architectures of GPUs by a name or display substring, for a profile that names no `arch`
# (model.hardware.ARCHES; the shipped profiles name theirs, and tests/test_hardware.py checks
# that the two agree): sm89 is Ada (L40S), sm120 the Blackwell workstation and server parts (RTX
# PRO 6000), neither Hopper nor sm100 to the engines' rules
_GPUS = {
    "sm100": ("B200", "B100", "GB200", "B300"),
    "sm90": ("H100", "H200", "H800", "H20"),
    "sm80": ("A100", "A800"),
    "sm89": ("L40S", "L40", "RTX 6000 ADA", "RTX 4090"),
    "sm120": ("RTX PRO 6000", "RTX 5090"),
    "rocm": ("MI300", "MI325", "MI355"),
}
ARCH_BY_NAME = tuple((key, arch) for arch, keys in _GPUS.items() for key in keys)
