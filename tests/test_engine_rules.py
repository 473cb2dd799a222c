"""Every branch of every engine rule set, pinned against a second, table-driven implementation
written from the engines' source: plain Python, one request at a time, the source's if/else.

Each case carries the source line it exercises. Sources (docs/engines.md cites them in full):

  SGLang  sgl-project/sglang python/sglang/srt/models/deepseek_common/attention_backend_handler.py
          (0a8dcfa9 = 0.5.14; the stored version without cutlass_mla = 0.5.23) and server_args.py
  vLLM    vllm-project/vllm vllm/v1/attention/backends/utils.py (split_decodes_and_prefills,
          reorder_batch_to_split_decodes_and_prefills), vllm/v1/attention/backend.py
          (_init_reorder_batch_threshold), vllm/platforms/cuda.py, vllm/v1/attention/backends/mla/*.py
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlactl.decide.engines import Context, parse_engines, step_counts, step_paths
from mlactl.util.errors import MlactlError

NAME = {"MHA_ONE_SHOT": "expand", "MHA": "expand", "MHA_CHUNKED_KV": "expand_chunked", "MLA": "absorb"}


# -- the second implementation: SGLang ---------------------------------------------------------------


class SGLangServer:
    """The server args and environment one SGLang release reads, with its defaults."""

    def __init__(self, version="0.5.23", **args):
        self.version = version
        self.attention_backend = args.pop("attention_backend", None)
        self.prefill_attention_backend = args.pop("prefill_attention_backend", None)
        self.decode_attention_backend = args.pop("decode_attention_backend", None)
        self.chunked_prefix_cache_threshold = args.pop("chunked_prefix_cache_threshold", 8192)  # environ.py
        self.max_kv_chunk_capacity = args.pop("max_kv_chunk_capacity", 128 * 1024)  # environ.py
        self.disable_chunked_prefix_cache = args.pop("disable_chunked_prefix_cache", False)
        self.flashinfer_mla_disable_ragged = args.pop("flashinfer_mla_disable_ragged", False)
        self.enable_deterministic_inference = args.pop("enable_deterministic_inference", False)
        self.enable_mixed_chunk = args.pop("enable_mixed_chunk", False)
        self.enable_prefill_context_parallel = args.pop("enable_prefill_context_parallel", False)
        self.enable_piecewise_cuda_graph = args.pop("enable_piecewise_cuda_graph", False)  # 0.5.14
        self.disable_piecewise_cuda_graph = args.pop("disable_piecewise_cuda_graph", False)  # 0.5.23
        self.piecewise_cuda_graph_max_tokens = args.pop("piecewise_cuda_graph_max_tokens", 2048)
        assert not args, args

    def resolve(self, arch, model_arch="DeepseekV3ForCausalLM"):
        # server_args.py: MLA -> fa3 on Hopper, flashinfer on sm100, triton otherwise; then
        # _handle_model_specific_adjustments: trtllm_mla for DeepseekV3ForCausalLM on sm100
        if self.attention_backend is None:
            if arch == "sm90":
                self.attention_backend = "fa3"
            elif arch == "sm100":
                self.attention_backend = "trtllm_mla" if model_arch == "DeepseekV3ForCausalLM" else "flashinfer"
            else:
                self.attention_backend = "triton"
        self.prefill = self.prefill_attention_backend or self.attention_backend
        self.decode = self.decode_attention_backend or self.attention_backend
        supported = ["flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla", "trtllm_mla", "tokenspeed_mla"]
        self.cpc_off = self.disable_chunked_prefix_cache or self.prefill not in supported
        if self.version == "0.5.14":
            self.graph = self.enable_piecewise_cuda_graph
        else:
            self.graph = not self.disable_piecewise_cuda_graph
            if self.prefill == "trtllm_mla" and model_arch == "DeepseekV3ForCausalLM":
                self.graph = False  # issue 19's statement
        return self


def sglang_handler(server, backend, forward_mode, extend_prefix_lens, seq_lens, extend_seq_lens):
    """The handler `backend` registers, on one batch (lists of the batch's requests)."""
    in_graph = (
        server.graph and forward_mode == "extend" and sum(extend_seq_lens) <= server.piecewise_cuda_graph_max_tokens
    )
    is_extend_without_speculative = forward_mode == "extend"
    sum_extend_prefix_lens = sum(extend_prefix_lens)
    if backend == "fa4":  # handle_attention_fa4
        return "MHA_CHUNKED_KV"
    if backend == "aiter":  # handle_attention_aiter
        if in_graph and server.version != "0.5.14":
            return "MHA"
        return "MHA" if is_extend_without_speculative else "MLA"
    if backend in ("trtllm_mla", "tokenspeed_mla"):  # handle_attention_trtllm_mla
        if in_graph:
            return "MLA"
        if is_extend_without_speculative and (not server.cpc_off or sum_extend_prefix_lens == 0):
            return "MHA_CHUNKED_KV"
        return "MLA"
    if backend == "triton":  # handle_attention_triton
        if in_graph:
            return "MLA"
        if server.enable_deterministic_inference:
            return "MLA"
        if is_extend_without_speculative and sum_extend_prefix_lens == 0:
            return "MHA"
        return "MLA"
    if backend == "fa3" and server.enable_deterministic_inference:  # handle_attention_fa3
        return "MLA"
    # _handle_attention_backend
    if in_graph:
        return "MLA"
    if server.enable_prefill_context_parallel and forward_mode == "extend":
        return "MLA"
    disable_ragged = backend in ("flashinfer", "flashmla") and server.flashinfer_mla_disable_ragged
    if (
        not disable_ragged
        and is_extend_without_speculative
        and (
            (sum_extend_prefix_lens >= server.chunked_prefix_cache_threshold and not server.cpc_off)
            or sum_extend_prefix_lens == 0
        )
    ):
        one_shot = backend in ("fa3", "flashinfer", "flashmla") and sum(seq_lens) <= server.max_kv_chunk_capacity
        return "MHA_ONE_SHOT" if one_shot else "MHA_CHUNKED_KV"
    return "MLA"


def sglang_reference(server, requests):
    """`requests`: (new, prefix) of each request the scheduler put in the step. The decodes run
    as a decode batch and the rest as one extend batch; with mixed chunk, one extend batch."""
    decode = [new == 1 and prefix > 0 for new, prefix in requests]
    if server.enable_mixed_chunk and not all(decode):
        decode = [False] * len(requests)
    extends = [r for r, d in zip(requests, decode) if not d]
    method = None
    if extends:
        method = sglang_handler(
            server,
            server.prefill,
            "extend",
            [p for _, p in extends],
            [p + n for n, p in extends],
            [n for n, _ in extends],
        )
    decode_method = sglang_handler(server, server.decode, "decode", [], [], [])
    return [NAME[decode_method] if d else NAME[method] for d in decode]


# -- the second implementation: vLLM ------------------------------------------------------------------

VLLM_BACKENDS = {  # reorder_batch_threshold and query_len_support of each builder (mla/*.py)
    "FLASH_ATTN_MLA": (512, "VARLEN", True),  # flashattn_mla.py: 512, VARLEN, DCP varlen (interleave 1)
    "FLASHMLA": (128, "UNIFORM", False),  # flashmla.py: 128, UNIFORM
    "FLASHINFER_MLA": (1, "UNIFORM", True),  # flashinfer_mla.py: default 1, UNIFORM
    "CUTLASS_MLA": (1, "SINGLE_ONLY", False),  # cutlass_mla.py: default 1, SINGLE_ONLY
    "TRITON_MLA": (1, "UNIFORM", False),
}


def vllm_threshold(
    backend, num_speculative_tokens=0, parallel_drafting=False, dcp=1, version="0.33.0", override=None, pcp=1
):
    t, qls, dcp_varlen = VLLM_BACKENDS[backend]
    t = override or t  # the builder's class attribute, replaced (mlactl's what-if)
    if backend == "FLASHINFER_MLA" and version != "0.33.0":
        dcp_varlen = False
    # backend.py _init_reorder_batch_threshold
    if qls != "SINGLE_ONLY" and num_speculative_tokens:
        t = max(t, 1 + (2 if parallel_drafting else 1) * num_speculative_tokens)
    if dcp > 1 and not dcp_varlen:
        t = 1
    return t, qls


def vllm_reorder(requests, decode_threshold, four_regions):
    """reorder_batch_to_split_decodes_and_prefills, swap by swap. Three regions (utils.py at
    00bd1493): decode, extend, prefill. Four (0.33): decode (done prefilling), short extend
    (still prefilling, at most the threshold), long extend, prefill."""
    batch = list(requests)
    num_scheduled = [r[0] for r in batch]
    num_computed = [r[1] for r in batch]
    done_prefilling = [r[0] == 1 and r[1] > 0 for r in batch]  # mlactl's decode rows
    regions = []
    for i in range(len(batch)):
        has_context = num_computed[i] > 0
        below = num_scheduled[i] <= decode_threshold
        if four_regions:
            if not has_context:
                regions.append(3)
            elif not below:
                regions.append(2)
            elif not done_prefilling[i]:
                regions.append(1)
            else:
                regions.append(0)
        else:
            regions.append(2 if not has_context else (0 if below else 1))
    target = []
    for r in range(4 if four_regions else 3):
        target += [r] * regions.count(r)
    needs_swap = [r != t for r, t in zip(regions, target)]
    orig = [i for i in range(len(batch)) if needs_swap[i]]
    src = sorted(orig, key=lambda i: regions[i])  # stable
    src_dest = {s: d for s, d in zip(src, orig)}
    for s in list(src_dest):
        d = src_dest[s]
        while s != d:
            batch[s], batch[d] = batch[d], batch[s]  # input_batch.swap_states(src, dst)
            nxt = src_dest.get(d, d)
            src_dest[d] = d
            d = nxt
    return batch


def vllm_split(query_lens, decode_threshold, require_uniform, is_prefilling=None, short_as_decodes=True):
    """split_decodes_and_prefills: how many leading requests are decodes (utils.py;
    `short_as_decodes` is its treat_short_extends_as_decodes, False under PCP in 0.33)."""
    if max(query_lens) <= decode_threshold and (not require_uniform or decode_threshold <= 1) and short_as_decodes:
        return len(query_lens)
    if query_lens[0] > decode_threshold:
        return 0
    if require_uniform:
        if short_as_decodes and all(q == query_lens[0] for q in query_lens):
            return len(query_lens)
        is_prefill = [q != query_lens[0] for q in query_lens]
    else:
        is_prefill = [q > decode_threshold for q in query_lens]
    if not short_as_decodes:  # is_prefill |= is_prefilling
        is_prefill = [a or b for a, b in zip(is_prefill, is_prefilling)]
    return is_prefill.index(True) if True in is_prefill else len(query_lens)


def vllm_reference(requests, backend, **kw):
    """Paths in the order given (each request followed through the reorder)."""
    t, qls = vllm_threshold(backend, **kw)
    newest = kw.get("version", "0.33.0") == "0.33.0"
    tagged = [(n, p, i) for i, (n, p) in enumerate(requests)]
    ordered = vllm_reorder(tagged, t, four_regions=newest)
    decodes = vllm_split(
        [n for n, _, _ in ordered],
        t,
        require_uniform=qls != "VARLEN",
        is_prefilling=[not (n == 1 and p > 0) for n, p, _ in ordered],
        short_as_decodes=not (newest and kw.get("pcp", 1) > 1),
    )
    out = [None] * len(requests)
    for j, (_, p, i) in enumerate(ordered):
        out[i] = "absorb" if j < decodes else ("expand_chunked" if p > 0 else "expand")
    return out


# -- the table: hand-derived cases, each with its source line ------------------------------------------

H200 = Context(hardware="h200", arch="sm90", kv_dtype="bf16")
H200_FP8 = Context(hardware="h200", arch="sm90", kv_dtype="fp8")
B200 = Context(hardware="b200", arch="sm100", kv_dtype="bf16")
B200_FP8 = Context(hardware="b200", arch="sm100", kv_dtype="fp8")
A100 = Context(hardware="a100-sxm", arch="sm80", kv_dtype="bf16")
CTX = {"h200": H200, "h200-fp8": H200_FP8, "b200": B200, "b200-fp8": B200_FP8, "a100": A100}
D = 8192
BIG = 3000  # new tokens: above the 2048-token piecewise graph

SGLANG_CASES = [
    # id, version, context, options, requests, expected, source
    ("sum-below", "0.5.14", "h200", {}, [(512, D - 1)], ["absorb"], "handler L99-L100: sum < threshold -> MLA"),
    ("sum-at", "0.5.14", "h200", {}, [(512, D)], ["expand"], "handler L99-L100: sum >= threshold -> MHA"),
    ("two-summing", "0.5.14", "h200", {}, [(512, 4096)] * 2, ["expand"] * 2, "handler _get_sum_extend_prefix_lens"),
    ("prefix0", "0.5.14", "h200", {}, [(4096, 0)], ["expand"], "handler L102: sum == 0 -> MHA"),
    ("cap", "0.5.14", "h200", {}, [(4096, 131072 - 4096)], ["expand"], "_support_mha_one_shot: <= capacity"),
    ("cap+1", "0.5.14", "h200", {}, [(4096, 131073 - 4096)], ["expand_chunked"], "_support_mha_one_shot: > capacity"),
    ("decode", "0.5.14", "h200", {}, [(1, 32768)], ["absorb"], "decode batch: not extend -> MLA"),
    (
        "cutlass",
        "0.5.14",
        "h200",
        {"attention_backend": "cutlass_mla"},
        [(512, D)],
        ["expand_chunked"],
        "L14: cutlass_mla not one-shot",
    ),
    # the piecewise graph (0.5.23 on by default; 0.5.14 off)
    ("graph-0.5.23", "0.5.23", "h200", {}, [(512, 0)], ["absorb"], "handler L80-L81: in graph -> MLA"),
    ("graph-edge", "0.5.23", "h200", {}, [(2048, 0)], ["absorb"], "max tokens 2048 (server_args, MLA)"),
    ("graph-above", "0.5.23", "h200", {}, [(2049, 0)], ["expand"], "above the capture size: handler as usual"),
    ("graph-off-0.5.14", "0.5.14", "h200", {}, [(512, 0)], ["expand"], "0.5.14: enable_piecewise_cuda_graph=False"),
    ("graph-on-0.5.14", "0.5.14", "h200", {"enable_piecewise_cuda_graph": True}, [(512, 0)], ["absorb"], "flag on"),
    ("graph-disabled", "0.5.23", "h200", {"disable_piecewise_cuda_graph": True}, [(512, 0)], ["expand"], "flag off"),
    ("graph-tokens", "0.5.23", "h200", {"piecewise_cuda_graph_max_tokens": 256}, [(512, 0)], ["expand"], "max tokens"),
    (
        "graph-summed-tokens",
        "0.5.23",
        "h200",
        {},
        [(1500, 0), (1000, 0)],
        ["expand"] * 2,
        "graph takes the batch's tokens",
    ),
    # sm100: trtllm_mla for DeepSeek-V3
    (
        "b200-trtllm",
        "0.5.23",
        "b200",
        {},
        [(BIG, 100), (BIG, 0)],
        ["expand_chunked"] * 2,
        "handler L142-L145: every extend MHA_CHUNKED_KV",
    ),
    ("b200-trtllm-small", "0.5.23", "b200", {}, [(16, 100)], ["expand_chunked"], "trtllm: graph off for V3 (issue 19)"),
    ("b200-decode", "0.5.23", "b200-fp8", {}, [(1, 100)], ["absorb"], "trtllm: decode -> MLA"),
    (
        "trtllm-no-cpc",
        "0.5.23",
        "b200",
        {"disable_chunked_prefix_cache": True},
        [(BIG, 100)],
        ["absorb"],
        "not cpc and prefix>0 -> MLA",
    ),
    (
        "trtllm-no-cpc-0",
        "0.5.23",
        "b200",
        {"disable_chunked_prefix_cache": True},
        [(BIG, 0)],
        ["expand_chunked"],
        "prefix 0 -> MHA_CHUNKED_KV",
    ),
    # the chunked prefix cache off
    (
        "no-cpc-sum",
        "0.5.23",
        "h200",
        {"disable_chunked_prefix_cache": True},
        [(BIG, 20000)],
        ["absorb"],
        "handler L100: and not disable_chunked_prefix_cache",
    ),
    (
        "no-cpc-0",
        "0.5.23",
        "h200",
        {"disable_chunked_prefix_cache": True},
        [(BIG, 0)],
        ["expand"],
        "handler L102: or sum == 0",
    ),
    # flashinfer_mla_disable_ragged, deterministic, prefill CP
    (
        "ragged-off",
        "0.5.23",
        "h200",
        {"attention_backend": "flashinfer", "flashinfer_mla_disable_ragged": True},
        [(BIG, 0)],
        ["absorb"],
        "handler L90-L95: disable_ragged -> MLA",
    ),
    (
        "ragged-fa3",
        "0.5.23",
        "h200",
        {"flashinfer_mla_disable_ragged": True},
        [(BIG, 0)],
        ["expand"],
        "fa3 is not flashinfer/flashmla",
    ),
    (
        "determ-fa3",
        "0.5.23",
        "h200",
        {"enable_deterministic_inference": True},
        [(BIG, 0)],
        ["absorb"],
        "handler L116-L119: handle_attention_fa3",
    ),
    (
        "determ-triton",
        "0.5.23",
        "a100",
        {"enable_deterministic_inference": True},
        [(BIG, 0)],
        ["absorb"],
        "handle_attention_triton",
    ),
    (
        "determ-flashinfer",
        "0.5.23",
        "h200",
        {"attention_backend": "flashinfer", "enable_deterministic_inference": True},
        [(BIG, 0)],
        ["expand"],
        "flashinfer has no switch",
    ),
    (
        "prefill-cp",
        "0.5.14",
        "h200",
        {"enable_prefill_context_parallel": True},
        [(BIG, 0)],
        ["absorb"],
        "handler L86-L87: mla_use_prefill_cp -> MLA",
    ),
    # mixed chunk
    (
        "mixed-chunk",
        "0.5.23",
        "h200",
        {"enable_mixed_chunk": True},
        [(1, 8000), (BIG, 192)],
        ["expand"] * 2,
        "mixed: decodes' prefixes count",
    ),
    ("no-mixed", "0.5.23", "h200", {}, [(1, 8000), (BIG, 192)], ["absorb"] * 2, "decodes apart: 192 < 8192"),
    (
        "mixed-decodes-only",
        "0.5.23",
        "h200",
        {"enable_mixed_chunk": True},
        [(1, 8000)] * 2,
        ["absorb"] * 2,
        "no extend: decode batch",
    ),
    # separate backends
    (
        "prefill-triton",
        "0.5.23",
        "h200",
        {"prefill_attention_backend": "triton"},
        [(BIG, 9000)],
        ["absorb"],
        "triton: prefix > 0 -> MLA",
    ),
    (
        "decode-fa4",
        "0.5.23",
        "h200",
        {"decode_attention_backend": "fa4"},
        [(1, 9000)],
        ["expand_chunked"],
        "handle_attention_fa4 on a decode",
    ),
    (
        "fa4",
        "0.5.23",
        "b200",
        {"attention_backend": "fa4"},
        [(16, 5)],
        ["expand_chunked"],
        "handler L132-L134: handle_attention_fa4",
    ),
    # triton (sm80 default), aiter
    ("a100-triton-0", "0.5.23", "a100", {}, [(BIG, 0)] * 50, ["expand"] * 50, "triton: sum == 0 -> MHA, never chunked"),
    ("a100-triton-prefix", "0.5.23", "a100", {}, [(BIG, 0), (BIG, 1)], ["absorb"] * 2, "triton: sum > 0 -> MLA"),
    (
        "aiter",
        "0.5.14",
        "h200",
        {"attention_backend": "aiter"},
        [(BIG, 50000)],
        ["expand"],
        "handler L156-L160: handle_attention_aiter",
    ),
    (
        "aiter-graph",
        "0.5.23",
        "h200",
        {"attention_backend": "aiter"},
        [(16, 50000)],
        ["expand"],
        "0.5.23 aiter: graph -> MHA",
    ),
]


@pytest.mark.parametrize(
    "version, ctx, options, requests, expected, source",
    [c[1:] for c in SGLANG_CASES],
    ids=[c[0] for c in SGLANG_CASES],
)
def test_sglang_case(version, ctx, options, requests, expected, source):
    arch = CTX[ctx].arch
    server = SGLangServer(version, **options).resolve(arch)
    assert sglang_reference(server, requests) == expected, source
    p = parse_engines(f"sglang@{version}", [f"{k}={v}" for k, v in options.items()], CTX[ctx])[0]
    new, prefix = np.array(requests).T
    assert list(step_paths(p, new, prefix)) == expected, source


VLLM_CASES = [
    # id, version, context, options, requests, expected, source
    ("h200-bf16-512", "0.33.0", "h200", {}, [(512, 10)], ["absorb"], "cuda.py: FLASH_ATTN_MLA first; threshold 512"),
    ("h200-bf16-513", "0.33.0", "h200", {}, [(513, 10)], ["expand_chunked"], "flashattn_mla.py: 512"),
    ("h200-fp8-128", "0.33.0", "h200-fp8", {}, [(128, 10)], ["absorb"], "FLASH_ATTN_MLA takes no fp8: FLASHMLA 128"),
    ("h200-fp8-129", "0.33.0", "h200-fp8", {}, [(129, 10)], ["expand_chunked"], "flashmla.py: 128"),
    ("b200-1", "0.33.0", "b200", {}, [(1, 10)], ["absorb"], "sm100: FLASHINFER_MLA, threshold 1"),
    ("b200-2", "0.33.0", "b200", {}, [(2, 10)], ["expand_chunked"], "threshold 1: two tokens prefill"),
    ("b200-fp8", "0.33.0", "b200-fp8", {}, [(2, 0)], ["expand"], "threshold 1, no context -> MHA"),
    (
        "cutlass",
        "0.33.0",
        "b200",
        {"backend": "cutlass_mla"},
        [(1, 5), (3, 5)],
        ["absorb", "expand_chunked"],
        "CUTLASS_MLA threshold 1",
    ),
    # the uniform split (FlashMLA)
    (
        "uniform",
        "0.33.0",
        "h200-fp8",
        {},
        [(10, 100), (20, 100)],
        ["absorb", "expand_chunked"],
        "require_uniform: q != q[0] -> prefill",
    ),
    ("uniform-same", "0.33.0", "h200-fp8", {}, [(10, 100), (10, 50)], ["absorb"] * 2, "uniform: all equal -> decodes"),
    ("varlen", "0.33.0", "h200", {}, [(10, 100), (20, 100)], ["absorb"] * 2, "VARLEN: q <= t -> decode"),
    # the reorder: no-context requests last, the first prefill ends the decodes
    (
        "no-context-last",
        "0.33.0",
        "h200",
        {},
        [(10, 0), (600, 100)],
        ["expand", "expand_chunked"],
        "reorder: prefill region last",
    ),
    (
        "no-context-alone",
        "0.33.0",
        "h200",
        {},
        [(10, 0), (5, 100)],
        ["absorb"] * 2,
        "max q <= t (VARLEN) -> all decodes",
    ),
    (
        "no-context-uniform",
        "0.33.0",
        "h200-fp8",
        {},
        [(10, 0), (5, 100)],
        ["expand", "absorb"],
        "uniform: 10 != 5 after the reorder",
    ),
    (
        "reorder-moves",
        "0.33.0",
        "h200",
        {},
        [(600, 1), (3, 2), (4, 3)],
        ["expand_chunked", "absorb", "absorb"],
        "decodes moved first",
    ),
    # speculation, parallel drafting, DCP
    (
        "spec",
        "0.33.0",
        "b200",
        {"num_speculative_tokens": 3},
        [(4, 100), (4, 100)],
        ["absorb"] * 2,
        "max(1, 1 + 3) = 4",
    ),
    ("spec-5", "0.33.0", "b200", {"num_speculative_tokens": 3}, [(5, 100)], ["expand_chunked"], "5 > 4"),
    (
        "spec-pd",
        "0.33.0",
        "b200",
        {"num_speculative_tokens": 3, "parallel_drafting": True},
        [(7, 100)],
        ["absorb"],
        "1 + 2 x 3 = 7",
    ),
    (
        "spec-cutlass",
        "0.33.0",
        "b200",
        {"backend": "cutlass_mla", "num_speculative_tokens": 3},
        [(4, 100)],
        ["expand_chunked"],
        "SINGLE_ONLY: no spec threshold",
    ),
    ("spec-fa-mla", "0.33.0", "h200", {"num_speculative_tokens": 3}, [(512, 100)], ["absorb"], "max(512, 4) = 512"),
    (
        "dcp-flashmla",
        "0.33.0",
        "h200-fp8",
        {"decode_context_parallel_size": 2},
        [(2, 100)],
        ["expand_chunked"],
        "DCP, no varlen -> 1",
    ),
    (
        "dcp-fa-mla",
        "0.33.0",
        "h200",
        {"decode_context_parallel_size": 2},
        [(500, 100)],
        ["absorb"],
        "FLASH_ATTN_MLA keeps 512",
    ),
    (
        "dcp-b200",
        "0.33.0",
        "b200",
        {"decode_context_parallel_size": 2},
        [(2, 100)],
        ["expand_chunked"],
        "sm100 + DCP -> CUTLASS_MLA",
    ),
    (
        "old-flashinfer-dcp",
        "0014ca6b",
        "b200",
        {"num_speculative_tokens": 3, "decode_context_parallel_size": 2, "backend": "flashinfer_mla"},
        [(4, 100)],
        ["expand_chunked"],
        "0014ca6b: no DCP varlen",
    ),
    (
        "new-flashinfer-dcp",
        "0.33.0",
        "b200",
        {"num_speculative_tokens": 3, "decode_context_parallel_size": 2, "backend": "flashinfer_mla"},
        [(4, 100)],
        ["absorb"],
        "0.33: DCP varlen",
    ),
    (
        "threshold-override",
        "0.33.0",
        "h200",
        {"reorder_batch_threshold": 16},
        [(16, 10), (17, 10)],
        ["absorb", "expand_chunked"],
        "what-if",
    ),
    # four regions (0.33): a short extend still prefilling goes behind the decodes
    ("four-regions", "0.33.0", "h200-fp8", {}, [(5, 100), (1, 100)], ["expand_chunked", "absorb"], "decode first"),
    ("three-regions", "0014ca6b", "h200-fp8", {}, [(5, 100), (1, 100)], ["absorb", "expand_chunked"], "one region"),
    # prefill context parallelism (0.33): short extends still prefilling are prefills
    (
        "pcp",
        "0.33.0",
        "h200",
        {"prefill_context_parallel_size": 2},
        [(1, 9), (99, 9)],
        ["absorb", "expand_chunked"],
        "|=",
    ),
    ("no-pcp", "0.33.0", "h200", {}, [(1, 9), (99, 9)], ["absorb", "absorb"], "max q <= 512: all decodes"),
    ("pcp-one", "0.33.0", "h200", {"prefill_context_parallel_size": 2}, [(99, 9)], ["expand_chunked"], "no shortcut"),
]


@pytest.mark.parametrize(
    "version, ctx, options, requests, expected, source", [c[1:] for c in VLLM_CASES], ids=[c[0] for c in VLLM_CASES]
)
def test_vllm_case(version, ctx, options, requests, expected, source):
    p = parse_engines(f"vllm@{version}", [f"{k}={v}" for k, v in options.items()], CTX[ctx])[0]
    kw = {
        "num_speculative_tokens": options.get("num_speculative_tokens", 0),
        "parallel_drafting": options.get("parallel_drafting", False),
        "dcp": options.get("decode_context_parallel_size", 1),
        "version": version,
        "override": options.get("reorder_batch_threshold"),
        "pcp": options.get("prefill_context_parallel_size", 1),
    }
    assert vllm_reference(requests, p.backend, **kw) == expected, source
    new, prefix = np.array(requests).T
    assert list(step_paths(p, new, prefix)) == expected, source


# -- resolution: each architecture and cache dtype ----------------------------------------------------

RESOLVE = [
    ("vllm@0.33.0", "h200", "FLASH_ATTN_MLA", 512, "cuda.py: SM90 priority, FLASH_ATTN_MLA takes bf16"),
    ("vllm@0.33.0", "h200-fp8", "FLASHMLA", 128, "flashattn_mla.py: kv dtypes auto/fp16/bf16 only"),
    ("vllm@0.33.0", "b200", "FLASHINFER_MLA", 1, "cuda.py check_and_update_config: forced on sm100"),
    ("vllm@0.33.0", "b200-fp8", "FLASHINFER_MLA", 1, "FLASHINFER_MLA takes fp8"),
    ("vllm@0.33.0", "a100", "TRITON_MLA", 1, "only TRITON_MLA runs before SM90"),
    ("sglang@0.5.23", "h200", "fa3", 8192, "server_args: MLA on Hopper -> fa3"),
    ("sglang@0.5.23", "b200", "trtllm_mla", 8192, "server_args: DeepseekV3ForCausalLM on sm100"),
    ("sglang@0.5.14", "b200-fp8", "trtllm_mla", 8192, "same in 0.5.14"),
    ("sglang@0.5.23", "a100", "triton", 8192, "server_args: otherwise triton"),
]


@pytest.mark.parametrize("engine, ctx, backend, threshold, source", RESOLVE, ids=[f"{r[0]}-{r[1]}" for r in RESOLVE])
def test_default_backend(engine, ctx, backend, threshold, source):
    p = parse_engines(engine, [], CTX[ctx])[0]
    assert (p.backend, p.threshold) == (backend, threshold), source
    assert p.why[0].startswith(
        f"{engine} on {CTX[ctx].hardware} ({CTX[ctx].arch}), {CTX[ctx].kv_dtype} cache → {backend}"
    )


def test_why_line_names_version_backend_threshold():
    p = parse_engines("vllm@0.33.0", [], H200)[0]
    assert p.why[0].startswith("vllm@0.33.0 on h200 (sm90), bf16 cache → FLASH_ATTN_MLA (threshold 512)")
    p = parse_engines("vllm", [], H200_FP8)[0]
    assert "FLASH_ATTN_MLA takes no fp8 cache" in p.why[0] and "FLASHMLA (threshold 128)" in p.why[0]


def test_deepseek_v2_on_sm100_is_not_trtllm():
    ctx = Context(hardware="b200", arch="sm100", model="deepseek-v2", model_arch="DeepseekV2ForCausalLM")
    assert parse_engines("sglang", [], ctx)[0].backend == "flashinfer"


def test_unknown_architecture_is_said():
    ctx = Context(hardware="teaching", arch=None)
    p = parse_engines("sglang", [], ctx)[0]
    assert p.backend == "fa3" and any("sm90 default is assumed" in w for w in p.why)


# -- options: names, types, bounds, versions -----------------------------------------------------------

BAD_OPTIONS = [
    (
        "sglang@0.5.14",
        "bogus=1",
        "sglang@0.5.14 has no option 'bogus'; valid keys for sglang@0.5.14: attention_backend",
    ),
    ("sglang@0.5.14", "disable_piecewise_cuda_graph=true", "has no option 'disable_piecewise_cuda_graph'"),
    ("sglang@0.5.23", "enable_piecewise_cuda_graph=true", "has no option 'enable_piecewise_cuda_graph'"),
    ("sglang@0.5.23", "attention_backend=cutlass_mla", "attention_backend must be one of aiter, fa3, fa4"),
    ("sglang", "enable_mixed_chunk=maybe", "enable_mixed_chunk takes true or false, got 'maybe'"),
    ("sglang", "chunked_prefix_cache_threshold=1.5", "takes a whole number from 0 to 2,147,483,647"),
    ("sglang", "chunked_prefix_cache_threshold=-1", "takes a whole number"),
    ("sglang", "chunked_prefix_cache_threshold=99999999999999999999999", "must be from 0 to 2,147,483,647"),
    ("sglang", "chunked_prefix_cache_threshold=9223372036854775808", "must be from 0 to 2,147,483,647"),
    ("sglang", "chunked_prefix_cache_threshold=٤", "takes a whole number"),
    ("vllm", "num_speculative_tokens=2000", "must be from 0 to 1,024"),
    (
        "vllm",
        "backend=flashinfer",
        "backend must be one of flash_attn_mla, flashmla, flashinfer_mla, cutlass_mla, triton_mla",
    ),
    ("vllm", "decode_context_parallel_size=0", "must be from 1 to 1,024"),
]


@pytest.mark.parametrize("engine, option, message", BAD_OPTIONS, ids=[o for _, o, _ in BAD_OPTIONS])
def test_bad_option(engine, option, message):
    with pytest.raises(MlactlError, match=None) as err:
        parse_engines(engine, [option], H200)
    assert message in str(err.value)


def test_backend_the_gpu_cannot_run_is_refused():
    with pytest.raises(MlactlError, match="FLASH_ATTN_MLA does not run on b200"):
        parse_engines("vllm", ["backend=flash_attn_mla"], B200)
    with pytest.raises(MlactlError, match="FLASH_ATTN_MLA takes no fp8 cache"):
        parse_engines("vllm", ["backend=flash_attn_mla"], H200_FP8)


def test_options_route_by_family_and_version():
    a, b = parse_engines("sglang@0.5.14,sglang@0.5.23", ["sglang.enable_mixed_chunk=true"], H200)
    assert a.opt("enable_mixed_chunk") and b.opt("enable_mixed_chunk")
    a, b = parse_engines("sglang@0.5.14,sglang@0.5.23", ["sglang@0.5.14.enable_mixed_chunk=1"], H200)
    assert a.opt("enable_mixed_chunk") and not b.opt("enable_mixed_chunk")
    (v,) = parse_engines("vllm", ["num_speculative_tokens=3"], B200)
    assert v.threshold == 4 and v.label == "vllm(num_speculative_tokens=3)"
    with pytest.raises(MlactlError, match="belongs to sglang and vllm"):
        parse_engines("sglang,vllm", ["threshold=4"], H200)
    with pytest.raises(MlactlError, match="sglang-triton fixes attention_backend=triton"):
        parse_engines("sglang-triton", ["attention_backend=fa3"], H200)
    with pytest.raises(MlactlError, match="no rule set for sglang@0.4.0; sglang versions: 0.5.14, 0.5.23"):
        parse_engines("sglang@0.4.0", [], H200)


# -- the vectorised rules agree with the reference on random steps --------------------------------------

requests_st = st.lists(
    st.tuples(st.one_of(st.just(1), st.integers(1, 700)), st.sampled_from([0, 1, 50, 4000, 9000])),
    min_size=1,
    max_size=10,
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(requests_st, min_size=1, max_size=4),
    backend=st.sampled_from(["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"]),
    spec=st.sampled_from([0, 2, 5]),
    version=st.sampled_from(["0014ca6b", "0.33.0"]),
    pcp=st.sampled_from([1, 2]),
)
def test_vllm_steps_match_reference(steps, backend, spec, version, pcp):
    ctx = B200 if backend == "FLASHINFER_MLA" else (H200_FP8 if backend == "FLASHMLA" else H200)
    options = [f"backend={backend.lower()}", f"num_speculative_tokens={spec}"]
    if version == "0.33.0":
        options.append(f"prefill_context_parallel_size={pcp}")
    p = parse_engines(f"vllm@{version}", options, ctx)[0]
    new = np.array([n for s in steps for n, _ in s])
    prefix = np.array([q for s in steps for _, q in s])
    step = np.repeat(np.arange(len(steps)), [len(s) for s in steps])
    # steps interleaved in the input, each step's requests still in their order
    slots = step[np.random.default_rng(len(new)).permutation(len(new))]
    shuffle = np.empty(len(new), dtype=np.int64)
    for s in range(len(steps)):
        shuffle[slots == s] = np.flatnonzero(step == s)
    got = step_paths(p, new[shuffle], prefix[shuffle], step=step[shuffle])
    kw = {"num_speculative_tokens": spec, "version": version, "pcp": pcp}
    want = np.concatenate([vllm_reference(s, backend, **kw) for s in steps])[shuffle]
    assert list(got) == list(want)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(requests_st, min_size=1, max_size=4),
    options=st.sampled_from(
        [{}, {"enable_mixed_chunk": True}, {"disable_chunked_prefix_cache": True}, {"attention_backend": "triton"}]
    ),
    version=st.sampled_from(["0.5.14", "0.5.23"]),
)
def test_sglang_steps_match_reference(steps, options, version):
    steps = [[(1 if n < 30 else n, q) for n, q in s] for s in steps]  # some decodes
    server = SGLangServer(version, **options).resolve("sm90")
    p = parse_engines(f"sglang@{version}", [f"{k}={v}" for k, v in options.items()], H200)[0]
    new = np.array([n for s in steps for n, _ in s])
    prefix = np.array([q for s in steps for _, q in s])
    step = np.repeat(np.arange(len(steps)), [len(s) for s in steps])
    got = step_paths(p, new, prefix, step=step)
    want = np.concatenate([sglang_reference(server, s) for s in steps])
    assert list(got) == list(want)


