"""The inference engines' own path rules: which MLA path each engine runs for a batch.

Each rule is a pure function of the batch, written from one engine version's source (cited in
its docstring and in docs/engines.md). Paths use mlactl's names: SGLang's MLA / vLLM's decode
pathway is `absorb`; SGLang's MHA_ONE_SHOT and vLLM's prefill without context are `expand`;
SGLang's MHA_CHUNKED_KV and vLLM's prefill with context (processed in workspace-sized chunks)
are `expand_chunked`.

A decode is one new token after a cached prefix (`new == 1`, `prefix > 0`); one new token with
no prefix is a one-token prefill (an extend). Speculative decoding (target verify, draft
extend) is not modelled: every engine here would send those batches to absorb.

    sglang         sgl-project/sglang @ 0a8dcfa9, python/sglang/srt/models/deepseek_common/
                   attention_backend_handler.py, `_handle_attention_backend` (fa3, flashinfer,
                   flashmla, cutlass_mla); threshold and capacity from python/sglang/srt/environ.py
    sglang-triton  same file, `handle_attention_triton`
    sglang-trtllm  same file, `handle_attention_trtllm_mla`
    vllm           vllm-project/vllm @ 0014ca6b, vllm/model_executor/layers/attention/
                   mla_attention.py (`split_decodes_and_prefills` with the builder's
                   `reorder_batch_threshold`; `determine_chunked_prefill_workspace_size`);
                   thresholds from vllm/v1/attention/backends/mla/flashmla.py (128) and
                   flashattn_mla.py (512)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mlactl.util.defaults import ENGINES
from mlactl.util.errors import MlactlError

DEFAULT_ENGINES = ("sglang", "vllm")

SGLANG_VERSION = "sgl-project/sglang@0a8dcfa9"
SGLANG_SOURCE = "python/sglang/srt/models/deepseek_common/attention_backend_handler.py"
VLLM_VERSION = "vllm-project/vllm@0014ca6b"
VLLM_SOURCE = "vllm/model_executor/layers/attention/mla_attention.py"

# SGLang: SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD = EnvInt(8192), SGLANG_MAX_KV_CHUNK_CAPACITY =
# EnvInt(128 * 1024) in python/sglang/srt/environ.py.
SGLANG_THRESHOLD = 8192
SGLANG_CAPACITY = 128 * 1024
# MHA_ONE_SHOT_SUPPORTED_BACKENDS in the handler; cutlass_mla is handled by the same rule but
# never runs one-shot.
SGLANG_BACKENDS = ("fa3", "flashinfer", "flashmla", "cutlass_mla")
SGLANG_ONE_SHOT = ("fa3", "flashinfer", "flashmla")
# vLLM: each metadata builder's reorder_batch_threshold ("process small prefills with decode
# pathway"); the runner takes the minimum when several KV groups declare one.
VLLM_THRESHOLDS = {"flashmla": 128, "flash_attn_mla": 512}
# determine_chunked_prefill_workspace_size: min(max(8 * max_model_len, 4 * max_num_seqs *
# block_size), 64 * 1024), at least max_num_seqs * block_size. DeepSeek-V3's 163,840-token
# context makes it 64K tokens; the chunk per prefill with context is workspace // their number,
# rounded down to the page (64 tokens for FlashMLA).
VLLM_WORKSPACE = 64 * 1024
VLLM_PAGE = 64


@dataclass(frozen=True)
class EngineParams:
    """The parameters of one engine's rule; `options` lists those a user may set."""

    engine: str
    threshold: int  # sglang: summed-prefix threshold; vllm: decode query-length threshold
    backend: str = ""
    capacity: int = SGLANG_CAPACITY  # sglang: most summed tokens a one-shot expand takes
    workspace: int = VLLM_WORKSPACE  # vllm: context tokens expanded at once, over all prefills
    options: tuple[str, ...] = field(default=(), compare=False)

    @property
    def label(self) -> str:
        """The engine and its non-default settings, e.g. `sglang(threshold=4096)`."""
        base = default_params(self.engine)
        changed = [f"{k}={getattr(self, k)}" for k in self.options if getattr(self, k) != getattr(base, k)]
        return self.engine + (f"({','.join(changed)})" if changed else "")

    @property
    def citation(self) -> str:
        if self.engine == "vllm":
            return f"{VLLM_VERSION} {VLLM_SOURCE}"
        return f"{SGLANG_VERSION} {SGLANG_SOURCE}"


