"""Each engine's scheduler and cache defaults as it ships, per backend and GPU memory.

A replayed engine runs its own page size, chunk and request cap unless the user sets them under
the engine's own option names (`--engine-option sglang.chunked_prefill_size=16384`,
`vllm.max_num_batched_tokens=4096`; `--max-batch-tokens` and `--max-running` set both engines).
Where each value comes from (docs/replay.md, "Defaults as the engines ship"):

SGLang (sgl-project/sglang):
  page_size        1, raised by `ServerArgs._handle_attention_backend_compatibility`
                   (python/sglang/srt/server_args.py): flashmla 64, cutlass_mla 128, trtllm_mla
                   (and tokenspeed_mla) 64 unless 32 or 64 is given; either the attention or the
                   decode attention backend triggers it.
  chunked_prefill_size   by the GPU's memory in MiB (server_args.py, the chunked prefill size
                   default): under 35 GiB 2048, under 60 GiB 4096, under 160 GiB 8192 (H100,
                   H200), else 16384 (B200, MI300).
  max_running_requests   `ModelRunner._resolve_max_num_reqs`: min(clamp(int(pool tokens /
                   context_len * 512), 2048, 4096), pool tokens // 2).
  schedule_policy  "fcfs" (server_args.py @001067ff, `ServerArgs.schedule_policy`); replay also
                   takes "lpm" (SchedulePolicy.calc_priority, schedule_policy.py @00550cd1).
  schedule_conservativeness   1.0: new_token_ratio starts at min(0.7 x it, 1)
                   (Scheduler.init_schedule_policy, scheduler.py @0003215c).
  mem_fraction_static   (GPU memory - reserve) / GPU memory, rounded to 3 places, the reserve in
                   MiB 512 + 1.5 x max(chunk, 2048) + TP x PP / 8 x 1024 + 2 x the decode CUDA
                   graph's max batch + 1.5 GiB where the prefill (piecewise) graph is on, at least
                   10 GiB on a GPU above 60 GiB (sgl-project/sglang@031ed82d
                   python/sglang/srt/arg_groups/memory_hook.py, handle_gpu_memory_settings and
                   reserve_for_graph_mb). The weights and the KV pool share that fraction.

vLLM (vllm-project/vllm), the OpenAI server's usage context (what `vllm serve` runs):
  block_size       16 (vllm/config/cache.py), forced by `CudaPlatform.check_and_update_config`
                   (vllm/platforms/cuda.py): FlashMLA 64, CUTLASS MLA 128, FlashInfer MLA 64
                   (32 kept when given), the sparse backends 64. mlactl's rule already resolves
                   it (EngineParams.block).
  max_num_batched_tokens, max_num_seqs   `EngineArgs.get_batch_defaults`
                   (vllm/engine/arg_utils.py): a GPU of at least 70 GiB that is not an A100 gets
                   8192 tokens and 1024 sequences, any other 2048 and 256; from v0.28.0 a GPU of
                   at least 160 GiB gets 16384 tokens.
  gpu_memory_utilization   0.92 (vllm-project/vllm@002f10e0 vllm/config/cache.py, CacheConfig);
                   vLLM's KV cache gets what it leaves after the weights and the profiled
                   activation peak, which replay does not estimate (the pool is the fraction less
                   the weights, as SGLang's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlactl.util.errors import MlactlError

GIB = float(1 << 30)
# The engines' own names for what replay's scheduler takes, per family (`--engine-option`).
SCHEDULER_OPTIONS = {
    "sglang": (
        "chunked_prefill_size",
        "max_running_requests",
        "page_size",
        "schedule_policy",
        "mem_fraction_static",
        "schedule_conservativeness",
    ),
    # max_num_seqs and block_size are the rule's own options
    "vllm": ("max_num_batched_tokens", "gpu_memory_utilization"),
}
# The scheduler options that take a word, and the words each takes (the first: as shipped)
WORD_OPTIONS = {"schedule_policy": ("fcfs", "lpm")}
# Each family's share of the GPU's memory for the weights and the KV cache, under its own name
# (a fraction, above 0 and at most 1)
FRACTION_OPTIONS = {"sglang": "mem_fraction_static", "vllm": "gpu_memory_utilization"}
VLLM_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py @002f10e0
# The scheduler options that take a real number, and its range: SGLang's schedule_conservativeness
# scales its estimate of the running requests' output to come (1.0 as shipped; ServerArgs asserts
# it is at least 0)
REAL_OPTIONS = {"schedule_conservativeness": (0.0, 100.0)}
# The model's context length (config.json max_position_embeddings), which SGLang's request cap
# reads; a model not listed takes DeepSeek-V3's.
CONTEXT_LEN = {"deepseek-v3": 163840, "deepseek-v2": 163840, "deepseek-v2-lite": 163840, "kimi-k2": 131072}
DEFAULT_CONTEXT_LEN = 163840
# SGLang's page size forced by a backend (ServerArgs._handle_attention_backend_compatibility)
SGLANG_PAGE = {"flashmla": 64, "cutlass_mla": 128, "trtllm_mla": 64, "tokenspeed_mla": 64}


@dataclass(frozen=True)
class Shipped:
    """One engine's scheduler as it runs: the new tokens a step takes, the requests that run at
    once, and the page (block) the prefix cache matches and allocates in; `why`: where each
    came from, one phrase each."""

    max_batch_tokens: int
    max_running: int
    page: int  # hits are whole pages, and so is what a request reserves
    why: tuple[str, ...] = ()
    schedule_policy: str | None = None  # SGLang's order of the waiting queue (None: vLLM's own FCFS)
    kv_tokens: int = 0  # the KV pool's tokens (before whole pages)
    mem_fraction: float | None = None  # the share of the GPU's memory it came from (None: --cache-tokens)
    conservativeness: float | None = None  # SGLang's schedule_conservativeness (None: vLLM)

    @property
    def pool_tokens(self) -> int:
        """The KV pool in whole pages."""
        return self.kv_tokens // self.page * self.page

    def to_json(self) -> dict:
        out: dict = {"max_batch_tokens": self.max_batch_tokens, "max_running": self.max_running, "page": self.page}
        if self.schedule_policy is not None:
            out["schedule_policy"] = self.schedule_policy
        if self.conservativeness is not None:
            out["schedule_conservativeness"] = self.conservativeness
        out["mem_fraction"] = self.mem_fraction
        out["kv_cache_tokens"] = self.kv_tokens
        out["why"] = list(self.why)
        return out


def word_option(family: str, key: str, value) -> str:
    """A word option's value checked against the words it takes: one error line otherwise."""
    words = WORD_OPTIONS[key]
    text = str(value).strip().lower()
    if text not in words:
        raise MlactlError(f"{family}.{key} takes {' or '.join(words)}, got {value!r}")
    return text


