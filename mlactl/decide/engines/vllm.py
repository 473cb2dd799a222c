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
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.engines.params import EngineParams
from mlactl.util.errors import MlactlError

ABSORB, EXPAND, CHUNKED = "absorb", "expand", "expand_chunked"
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
    paths = np.where(decode, ABSORB, np.where(ctx > 0, CHUNKED, EXPAND))
    out = np.empty(n, dtype=paths.dtype)
    out[order[perm]] = paths
    return out


def step_paths(p: EngineParams, new, prefix, count=None, step=None, done=None) -> np.ndarray:
    """Per row of many steps: a [R, 3] count of the row's requests that run absorb, expand and
    expand_chunked (a row of alike requests can straddle the end of the decodes)."""
    new, prefix = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    rows = len(new)
    count = np.ones(rows, dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)
    step = np.zeros(rows, dtype=np.int64) if step is None else np.asarray(step, dtype=np.int64)
    from_row = _expand_rows(count)
    done_rows = None if done is None else np.asarray(done, dtype=bool)[from_row]
    paths = request_paths(p, new[from_row], prefix[from_row], step[from_row], done_rows)
    out = np.zeros((rows, 3), dtype=np.int64)
    for j, name in enumerate((ABSORB, EXPAND, CHUNKED)):
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
    return np.where(new <= p.threshold, ABSORB, np.where(prefix > 0, CHUNKED, EXPAND))


def context_chunk(p: EngineParams, prefills_with_context) -> np.ndarray:
    """Context tokens per chunk and prefill: the workspace split evenly over the prefills with
    context, rounded down to the block (MLACommonMetadataBuilder.build); 0 where there are none."""
    m = np.asarray(prefills_with_context, dtype=np.int64)
    chunk = (p.workspace // np.maximum(m, 1)) // p.block * p.block
    # vLLM asserts a chunk of at least one block; mlactl keeps one block where it would be 0
    return np.where(m > 0, np.maximum(chunk, p.block), 0)
