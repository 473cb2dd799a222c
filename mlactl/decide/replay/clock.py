"""The simulated clock: how long a step takes, priced inside the scheduler's loop.

A step takes

    attention for every layer    the engine's rule's paths, each path one launch per op at the
                                 roofline (as `batch_time` and `PathLaunches` price a mixed batch)
  + the other weights            read once per step at the roofline (mlactl.model.cost.WeightCost):
                                 the dense weights and the routed experts the step's tokens hit,
                                 at the weight dtype's peak; the LM head for the tokens that sample
  + --step-overhead-ms

The loop prices ~10^5 to 10^6 steps one at a time; cost.ops on numpy arrays takes ~0.5 ms a
step, a thousand times what the loop can spend. But each op's FLOPs and bytes are linear in five
sums over the step's rows (seven for a DSA model: its top-k's selected pairs and masks;
mlactl.model.linear, which recovers the coefficients from cost.ops itself), so the loop adds up
features in plain Python floats and the one source of FLOPs and bytes stays cost.py.
tests/test_replay.py checks the clock against the exact pricing of the same steps.

The clock is always the roofline: a calibrated time (--calibration) changes what replay reports,
not when steps run (docs/replay.md).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from mlactl.model.cost import CostModel, WeightCost, causal_pairs
from mlactl.model.hardware import HardwareProfile
from mlactl.model.linear import features, linear_ops
from mlactl.util.errors import MlactlError


class Clock:
    """Prices a step from sums over its rows, in plain Python floats."""

    def __init__(self, cost: CostModel, hw: HardwareProfile, weights: WeightCost, paths, overhead_s: float = 0.0):
        self.cost, self.layers, self.overhead = cost, cost.cfg.layers, float(overhead_s)
        self.peak, self.bandwidth = hw.peak_flops(cost.dtype), hw.bandwidth
        self.weights = weights
        self.peak_weights = hw.peak_flops(weights.weights.dtype)
        self.peak_head = hw.peak_flops("bf16")
        self.linear = {p: linear_ops(cost, p) for p in paths}
        self.coef = {
            p: [(lin.flops[k].tolist(), lin.bytes[k].tolist(), lin.weights[k].tolist()) for k in range(len(lin.names))]
            for p, lin in self.linear.items()
        }
        self.partial_paths = {p for p, lin in self.linear.items() if lin.uses_partials}
        self._costs: dict[int, CostModel] = {}
        self.dsa = len(features(cost)) > 5  # a DSA model: the selected pairs and the masks too
        self.topk = cost.cfg.index().topk if self.dsa else 0
        if self.dsa:  # decode_features leaves the mask 0: only a path priced row by row may read it
            mask = {p for p, lin in self.linear.items() if lin.flops[:, 6].any() or lin.bytes[:, 6].any()}
            if not mask <= self.partial_paths:
                raise MlactlError(f"{sorted(mask - self.partial_paths)} read the top-k mask: the clock cannot sum them")
        pairs = causal_pairs(1, np.array([0.0, 7.0, 1000.0]))
        if not np.array_equal(pairs, [1.0, 8.0, 1001.0]):  # a decode's one query sees its p + 1 keys
            raise MlactlError("cost.causal_pairs(1, p) is not p + 1: the clock's decode sums need it")

    def features(self, new: int, prefix: int, chunk: int | None = None, partials: bool = True) -> list[float]:
        """One row's features (a chunk of a prompt), partials at `chunk` (default cost.chunk);
        without `partials` those two are left 0 (for a path that does not use them)."""
        pairs = float(causal_pairs(new, prefix))
        if not partials:
            out = [float(new), float(new + prefix), pairs, 0.0, 0.0]
        else:
            c = self.cost if chunk is None else self._with_chunk(chunk)
            m = float(c.num_partials(prefix))
            merged = 1.0 if m > 1 else 0.0
            out = [float(new), float(new + prefix), pairs, merged * new, merged * m * new]
        if self.dsa:  # cost.sparse_pairs, one request: min(p + i, topk) summed over its queries
            k = min(max(self.topk - prefix, 0), new)
            out += [float(k * prefix + k * (k + 1) // 2 + (new - k) * self.topk), float(math.ceil(pairs / 8))]
        return out

    def partials(self, prefix: int, chunk: int | None = None) -> float:
        c = self.cost if chunk is None else self._with_chunk(chunk)
        return float(c.num_partials(prefix))

    def _with_chunk(self, chunk: int) -> CostModel:
        found = self._costs.get(chunk)
        if found is None:
            found = self._costs[chunk] = replace(self.cost, chunk=int(chunk))
        return found

    def decode_features(self, count: int, sum_prefix: float, selected: float = 0.0) -> list[float]:
        """Sums over `count` decodes (one new token each) with `sum_prefix` cached tokens in all;
        for paths that do not use the partials (absorb, expand; a DSA model's sparse_absorb and
        dense_expand, which read no mask: `selected` is the decodes' summed min(prefix + 1, topk))."""
        out = [float(count), sum_prefix + count, sum_prefix + count, 0.0, 0.0]
        if self.dsa:
            out += [float(selected), 0.0]
        return out

    def decode_selected(self, prefixes) -> float:
        """Decodes' selected pairs: min(prefix + 1, topk) summed (a DSA model)."""
        topk = self.topk
        return float(sum(min(p + 1, topk) for p in prefixes))

    def launch(self, path: str, sums: list[float], max_partials: float = 1.0) -> float:
        """Seconds of one path's launches (every layer) over rows whose features sum to `sums`."""
        t = 0.0
        peak, bw = self.peak, self.bandwidth
        if self.dsa:
            for cf, cb, cw in self.coef[path]:
                f = sum(c * v for c, v in zip(cf, sums))
                b = sum(c * v for c, v in zip(cb, sums)) + cw[0] + cw[1] * max_partials
                t += max(f / peak, b / bw)
            return t * self.layers
        s0, s1, s2, s3, s4 = sums
        for cf, cb, cw in self.coef[path]:
            f = cf[0] * s0 + cf[1] * s1 + cf[2] * s2 + cf[3] * s3 + cf[4] * s4
            b = cb[0] * s0 + cb[1] * s1 + cb[2] * s2 + cb[3] * s3 + cb[4] * s4 + cw[0] + cw[1] * max_partials
            t += max(f / peak, b / bw)
        return t * self.layers

    def other(self, tokens: int, sampled: int) -> float:
        """Seconds of the weights outside attention and the fixed overhead, for a step of
        `tokens` tokens of which `sampled` sample."""
        w = self.weights
        dense = max(w.dense_flops(tokens) / self.peak_weights, w.dense_bytes(tokens) / self.bandwidth)
        head = max(w.head_flops(sampled) / self.peak_head, w.head_bytes(sampled) / self.bandwidth)
        return dense + head + self.overhead
