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

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide.engines import Context, arch_of, context_for, grid_paths, parse_engines, step_counts, step_paths
from mlactl.model import hardware
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
                self.graph = False  # assumed, not found in server_args.py (rulesets.py, 0.5.23's notes)
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
    ("b200-trtllm-small", "0.5.23", "b200", {}, [(16, 100)], ["expand_chunked"], "trtllm: graph off for V3 (assumed)"),
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


@pytest.mark.parametrize(
    "profile, arch, sglang, vllm",
    [
        ("h200", "sm90", "fa3", "FLASH_ATTN_MLA"),
        ("b300", "sm100", "trtllm_mla", "FLASHINFER_MLA"),
        ("gb300", "sm100", "trtllm_mla", "FLASHINFER_MLA"),
        ("a100-sxm", "sm80", "triton", "TRITON_MLA"),
        # Ada and sm120 are neither Hopper nor sm100: server_args.py's MLA default is triton there, and
        # TRITON_MLA is the one backend of cuda.py's other list that runs on them
        ("l40s", "sm89", "triton", "TRITON_MLA"),
        ("rtx-pro-6000", "sm120", "triton", "TRITON_MLA"),
    ],
)
def test_every_shipped_gpu_resolves_by_its_own_architecture(profile, arch, sglang, vllm):
    ctx = context_for(None, hardware.resolve(profile))
    assert arch_of(hardware.resolve(profile)) == arch == ctx.arch
    got = parse_engines("sglang,vllm", [], ctx)
    assert [p.backend for p in got] == [sglang, vllm]
    assert not any("default is assumed" in w or "priorities are assumed" in w for p in got for w in p.why)


# -- options: names, types, bounds, versions -----------------------------------------------------------