def sglang_chunk(memory_gib: float) -> int:
    """SGLang's default chunked_prefill_size for a GPU of this much memory (GiB)."""
    if memory_gib < 35:
        return 2048
    if memory_gib < 60:
        return 4096
    if memory_gib < 160:
        return 8192
    return 16384


def vllm_batch(memory_gib: float, name: str) -> tuple[int, int]:
    """vLLM's default (max_num_batched_tokens, max_num_seqs) for `vllm serve` on this GPU."""
    if memory_gib >= 160:
        return 16384, 1024
    if memory_gib >= 70 and "a100" not in name.lower():
        return 8192, 1024
    return 2048, 256


def sglang_decode_graph_bs(memory_gib: float, tp: int) -> int:
    """SGLang's default decode CUDA graph max batch (cuda_graph_config[decode].max_bs) on a GPU of
    this much memory (GiB) at this TP (memory_hook.py @031ed82d)."""
    if memory_gib < 20:
        return 8
    if memory_gib < 35:
        return 48 if tp < 4 else 160
    if memory_gib < 60:
        return 32 if tp < 4 else 160
    if memory_gib < 160:
        return 256 if tp < 4 else 512
    return 512


def sglang_mem_fraction(memory_gib: float, chunk: int, tp: int, prefill_graph: bool, pp: int = 1) -> float:
    """SGLang's default mem_fraction_static (handle_gpu_memory_settings, memory_hook.py
    @031ed82d): the GPU's memory less a reserve for activations and CUDA graphs, in MiB, as a
    fraction of it rounded to 3 places."""
    mib = memory_gib * 1024
    reserve = 512 + 1.5 * max(chunk, 2048) + tp * pp / 8 * 1024
    reserve += 2 * sglang_decode_graph_bs(memory_gib, tp) + (1.5 * 1024 if prefill_graph else 0)
    if mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return round((mib - reserve) / mib, 3)


