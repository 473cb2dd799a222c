"""vLLM's path rule, vectorised over requests and over scheduler steps.

vLLM judges request by request, but in order (vllm/v1/attention/backends/utils.py):

1. `reorder_batch_to_split_decodes_and_prefills` reorders each step: decodes (at most
   `threshold` new tokens, with context), then extends (more, with context), then prefills (no
   context); from 0.33 in four regions: decodes done prefilling, short extends (at most
   `threshold` tokens, still prefilling), long extends, prefills. Requests already in their
   region keep their place; the others fill the remaining places of their region in their
   original order.
2. `split_decodes_and_prefills` then takes the leading requests as decodes: with a VARLEN
   backend, those up to the first of more than `threshold` new tokens; with a UNIFORM (or
   single-token) backend, those up to the first whose query length differs from the first
   request's. Everything is a decode when the longest query is at most the threshold and the
   backend is VARLEN or the threshold is 1; nothing is when the first request is longer. Under
   prefill context parallelism (0.33) a request still prefilling is a prefill, and neither
   shortcut applies.

A decode runs the decode pathway (absorb). A prefill runs MHA over its new tokens: with cached
context (`expand_chunked`) the context is expanded in chunks of the workspace, merged by LSE;
without, plain MHA (`expand`).

A DSA model (DeepSeek-V3.2) runs on a sparse backend. Its decodes run the sparse MQA
(sparse_absorb). Where the release has MHA for sparse models (0.33), a step's prefills, judged
together (MLAAttention.forward_impl), run dense MHA (dense_expand) when their longest sequence is
at most index_topk, masked MHA (masked_expand) when masked MHA is available here, their longest
query reaches the table's least query length for the longest sequence's bucket and their top-k
masks fit the workspace; otherwise every token of the step runs the sparse MQA.
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.engines.params import EngineParams
from mlactl.util.errors import MlactlError

ABSORB, EXPAND, CHUNKED = "absorb", "expand", "expand_chunked"
SPARSE, DENSE, MASKED = "sparse_absorb", "dense_expand", "masked_expand"
# Requests of one call expanded from their counts at most (a row of `count` alike requests is
# that many requests, and the reorder moves each one): 8M requests is ~0.5 GB of int64 arrays.
MAX_REQUESTS = 1 << 23


def request_paths(p: EngineParams, new, prefix, step=None, done=None) -> np.ndarray:
    """The path of each request of many steps (arrays of one entry per request, in the order
    the scheduler lists them; `step`: [N] int, the step of each, default all one; `done`: [N]
    bool, requests done prefilling, default one new token after a prefix)."""
    q, ctx = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    n = len(q)
    if n == 0:
        return np.array([], dtype=str)
    step = np.zeros(n, dtype=np.int64) if step is None else np.asarray(step, dtype=np.int64)
    done = (q == 1) & (ctx > 0) if done is None else np.asarray(done, dtype=bool)
    t = p.threshold
    # keep each step's requests in their listed order, steps one after another
    order = np.lexsort((np.arange(n), step))
    q, ctx, s, done = q[order], ctx[order], step[order], done[order]
    first = np.r_[True, s[1:] != s[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    pos = np.arange(n) - start
    sid = np.cumsum(first) - 1
    nsteps = int(sid[-1]) + 1
    # 1. the reorder
    if p.ruleset.reorder_regions == 4:
        region = np.where(ctx == 0, 3, np.where(q > t, 2, np.where(done, 0, 1)))
    else:
        region = np.where(ctx == 0, 2, np.where(q <= t, 0, 1))
    target = np.zeros(n, dtype=np.int64)
    edge = np.zeros(nsteps, dtype=np.int64)
    for r in range(p.ruleset.reorder_regions - 1):  # a place at or past a region's end is later
        edge += np.bincount(sid, weights=region == r, minlength=nsteps).astype(np.int64)
        target += pos >= edge[sid]
    moved = region != target
    src = np.flatnonzero(moved)
    src = src[np.lexsort((pos[src], region[src], sid[src]))]  # by step, region, original place
    dst = np.flatnonzero(moved)  # by step, then place (targets ascend with the place)
    perm = np.arange(n)
    perm[dst] = src  # the request that lands at each place
    q, ctx, done = q[perm], ctx[perm], done[perm]
    # 2. the split
    uniform = p.query_len != "varlen"
    short_as_decodes = p.short_extends_as_decodes
    q0 = q[start]
    heads = np.flatnonzero(first)
    qmax = np.maximum.reduceat(q, heads)[sid]
    breaks = (q != q0) if uniform else (q > t)
    if not short_as_decodes:  # is_prefill |= is_prefilling
        breaks = breaks | ~done
    breaks_at = np.where(breaks, pos, np.iinfo(np.int64).max)
    first_break = np.minimum.reduceat(breaks_at, heads)[sid]
    decode = pos < first_break
    all_decode = (qmax <= t) & (not uniform or t <= 1) & short_as_decodes
    decode = np.where(all_decode, True, np.where(q0 > t, False, decode))
    if p.is_dsa:
        paths = dsa_prefill_paths(p, q, ctx, decode, sid, heads)
    else:
        paths = np.where(decode, ABSORB, np.where(ctx > 0, CHUNKED, EXPAND))
    out = np.empty(n, dtype=paths.dtype)
    out[order[perm]] = paths
    return out


def masked_min_query(p: EngineParams, seq) -> np.ndarray:
    """_use_masked_mha's least query length for a longest prefill sequence (its bucket's entry of
    the table row); -1 where masked MHA never runs (no row, no entry, or past the last bucket)."""
    seq = np.asarray(seq, dtype=np.int64)
    if p.masked_row is None:
        return np.full(seq.shape, -1, dtype=np.int64)
    buckets = np.asarray(p.vllm_dsa.buckets, dtype=np.int64)
    row = np.array([-1 if m is None else m for m in p.masked_row] + [-1], dtype=np.int64)
    return row[np.searchsorted(buckets, seq, side="left")]  # the first bucket >= seq


def mask_fits(p: EngineParams, prefills, max_query, max_chunk) -> np.ndarray:
    """_masked_mha_workspace_fits: the bit-packed top-k masks of a step's prefills (prefills x
    the longest query rounded up to its tile x words of the longest key run) fit the workspace."""
    prefills, q, c = (np.asarray(a, dtype=np.int64) for a in (prefills, max_query, max_chunk))
    tile = np.where(q <= 128, 128, 256)
    words = -(-np.maximum(q, c) // 32)
    return prefills * (-(-q // tile) * tile) * words <= p.vllm_dsa.mask_words


def dsa_step_paths(p: EngineParams, prefills, max_query, max_seq, max_chunk) -> np.ndarray:
    """The path of each step's prefills (arrays, one entry per step): dense_expand where the
    longest sequence is at most topk, masked_expand where masked MHA fires, else sparse_absorb."""
    if not p.mha:
        return np.full(np.shape(prefills), SPARSE)
    least = masked_min_query(p, max_seq)
    masked = (
        p.masked_ok & (least >= 0) & (np.asarray(max_query) >= least) & mask_fits(p, prefills, max_query, max_chunk)
    )
    return np.where(np.asarray(max_seq) <= p.topk, DENSE, np.where(masked, MASKED, SPARSE))


def dsa_chunk(p: EngineParams) -> int:
    """The longest run of context keys one chunk of a prefill holds: the workspace rounded down
    to the block (build_mla_chunked_context_metadata's max_context_chunk)."""
    return max(p.workspace // p.block * p.block, p.block)


def dsa_prefill_paths(p: EngineParams, q, ctx, decode, sid, heads) -> np.ndarray:
    """Requests in step order after the reorder: decodes sparse, each step's prefills as one."""
    prefill = ~decode
    chunk = dsa_chunk(p)  # a context chunk's longest run of keys

    def per_step(values, reduce=np.maximum):
        return reduce.reduceat(np.where(prefill, values, 0), heads)[sid]

    step = dsa_step_paths(
        p,
        per_step(np.ones_like(q), np.add),
        per_step(q),
        per_step(q + ctx),
        per_step(np.minimum(ctx, chunk)),
    )
    return np.where(decode, SPARSE, step)


def step_paths(p: EngineParams, new, prefix, count=None, step=None, done=None) -> np.ndarray:
    """Per row of many steps: a [R, 3] count of the row's requests on each of p.paths (absorb,
    expand, expand_chunked; a DSA model's sparse_absorb, dense_expand, masked_expand): a row of
    alike requests can straddle the end of the decodes."""
    new, prefix = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    rows = len(new)
    count = np.ones(rows, dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)
    step = np.zeros(rows, dtype=np.int64) if step is None else np.asarray(step, dtype=np.int64)
    from_row = _expand_rows(count)
    done_rows = None if done is None else np.asarray(done, dtype=bool)[from_row]
    paths = request_paths(p, new[from_row], prefix[from_row], step[from_row], done_rows)
    out = np.zeros((rows, 3), dtype=np.int64)
    for j, name in enumerate(p.paths):
        out[:, j] = np.bincount(from_row, weights=paths == name, minlength=rows).astype(np.int64)
    return out


def _expand_rows(count: np.ndarray) -> np.ndarray:
    total = int(count.sum()) if len(count) else 0
    if total > MAX_REQUESTS:
        raise MlactlError(
            f"{total:,} requests in one vLLM batch; the reorder is followed request by request, "
            f"up to {MAX_REQUESTS:,} at once"
        )
    return np.repeat(np.arange(len(count)), count)


def grid_paths(p: EngineParams, batch, new, prefix) -> np.ndarray:
    """Each point a step of `batch` alike requests: all decodes when the query is at most the
    threshold (the longest query is, or they are uniform), else all prefills."""
    batch, new, prefix = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (batch, new, prefix)))
    if p.is_dsa:
        prefill = dsa_step_paths(p, batch, new, prefix + new, np.minimum(prefix, dsa_chunk(p)))
        return np.where(new <= p.threshold, SPARSE, prefill)
    return np.where(new <= p.threshold, ABSORB, np.where(prefix > 0, CHUNKED, EXPAND))


def context_chunk(p: EngineParams, prefills_with_context) -> np.ndarray:
    """Context tokens per chunk and prefill: the workspace split evenly over the prefills with
    context, rounded down to the block (MLACommonMetadataBuilder.build); 0 where there are none."""
    m = np.asarray(prefills_with_context, dtype=np.int64)
    chunk = (p.workspace // np.maximum(m, 1)) // p.block * p.block
    # vLLM asserts a chunk of at least one block; mlactl keeps one block where it would be 0
    return np.where(m > 0, np.maximum(chunk, p.block), 0)