BAD_OPTIONS = [
    (
        "sglang@0.5.14",
        "bogus=1",
        "sglang@0.5.14 has no option 'bogus'; valid keys for sglang@0.5.14: attention_backend",
    ),
    ("sglang@0.5.14", "disable_piecewise_cuda_graph=true", "has no option 'disable_piecewise_cuda_graph'"),
    ("sglang@0.5.23", "enable_piecewise_cuda_graph=true", "has no option 'enable_piecewise_cuda_graph'"),
    ("sglang@0.5.23", "attention_backend=cutlass_mla", "attention_backend must be one of aiter, dsa, fa3, fa4"),
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


# -- DeepSeek-V3.2 (DSA): the second implementation ----------------------------------------------------
#
# SGLang: handle_attention_dsa (attention_backend_handler.py at 0a8dcfa9 L163-L174) returns
# MHA_ONE_SHOT when the backend's use_mha is set, else MLA; set_dsa_prefill_impl (dsa_backend.py
# 0034a380; set_nsa_prefill_impl in nsa_backend.py 005e8bf8) sets use_mha. vLLM: MLAAttention.forward_impl
# (mla_attention.py: at 0014ca6b every token of a sparse impl runs forward_mqa; in the newest the
# prefills' use_dense_mha / use_masked_mha), SparseMLACommonMetadataBuilder.build, _use_masked_mha,
# _masked_mha_workspace_fits, _topk_mask_shape, and the sparse builders' thresholds.

DSA_NAME = {"MHA_ONE_SHOT": "dense_expand", "MLA": "sparse_absorb"}
TOPK = 2048  # DeepSeek-V3.2's index_topk


class SGLangDSAServer:
    def __init__(self, version="0.5.23", **args):
        self.version = version
        name = "nsa" if version == "0.5.14" else "dsa"
        # server_args: SGLANG_{NSA,DSA}_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = index_topk unless set
        self.threshold = args.pop(f"{name}_prefill_dense_attn_kv_len_threshold", TOPK)
        self.cp = args.pop(f"enable_{name}_prefill_context_parallel", False)
        self.max_kv_chunk_capacity = args.pop("max_kv_chunk_capacity", 128 * 1024)  # environ.py
        self.enable_mixed_chunk = args.pop("enable_mixed_chunk", False)
        self.disable_piecewise_cuda_graph = args.pop("disable_piecewise_cuda_graph", False)  # 0.5.23
        self.enable_piecewise_cuda_graph = args.pop("enable_piecewise_cuda_graph", False)  # 0.5.14
        self.piecewise_cuda_graph_max_tokens = args.pop("piecewise_cuda_graph_max_tokens", 2048)
        assert not args, args
        # 0.5.14: model_config disables the piecewise graph for DSA models (is_deepseek_nsa) and
        # set_nsa_prefill_impl has no graph guard; 0.5.23: the graph captures them (on by
        # default), set_dsa_prefill_impl turns MHA off inside it; prefill CP turns the graph off
        self.graph = version != "0.5.14" and not self.disable_piecewise_cuda_graph and not self.cp


def sglang_dsa_use_mha(server, arch, kv, forward_mode, seq_lens, extend_seq_lens):
    """set_dsa_prefill_impl on one batch."""
    in_graph = (
        server.graph and forward_mode == "extend" and sum(extend_seq_lens) <= server.piecewise_cuda_graph_max_tokens
    )
    if in_graph:
        return False  # "Can't branch on seq_lens_cpu in graph replay, force MHA off"
    if forward_mode == "extend":  # is_extend_without_speculative
        device_sm = {"sm80": 80, "sm90": 90, "sm100": 100}[arch]
        return (
            (device_sm == 90 or (device_sm >= 100 and device_sm < 110))
            and max(seq_lens) <= server.threshold
            and kv in ("bf16", "fp8")  # torch.bfloat16, torch.float8_e4m3fn
            and sum(seq_lens) <= server.max_kv_chunk_capacity
            and not server.cp
        )
    return False  # decode/verify always use MLA


def sglang_dsa_reference(server, arch, kv, requests):
    decode = [new == 1 and prefix > 0 for new, prefix in requests]
    if server.enable_mixed_chunk and not all(decode):
        decode = [False] * len(requests)
    extends = [r for r, d in zip(requests, decode) if not d]
    method = None
    if extends:
        use_mha = sglang_dsa_use_mha(server, arch, kv, "extend", [p + n for n, p in extends], [n for n, _ in extends])
        method = "MHA_ONE_SHOT" if use_mha else "MLA"  # handle_attention_dsa
    return [DSA_NAME["MLA"] if d else DSA_NAME[method] for d in decode]


# builders' thresholds by query heads per GPU: flashmla_sparse.py (newest: 008a0c31),
# flashinfer_mla_sparse.py (the version on SparseMLACommonMetadataBuilder); UNIFORM / VARLEN
SPARSE_SM100 = {8: 128, 16: 128, 32: 128, 64: 256, 128: 1024}
SPARSE_OTHER = {16: 128, 32: 128, 64: 256, 128: 256}
DSV32_MASKED_MHA_THRESHOLDS = {
    "FLASHMLA_SPARSE": {
        1: (1536, 4096, None, None, None),
        2: (512, 1024, 4096, None, None),
        4: (512, 1024, 1536, 8192, None),
        8: (512, 512, 1024, 2048, 16384),
    },
    "FLASHINFER_MLA_SPARSE": {8: (512, 1024, 1024, 2048, 32768)},
}
DSV32_SEQ_LEN_BUCKETS = (2048, 4096, 8192, 16384, 32768)
MASK_WORDS = 128 * 1024 * 1024 // 4  # GLOBAL_TOPK_MASK_MAX_BYTES // torch.int32.itemsize


def sparse_builder_threshold(backend, arch, heads):
    if arch == "sm100":  # is_device_capability_family(100)
        return SPARSE_SM100.get(heads, 1024)
    assert backend == "FLASHMLA_SPARSE"
    return SPARSE_OTHER.get(heads, 256)


def use_masked_mha(backend_name, tensor_parallel_size, query_len, seq_len):
    thresholds = DSV32_MASKED_MHA_THRESHOLDS.get(backend_name, {}).get(tensor_parallel_size)
    if thresholds is None:
        return False
    for bucket_idx, bucket_seq_len in enumerate(DSV32_SEQ_LEN_BUCKETS):
        if seq_len <= bucket_seq_len:
            min_query_len = thresholds[bucket_idx]
            return min_query_len is not None and query_len >= min_query_len
    return False


def masked_mha_workspace_fits(batch_size, max_query_len, max_context_chunk_seq_len):
    max_key_len = max(max_query_len, max_context_chunk_seq_len)
    tile_m = 128 if max_query_len <= 128 else 256
    padded_q_len = -(-max_query_len // tile_m) * tile_m
    num_words = -(-max_key_len // 32)
    return batch_size * padded_q_len * num_words <= MASK_WORDS


def vllm_dsa_reference(requests, backend, arch, kv, tp=1, version="0.33.0", force_mqa=False, spec=0):
    """Paths of one step's requests (in the order given) on a sparse backend."""
    if version == "0014ca6b":
        return ["sparse_absorb"] * len(requests)  # sparse impls only support forward_mqa
    heads = 128 // tp
    t = sparse_builder_threshold(backend, arch, heads)
    if spec:  # _init_reorder_batch_threshold(supports_spec_as_decode=True)
        t = max(t, 1 + spec)
    uniform = backend == "FLASHMLA_SPARSE"  # require_uniform_decodes
    tagged = [(n, p, i) for i, (n, p) in enumerate(requests)]
    ordered = vllm_reorder(tagged, t, four_regions=True)
    decodes = vllm_split(
        [n for n, _, _ in ordered],
        t,
        require_uniform=uniform,
        is_prefilling=[not (n == 1 and p > 0) for n, p, _ in ordered],
    )
    prefills = ordered[decodes:]
    out = [None] * len(requests)
    for _, _, i in ordered[:decodes]:
        out[i] = "sparse_absorb"
    if prefills:
        prefill_max_seq_len = max(n + p for n, p, _ in prefills)
        max_query_len = max(n for n, _, _ in prefills)
        workspace = 64 * 1024  # min(max(8 x 163840, 4 x 256 x 64), 64K, 256 x 2048)
        max_chunk = max(min(p, workspace) for _, p, _ in prefills)
        use_dense_mha = prefill_max_seq_len <= TOPK and not force_mqa
        masked_available = arch == "sm100" and kv in ("bf16", "fp16")  # FA4, not a quantized cache, V3.2 dims
        use_masked = (
            masked_available
            and use_masked_mha(backend, tp, max_query_len, prefill_max_seq_len)
            and masked_mha_workspace_fits(len(prefills), max_query_len, max_chunk)
        )
        use_mha = (use_dense_mha or use_masked) and not force_mqa
        for _, _, i in prefills:
            if not use_mha:
                out[i] = "sparse_absorb"
            else:  # forward_mha: dense when prefill_max_seq_len <= topk_tokens, else masked
                out[i] = "dense_expand" if prefill_max_seq_len <= TOPK else "masked_expand"
    return out


def dsa_ctx(base, tp=1, kv=None):
    return Context(
        hardware=base.hardware,
        arch=base.arch,
        kv_dtype=kv or base.kv_dtype,
        model="deepseek-v3.2",
        model_kind="dsa",
        model_arch="DeepseekV32ForCausalLM",
        index_topk=TOPK,
        tp=tp,
        heads=128 // tp,
    )


DSA_SGLANG_CASES = [
    # id, version, context, options, requests, expected, source
    ("dense-at-topk", "0.5.14", "h200", {}, [(1048, 1000)], ["dense_expand"], "max_kv_len <= threshold (2048)"),
    ("sparse-above", "0.5.14", "h200", {}, [(1049, 1000)], ["sparse_absorb"], "max_kv_len 2049 > 2048"),
    ("longest-decides", "0.5.14", "h200", {}, [(100, 0), (3000, 0)], ["sparse_absorb"] * 2, "seq_lens_cpu.max()"),
    ("all-short", "0.5.14", "h200", {}, [(2048, 0)] * 3, ["dense_expand"] * 3, "each <= 2048"),
    (
        "cap",
        "0.5.14",
        "h200",
        {"max_kv_chunk_capacity": 4096},
        [(2048, 0)] * 2,
        ["dense_expand"] * 2,
        "sum 4096 <= cap",
    ),
    ("cap+1", "0.5.14", "h200", {"max_kv_chunk_capacity": 4095}, [(2048, 0)] * 2, ["sparse_absorb"] * 2, "sum > cap"),
    ("decode", "0.5.14", "h200", {}, [(1, 100)], ["sparse_absorb"], "decode: use_mha = False"),
    ("b200", "0.5.14", "b200-fp8", {}, [(500, 0)], ["dense_expand"], "SM100, fp8_e4m3"),
    ("sm80", "0.5.14", "a100", {}, [(500, 0)], ["sparse_absorb"], "device_sm 80: not SM90/SM100"),
    (
        "threshold",
        "0.5.14",
        "h200",
        {"nsa_prefill_dense_attn_kv_len_threshold": 1024},
        [(1025, 0)],
        ["sparse_absorb"],
        "SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD",
    ),  # fmt: skip
    (
        "threshold-dsa-name",
        "0.5.14",
        "h200",
        {"nsa_prefill_dense_attn_kv_len_threshold": 0},
        [(5, 0)],
        ["sparse_absorb"],
        "threshold 0: never dense (what server_args sets for GLM-5 on Blackwell)",
    ),  # fmt: skip
    (
        "cp",
        "0.5.14",
        "h200",
        {"enable_nsa_prefill_context_parallel": True},
        [(500, 0)],
        ["sparse_absorb"],
        "not is_nsa_enable_prefill_cp()",
    ),  # fmt: skip
    (
        "no-graph-0.5.14",
        "0.5.14",
        "h200",
        {"enable_piecewise_cuda_graph": True},
        [(500, 0)],
        ["dense_expand"],
        "model_config: the graph is off for DSA models (is_deepseek_nsa)",
    ),  # fmt: skip
    ("graph-0.5.23", "0.5.23", "h200", {}, [(500, 0)], ["sparse_absorb"], "set_dsa_prefill_impl: in a graph -> no MHA"),
    ("graph-above", "0.5.23", "h200", {}, [(1500, 0), (1000, 0)], ["dense_expand"] * 2, "2500 tokens > 2048: no graph"),
    ("graph-off", "0.5.23", "h200", {"disable_piecewise_cuda_graph": True}, [(500, 0)], ["dense_expand"], "flag off"),
    (
        "graph-tokens",
        "0.5.23",
        "h200",
        {"piecewise_cuda_graph_max_tokens": 256},
        [(500, 0)],
        ["dense_expand"],
        "500 > 256 captured tokens",
    ),  # fmt: skip
    (
        "mixed-decode-long",
        "0.5.23",
        "h200",
        {"enable_mixed_chunk": True},
        [(1, 5000), (3000, 0)],
        ["sparse_absorb"] * 2,
        "mixed: the decode's 5001 tokens count in max_kv_len",
    ),  # fmt: skip
    (
        "mixed-decode-short",
        "0.5.23",
        "h200",
        {"enable_mixed_chunk": True},
        [(1, 100), (3000, 0)],
        ["sparse_absorb"] * 2,
        "3000 > 2048 anyway",
    ),  # fmt: skip
    (
        "mixed-short",
        "0.5.14",
        "h200",
        {"enable_mixed_chunk": True},
        [(1, 100), (1500, 0)],
        ["dense_expand"] * 2,
        "mixed: the decode rides the dense extend",
    ),  # fmt: skip
    ("not-mixed", "0.5.14", "h200", {}, [(1, 100), (1500, 0)], ["sparse_absorb", "dense_expand"], "decode batch apart"),
]


@pytest.mark.parametrize(
    "version, ctx, options, requests, expected, source",
    [c[1:] for c in DSA_SGLANG_CASES],
    ids=[c[0] for c in DSA_SGLANG_CASES],
)
def test_sglang_dsa_case(version, ctx, options, requests, expected, source):
    server = SGLangDSAServer(version, **options)
    assert sglang_dsa_reference(server, CTX[ctx].arch, CTX[ctx].kv_dtype, requests) == expected, source
    p = parse_engines(f"sglang@{version}", [f"{k}={v}" for k, v in options.items()], dsa_ctx(CTX[ctx]))[0]
    new, prefix = np.array(requests).T
    assert list(step_paths(p, new, prefix)) == expected, source


DSA_VLLM_CASES = [
    # id, version, context, tp, options, requests, expected, source
    (
        "0014-all-sparse",
        "0014ca6b",
        "b200",
        8,
        {},
        [(500, 0), (5000, 100), (1, 9)],
        ["sparse_absorb"] * 3,
        "mla_attention.py at 0014ca6b: sparse impls only support forward_mqa",
    ),  # fmt: skip
    (
        "h200-decode-256",
        "0.33.0",
        "h200",
        1,
        {},
        [(256, 100)],
        ["sparse_absorb"],
        "FLASHMLA_SPARSE sm90 128 heads: 256",
    ),
    ("h200-dense", "0.33.0", "h200", 1, {}, [(257, 100)], ["dense_expand"], "prefill_max_seq_len 357 <= topk"),
    ("h200-dense-edge", "0.33.0", "h200", 1, {}, [(1048, 1000)], ["dense_expand"], "2048 <= 2048: use_dense_mha"),
    ("h200-no-masked", "0.33.0", "h200", 1, {}, [(1049, 1000)], ["sparse_absorb"], "sm90: no FA4 masked MHA"),
    (
        "h200-tp8",
        "0.33.0",
        "h200",
        8,
        {},
        [(128, 100), (129, 100)],
        ["sparse_absorb", "dense_expand"],
        "16 heads per GPU: 128; uniform split",
    ),  # fmt: skip
    ("b200-tp1-decode", "0.33.0", "b200", 1, {}, [(1024, 0)], ["sparse_absorb"], "sm100 128 heads: 1024"),
    ("b200-tp1-masked", "0.33.0", "b200", 1, {}, [(4096, 0)], ["masked_expand"], "bucket 4096, TP 1: >= 4096"),
    ("b200-tp1-short", "0.33.0", "b200", 1, {}, [(3000, 1000)], ["sparse_absorb"], "seq 4000: 3000 < 4096"),
    ("b200-tp1-8k", "0.33.0", "b200", 1, {}, [(8192, 0)], ["sparse_absorb"], "bucket 8192, TP 1: None"),
    ("b200-tp2", "0.33.0", "b200", 2, {}, [(4096, 4000)], ["masked_expand"], "TP 2 bucket 8192: >= 4096"),
    ("b200-tp4-edge", "0.33.0", "b200", 4, {}, [(8192, 8000)], ["masked_expand"], "TP 4 bucket 16384: 8192"),
    ("b200-tp4-below", "0.33.0", "b200", 4, {}, [(8191, 8000)], ["sparse_absorb"], "8191 < 8192"),
    ("b200-tp8-32k", "0.33.0", "b200", 8, {}, [(16384, 16384)], ["masked_expand"], "TP 8 bucket 32768: 16384"),
    ("b200-tp8-past", "0.33.0", "b200", 8, {}, [(16384, 16385)], ["sparse_absorb"], "seq > 32768: no bucket"),
    ("b200-fp8", "0.33.0", "b200-fp8", 8, {}, [(4096, 0)], ["sparse_absorb"], "quantized cache: no masked MHA"),
    ("b200-fp8-dense", "0.33.0", "b200-fp8", 8, {}, [(1000, 0)], ["dense_expand"], "dense MHA with any cache"),
    ("b200-tp16", "0.33.0", "b200", 16, {}, [(4096, 4000)], ["sparse_absorb"], "no table row for TP 16"),
    (
        "step-longest",
        "0.33.0",
        "b200",
        8,
        {},
        [(600, 0), (600, 1800)],
        ["masked_expand"] * 2,
        "the longest prefill (seq 2400, bucket 4096, TP 8: 600 >= 512) decides: (600, 0) runs masked too",
    ),  # fmt: skip
    ("step-alone", "0.33.0", "b200", 8, {}, [(600, 0)], ["dense_expand"], "alone: seq 600 <= topk"),
    (
        "force-mqa",
        "0.33.0",
        "h200",
        1,
        {"sparse_mla_force_mqa": True},
        [(500, 0)],
        ["sparse_absorb"],
        "attention_config.sparse_mla_force_mqa",
    ),  # fmt: skip
    (
        "flashinfer-sparse",
        "0.33.0",
        "b200",
        8,
        {"backend": "flashinfer_mla_sparse"},
        [(1024, 6000)],
        ["masked_expand"],
        "FLASHINFER_MLA_SPARSE TP 8, bucket 8192: 1024",
    ),  # fmt: skip
    (
        "flashinfer-sparse-below",
        "0.33.0",
        "b200",
        8,
        {"backend": "flashinfer_mla_sparse"},
        [(1023, 6000)],
        ["sparse_absorb"],
        "1023 < 1024",
    ),  # fmt: skip
    (
        "flashinfer-varlen",
        "0.33.0",
        "b200",
        8,
        {"backend": "flashinfer_mla_sparse"},
        [(5, 100), (100, 100)],
        ["sparse_absorb"] * 2,
        "VARLEN: every query <= 128 is a decode",
    ),  # fmt: skip
    (
        "flashmla-uniform",
        "0.33.0",
        "b200",
        8,
        {},
        [(5, 100), (100, 100)],
        ["sparse_absorb", "dense_expand"],
        "UNIFORM: 100 != 5 is a prefill, seq 200 <= topk",
    ),  # fmt: skip
    (
        "decodes-and-prefills",
        "0.33.0",
        "b200",
        8,
        {},
        [(1, 5000), (1, 5000), (5000, 0)],
        ["sparse_absorb", "sparse_absorb", "masked_expand"],
        "decodes sparse; seq 5000 bucket 8192 TP8: 1024",
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    "version, ctx, tp, options, requests, expected, source",
    [c[1:] for c in DSA_VLLM_CASES],
    ids=[c[0] for c in DSA_VLLM_CASES],
)
def test_vllm_dsa_case(version, ctx, tp, options, requests, expected, source):
    p = parse_engines(f"vllm@{version}", [f"{k}={v}" for k, v in options.items()], dsa_ctx(CTX[ctx], tp))[0]
    want = vllm_dsa_reference(
        requests, p.backend, CTX[ctx].arch, CTX[ctx].kv_dtype, tp, version, options.get("sparse_mla_force_mqa", False)
    )
    assert want == expected, source
    new, prefix = np.array(requests).T
    assert list(step_paths(p, new, prefix)) == expected, source


DSA_RESOLVE = [
    ("sglang@0.5.14", "h200", "nsa", "server_args: attention_backend = 'nsa' for a DSA model when not set"),
    ("sglang@0.5.23", "b200-fp8", "dsa", "the 'dsa' fill (arg_groups/overrides.py _deepseek_family_overrides)"),
    ("vllm@0.33.0", "h200", "FLASHMLA_SPARSE", "cuda.py: the one sparse backend in the SM90 priorities"),
    ("vllm@0.33.0", "b200-fp8", "FLASHMLA_SPARSE", "cuda.py: last in the sm100 list, the only sparse one"),
    ("vllm@0014ca6b", "b200", "FLASHMLA_SPARSE", "same list (read at 002db495)"),
]


@pytest.mark.parametrize("engine, ctx, backend, source", DSA_RESOLVE, ids=[f"{r[0]}-{r[1]}" for r in DSA_RESOLVE])
def test_dsa_default_backend(engine, ctx, backend, source):
    p = parse_engines(engine, [], dsa_ctx(CTX[ctx]))[0]
    assert p.backend == backend and p.paths == ("sparse_absorb", "dense_expand", "masked_expand"), source
    assert p.why[0].startswith(
        f"{engine} on {CTX[ctx].hardware} ({CTX[ctx].arch}), {CTX[ctx].kv_dtype} cache → {backend}"
    )


def test_dsa_thresholds_by_heads_and_architecture():
    """FlashMLASparseMetadataBuilder: sm100 {8,16,32: 128, 64: 256, 128: 1024}, else {16,32: 128,
    64: 256, 128: 256}; speculation raises it as for the dense builders."""
    for ctx, tp, t in [("h200", 1, 256), ("h200", 2, 256), ("h200", 4, 128), ("b200", 1, 1024), ("b200", 2, 256)]:
        assert parse_engines("vllm", [], dsa_ctx(CTX[ctx], tp))[0].threshold == t, (ctx, tp)
    assert parse_engines("vllm", ["num_speculative_tokens=300"], dsa_ctx(H200, 8))[0].threshold == 301


DSA_REFUSED = [
    ("sglang", [], "mla", "dsa is the backend of DSA models", {"attention_backend": "dsa"}),
    ("sglang", ["attention_backend=fa3"], "dsa", "attention_backend=fa3 has no sparse attention", {}),
    ("sglang-triton", [], "dsa", "sglang-triton fixes attention_backend=triton", {}),
    ("vllm", ["backend=flashmla"], "dsa", "flashmla is not one", {}),
    ("vllm", ["backend=flashmla_sparse"], "mla", "FLASHMLA_SPARSE is a sparse MLA backend", {}),
    ("vllm", ["backend=flashinfer_mla_sparse"], "dsa-h200", "FLASHINFER_MLA_SPARSE does not run on h200", {}),
    ("sglang", ["dsa_prefill_dense_attn_kv_len_threshold=2049"], "dsa", "above deepseek-v3.2's index_topk (2048)", {}),
    ("vllm@0014ca6b", ["sparse_mla_force_mqa=true"], "dsa", "has no option 'sparse_mla_force_mqa'", {}),
]


@pytest.mark.parametrize("engine, options, kind, message, extra", DSA_REFUSED, ids=[r[3][:30] for r in DSA_REFUSED])
def test_dsa_refusals(engine, options, kind, message, extra):
    ctx = {"mla": H200, "dsa": dsa_ctx(B200), "dsa-h200": dsa_ctx(H200)}[kind]
    opts = options + [f"{k}={v}" for k, v in extra.items()]
    with pytest.raises(MlactlError) as err:
        parse_engines(engine, opts, ctx)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_release_without_dsa_rules_refuses_a_dsa_model(monkeypatch):
    """A rule set whose model_kinds lacks dsa (a release before DeepSeek-V3.2) says so in one line."""
    from dataclasses import replace

    from mlactl.decide.engines import rulesets

    old = replace(rulesets.RULESETS["sglang@0.5.14"], version="0.5.0", model_kinds=("mla",), dsa=None)
    monkeypatch.setitem(rulesets.RULESETS, "sglang@0.5.0", old)
    with pytest.raises(MlactlError) as err:
        parse_engines("sglang@0.5.0", [], dsa_ctx(H200))
    assert str(err.value) == (
        "sglang@0.5.0 has no rule for DSA (sparse MLA) models such as deepseek-v3.2; rule sets with one: "
        "sglang@0.5.14, sglang@0.5.23 (docs/engines.md)"
    )
    assert parse_engines("sglang@0.5.0", [], H200)[0].backend == "fa3"  # its dense rule still answers


def test_dsa_option_names_of_both_generations():
    """Each release takes its own name and the other generation's (environ.py's EnvIntWithAlias
    reads the NSA name as the DSA one's deprecated alias)."""
    for engine, name in [("sglang@0.5.14", "dsa"), ("sglang@0.5.23", "nsa"), ("sglang@0.5.23", "dsa")]:
        p = parse_engines(engine, [f"{name}_prefill_dense_attn_kv_len_threshold=1000"], dsa_ctx(H200))[0]
        assert p.dense_threshold == 1000
    p = parse_engines("sglang@0.5.14", ["enable_dsa_prefill_context_parallel=true"], dsa_ctx(H200))[0]
    assert p.values["enable_nsa_prefill_context_parallel"] and not p.dense_ok


dsa_requests = st.lists(
    st.tuples(st.one_of(st.just(1), st.integers(1, 5000)), st.sampled_from([0, 1, 50, 1000, 2047, 4000, 20000])),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(dsa_requests, min_size=1, max_size=4),
    version=st.sampled_from(["0.5.14", "0.5.23"]),
    ctx=st.sampled_from(["h200", "b200-fp8", "a100"]),
    options=st.sampled_from(
        [{}, {"enable_mixed_chunk": True}, {"max_kv_chunk_capacity": 3000}, {"piecewise_cuda_graph_max_tokens": 100}]
    ),
)
def test_sglang_dsa_steps_match_reference(steps, version, ctx, options):
    server = SGLangDSAServer(version, **options)
    p = parse_engines(f"sglang@{version}", [f"{k}={v}" for k, v in options.items()], dsa_ctx(CTX[ctx]))[0]
    new = np.array([n for s in steps for n, _ in s])
    prefix = np.array([q for s in steps for _, q in s])
    step = np.repeat(np.arange(len(steps)), [len(s) for s in steps])
    got = step_paths(p, new, prefix, step=step)
    want = np.concatenate([sglang_dsa_reference(server, CTX[ctx].arch, CTX[ctx].kv_dtype, s) for s in steps])
    assert list(got) == list(want)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(dsa_requests, min_size=1, max_size=4),
    version=st.sampled_from(["0014ca6b", "0.33.0"]),
    ctx=st.sampled_from(["h200", "b200", "b200-fp8"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    backend=st.sampled_from(["flashmla_sparse", "flashinfer_mla_sparse"]),
    spec=st.sampled_from([0, 3]),
)
def test_vllm_dsa_steps_match_reference(steps, version, ctx, tp, backend, spec):
    if backend == "flashinfer_mla_sparse" and CTX[ctx].arch != "sm100":
        backend = "flashmla_sparse"
    options = [f"backend={backend}", f"num_speculative_tokens={spec}"]
    p = parse_engines(f"vllm@{version}", options, dsa_ctx(CTX[ctx], tp))[0]
    new = np.array([n for s in steps for n, _ in s])
    prefix = np.array([q for s in steps for _, q in s])
    step = np.repeat(np.arange(len(steps)), [len(s) for s in steps])
    got = step_paths(p, new, prefix, step=step)
    want = np.concatenate(
        [
            vllm_dsa_reference(s, backend.upper(), CTX[ctx].arch, CTX[ctx].kv_dtype, tp, version, spec=spec)
            for s in steps
        ]
    )
    assert list(got) == list(want)


def test_dsa_grid_points_match_the_step_rule():
    """A grid point of `batch` alike requests is the step of those requests, for both engines."""
    for engine in ("sglang@0.5.14", "sglang@0.5.23", "vllm@0.33.0"):
        for ctx, tp in (("h200", 1), ("b200", 8), ("b200", 1)):
            p = parse_engines(engine, [], dsa_ctx(CTX[ctx], tp))[0]
            for b, n, q in [(1, 1, 500), (1, 600, 0), (4, 600, 0), (2, 1500, 0), (1, 5000, 3000), (3, 20000, 100)]:
                want = step_paths(p, [n] * b, [q] * b)
                assert set(want) == {grid_paths(p, b, n, q).item()}, (engine, ctx, b, n, q)


runner = CliRunner()
ALL_RULES = ("sglang@0.5.14", "sglang@0.5.23", "vllm@0014ca6b", "vllm@0.33.0")
DEV_NOTES = re.compile(r"issue \d|search tool|index id|tools hold|\bthe index\b|\bstored\b", re.IGNORECASE)


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v3.2"])
def test_what_users_read_cites_sources_not_how_they_were_looked_up(model):
    """A citation names a repository, a commit or release, a file and a line; what could not be
    confirmed is said in the user's terms, never by the project's own notes or tools."""
    texts = [runner.invoke(app, ["engines", "--list", "-f", "json"]).stdout]
    for gpu in ("h200", "b200", "a100-sxm"):
        for kv in ("bf16", "fp8"):
            args = ["--model", model, "--hardware", gpu, "--kv-dtype", kv]
            texts.append(runner.invoke(app, ["analyze", *args, "--engines", ",".join(ALL_RULES)]).output)
            texts.append(runner.invoke(app, ["analyze", *args, "--engines", ",".join(ALL_RULES), "-f", "json"]).output)
    found = sorted({m.group(0) for t in texts for m in DEV_NOTES.finditer(t)})
    assert not found, found