def test_counts_split_a_row_that_straddles_the_split():
    """A row of three alike no-context requests behind an extend: the reorder keeps the decodes
    (5 new tokens after context) first, then the extend, then the three; with FLASH_ATTN_MLA
    (VARLEN, 512) the extend ends the decodes, so all three are prefills (expand)."""
    p = parse_engines("vllm", [], H200)[0]
    counts = step_counts(p, [5, 600, 10], [100, 100, 0], [2, 1, 3])
    assert counts.tolist() == [[2, 0, 0], [0, 0, 1], [0, 3, 0]]
    assert vllm_reference([(5, 100), (5, 100), (600, 100)] + [(10, 0)] * 3, "FLASH_ATTN_MLA") == [
        "absorb",
        "absorb",
        "expand_chunked",
        "expand",
        "expand",
        "expand",
    ]


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(
        ["chunked_prefix_cache_threshold", "enable_mixed_chunk", "attention_backend", "num_speculative_tokens", "bogus"]
    ),
    value=st.text(max_size=40) | st.integers(-(2**70), 2**70).map(str),
)
def test_any_option_value_is_taken_or_refused_in_one_line(key, value):
    """Whatever the text, an option value parses or is one MlactlError naming the option:
    never an OverflowError, a ValueError or a silent wrap past int64."""
    engine = "vllm" if key == "num_speculative_tokens" else "sglang"
    try:
        (p,) = parse_engines(engine, [f"{key}={value}"], H200)
    except MlactlError as exc:
        assert "\n" not in str(exc) and key in str(exc)
        return
    got = p.opt(key)
    if isinstance(got, int) and not isinstance(got, bool):
        assert 0 <= got <= 2**31 - 1
