"""SGLang's path rule, vectorised over batches and over scheduler steps.

SGLang judges a whole forward batch at once (attention_backend_handler.py): the scheduler runs a
step's decodes as one decode batch and its other requests as one extend batch (with
`--enable-mixed-chunk` the decodes join the extend batch), and the handler of the backend that
runs the batch picks one method for all of its requests from the batch's sums:

    sum_prefix  = sum of extend_prefix_lens (cached tokens)
    sum_seq     = sum of seq_lens (cached + new)
    tokens      = sum of extend_seq_lens (new tokens: what a piecewise CUDA graph captures)

Methods map onto mlactl's paths: MLA -> absorb, MHA_ONE_SHOT and MHA -> expand,
MHA_CHUNKED_KV -> expand_chunked.

A DSA model (DeepSeek-V3.2) runs on the dsa backend, whose handler reads the backend's own
decision (set_dsa_prefill_impl): an extend batch runs dense MHA (MHA_ONE_SHOT -> dense_expand)
when its longest sequence (max of seq_lens) is at most the dense threshold and its summed
sequences fit the chunk capacity, on SM90/SM100 with a bf16 or fp8_e4m3 cache and outside a
captured prefill graph; everything else, decodes included, runs MLA: the sparse MQA
(sparse_absorb).
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.engines.params import EngineParams

ABSORB, EXPAND, CHUNKED = "absorb", "expand", "expand_chunked"
SPARSE, DENSE = "sparse_absorb", "dense_expand"


def dsa_extend_paths(p: EngineParams, max_seq, sum_seq, tokens) -> np.ndarray:
    """The path of a DSA model's extend batches: dense_expand where use_mha holds, else
    sparse_absorb (arrays, one entry per batch: longest sequence, summed sequences, new tokens)."""
    max_seq, sum_seq, tokens = (np.asarray(a, dtype=np.int64) for a in (max_seq, sum_seq, tokens))
    graph = (tokens <= p.graph_max_tokens) if p.graph_max_tokens else np.zeros(np.shape(tokens), dtype=bool)
    dense = p.dense_ok & ~graph & (max_seq <= p.dense_threshold) & (sum_seq <= p.capacity)
    return np.where(dense, DENSE, SPARSE)


def extend_paths(p: EngineParams, sum_prefix, sum_seq, tokens) -> np.ndarray:
    """The path of extend batches (arrays, one entry per batch) on p's prefill backend."""
    sum_prefix, sum_seq, tokens = (np.asarray(a, dtype=np.int64) for a in (sum_prefix, sum_seq, tokens))
    shape = np.broadcast(sum_prefix, sum_seq, tokens).shape
    b = p.backend_info
    v = p.values
    graph = (tokens <= p.graph_max_tokens) if p.graph_max_tokens else np.zeros(shape, dtype=bool)
    if b.handler == "fa4":  # handle_attention_fa4: MHA_CHUNKED_KV whatever the batch
        return np.full(shape, CHUNKED)
    if b.handler == "aiter":  # MHA for every extend without speculation (and inside a graph)
        return np.full(shape, EXPAND)
    if b.handler == "triton":
        if v["enable_deterministic_inference"]:
            return np.full(shape, ABSORB)
        return np.where(~graph & (sum_prefix == 0), EXPAND, ABSORB)
    if b.handler == "trtllm":
        mha = np.full(shape, True) if p.chunked_prefix_cache else (sum_prefix == 0)
        return np.where(~graph & mha, CHUNKED, ABSORB)
    # _handle_attention_backend (fa3 first checks deterministic inference)
    if b.handler == "fa3" and v["enable_deterministic_inference"]:
        return np.full(shape, ABSORB)
    if (b.prefill_cp and v["enable_prefill_context_parallel"]) or (
        b.ragged_switch and v["flashinfer_mla_disable_ragged"]
    ):
        return np.full(shape, ABSORB)
    mha = (sum_prefix == 0) | ((sum_prefix >= p.threshold) if p.chunked_prefix_cache else False)
    one_shot = b.one_shot & (sum_seq <= p.capacity)
    return np.where(~graph & mha, np.where(one_shot, EXPAND, CHUNKED), ABSORB)


def decode_path(p: EngineParams) -> str:
    """The path of a decode batch on p's decode backend (every handler but fa4's returns MLA;
    a DSA model's decodes run the sparse MQA)."""
    if p.is_dsa:
        return SPARSE
    return CHUNKED if p.decode_info.handler == "fa4" else ABSORB


def step_paths(p: EngineParams, new, prefix, count=None, step=None, decode=None) -> np.ndarray:
    """The path of every row of many scheduler steps at once.

    Args:
        new, prefix: [R] int, new and cached tokens of each row.
        count: [R] int, alike requests a row stands for (default 1).
        step: [R] int, the step (scheduler batch) each row belongs to (default: all one step).
        decode: [R] bool, rows that are decodes (default: one new token after a prefix).

    Returns:
        [R] path names.
    """
    new, prefix = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    n = len(new)
    count = np.ones(n, dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)
    step = np.zeros(n, dtype=np.int64) if step is None else np.asarray(step, dtype=np.int64)
    decode = is_decode(new, prefix) if decode is None else np.asarray(decode, dtype=bool)
    out = np.full(n, decode_path(p), dtype=object)
    if n == 0:
        return out.astype(str)
    steps, inverse = np.unique(step, return_inverse=True)
    extend = ~decode
    if p.values["enable_mixed_chunk"]:  # a step with any extend is one extend batch, decodes included
        has_extend = np.bincount(inverse, weights=extend, minlength=len(steps)) > 0
        extend = has_extend[inverse]
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(steps)))

    def per_step(values, reduce=np.add) -> np.ndarray:
        return reduce.reduceat(np.where(extend, values, 0)[order], starts)

    if p.is_dsa:  # the longest sequence, the summed sequences, the new tokens
        sums = [
            per_step(np.where(count > 0, prefix + new, 0), np.maximum),
            per_step(count * (prefix + new)),
            per_step(count * new),
        ]
        paths = dsa_extend_paths(p, *sums)
    else:
        sums = [per_step(count * prefix), per_step(count * (prefix + new)), per_step(count * new)]
        paths = extend_paths(p, *sums)
    out[extend] = paths[inverse[extend]]
    return out.astype(str)


def grid_paths(p: EngineParams, batch, new, prefix) -> np.ndarray:
    """Each point a step of `batch` alike requests (vectorised over points)."""
    batch, new, prefix = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (batch, new, prefix)))
    if p.is_dsa:
        ext = dsa_extend_paths(p, prefix + new, batch * (prefix + new), batch * new)
    else:
        ext = extend_paths(p, batch * prefix, batch * (prefix + new), batch * new)
    return np.where(is_decode(new, prefix), decode_path(p), ext)


def is_decode(new, prefix) -> np.ndarray:
    """One new token after a cached prefix: mlactl's convention for a decode."""
    return (np.asarray(new) == 1) & (np.asarray(prefix) > 0)