def default_params(engine: str) -> EngineParams:
    if engine == "sglang":
        return EngineParams(engine, SGLANG_THRESHOLD, "fa3", options=("threshold", "capacity", "backend"))
    if engine == "vllm":
        return EngineParams(
            engine, VLLM_THRESHOLDS["flashmla"], "flashmla", options=("threshold", "backend", "workspace")
        )
    if engine in ("sglang-triton", "sglang-trtllm"):
        return EngineParams(engine, SGLANG_THRESHOLD)
    raise MlactlError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")


def _positive_int(text: str, what: str) -> int:
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        raise MlactlError(f"{what} must be a positive integer, got {text!r}")
    return int(value)


def parse_engines(engines: str | None, options: list[str] | None = None) -> list[EngineParams]:
    """`--engines a,b` and `--engine-option [ENGINE.]KEY=VALUE` into one EngineParams each.

    A bare KEY applies to the one selected engine that has it; when several do, the engine
    must be named (`sglang.threshold=4096`).
    """
    names = [e.strip() for e in (engines or ",".join(DEFAULT_ENGINES)).split(",") if e.strip()]
    if not names:
        raise MlactlError(f"--engines names no engine; choose from {', '.join(ENGINES)}")
    params = {}
    for name in names:
        params[name] = default_params(name)  # raises on an unknown engine
    set_threshold = set()
    for text in options or []:
        key, eq, value = text.partition("=")
        if not eq or not key.strip():
            raise MlactlError(f"--engine-option takes [ENGINE.]KEY=VALUE, got {text!r}")
        engine, dot, key = key.strip().rpartition(".")
        if dot:
            if engine not in params:
                default_params(engine)  # an unknown engine says so, listing the known ones
                raise MlactlError(f"--engine-option {text!r}: {engine} is not among --engines ({', '.join(names)})")
            targets = [engine]
        else:
            targets = [n for n in names if key in params[n].options]
            if len(targets) > 1:
                raise MlactlError(
                    f"--engine-option {text!r}: {key} belongs to {' and '.join(targets)}; "
                    f"name one, e.g. {targets[0]}.{key}={value}"
                )
        if not targets or key not in params[targets[0]].options:
            where = targets[0] if targets else ", ".join(names)
            known = sorted({f"{n}.{o}" for n in names for o in params[n].options}) or ["none"]
            raise MlactlError(
                f"--engine-option {text!r}: unknown option {key!r} for {where}; known: {', '.join(known)}"
            )
        name = targets[0]
        p = params[name]
        if key == "backend":
            backends = SGLANG_BACKENDS if name == "sglang" else tuple(VLLM_THRESHOLDS)
            if value not in backends:
                raise MlactlError(f"--engine-option {text!r}: {name} backend must be one of {', '.join(backends)}")
            p = replace(p, backend=value)
            if name == "vllm" and name not in set_threshold:
                p = replace(p, threshold=VLLM_THRESHOLDS[value])
        else:
            number = _positive_int(value, f"--engine-option {name}.{key}")
            if key == "threshold":
                p = replace(p, threshold=number)
            elif key == "capacity":
                p = replace(p, capacity=number)
            else:
                p = replace(p, workspace=number)
            if key == "threshold":
                set_threshold.add(name)
        params[name] = p
    return list(params.values())


# -- the rules ------------------------------------------------------------------------------------


def sglang_batch_path(is_decode, sum_prefix, sum_seq, p: EngineParams) -> np.ndarray:
    """SGLang's choice for whole batches (vectorised over batches); every request of a batch
    runs it. `sum_prefix` is the sum over the batch of cached tokens (extend_prefix_lens),
    `sum_seq` of prefix + new (seq_lens).

    sglang (`_handle_attention_backend`): an extend batch whose summed prefix is 0, or at least
    the threshold (chunked prefix cache on), runs MHA: one-shot (`expand`) when the backend is
    fa3/flashinfer/flashmla and the summed sequence lengths fit the max chunk capacity
    (`_support_mha_one_shot`), else MHA_CHUNKED_KV (`expand_chunked`). Every other extend, and
    every decode, runs MLA (`absorb`).
    sglang-triton (`handle_attention_triton`): MHA (`expand`, never chunked) only for an extend
    batch with summed prefix 0; else MLA.
    sglang-trtllm (`handle_attention_trtllm_mla`): every extend runs MHA_CHUNKED_KV; decode MLA.
    """
    is_decode = np.asarray(is_decode, dtype=bool)
    sum_prefix = np.asarray(sum_prefix)
    sum_seq = np.asarray(sum_seq)
    if p.engine == "sglang-trtllm":
        return np.where(is_decode, "absorb", "expand_chunked")
    if p.engine == "sglang-triton":
        return np.where(~is_decode & (sum_prefix == 0), "expand", "absorb")
    if p.engine != "sglang":
        raise MlactlError(f"{p.engine} is not an SGLang rule")
    mha = ~is_decode & ((sum_prefix == 0) | (sum_prefix >= p.threshold))
    one_shot = (p.backend in SGLANG_ONE_SHOT) & (sum_seq <= p.capacity)
    return np.where(mha, np.where(one_shot, "expand", "expand_chunked"), "absorb")


