"""What each engine's threshold gives over a workload of shapes, tried at every value that
changes a path: the sweeps of `mlactl engines`.

A threshold only matters where it crosses a shape's summed prefix (SGLang), query length
(vLLM) or longest sequence (SGLang's dense threshold on a DSA model), so every distinct value
is tried, in O(log n) each (`_split_sums`). Each family's rule says which of its thresholds
move a path (`sweeps`).

    found = sweeps(p, batch, new, prefix, weight, times)   # [Sweep], the rule's first first
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mlactl.decide.engines.params import EngineParams
from mlactl.decide.engines.paths import grid_paths, time_of
from mlactl.decide.engines.sglang import SGLangParams
from mlactl.decide.engines.vllm import VLLMParams, dsa_chunk, mask_fits
from mlactl.decide.sweep import Sweep, pick


def sweeps(p: EngineParams, batch, new, prefix, weight, times: dict[str, np.ndarray]) -> list[Sweep]:
    """Every threshold of the rule that moves a shape of the workload (batch, new, prefix; each
    shape's weight), with `times` of each path at each shape as the engine runs them."""
    wl = _Shapes(np.asarray(batch), np.asarray(new), np.asarray(prefix), np.asarray(weight, dtype=np.float64))
    found: list[Sweep | None] = []
    if isinstance(p, SGLangParams):
        found = [sweep_sglang_dsa(p, wl, times) if p.is_dsa else sweep_sglang(p, wl, times)]
    elif isinstance(p, VLLMParams):
        found = [sweep_vllm(p, wl, times)]
        if p.is_dsa:
            found += sweep_vllm_masked(p, wl, times)
    return [s for s in found if s is not None]


class _Shapes:
    """A workload's shapes as the sweeps read them."""

    def __init__(self, batch, new, prefix, weight):
        self.batch, self.new, self.prefix, self.weight = batch, new, prefix, weight

    def __len__(self) -> int:
        return len(self.new)


def _split_sums(keys: np.ndarray, below: np.ndarray, above: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each threshold in `at`: the sum of `below` over keys < it plus the sum of `above` over
    keys >= it. One sort and two cumulative sums, so every threshold costs O(log n); no
    subtraction, so a +inf (a path that does not fit) stays +inf and never turns into NaN."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    head = np.concatenate([[0.0], np.cumsum(below[order])])  # head[i] = sum of below[:i]
    tail = np.concatenate([np.cumsum(above[order][::-1])[::-1], [0.0]])  # tail[i] = sum of above[i:]
    i = np.searchsorted(k, at, side="left")
    return head[i] + tail[i]


def _swept(p: EngineParams, option: str, current: int, now: float, candidates, totals, lows, highs) -> Sweep:
    """The Sweep of `option` whose thresholds `candidates` give `totals`: the best (`sweep.pick`), its
    range [lows[i], highs[i]], every candidate's total."""
    i = pick(candidates, totals, current, lows, highs)
    table: list[tuple[int | None, float]] = [(int(t), float(v)) for t, v in zip(candidates, totals)]
    return Sweep(p.engine, option, current, now, int(candidates[i]), (int(lows[i]), highs[i]), float(totals[i]), table)


def sweep_sglang(p: SGLangParams, wl: _Shapes, times: dict[str, np.ndarray]) -> Sweep | None:
    """SGLang's summed-prefix threshold t: an extend batch with summed prefix s > 0 runs MHA when
    s >= t, else MLA. Every t in (s_(k-1), s_k] gives the same paths, so t = s_k for each distinct
    s_k, and one past the largest (MHA only without a prefix), are all the choices there are.
    None where the threshold moves no shape (its backend ignores it, the chunked prefix cache is
    off, or every shape is a decode, has no prefix, or runs inside the prefill graph)."""
    s = wl.batch * wl.prefix
    low, high = replace(p, threshold=1), replace(p, threshold=np.iinfo(np.int64).max)
    mha = time_of(grid_paths(low, wl.batch, wl.new, wl.prefix), times) * wl.weight
    mla = time_of(grid_paths(high, wl.batch, wl.new, wl.prefix), times) * wl.weight
    movable = (grid_paths(low, wl.batch, wl.new, wl.prefix) != grid_paths(high, wl.batch, wl.new, wl.prefix)) & (s > 0)
    if not movable.any():  # its backend ignores the threshold, or no shape has a prefix it can move
        return None
    fixed = float(
        np.sum(np.where(movable, 0.0, time_of(grid_paths(p, wl.batch, wl.new, wl.prefix), times) * wl.weight))
    )
    sm = s[movable]
    values = np.unique(sm)
    candidates = np.append(values, values[-1] + 1 if len(values) else max(p.threshold, 1))
    totals = fixed + _split_sums(sm, mla[movable], mha[movable], candidates)
    now = float(fixed + _split_sums(sm, mla[movable], mha[movable], np.array([p.threshold]))[0])
    lows = np.append([1], values + 1)[: len(candidates)]
    highs: list = [int(v) for v in values] + [None]
    return _swept(p, p.swept.option, p.threshold, now, candidates, totals, lows, highs)


def sweep_vllm(p: VLLMParams, wl: _Shapes, times: dict[str, np.ndarray]) -> Sweep | None:
    """vLLM's decode threshold t: a request of at most t new tokens runs the decode pathway. Every
    t in [n_k, n_(k+1)) gives the same paths, so t = 1 and each distinct query length are all the
    choices there are. None for a DSA rule where decodes and prefills run the same path."""
    decode_path = p.paths[0]  # absorb; a DSA model's sparse_absorb
    as_prefill = grid_paths(replace(p, threshold=0), wl.batch, wl.new, wl.prefix)
    if p.is_dsa and not (as_prefill != decode_path).any():
        return None
    absorb = time_of(np.full(len(wl), decode_path), times) * wl.weight
    prefill = time_of(as_prefill, times) * wl.weight
    candidates = np.unique(np.append(wl.new, 1))
    # total(t) = absorb over n <= t (n < t + 1) + prefill over n > t
    totals = _split_sums(wl.new, absorb, prefill, candidates + 1)
    now = float(_split_sums(wl.new, absorb, prefill, np.array([p.threshold + 1]))[0])
    lows = candidates
    highs: list = [int(x) - 1 for x in candidates[1:]] + [None]
    return _swept(p, p.swept.option, p.threshold, now, candidates, totals, lows, highs)


def sweep_sglang_dsa(p: SGLangParams, wl: _Shapes, times: dict[str, np.ndarray]) -> Sweep | None:
    """SGLang's DSA dense threshold t: an extend batch whose longest sequence S is at most t runs
    dense MHA (where its other conditions hold), else the sparse MQA. Every t in [S_k, S_(k+1))
    gives the same paths, so t = 0 and each distinct S are all the choices there are, up to the
    model's index_topk. None where no shape can run dense."""
    seq = wl.prefix + wl.new
    movable = grid_paths(replace(p, dense_threshold=p.topk), wl.batch, wl.new, wl.prefix) == "dense_expand"
    if not movable.any():
        return None
    current = grid_paths(p, wl.batch, wl.new, wl.prefix)
    fixed = float(np.sum(np.where(movable, 0.0, time_of(current, times) * wl.weight)))
    dense = time_of(np.full(len(wl), "dense_expand"), times)[movable] * wl.weight[movable]
    sparse = time_of(np.full(len(wl), "sparse_absorb"), times)[movable] * wl.weight[movable]
    sm = seq[movable]
    values = np.unique(sm)
    candidates = np.concatenate([[0], values])
    # total(t) = dense over S <= t (S < t + 1) + sparse over S > t
    totals = fixed + _split_sums(sm, dense, sparse, candidates + 1)
    now = float(fixed + _split_sums(sm, dense, sparse, np.array([p.dense_threshold + 1]))[0])
    lows = candidates
    highs: list = [int(v) - 1 for v in values] + [p.topk]
    return _swept(p, p.swept.option, p.dense_threshold, now, candidates, totals, lows, highs)


def sweep_vllm_masked(p: VLLMParams, wl: _Shapes, times: dict[str, np.ndarray]) -> list[Sweep]:
    """vLLM's masked-MHA table, one sweep per sequence-length bucket of the resolved row: a step of
    prefills whose longest sequence S falls in the bucket (and above index_topk, where dense MHA
    runs instead) runs masked MHA when its longest query Q is at least the bucket's entry m (and
    its masks fit the workspace), else the sparse MQA. Every m in (Q_(k-1), Q_k] gives the same
    paths, so each distinct Q and `off` (never) are all the choices there are."""
    if not p.masked_ok or p.masked_row is None:
        return []
    buckets = p.vllm_dsa.buckets
    seq = wl.prefix + wl.new
    prefill = wl.new > p.threshold
    fits = mask_fits(p, wl.batch, wl.new, np.minimum(wl.prefix, dsa_chunk(p)))
    current = grid_paths(p, wl.batch, wl.new, wl.prefix)
    masked_t = time_of(np.full(len(wl), "masked_expand"), times) * wl.weight
    sparse_t = time_of(np.full(len(wl), "sparse_absorb"), times) * wl.weight
    all_t = time_of(current, times) * wl.weight
    out = []
    low = 0
    for entry, high in zip(p.masked_row, buckets):
        in_bucket = prefill & fits & (seq > max(low, p.topk)) & (seq <= high)
        span = f"{max(low, p.topk) + 1:,}-{high:,}"
        low = high
        if not in_bucket.any():
            continue
        q = wl.new[in_bucket]
        fixed = float(np.sum(np.where(in_bucket, 0.0, all_t)))
        values = np.unique(q)
        off = int(values[-1]) + 1
        candidates = np.append(values, off)
        # total(m) = sparse over Q < m + masked over Q >= m
        totals = fixed + _split_sums(q, sparse_t[in_bucket], masked_t[in_bucket], candidates)
        cur = off if entry is None else int(entry)
        now = float(fixed + _split_sums(q, sparse_t[in_bucket], masked_t[in_bucket], np.array([cur]))[0])
        lows = np.append(np.concatenate([[1], values[:-1] + 1]), off)
        highs: list = [int(v) for v in values] + [None]
        i = pick(candidates, totals, cur, lows, highs)
        best = None if i == len(values) else int(candidates[i])
        out.append(
            Sweep(
                p.engine,
                f"masked MHA least query length (prefill sequences {span})",
                entry,
                now,
                best,
                (int(lows[i]), highs[i]),
                float(totals[i]),
                [(int(t), float(v)) for t, v in zip(values, totals)] + [(None, float(totals[-1]))],
            )
        )
    return out