def sglang_max_running(pool_tokens: int, context_len: int) -> int:
    """SGLang's default max_running_requests for a KV pool of this many tokens."""
    estimated = max(min(int(pool_tokens / context_len * 512), 4096), 2048)
    return max(1, min(estimated, pool_tokens // 2))


def sglang_page(backend: str, decode_backend: str, given: int | None = None) -> int:
    """SGLang's page size: `given` (default 1) unless a backend forces its own."""
    page = given or 1
    for b in (backend, decode_backend or backend):
        forced = SGLANG_PAGE.get(b)
        if forced is None:
            continue
        if b in ("trtllm_mla", "tokenspeed_mla"):
            page = page if page in (32, 64) else forced
        else:
            page = forced
    return page


def shipped(
    family: str,
    params,
    memory_gb: float,
    hw_name: str,
    pool: Callable[[float | None], int],
    model: str,
    given: dict,
    max_batch_tokens: int | None = None,
    max_running: int | None = None,
    *,
    tp: int = 1,
    mem_fraction: float | None = None,
    fixed_pool: bool = False,
) -> Shipped:
    """The scheduler `family`'s engine runs on this GPU: each value as set (`given`, the
    engine's own option names; then --max-batch-tokens, --max-running and --mem-fraction), else
    as it ships. `params`: the engine's resolved rule (mlactl.decide.engines.EngineParams).
    `pool(fraction)`: the KV tokens that share of the GPU's memory leaves after the weights; with
    `fixed_pool` (--cache-tokens) it is called with None and no fraction is derived."""
    gib = memory_gb * 1e9 / GIB
    by_memory = f"default for {gib:.0f} GiB"
    why = []

    def option(name: str, shared: int | None, default: int, source: str) -> int:
        """An option as set under the engine's own name, else by the shared flag, else `default`."""
        value = given.get(name) or shared
        why.append(f"{name} " + ("set" if value else source))
        return value or default

    policy: str | None = None
    conservativeness: float | None = None
    frac_key = FRACTION_OPTIONS[family]
    frac = given.get(frac_key)
    if frac is not None and fixed_pool:
        raise MlactlError(f"{family}.{frac_key} and --cache-tokens both size the KV pool: give one")
    frac_why = f"{frac_key} set" if frac is not None else "--mem-fraction" if mem_fraction is not None else ""
    frac = frac if frac is not None else mem_fraction
    if family == "sglang":
        chunk = option("chunked_prefill_size", max_batch_tokens, sglang_chunk(gib), by_memory)
        if frac is None and not fixed_pool:
            graph = bool(getattr(params, "graph_max_tokens", 0))
            frac = sglang_mem_fraction(gib, chunk, tp, graph)
            frac_why = f"mem_fraction_static derived for {gib:.0f} GiB, chunk {chunk}, TP {tp}, prefill graph " + (
                "on" if graph else "off"
            )
        page = sglang_page(params.backend, params.decode_backend, given.get("page_size"))
        why.append(f"page_size {page} ({'set' if given.get('page_size') else 'as ' + params.backend + ' takes it'})")
        pool_tokens = pool(frac)
        ctx = CONTEXT_LEN.get(model, DEFAULT_CONTEXT_LEN)
        derived = sglang_max_running(pool_tokens, ctx)
        running = option("max_running_requests", max_running, derived, f"from the pool and context {ctx:,}")
        given_policy = given.get("schedule_policy")
        policy = word_option("sglang", "schedule_policy", given_policy or WORD_OPTIONS["schedule_policy"][0])
        why.append(f"schedule_policy {policy} ({'set' if given_policy else 'default'})")
        given_c = given.get("schedule_conservativeness")
        conservativeness = 1.0 if given_c is None else float(given_c)
        why.append(f"schedule_conservativeness {conservativeness:g} ({'default' if given_c is None else 'set'})")
    else:
        tokens, seqs = vllm_batch(gib, hw_name)
        chunk = option("max_num_batched_tokens", max_batch_tokens, tokens, by_memory)
        page = int(params.block) or 16
        why.append(f"block_size {page} ({params.backend})")
        running = option("max_num_seqs", max_running, seqs, by_memory)
        if frac is None and not fixed_pool:
            frac, frac_why = VLLM_GPU_MEMORY_UTILIZATION, "gpu_memory_utilization default"
        pool_tokens = pool(frac)
    source = "--cache-tokens" if fixed_pool else f"{frac_why}: {frac:g}"
    why.append(f"KV pool {pool_tokens:,} tokens ({source})")
    if chunk < 1 or running < 1 or page < 1:
        raise MlactlError("the chunk, the running requests and the page must each be at least 1")
    return Shipped(int(chunk), int(running), int(page), tuple(why), policy, int(pool_tokens), frac, conservativeness)
