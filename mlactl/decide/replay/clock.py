"""The simulated clock: how long a step takes, priced inside the scheduler's loop.

A step takes the whole forward pass of its tokens:

    attention for every layer    the engine's rule's paths, each path one launch per op at the
                                 roofline (as `batch_time` and `PathLaunches` price a mixed batch)
  + the rest of the forward      every op of mlactl.model.cost.ForwardCost at the roofline, each on
                                 its own (max of its FLOPs over its dtype's peak and its bytes over
                                 the bandwidth), times the layers it runs in: the MLA projections
                                 (qkv_a, q, o), the dense MLP, the router, shared and routed
                                 experts (the experts the step's tokens hit, uniform routing), the
                                 LM head for the tokens that sample
  + the collectives              two all-reduces a layer and the logits' gather at TP, their bytes
                                 over NVLink one way (the profile's nvlink_gbps / 2); a profile
                                 without nvlink_gbps prices them at 0 and says so (`comm_basis`)
  + --step-overhead-ms

The loop prices ~10^5 to 10^6 steps one at a time; cost.ops on numpy arrays takes ~0.5 ms a
step, a thousand times what the loop can spend. But each attention op's FLOPs and bytes are
linear in five sums over the step's rows (seven for a DSA model: its top-k's selected pairs and
masks; mlactl.model.linear, which recovers the coefficients from cost.ops itself), and each
other op's in the step's tokens, sampled tokens, experts read and LM-head reads (recovered here
from ForwardCost.ops at five points, and checked at a sixth), so the loop adds up features in
plain Python floats and the one source of FLOPs and bytes stays cost.py. tests/test_replay.py
checks the clock against the exact pricing of the same steps, and against a forward worked out
by hand.

The clock's attention is always the roofline: a calibrated time (--calibration) changes what
replay reports, not when steps run (docs/replay.md). The calibrations hold the attention paths'
ops only, so a calibrated replay's GPU time is its calibrated attention plus the clock's rest.
With `tables` (--forward-tables: aiconfigurator-core's GEMM, MoE and all-reduce tables,
mlactl.decide.calibration.forward_tables) the ops outside attention that they measured take
their measured time, in the clock and so in when steps run; the others stay at the roofline.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from mlactl.model.cost import CostModel, ForwardCost, WeightCost, causal_pairs
from mlactl.model.hardware import HardwareProfile
from mlactl.model.linear import features, linear_ops
from mlactl.util.errors import MlactlError

if TYPE_CHECKING:
    from mlactl.decide.calibration.forward_tables import ForwardTables


class Clock:
    """Prices a step from sums over its rows, in plain Python floats."""

    def __init__(
        self,
        cost: CostModel,
        hw: HardwareProfile,
        weights: WeightCost,
        paths,
        overhead_s: float = 0.0,
        tables: ForwardTables | None = None,
    ):
        self.cost, self.layers, self.overhead = cost, cost.cfg.layers, float(overhead_s)
        self.tables = tables  # measured times of the ops outside attention, where they have them
        self.peak, self.bandwidth = hw.peak_flops(cost.dtype), hw.bandwidth
        self.weights = weights
        self.forward = ForwardCost(cost.cfg, weights.weights, act_dtype=cost.dtype)
        self._forward_terms(hw)
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
            m = self.partials(prefix, chunk)
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

    def _forward_terms(self, hw: HardwareProfile) -> None:
        """Each ForwardCost op as (count, peak, FLOP terms, byte terms, interconnect terms), each
        term list the coefficients of (1, tokens, sampled, experts read, LM-head reads)."""
        fc = self.forward
        unit = (0.0, 0.0, 0.0, 0.0)
        basis = [unit] + [tuple(1.0 if j == k else 0.0 for j in range(4)) for k in range(4)]
        at = [fc.ops(*b) for b in basis]
        self.forward_terms: list[tuple[str, int, float, list[float], list[float], list[float]]] = []
        for k, op in enumerate(at[0]):
            fl, by, cm = (
                self._terms([float(getattr(ops[k], f)) for ops in at]) for f in ("flops", "bytes", "comm_bytes")
            )
            self.forward_terms.append((op.name, op.count, hw.peak_flops(op.dtype), fl, by, cm))
        probe = (37.0, 5.0, 11.0, 1.0)  # ForwardCost must be linear in these four: checked at a sixth point
        for (name, _, _, fl, by, cm), op in zip(self.forward_terms, fc.ops(*probe)):
            for terms, got in ((fl, op.flops), (by, op.bytes), (cm, op.comm_bytes)):
                want = _at(terms, probe)
                if abs(want - float(got)) > 1e-9 * max(abs(float(got)), 1.0):
                    raise MlactlError(f"cost.ForwardCost's {name} is not linear in tokens, sampled and experts read")
        w = self.weights.weights
        self.experts, self.top_k = w.experts, w.top_k
        tp = self.cost.cfg.tp
        if tp == 1:
            self.link, self.comm_basis = float("inf"), "tp 1: no collectives"
        elif hw.nvlink_gbps is None:
            self.link = float("inf")
            self.comm_basis = f"not priced: {hw.name} has no nvlink_gbps"
        else:
            self.link = hw.nvlink_gbps * 1e9 / 2  # one way: a ring sends and receives at once
            self.comm_basis = f"roofline: NVLink {hw.nvlink_gbps:g} GB/s, {hw.nvlink_gbps / 2:g} GB/s each way"
        self._other: dict[tuple[int, int], float] = {}

    @staticmethod
    def _terms(v: list[float]) -> list[float]:
        """Values at the origin and at each unit point -> (constant, coefficients)."""
        return [v[0]] + [x - v[0] for x in v[1:]]

    def experts_read(self, tokens: float) -> float:
        """Routed experts a step of `tokens` tokens reads per MoE layer (ForwardCost's default)."""
        e = self.experts
        return e * (1.0 - (1.0 - self.top_k / e) ** tokens) if e else 0.0

    def forward_parts(self, tokens: int, sampled: int) -> dict[str, float]:
        """Seconds of each op of the forward outside attention (every layer it runs in) for a
        step of `tokens` tokens of which `sampled` sample; the collectives over the link."""
        x = (float(tokens), float(sampled), self.experts_read(tokens), 1.0 if sampled > 0 else 0.0)
        bw, link, tables = self.bandwidth, self.link, self.tables
        out = {}
        for name, count, peak, fl, by, cm in self.forward_terms:
            measured = None if tables is None else tables.seconds(name, float(tokens), float(sampled))
            if measured is not None:
                out[name] = count * measured
                continue
            out[name] = count * (max(_at(fl, x) / peak, _at(by, x) / bw) + _at(cm, x) / link)
        return out

    def other(self, tokens: int, sampled: int) -> float:
        """Seconds of the forward outside attention and the fixed overhead, for a step of
        `tokens` tokens of which `sampled` sample."""
        key = (tokens, sampled)
        got = self._other.get(key)
        if got is None:
            got = self._other[key] = sum(self.forward_parts(tokens, sampled).values()) + self.overhead
        return got


def _at(terms: list[float], x) -> float:
    """A forward term list (constant, then the coefficients of tokens, sampled, experts read and
    LM-head reads) at the point x of those four."""
    return terms[0] + terms[1] * x[0] + terms[2] * x[1] + terms[3] * x[2] + terms[4] * x[3]
