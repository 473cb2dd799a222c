"""cost.py's ops as linear forms in a few per-row features, so that many rows are priced by sums.

For rows of one request each (`new` tokens after `prefix`), every op of the MLA paths has

    FLOPs              = F . x
    bytes less weights = B . x        x = (new, context, pairs, merged_new, merged_partials_new)
    weights            = W . (1, m)

where context = prefix + new, pairs = cost.causal_pairs(new, prefix), m = cost.num_partials(prefix)
(the partial results expand_chunked merges: one per `chunk` of the prefix, and one for the new
tokens) and merged = (m > 1). (m * new needs no feature: it is new - merged_new +
merged_partials_new.) So a launch of many rows has FLOPs F . (sum of x) and reads its weights once,
W . (1, largest m): a step's sums of six numbers price it, whatever its rows.

A DSA model's paths add two features (`features(cost)`): `selected`, the (query, key) pairs its
sparse attention reads, cost.sparse_pairs(new, prefix, topk), and `mask_bytes`, ceil(pairs / 8),
the bit-packed top-k mask of masked MHA; the top-k and the sparse attention are linear in
them, and every other DSA op in the five.

Nothing is written twice: `LinearOps` recovers F, B and W from cost.ops itself, solving at probe
rows, and checks them at other rows and another chunk (to 1e-9); a path whose ops are not linear
in these features (one a future cost.py might add) raises instead of being priced wrong.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from mlactl.model.cost import CostModel, causal_pairs, sparse_pairs
from mlactl.util.errors import MlactlError

FEATURES = ("new", "context", "pairs", "merged_new", "merged_partials_new")
DSA_FEATURES = (*FEATURES, "selected", "mask_bytes")
PROBE_NEW = (1, 2, 3, 5, 8, 17, 40)
PROBE_PREFIX = (0, 1, 5, 16, 17, 33, 100, 257)
PROBE_CHUNK = 16


def features(cost: CostModel) -> tuple[str, ...]:
    """The features cost's paths are linear in: FEATURES, and for a DSA model DSA_FEATURES."""
    return DSA_FEATURES if cost.cfg.is_dsa else FEATURES


def probe_prefixes(cost: CostModel) -> tuple[int, ...]:
    """Probe prefixes: for a DSA model also past topk, where selected pairs part from pairs."""
    if not cost.cfg.is_dsa:
        return PROBE_PREFIX
    topk = cost.cfg.index().topk
    return (*PROBE_PREFIX, topk - 3, topk + 1, 2 * topk + 5)


def partials(cost: CostModel, prefix, chunk=None) -> np.ndarray:
    """[rows]: cost.num_partials at cost.chunk, or at each row's own `chunk` ([rows])."""
    p = np.asarray(prefix, dtype=np.float64)
    if chunk is None:
        return cost.num_partials(p)
    chunk = np.asarray(chunk, dtype=np.int64)
    out = np.empty(p.shape)
    for c in np.unique(chunk):
        at = chunk == c
        out[at] = replace(cost, chunk=int(c)).num_partials(p[at])
    return out


def row_features(cost: CostModel, new, prefix, chunk=None) -> np.ndarray:
    """[F + 1, rows]: the features(cost) of each row, then m (the partials, for the weights):
    [6, rows] for an MLA model, [8, rows] for a DSA one."""
    n = np.asarray(new, dtype=np.float64)
    p = np.asarray(prefix, dtype=np.float64)
    f = len(features(cost))
    out = np.empty((f + 1,) + n.shape)
    out[0] = n
    np.add(n, p, out=out[1])
    out[2] = causal_pairs(n, p)
    out[f] = partials(cost, p, chunk)
    merged = out[f] > 1
    np.multiply(merged, n, out=out[3])
    np.multiply(out[3], out[f], out=out[4])
    if f > 5:
        out[5] = sparse_pairs(n, p, cost.cfg.index().topk)
        out[6] = np.ceil(out[2] / 8)
    return out


@lru_cache(maxsize=64)
def linear_ops(cost: CostModel, path: str) -> LinearOps:
    return LinearOps(cost, path)


class LinearOps:
    """The ops of one path as linear forms: `names` [ops], `flops` and `bytes` [ops, F] (bytes
    less weights; F = len(features(cost))), `weights` [ops, 2] over (1, m)."""

    def __init__(self, cost: CostModel, path: str):
        self.path = path
        probe = replace(cost, chunk=PROBE_CHUNK)
        n, p = (a.ravel().astype(np.float64) for a in np.meshgrid(PROBE_NEW, probe_prefixes(cost)))
        x = row_features(probe, n, p)
        xf, xw = x[:-1].T, np.stack([np.ones_like(n), x[-1]], axis=-1)
        names, flops, nbytes, weights = [], [], [], []
        for op in probe.ops(path, 1, n, p):
            names.append(op.name)
            flops.append(_solve(xf, op.flops))
            nbytes.append(_solve(xf, op.bytes - op.weight_bytes))
            weights.append(_solve(xw, np.broadcast_to(op.weight_bytes, n.shape)))
        self.names = names
        self.flops, self.bytes, self.weights = np.array(flops), np.array(nbytes), np.array(weights)
        self._check(cost)

    @property
    def uses_partials(self) -> bool:
        """Whether the chunking of the prefix matters (expand_chunked; masked_expand)."""
        parts = slice(3, 5)  # merged_new, merged_partials_new
        return bool(np.any(self.flops[:, parts]) or np.any(self.bytes[:, parts]) or np.any(self.weights[:, 1]))

    def _check(self, cost: CostModel) -> None:
        n = np.array([1, 1, 7, 300, 4096, 1, 8192, 2000, 3, 2047], dtype=np.float64)
        p = np.array([0, 9000, 0, 70000, 123457, 1_000_000, 16384, 1, 2046, 3], dtype=np.float64)
        for chunk in (cost.chunk, 1000):
            c = replace(cost, chunk=chunk)
            x = row_features(c, n, p)
            got_w = self.weights[:, :1] + self.weights[:, 1:] * x[-1]
            for k, op in enumerate(c.ops(self.path, 1, n, p)):
                pairs = (
                    (self.flops[k] @ x[:-1], op.flops),
                    (self.bytes[k] @ x[:-1], op.bytes - op.weight_bytes),
                    (got_w[k], op.weight_bytes),
                )
                for got, want in pairs:
                    scale = max(float(np.max(np.abs(want))), 1.0)
                    if np.max(np.abs(got - want)) > 1e-9 * scale:
                        raise MlactlError(
                            f"the {self.path} path's {op.name} is not linear in {', '.join(features(cost))}: "
                            "it cannot be priced from sums over rows (mlactl/model/linear.py)"
                        )


def _solve(x: np.ndarray, y) -> np.ndarray:
    """Least squares, then the solver's 1e-12 noise rounded away (the coefficients are sums of
    products of the model's integer dims): to 6 decimals, and a coefficient 1e-9 of the op's
    largest or less (noise beside a large one: a DSA op's millions of FLOPs a token) to 0."""
    c = np.linalg.lstsq(x, np.asarray(y, dtype=np.float64), rcond=None)[0]
    r = np.round(c, 6)
    small = max(1e-6, 1e-9 * float(np.max(np.abs(r)))) if r.size else 1e-6
    return np.where(np.abs(r) < small, 0.0, r)