def vllm_request_path(new, prefix, p: EngineParams) -> np.ndarray:
    """vLLM's choice per request (vectorised): a query of at most `threshold` tokens runs the
    decode pathway (`absorb`); a longer one runs the prefill pathway, which expands its context
    in workspace-sized chunks merged by LSE (`expand_chunked`) or, with no context, is a plain
    MHA over the new tokens (`expand`)."""
    new, prefix = np.asarray(new), np.asarray(prefix)
    return np.where(new <= p.threshold, "absorb", np.where(prefix > 0, "expand_chunked", "expand"))


def vllm_context_chunk(num_prefills_with_context: int, p: EngineParams) -> int:
    """Context tokens vLLM expands per chunk and prefill: the workspace split evenly over the
    prefills that have context, rounded down to the page (MLACommonMetadataBuilder.build)."""
    if num_prefills_with_context < 1:
        return 0
    return (p.workspace // num_prefills_with_context) // VLLM_PAGE * VLLM_PAGE


def chunk_sizes(p: EngineParams, batch) -> np.ndarray | None:
    """Context tokens per chunk of the engine's own `expand_chunked` at each grid point (a batch of
    `batch` alike prefills with context), or None where mlactl's `--chunk` stands in for it. vLLM
    sizes it from the workspace (`vllm_context_chunk`); SGLang's chunked prefix cache is not
    modelled here (docs/engines.md)."""
    if p.engine != "vllm":
        return None
    batch = np.maximum(np.asarray(batch, dtype=np.int64), 1)
    return np.maximum((p.workspace // batch) // VLLM_PAGE * VLLM_PAGE, VLLM_PAGE)


def is_decode(new, prefix) -> np.ndarray:
    """One new token after a cached prefix."""
    return (np.asarray(new) == 1) & (np.asarray(prefix) > 0)


def grid_paths(p: EngineParams, batch, new, prefix) -> np.ndarray:
    """The engine's path for each grid point, each a batch of `batch` alike requests."""
    batch, new, prefix = (np.asarray(a, dtype=np.int64) for a in (batch, new, prefix))
    if p.engine == "vllm":
        return vllm_request_path(new, prefix, p)
    return sglang_batch_path(is_decode(new, prefix), batch * prefix, batch * (prefix + new), p)


def batch_paths(p: EngineParams, new, prefix, count) -> np.ndarray:
    """The engine's path for each request row of one mixed batch (`count` alike requests a row).

    SGLang runs decode requests as their own decode batch and the others as one extend batch,
    judged on their summed prefix; vLLM judges each request by its query length.
    """
    new, prefix, count = (np.asarray(a, dtype=np.int64) for a in (new, prefix, count))
    if p.engine == "vllm":
        return vllm_request_path(new, prefix, p)
    decode = is_decode(new, prefix)
    extend = ~decode
    sum_prefix = int((count * prefix)[extend].sum())
    sum_seq = int((count * (prefix + new))[extend].sum())
    return sglang_batch_path(decode, np.where(extend, sum_prefix, 0), np.where(extend, sum_seq, 0), p)


# -- what a choice loses ----------------------------------------------------------------------------


def time_of(chosen: np.ndarray, times: dict[str, np.ndarray]) -> np.ndarray:
    """Time of the chosen path per point, from per-path times (+inf where a path does not fit).

    `times` is whatever time model is in use (roofline today, a calibrated one later): this and
    `time_lost` are the only places a loss is computed from it."""
    out = np.zeros(np.shape(chosen), dtype=np.float64)
    for path, t in times.items():
        out = np.where(chosen == path, np.broadcast_to(t, out.shape), out)
    return out


def time_lost(chosen: np.ndarray, times: dict[str, np.ndarray], best: np.ndarray | None = None) -> np.ndarray:
    """Time the chosen path loses against the fastest path that fits (+inf if it does not fit, and
    where nothing fits: the latent cache alone can be too big). `best` (default: the fastest of
    `times`) is the time to beat, when the engine's own times differ from the reference ones."""
    if best is None:
        best = np.min(np.stack([np.broadcast_to(t, np.shape(chosen)) for t in times.values()]), axis=0)
    best = np.minimum(best, time_of(chosen, times))  # an engine's own chunking can beat ours
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(best), time_of(chosen, times) - best, np.inf)
