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

    def paths(self, p: EngineParams) -> np.ndarray:
        """The path rule `p` gives each shape."""
        return grid_paths(p, self.batch, self.new, self.prefix)

    def cost(self, paths, times: dict[str, np.ndarray]) -> np.ndarray:
        """Each shape's time on `paths` (one per shape, or one path for all), times its weight."""
        return time_of(np.full(len(self), paths) if isinstance(paths, str) else paths, times) * self.weight


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


def _totals(keys, below, above, candidates, current, fixed: float = 0.0) -> tuple[np.ndarray, float]:
    """`fixed` plus `_split_sums` at each of the candidate thresholds, and at the one in force."""
    sums = fixed + _split_sums(keys, below, above, np.append(candidates, current))
    return sums[:-1], float(sums[-1])


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
    mha, mla = wl.paths(replace(p, threshold=1)), wl.paths(replace(p, threshold=np.iinfo(np.int64).max))
    movable = (mha != mla) & (s > 0)
    if not movable.any():  # its backend ignores the threshold, or no shape has a prefix it can move
        return None
    fixed = float(np.sum(np.where(movable, 0.0, wl.cost(wl.paths(p), times))))
    sm = s[movable]
    values = np.unique(sm)
    candidates = np.append(values, values[-1] + 1 if len(values) else max(p.threshold, 1))
    below, above = wl.cost(mla, times)[movable], wl.cost(mha, times)[movable]
    totals, now = _totals(sm, below, above, candidates, p.threshold, fixed)
    lows = np.append([1], values + 1)[: len(candidates)]
    highs: list = [int(v) for v in values] + [None]
    return _swept(p, p.swept.option, p.threshold, now, candidates, totals, lows, highs)


def sweep_vllm(p: VLLMParams, wl: _Shapes, times: dict[str, np.ndarray]) -> Sweep | None:
    """vLLM's decode threshold t: a request of at most t new tokens runs the decode pathway. Every
    t in [n_k, n_(k+1)) gives the same paths, so t = 1 and each distinct query length are all the
    choices there are. None for a DSA rule where decodes and prefills run the same path."""
    decode_path = p.paths[0]  # absorb; a DSA model's sparse_absorb
    as_prefill = wl.paths(replace(p, threshold=0))
    if p.is_dsa and not (as_prefill != decode_path).any():
        return None
    candidates = np.unique(np.append(wl.new, 1))
    # total(t) = absorb over n <= t (n < t + 1) + prefill over n > t
    absorb, prefill = wl.cost(decode_path, times), wl.cost(as_prefill, times)
    totals, now = _totals(wl.new, absorb, prefill, candidates + 1, p.threshold + 1)
    lows = candidates
    highs: list = [int(x) - 1 for x in candidates[1:]] + [None]
    return _swept(p, p.swept.option, p.threshold, now, candidates, totals, lows, highs)


def sweep_sglang_dsa(p: SGLangParams, wl: _Shapes, times: dict[str, np.ndarray]) -> Sweep | None:
    """SGLang's DSA dense threshold t: an extend batch whose longest sequence S is at most t runs
    dense MHA (where its other conditions hold), else the sparse MQA. Every t in [S_k, S_(k+1))
    gives the same paths, so t = 0 and each distinct S are all the choices there are, up to the
    model's index_topk. None where no shape can run dense."""
    seq = wl.prefix + wl.new
    movable = wl.paths(replace(p, dense_threshold=p.topk)) == "dense_expand"
    if not movable.any():
        return None
    fixed = float(np.sum(np.where(movable, 0.0, wl.cost(wl.paths(p), times))))
    dense, sparse = wl.cost("dense_expand", times)[movable], wl.cost("sparse_absorb", times)[movable]
    sm = seq[movable]
    values = np.unique(sm)
    candidates = np.concatenate([[0], values])
    # total(t) = dense over S <= t (S < t + 1) + sparse over S > t
    totals, now = _totals(sm, dense, sparse, candidates + 1, p.dense_threshold + 1, fixed)
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
    masked_t = wl.cost("masked_expand", times)
    sparse_t = wl.cost("sparse_absorb", times)
    all_t = wl.cost(wl.paths(p), times)
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
        cur = off if entry is None else int(entry)
        # total(m) = sparse over Q < m + masked over Q >= m
        totals, now = _totals(q, sparse_t[in_bucket], masked_t[in_bucket], candidates, cur, fixed)
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
