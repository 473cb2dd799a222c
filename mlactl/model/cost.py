"""The single source of FLOPs and bytes: every op of every path, vectorised over workload points.

A workload point is (batch, new, prefix); context k = prefix + new. All requests of a point are
alike. Names as docs/design.md ("The math"): H heads (per GPU), r latent rank, dR RoPE dim,
dC/dV nope/value head dims. Below, Nq = batch*new query tokens, Nk = batch*context cached tokens, P = batch*pairs.

FLOPs count a multiply-add as 2. Bytes follow one convention: each op reads each operand once
and writes each result once (the ideal a perfect kernel reaches); the attention op of each path
is the "core" that published tables quote -- cache (or expanded K/V) + queries + outputs, as
FlashMLA counts -- without its softmax-statistics (lse) output. Projections read their weights
once per launch: a batch shares one read, which is why weights are kept apart in `weight_bytes`.

expand          kv_expand   latent of every context token -> per-head k_nope, v (written out)
                attention   MHA, qk dim dC+dR, v dim dV, over the expanded K/V and the RoPE key
expand_chunked  as expand, but the prefix goes chunk by chunk (`chunk` tokens), each chunk
                expanded and attended on its own, then:
                lse_merge   partial outputs merged pairwise by their log-sum-exp
absorb          q_absorb    q_nope . W_UK per new token -> latent query
                attention   MQA over the latent cache, key r+dR, value r
                out_absorb  latent output . W_UV
mha             attention   reference MHA whose cache holds per-head K (dC+dR) and V (dV)

A DSA model (DeepSeek-V3.2, `cfg.is_dsa`) has three paths instead; L is a query's context
(prefix + its position), topk the tokens its sparse attention reads, Hi/di the indexer's heads
and width (docs/design.md, "DSA: DeepSeek-V3.2's sparse MLA"):

sparse_absorb   indexer_proj  per new token: wq_b (q_lora -> Hi*di), wk (hidden -> di),
                              weights_proj (hidden -> Hi); writes the indexer cache row
                indexer       2*Hi*di FLOPs per (query, key) pair over the whole causal context,
                              reading each cached index row (di fp8 + fp32 scales) once,
                              writing a 4-byte fp32 logit per pair
                topk          picks min(L, topk) of each query's L logits (counted below)
                q_absorb      as absorb
                attention     MQA over each query's selected rows only: pairs sum_i min(L_i, topk)
                out_absorb    as absorb
masked_expand   expand_chunked's ops (the prefix chunk by chunk, as vLLM's masked MHA runs it)
                plus indexer_proj, indexer and topk, which it needs for its mask; the attention
                computes every causal pair and reads a 1-bit mask per pair
dense_expand    expand (one shot) plus indexer_key (wk only: the index cache must still be
                written); only where the context is at most topk, when no mask is needed

Arrays are float64: exact for every figure below 2**53 (9.0e15), 16 significant digits above.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mlactl.model.config import MLAConfig
from mlactl.model.weights import ModelWeights
from mlactl.util.defaults import ACT_DTYPES, DEFAULT_CHUNK, DTYPE_BYTES, KV_DTYPES, MLA_PATHS  # noqa: F401  (MLA_PATHS: re-exported)
from mlactl.util.errors import MlactlError

LSE_BYTES = 4  # softmax statistics are fp32
PATHS = ("expand", "expand_chunked", "absorb", "mha")
DSA_PATHS = ("sparse_absorb", "masked_expand", "dense_expand")
OPS = {
    "expand": ("kv_expand", "attention"),
    "expand_chunked": ("kv_expand", "attention", "lse_merge"),
    "absorb": ("q_absorb", "attention", "out_absorb"),
    "mha": ("attention",),
    "sparse_absorb": ("indexer_proj", "indexer", "topk", "q_absorb", "attention", "out_absorb"),
    "masked_expand": ("kv_expand", "indexer_proj", "indexer", "topk", "attention", "lse_merge"),
    "dense_expand": ("kv_expand", "indexer_key", "attention"),
}
# dense_expand's indexer: only each new token's key, or the whole indexer (CostModel.dense_indexer)
DENSE_INDEXER = ("key", "full")
# DSA caches (FlashMLA's "FP8 with scale" layout, README "FP8 KV Cache", and the indexer's own
# cache, SGLang nsa_indexer.py head_dim_with_sf = 132): fp8 values with one fp32 scale per tile
# of this many values; the RoPE part of the latent row stays bf16.
DSA_SCALE_TILE = 128
SCALE_BYTES = 4  # fp32 scale
ROPE_BYTES = 2  # bf16 RoPE values of FlashMLA's fp8 row
LOGIT_BYTES = 4  # the indexer writes fp32 logits, top-k reads them
INDEX_BYTES = 4  # top-k writes int32 token indices


@dataclass(frozen=True)
class Op:
    name: str
    flops: np.ndarray
    bytes: np.ndarray  # includes weight_bytes
    weight_bytes: np.ndarray  # read once per launch, shared by every request of a batch


def causal_pairs(new, prefix):
    """(query, key) pairs of n new tokens after p cached ones, causal: n*k - n*(n-1)/2."""
    n = np.asarray(new, dtype=np.float64)
    k = n + np.asarray(prefix, dtype=np.float64)
    return n * k - n * (n - 1) / 2


def sparse_pairs(new, prefix, topk):
    """(query, key) pairs a sparse attention reads: query i (1-based) of n new tokens after p
    cached ones sees L_i = p + i keys and reads min(L_i, topk) of them, summed over i.

    The first m = clip(topk - p, 0, n) queries read all they see (m*p + m*(m+1)/2 pairs), the
    other n - m read topk each."""
    n = np.asarray(new, dtype=np.float64)
    p = np.asarray(prefix, dtype=np.float64)
    m = np.clip(topk - p, 0.0, n)
    return m * p + m * (m + 1) / 2 + (n - m) * topk


def lse_merge(rows, d_v: int, act_bytes, zero) -> Op:
    """Merging the partial outputs of `rows` (query, head) rows pairwise by their softmax
    statistics: scale both by their weights and add (3 FLOPs an element); read two partials
    (output + lse), write one."""
    return Op("lse_merge", flops=rows * 3 * d_v, bytes=rows * 3 * (d_v * act_bytes + LSE_BYTES), weight_bytes=zero)


@dataclass(frozen=True)
class CostModel:
    cfg: MLAConfig
    kv_dtype: str = "bf16"  # the cache: latent + RoPE key (and the MHA cache of `mha`)
    dtype: str = "bf16"  # activations, weights and expanded K/V; also the compute dtype
    chunk: int = DEFAULT_CHUNK  # prefix tokens per chunk of expand_chunked
    # what dense_expand runs of a DSA model's indexer: "key", only each new token's key (SGLang,
    # nsa_indexer.py skip_logits_computation), or "full", projections, logits and top-k whose
    # result goes unused (vLLM runs the indexer on every path)
    dense_indexer: str = "key"

    def __post_init__(self):
        if self.kv_dtype not in KV_DTYPES:
            raise MlactlError(f"unknown kv dtype {self.kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
        if self.dtype not in ACT_DTYPES:
            raise MlactlError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(ACT_DTYPES)}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise MlactlError(f"--chunk must be a positive integer, got {self.chunk!r}")
        if self.dense_indexer not in DENSE_INDEXER:
            raise MlactlError(f"dense_indexer must be one of {', '.join(DENSE_INDEXER)}, got {self.dense_indexer!r}")

    # -- which paths this model has -------------------------------------------------------------

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path costed for this model: MLA's (with the `mha` baseline) or DSA's."""
        return DSA_PATHS if self.cfg.is_dsa else PATHS

    @property
    def choices(self) -> tuple[str, ...]:
        """The paths a policy chooses between (an MLA model's `mha` is a baseline, not a choice)."""
        return DSA_PATHS if self.cfg.is_dsa else MLA_PATHS

    @property
    def strategies(self) -> tuple[str, ...]:
        """A mixed batch's strategies: each request on its own best path, or all on one choice."""
        return ("per_request",) + tuple(f"all_{p}" for p in self.choices)

    @property
    def restricted(self) -> tuple[str, ...]:
        """The paths that run only at some shapes (`applicable`): DSA's dense_expand."""
        return ("dense_expand",) if self.cfg.is_dsa else ()

    @property
    def windows(self) -> bool:
        """Whether an expand path beats absorb only within windows of new-token counts (DSA's
        sparse absorb reads at most top-k tokens), not from one crossover count on."""
        return self.cfg.is_dsa

    def _check_path(self, path: str) -> None:
        if path not in self.paths:
            raise MlactlError(
                f"unknown path {path!r} for the {self.cfg.attention} model {self.cfg.name}; "
                f"paths: {', '.join(self.paths)}"
            )

    def applicable(self, path: str, batch, new, prefix) -> np.ndarray:
        """Where `path` can run at all: dense_expand only where the whole context is at most
        topk (no query then has tokens to leave out); every other path everywhere."""
        self._check_path(path)
        b, n, p = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (batch, new, prefix)))
        if path == "dense_expand":
            return (n + p) <= self.cfg.index().topk
        return np.ones(b.shape, dtype=bool)

    # -- per-pair and per-token figures (the numbers docs/design.md quotes) --------------------------

    def pair_flops(self, path: str) -> int:
        """FLOPs of one (query, key) pair in the attention op: QK^T plus PV, all heads."""
        c = self.cfg
        if path in ("absorb", "sparse_absorb"):
            return 2 * c.H * (c.r + c.dR) + 2 * c.H * c.r
        if path in ("expand", "expand_chunked", "mha", "masked_expand", "dense_expand"):
            return 2 * c.H * (c.dC + c.dR) + 2 * c.H * c.dV
        raise MlactlError(f"unknown path {path!r}; paths: {', '.join(PATHS + DSA_PATHS)}")

    def index_pair_flops(self) -> int:
        """FLOPs of one (query, key) pair in the indexer: a dot of width di per index head (the
        ReLU, the head weight and the sum over heads, 3*Hi more, are left out as a softmax is)."""
        d = self.cfg.index()
        return 2 * d.heads * d.dim

    def index_proj_flops(self) -> int:
        """FLOPs of the indexer's projections of one new token: wq_b (q_lora_rank -> Hi*di),
        wk (hidden -> di), weights_proj (hidden -> Hi)."""
        d, hidden = self.cfg.index(), self.cfg.hidden
        return 2 * (d.q_lora * d.heads * d.dim + hidden * d.dim + hidden * d.heads)

    def index_row_bytes(self) -> int:
        """The indexer's cache per token and layer: di fp8 values and one fp32 scale per 128
        (132 bytes for DeepSeek-V3.2; SGLang nsa_indexer.py head_dim_with_sf = 132)."""
        dim = self.cfg.index().dim
        return dim + SCALE_BYTES * -(-dim // DSA_SCALE_TILE)

    def expand_token_flops(self) -> int:
        """FLOPs to up-project one cached latent into every head's k_nope and v."""
        c = self.cfg
        return 2 * c.r * c.H * (c.dC + c.dV)

    def latent_row_bytes(self) -> int:
        """Cache bytes per token and layer: latent plus RoPE key. A DSA model's fp8 cache is
        FlashMLA's sparse layout: r fp8 values, an fp32 scale per 128 of them, the RoPE key in
        bf16 (512 + 16 + 128 = 656 bytes for DeepSeek-V3.2); an MLA model's fp8 cache has one
        per-tensor scale (r + dR bytes)."""
        c = self.cfg
        if c.is_dsa and self.kv_dtype == "fp8":
            return c.r + SCALE_BYTES * -(-c.r // DSA_SCALE_TILE) + ROPE_BYTES * c.dR
        return (c.r + c.dR) * DTYPE_BYTES[self.kv_dtype]

    def cache_row_bytes(self) -> int:
        """Everything cached per token and layer: the latent row, and a DSA model's index row."""
        return self.latent_row_bytes() + (self.index_row_bytes() if self.cfg.is_dsa else 0)

    def mha_row_bytes(self) -> int:
        """Cache bytes per token and layer (this GPU's heads) if K and V were cached per head."""
        c = self.cfg
        return c.H * (c.dC + c.dR + c.dV) * DTYPE_BYTES[self.kv_dtype]

    def num_partials(self, prefix):
        """Partial results expand_chunked merges: one per prefix chunk, one for the new tokens."""
        p = np.asarray(prefix, dtype=np.float64)
        return np.where(p > 0, np.ceil(p / self.chunk) + 1, 1.0)

    # -- ops -----------------------------------------------------------------------------------

    def ops(self, path: str, batch, new, prefix) -> list[Op]:
        """The ops of `path` at the given points (arrays broadcast against each other)."""
        self._check_path(path)
        if self.cfg.is_dsa:
            return self._dsa_ops(path, batch, new, prefix)
        return self._mla_ops(path, batch, new, prefix)

    def _mla_ops(self, path: str, batch, new, prefix) -> list[Op]:
        c = self.cfg
        a = DTYPE_BYTES[self.dtype]
        kv = DTYPE_BYTES[self.kv_dtype]
        b = np.asarray(batch, dtype=np.float64)
        n = np.asarray(new, dtype=np.float64)
        p = np.asarray(prefix, dtype=np.float64)
        b, n, p = np.broadcast_arrays(b, n, p)
        nq = b * n
        nk = b * (n + p)
        pairs = b * causal_pairs(n, p)
        zero = np.zeros_like(nq)
        H, r, dC, dR, dV = c.H, c.r, c.dC, c.dR, c.dV
        kv_weights = H * (dC + dV) * r * a  # W_UK and W_UV together

        def kv_expand(weight_reads):
            w = weight_reads * kv_weights + zero
            # read latents, read W_UK/W_UV (once per launch), write k_nope and v
            return Op(
                "kv_expand",
                flops=self.expand_token_flops() * nk,
                bytes=nk * r * kv + w + nk * H * (dC + dV) * a,
                weight_bytes=w,
            )

        if path == "expand":
            return [
                kv_expand(1),
                Op(
                    "attention",
                    flops=self.pair_flops(path) * pairs,
                    # read q, k_nope, v, the shared RoPE key; write out
                    bytes=nq * H * (dC + dR) * a + nk * H * (dC + dV) * a + nk * dR * kv + nq * H * dV * a,
                    weight_bytes=zero,
                ),
            ]
        if path == "expand_chunked":
            m = self.num_partials(p)  # each chunk's expansion is its own launch
            merged = m > 1
            # each pass reads all new queries and writes a partial output (+ lse when merged)
            partial_out = np.where(merged, m * nq * H * (dV * a + LSE_BYTES), nq * H * dV * a)
            merge_rows = (m - 1) * nq * H  # pairwise merges, one (query, head) row each
            return [
                kv_expand(m),
                Op(
                    "attention",
                    flops=self.pair_flops(path) * pairs,
                    bytes=m * nq * H * (dC + dR) * a + nk * H * (dC + dV) * a + nk * dR * kv + partial_out,
                    weight_bytes=zero,
                ),
                lse_merge(merge_rows, dV, a, zero),
            ]
        if path == "absorb":
            q_absorb, out_absorb = self._absorb_projections(nq, zero)
            return [
                q_absorb,
                Op(
                    "attention",
                    flops=self.pair_flops(path) * pairs,
                    # read the latent cache once for all heads, the queries (latent + RoPE);
                    # write the latent output
                    bytes=nk * (r + dR) * kv + nq * H * (r + dR) * a + nq * H * r * a,
                    weight_bytes=zero,
                ),
                out_absorb,
            ]
        if path == "mha":
            return [
                Op(
                    "attention",
                    flops=self.pair_flops(path) * pairs,
                    # read the per-head K/V cache, q; write out
                    bytes=nk * H * (dC + dR + dV) * kv + nq * H * (dC + dR) * a + nq * H * dV * a,
                    weight_bytes=zero,
                ),
            ]
        raise MlactlError(f"unknown path {path!r}; paths: {', '.join(PATHS)}")

    def _dsa_ops(self, path: str, batch, new, prefix) -> list[Op]:
        """The ops of a DSA path (see the module docstring). What each op reads and writes is
        written beside it; `pairs` are causal (query, key) pairs over the whole context,
        `selected` the pairs the sparse attention reads (sparse_pairs)."""
        c = self.cfg
        a = DTYPE_BYTES[self.dtype]
        kv = DTYPE_BYTES[self.kv_dtype]
        b, n, p = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (batch, new, prefix)))
        nq = b * n
        nk = b * (n + p)
        pairs = b * causal_pairs(n, p)
        d = c.index()
        selected = b * sparse_pairs(n, p, d.topk)
        zero = np.zeros_like(nq)
        H, r, dC, dR, dV = c.H, c.r, c.dC, c.dR, c.dV
        Hi, di = d.heads, d.dim

        def indexer_proj():
            w = zero + (d.q_lora * Hi * di + c.hidden * di + c.hidden * Hi) * a
            # read the query latent and the hidden state, the three weights (once per launch);
            # write the fp8 index query, its fp32 per-head weights and the token's index row
            return Op(
                "indexer_proj",
                flops=self.index_proj_flops() * nq,
                bytes=nq * (d.q_lora + c.hidden) * a + w + nq * (Hi * di + Hi * SCALE_BYTES + self.index_row_bytes()),
                weight_bytes=w,
            )

        def indexer():
            # read every cached index row once per request, the fp8 queries and their head
            # weights; write one fp32 logit per causal pair
            return Op(
                "indexer",
                flops=self.index_pair_flops() * pairs,
                bytes=nk * self.index_row_bytes() + nq * Hi * (di + SCALE_BYTES) + pairs * LOGIT_BYTES,
                weight_bytes=zero,
            )

        def topk():
            # one comparison per candidate logit (a single-pass select; real radix kernels make
            # 2-4 passes over a row held on chip); read the logits, write int32 indices
            return Op("topk", flops=pairs.copy(), bytes=pairs * LOGIT_BYTES + selected * INDEX_BYTES, weight_bytes=zero)

        # a cache row is the latent (with an fp8 row's scales), which kv_expand reads, and the
        # RoPE key (bf16 in an fp8 row), which the expand paths' attention reads
        rope_bytes = dR * (ROPE_BYTES if self.kv_dtype == "fp8" else kv)
        latent_bytes = self.latent_row_bytes() - rope_bytes

        def kv_expand(weight_reads):
            w = weight_reads * H * (dC + dV) * r * a + zero
            # read the latents, W_UK/W_UV once per launch; write k_nope and v
            return Op(
                "kv_expand",
                flops=self.expand_token_flops() * nk,
                bytes=nk * latent_bytes + w + nk * H * (dC + dV) * a,
                weight_bytes=w,
            )

        if path == "sparse_absorb":
            q_absorb, out_absorb = self._absorb_projections(nq, zero)
            return [indexer_proj(), indexer(), topk(), q_absorb, self.sparse_attention(nq, selected), out_absorb]
        if path == "masked_expand":
            m = self.num_partials(p)
            merged = m > 1
            partial_out = np.where(merged, m * nq * H * (dV * a + LSE_BYTES), nq * H * dV * a)
            merge_rows = (m - 1) * nq * H
            return [
                kv_expand(m),
                indexer_proj(),
                indexer(),
                topk(),
                Op(
                    "attention",
                    flops=self.pair_flops(path) * pairs,
                    # as expand_chunked's, plus the top-k mask: one bit per causal pair, written
                    # by the scatter and read by the kernel (vLLM sparse_mla_attention.py)
                    bytes=m * nq * H * (dC + dR) * a
                    + nk * H * (dC + dV) * a
                    + nk * rope_bytes
                    + partial_out
                    + 2 * np.ceil(pairs / 8),
                    weight_bytes=zero,
                ),
                lse_merge(merge_rows, dV, a, zero),
            ]
        # dense_expand: one shot; the indexer only computes and caches each new token's key, or
        # (dense_indexer "full", as vLLM runs it) all of it, its selection unused
        w_k = zero + c.hidden * di * a
        if self.dense_indexer == "full":
            indexer_ops = [indexer_proj(), indexer(), topk()]
        else:
            indexer_ops = [
                Op(
                    "indexer_key",
                    flops=2 * c.hidden * di * nq,
                    # read the hidden state and wk; write the token's index row
                    bytes=nq * c.hidden * a + w_k + nq * self.index_row_bytes(),
                    weight_bytes=w_k,
                )
            ]
        return [
            kv_expand(1),
            *indexer_ops,
            Op(
                "attention",
                flops=self.pair_flops(path) * pairs,
                bytes=nq * H * (dC + dR) * a + nk * H * (dC + dV) * a + nk * rope_bytes + nq * H * dV * a,
                weight_bytes=zero,
            ),
        ]

    def _absorb_projections(self, nq, zero) -> tuple[Op, Op]:
        """The two projections of the absorbed path for `nq` query tokens: q_absorb (read q_nope
        and W_UK, write the latent query) and out_absorb (read the latent output and W_UV, write
        out)."""
        c, a = self.cfg, DTYPE_BYTES[self.dtype]
        H, r, dC, dV = c.H, c.r, c.dC, c.dV
        w_uk, w_uv = zero + H * dC * r * a, zero + H * r * dV * a
        return (
            Op("q_absorb", flops=2 * H * dC * r * nq, bytes=nq * H * dC * a + w_uk + nq * H * r * a, weight_bytes=w_uk),
            Op(
                "out_absorb",
                flops=2 * H * r * dV * nq,
                bytes=nq * H * r * a + w_uv + nq * H * dV * a,
                weight_bytes=w_uv,
            ),
        )

    def sparse_attention(self, queries, selected) -> Op:
        """The sparse MQA of `queries` query tokens reading `selected` cache rows in all (a sum
        over queries of the rows each reads): pair_flops("sparse_absorb") a row; each query's
        heads share its rows (one MQA group), so a row is read once per query that selects it;
        plus the queries (latent + RoPE) read and the latent outputs written."""
        c = self.cfg
        a = DTYPE_BYTES[self.dtype]
        nq = np.asarray(queries, dtype=np.float64)
        sel = np.asarray(selected, dtype=np.float64)
        return Op(
            "attention",
            flops=self.pair_flops("sparse_absorb") * sel,
            bytes=sel * self.latent_row_bytes() + nq * c.H * (c.r + c.dR) * a + nq * c.H * c.r * a,
            weight_bytes=np.zeros(np.broadcast_shapes(nq.shape, sel.shape)),
        )

    # -- memory --------------------------------------------------------------------------------

    def kv_cache_bytes(self, batch, new, prefix):
        """Latent cache of the whole context, one layer (replicated on every TP rank); a DSA
        model's index cache too."""
        return np.asarray(batch, np.float64) * (np.asarray(new, np.float64) + prefix) * self.cache_row_bytes()

    def mha_cache_bytes(self, batch, new, prefix):
        """What an MHA cache of this GPU's heads would hold for the same context, one layer."""
        return np.asarray(batch, np.float64) * (np.asarray(new, np.float64) + prefix) * self.mha_row_bytes()

    def peak_expanded_bytes(self, path: str, batch, new, prefix):
        """Largest expanded K/V (k_nope + v) a path holds at once, one layer."""
        c = self.cfg
        per_token = c.H * (c.dC + c.dV) * DTYPE_BYTES[self.dtype]
        b = np.asarray(batch, np.float64)
        n = np.asarray(new, np.float64)
        p = np.asarray(prefix, np.float64)
        self._check_path(path)
        if path in ("expand", "dense_expand"):
            tokens = n + p
        elif path in ("expand_chunked", "masked_expand"):
            tokens = np.maximum(n, np.minimum(p, self.chunk))
        else:  # absorb, sparse_absorb, mha
            tokens = np.zeros_like(n + p)
        return b * tokens * per_token

    def resident_bytes(self, path: str, batch, new, prefix):
        """What a path needs in memory at once, one layer: the latent cache it reads (every path
        reads it) plus the largest expanded K/V it holds."""
        return self.kv_cache_bytes(batch, new, prefix) + self.peak_expanded_bytes(path, batch, new, prefix)

    # -- crossover by FLOPs --------------------------------------------------------------------

    def asymptotic_crossover(self) -> float | None:
        """New tokens above which expand takes fewer FLOPs than absorb, as the prefix grows without
        bound: 2*r*H*(dC+dV) / (pair_absorb - pair_expand). None if absorb is never costlier per pair,
        and None for a DSA model: a long prefix always favours sparse absorb (masked_window_by_flops)."""
        if self.cfg.is_dsa:
            return None
        delta = self.pair_flops("absorb") - self.pair_flops("expand")
        if delta <= 0:
            return None
        return self.expand_token_flops() / delta

    def crossover_by_flops(self, prefix: int) -> int | None:
        """Smallest new-token count at which expand takes strictly fewer FLOPs than absorb.

        expand - absorb = E*p - delta*pairs(n, p) with E the FLOPs to expand one token (equal to
        absorb's per-new-token projections, so only the prefix's expansion is left over); solved
        exactly in integers.
        """
        if self.cfg.is_dsa:
            return None  # a DSA model has a window instead: masked_window_by_flops
        p = int(prefix)
        E = self.expand_token_flops()
        delta = self.pair_flops("absorb") - self.pair_flops("expand")
        if delta <= 0:
            return None

        def expand_wins(n: int) -> bool:
            return delta * (2 * n * p + n * (n + 1)) > 2 * E * p  # pairs doubled to stay integer

        # real root of n^2 + (2p+1) n - 2Ep/delta = 0, then fixed up in exact integers
        root = (-(2 * p + 1) + ((2 * p + 1) ** 2 + 8 * E * p / delta) ** 0.5) / 2
        n = max(1, int(root) + 1)
        while n > 1 and expand_wins(n - 1):
            n -= 1
        while not expand_wins(n):
            n += 1
        return n

    # -- DSA: the window where masked MHA takes fewer FLOPs ------------------------------------------

    def masked_excess_flops(self, new, prefix) -> np.ndarray:
        """sparse_absorb's FLOPs less masked_expand's, per request: positive where masked MHA
        takes fewer. The indexer, its projections and top-k are the same on both and cancel;
        absorb's projections of n new tokens equal the expansion of n tokens (E each), so what
        is left is pair_absorb * selected - pair_expand * pairs - E * p. Exact in integers below
        2**53 (float64)."""
        n = np.asarray(new, dtype=np.float64)
        p = np.asarray(prefix, dtype=np.float64)
        sel = sparse_pairs(n, p, self.cfg.index().topk)
        return (
            self.pair_flops("sparse_absorb") * sel
            - self.pair_flops("masked_expand") * causal_pairs(n, p)
            - self.expand_token_flops() * p
        )

    def masked_window_by_flops(self, prefix: int, max_new: int = 1 << 31) -> tuple[int, int] | None:
        """The new-token counts (first, last) at which masked_expand takes strictly fewer FLOPs
        than sparse_absorb after `prefix` cached tokens, or None where it never does.

        The excess e(n) (masked_excess_flops) steps by pair_absorb*min(p+n+1, topk) -
        pair_expand*(p+n+1) from n to n+1: positive and growing while p+n+1 <= topk, then
        falling linearly for good. So e rises, then falls: where it is positive is one run of
        consecutive n, found here by bisection on each side of its peak."""
        topk = self.cfg.index().topk
        p = int(prefix)
        a, e_ = self.pair_flops("sparse_absorb"), self.pair_flops("masked_expand")
        # the step is positive for p+n+1 <= topk and while a*topk > e_*(p+n+1): peak at the last
        # n with a positive step, i.e. n_peak = max(1, floor(a*topk/e_) - p) (clipped to max_new)
        peak = int(min(max(1, (a * topk) // e_ - p), max_new)) if a > e_ else 1

        def wins(n: int) -> bool:
            return float(self.masked_excess_flops(n, p)) > 0

        if not wins(peak):
            return None
        lo, hi = 1, peak  # first win: smallest n in [1, peak] with wins(n)
        while lo < hi:
            mid = (lo + hi) // 2
            if wins(mid):
                hi = mid
            else:
                lo = mid + 1
        first = lo
        lo, hi = peak, max_new  # last win: largest n in [peak, max_new] with wins(n)
        if wins(hi):
            return first, hi
        while lo < hi - 1:
            mid = (lo + hi) // 2
            if wins(mid):
                lo = mid
            else:
                hi = mid
        return first, lo


# -- the rest of the model: what a step reads besides the attention paths' ops ---------------------


@dataclass(frozen=True)
class WeightCost:
    """FLOPs and bytes of every weight a forward step reads outside the MLA paths' ops, per GPU.

    The attention paths' ops (above) already read W_UK and W_UV (kv_b_proj). Everything else a
    step reads once: per layer the query projections (q_a_proj and q_b_proj, or q_proj without
    q_lora_rank), kv_a_proj_with_mqa (hidden -> r + dR) and o_proj; the dense MLP (gate, up,
    down: 3 * hidden * intermediate) of each dense layer; in each MoE layer the router
    (hidden * experts), the shared experts (3 * hidden * moe_intermediate each) and the routed
    experts the step's tokens hit; and the LM head (vocab * hidden). The embedding is held in
    memory but a step reads only its tokens' rows, which is left out. Every weight is split
    over the `tp` GPUs (`model weights / TP`), as tensor-parallel MoE shards each expert.

    FLOPs: 2 per weight per token through it; each token takes `top_k` routed experts, and only
    the tokens that sample (a decode, or a prompt's last chunk) go through the LM head.

    Routed experts hit: with `tokens` tokens each taking top_k of E experts, an expert is missed
    by one token with probability 1 - top_k / E and, routing taken as uniform and independent
    between tokens, by all of them with (1 - top_k / E) ** tokens: E * (1 - (1 - top_k/E)**T)
    experts are read. Real routers are skewed, so fewer distinct experts are hit: this is the
    most a step reads. All methods take numbers or arrays (one entry per step).
    """

    cfg: MLAConfig  # cfg.H are the heads per GPU and cfg.tp the tensor-parallel degree
    weights: ModelWeights

    @property
    def tp(self) -> int:
        return self.cfg.tp

    @cached_property
    def attention_params(self) -> int:
        """One layer's attention weights outside the paths' ops (q, kv_a, o), the whole model."""
        c, h = self.cfg, self.weights.hidden
        heads = c.H * c.tp
        q = (
            h * heads * (c.dC + c.dR)
            if c.q_lora_rank is None
            else h * c.q_lora_rank + c.q_lora_rank * heads * (c.dC + c.dR)
        )
        return q + h * (c.r + c.dR) + heads * c.dV * h

    @cached_property
    def expert_params(self) -> int:
        """One routed or shared expert of one layer: gate, up and down projections."""
        return 3 * self.weights.hidden * self.weights.moe_intermediate

    @cached_property
    def dense_params(self) -> int:
        """Linear weights every token passes through (the whole model, the LM head apart)."""
        w = self.weights
        mlp = 3 * w.hidden * w.intermediate * w.dense_layers
        shared = w.moe_layers * w.shared_experts * self.expert_params
        return self.attention_params * w.layers + mlp + shared

    @cached_property
    def router_params(self) -> int:
        return self.weights.moe_layers * self.weights.hidden * self.weights.experts

    @cached_property
    def kv_b_params(self) -> int:
        """W_UK and W_UV of every layer (read by the attention paths' ops)."""
        c = self.cfg
        return c.layers * c.r * c.H * c.tp * (c.dC + c.dV)

    @cached_property
    def indexer_params(self) -> tuple[int, int]:
        """A DSA model's lightning indexer, every layer (0 for MLA): (wq_b, wk and weights_proj).
        Its ops read them (indexer_proj), so they are held here, not read again per step."""
        c = self.cfg
        if not c.is_dsa:
            return 0, 0
        d = c.index()
        return c.layers * d.q_lora * d.heads * d.dim, c.layers * c.hidden * (d.dim + d.heads)

    @cached_property
    def total_params(self) -> int:
        """Every parameter of the model (embedding and LM head untied), norms left out."""
        w = self.weights
        routed = w.moe_layers * w.experts * self.expert_params
        index = sum(self.indexer_params)
        return self.dense_params + self.router_params + routed + self.kv_b_params + index + 2 * w.vocab * w.hidden

    @cached_property
    def model_bytes(self) -> float:
        """Weight bytes per GPU: the linear layers (and W_UK, W_UV) in the weight dtype; the
        embedding, the LM head and the router in bf16, all split over the tp GPUs. A DSA model's
        indexer is whole on every GPU (vLLM's deepseek_v2.py Indexer and SGLang's nsa_indexer:
        ReplicatedLinear, vllm-project/vllm@002d6073): wq_b in the weight dtype, wk and
        weights_proj in bf16 (vLLM fuses them, dequantising an fp8 wk)."""
        w = self.weights
        bf16 = DTYPE_BYTES["bf16"]
        wq_b, wk_w = self.indexer_params
        linear = self.total_params - self.router_params - 2 * w.vocab * w.hidden - wq_b - wk_w
        split = (linear * w.weight_bytes + (self.router_params + 2 * w.vocab * w.hidden) * bf16) / self.tp
        return split + wq_b * w.weight_bytes + wk_w * bf16

    def experts_hit(self, tokens):
        """Expected distinct routed experts `tokens` tokens hit in one MoE layer (uniform routing)."""
        e, k = self.weights.experts, self.weights.top_k
        if not e:
            return tokens * 0.0
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def dense_flops(self, tokens):
        """Every token through the dense weights, the router and top_k routed experts, per GPU."""
        w = self.weights
        routed = w.moe_layers * w.top_k * self.expert_params
        return 2.0 * tokens * (self.dense_params + self.router_params + routed) / self.tp

    def dense_bytes(self, tokens):
        """The dense weights and the router once, and each routed expert hit once, per GPU."""
        w = self.weights
        bf16 = DTYPE_BYTES["bf16"]
        routed = w.moe_layers * self.experts_hit(tokens) * self.expert_params
        return ((self.dense_params + routed) * w.weight_bytes + self.router_params * bf16) / self.tp


# -- the whole forward: every op a step runs besides the attention paths' ops ------------------------

# A ring all-reduce of S bytes over t GPUs: each GPU sends (and receives) 2 * (t - 1) / t * S
# bytes (reduce-scatter, then all-gather; NVIDIA/nccl-tests doc/PERFORMANCE.md, "AllReduce":
# busBW = algBW * 2 * (n - 1) / n); an all-gather of S bytes in all, (t - 1) / t * S.
FORWARD_OPS = (
    "qkv_a_proj",  # hidden -> q_lora + r + dR (or kv_a alone, r + dR, without q_lora): replicated
    "q_proj",  # q_lora -> H*(dC+dR) (q_b_proj), or hidden -> H*(dC+dR) without q_lora: split
    "o_proj",  # H*dV -> hidden: split by rows, its partial sums all-reduced
    "dense_mlp",  # gate/up (hidden -> 2 I), SiLU*up, down (I -> hidden): split
    "router",  # hidden -> experts logits (fp32 out): replicated
    "shared_experts",  # as dense_mlp, width n_shared * moe_intermediate: split
    "routed_experts",  # top_k experts per token, each split by its intermediate over the GPUs
    "all_reduce",  # 2 a layer: after o_proj and after the MLP/MoE, hidden per token
    "lm_head",  # hidden -> vocab for the tokens that sample: split by vocab
    "logits_gather",  # the vocab shards of the sampled tokens' logits gathered on every GPU
)


@dataclass(frozen=True)
class ForwardOp:
    """One op of the forward outside attention, per GPU, for one run of it; a forward runs it
    `count` times (once a layer it is in: 61 for DeepSeek-V3's projections, 2 a layer for the
    all-reduce). `comm_bytes`: what each GPU sends over the interconnect in one run (the
    collectives; their HBM traffic is left out)."""

    name: str
    count: int
    flops: Any
    bytes: Any  # includes weight_bytes
    weight_bytes: Any
    comm_bytes: Any
    dtype: str  # the compute dtype of its peak: the weights' for the linear layers, bf16 else


@dataclass(frozen=True)
class ForwardCost:
    """FLOPs and bytes of one forward pass outside the attention paths' ops, op by op, per GPU
    at the tensor-parallel degree `cfg.tp` (cfg.H are the heads per GPU).

    With the attention paths' ops (`CostModel.ops`, every layer) this is the whole forward:
    the MLA projections around attention (W_UK and W_UV are in the paths' ops), the dense MLP
    of the first layers, each MoE layer's router, shared and routed experts, two all-reduces a
    layer, the LM head and the logits' gather. The embedding (a lookup), the norms, RoPE and the
    residual adds are left out.

    How the weights are split follows SGLang's DeepSeek-V2/V3 model (sgl-project/sglang
    python/sglang/srt/models/deepseek_v2.py @ the stored snapshot: fused_qkv_a_proj_with_mqa is
    a ReplicatedLinear, q_b_proj a ColumnParallelLinear, o_proj a RowParallelLinear, the MoE
    gate's weight whole on every GPU, the experts split by intermediate under TP, the LM head
    split by vocab). Expert parallelism is not modelled.

    FLOPs: 2 per weight per token through it. Bytes follow cost.py's convention: each op reads
    its weights and inputs once and writes its outputs once; an MLP is three kernels (the gate/up
    GEMM writes 2 I, SiLU*up reads them and writes I, the down GEMM reads I), so per token it
    moves 2 hidden + 6 I activations. Routed experts: the weights of the experts the step's
    tokens hit (`experts_read`, by default WeightCost's uniform-routing expectation) and top_k
    copies of each token through them. Everything takes numbers or numpy arrays."""

    cfg: MLAConfig
    weights: ModelWeights
    act_dtype: str = "bf16"

    def __post_init__(self):
        if self.act_dtype not in ACT_DTYPES:
            raise MlactlError(f"unknown dtype {self.act_dtype!r}; choose one of {', '.join(ACT_DTYPES)}")

    def experts_hit(self, tokens):
        """Expected distinct routed experts `tokens` tokens hit in one MoE layer (uniform routing,
        as WeightCost.experts_hit)."""
        return WeightCost(self.cfg, self.weights).experts_hit(tokens)

    def ops(self, tokens, sampled, experts_read=None, head_read=None) -> list[ForwardOp]:
        """The ops of a forward of `tokens` tokens of which `sampled` sample. `experts_read`:
        routed experts read per MoE layer (default `experts_hit(tokens)`); `head_read`: times
        the LM head's weights are read (default 1 where anything samples, else 0)."""
        c, w = self.cfg, self.weights
        t = c.tp
        a = DTYPE_BYTES[self.act_dtype]
        wb = DTYPE_BYTES[w.dtype]
        bf16 = DTYPE_BYTES["bf16"]
        T, S = tokens, sampled
        E = self.experts_hit(T) if experts_read is None else experts_read
        head = (S > 0) * 1.0 if head_read is None else head_read
        h, H, dC, dR, dV, r = w.hidden, c.H, c.dC, c.dR, c.dV, c.r
        L = c.layers
        wd = w.dtype

        def linear(name, count, k, n, dtype=wd, wbytes=wb, reads=1.0, out_bytes=a):
            # a GEMM of T tokens: k -> n, its weights read `reads` times
            wt = reads * k * n * wbytes
            return ForwardOp(name, count, 2.0 * T * k * n, wt + T * k * a + T * n * out_bytes, wt, 0.0 * T, dtype)

        def mlp(name, count, width, rows=1):
            # gate/up, SiLU*up, down over `rows` copies of each token; `width` per GPU
            wt = 3 * h * width * wb
            return ForwardOp(
                name, count, 2.0 * rows * T * 3 * h * width, wt + rows * T * (2 * h + 6 * width) * a, wt, 0.0 * T, wd
            )

        out = []
        if c.q_lora_rank is not None:
            q = c.q_lora_rank
            out.append(linear("qkv_a_proj", L, h, q + r + dR))
            out.append(linear("q_proj", L, q, H * (dC + dR)))
        else:
            out.append(linear("qkv_a_proj", L, h, r + dR))
            out.append(linear("q_proj", L, h, H * (dC + dR)))
        out.append(linear("o_proj", L, H * dV, h))
        if w.dense_layers:
            out.append(mlp("dense_mlp", w.dense_layers, w.intermediate / t))
        if w.moe_layers:
            out.append(linear("router", w.moe_layers, h, w.experts, dtype="bf16", wbytes=bf16, out_bytes=4))
            if w.shared_experts:
                out.append(mlp("shared_experts", w.moe_layers, w.shared_experts * w.moe_intermediate / t))
            width = w.moe_intermediate / t
            wt = E * 3 * h * width * wb
            k = w.top_k
            out.append(
                ForwardOp(
                    "routed_experts",
                    w.moe_layers,
                    2.0 * k * T * 3 * h * width,
                    wt + k * T * (2 * h + 6 * width) * a,
                    wt,
                    0.0 * T,
                    wd,
                )
            )
        zero = 0.0 * T
        out.append(ForwardOp("all_reduce", 2 * L, zero, zero, zero, 2.0 * (t - 1) / t * T * h * a, "bf16"))
        vocab = w.vocab / t
        wt = head * h * vocab * bf16
        out.append(ForwardOp("lm_head", 1, 2.0 * S * h * vocab, wt + S * h * a + S * vocab * a, wt, 0.0 * S, "bf16"))
        out.append(ForwardOp("logits_gather", 1, 0.0 * S, 0.0 * S, 0.0 * S, (t - 1) / t * S * w.vocab * a, "bf16"))
        return out

    def gemms(self) -> dict[str, list[tuple[str, int, int, str]]]:
        """The GEMMs each linear op of `ops` runs, per GPU: {op: [(rows, k, n, weight dtype)]},
        `rows` "tokens" or "sampled" (the LM head's), an MLP as its gate/up GEMM (k -> 2 width)
        and its down GEMM (width -> k); SiLU*up between them is elementwise, in no GEMM. The
        routed experts and the collectives are not GEMMs of one shape: not here. The shapes are
        those `ops` prices (a test checks each GEMM's 2 rows k n against its FLOPs)."""
        c, w = self.cfg, self.weights
        h, H, t, wd = w.hidden, c.H, c.tp, w.dtype
        q = c.q_lora_rank
        out: dict[str, list[tuple[str, int, int, str]]] = {
            "qkv_a_proj": [("tokens", h, (q or 0) + c.r + c.dR, wd)],
            "q_proj": [("tokens", q if q is not None else h, H * (c.dC + c.dR), wd)],
            "o_proj": [("tokens", H * c.dV, h, wd)],
        }
        if w.dense_layers:
            width = int(w.intermediate // t)
            out["dense_mlp"] = [("tokens", h, 2 * width, wd), ("tokens", width, h, wd)]
        if w.moe_layers:
            out["router"] = [("tokens", h, w.experts, "bf16")]
            if w.shared_experts:
                width = int(w.shared_experts * w.moe_intermediate // t)
                out["shared_experts"] = [("tokens", h, 2 * width, wd), ("tokens", width, h, wd)]
        out["lm_head"] = [("sampled", h, int(w.vocab // t), "bf16")]
        return out

    def totals(self, tokens, sampled) -> tuple:
        """(FLOPs, bytes, interconnect bytes) of these ops over the whole forward."""
        ops = self.ops(tokens, sampled)
        return (
            sum(o.count * o.flops for o in ops),
            sum(o.count * o.bytes for o in ops),
            sum(o.count * o.comm_bytes for o in ops),
        )
