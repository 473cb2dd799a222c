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

Arrays are float64: exact for every figure below 2**53 (9.0e15), 16 significant digits above.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mlactl.model.config import MLAConfig
from mlactl.model.weights import ModelWeights
from mlactl.util.defaults import ACT_DTYPES, DEFAULT_CHUNK, DTYPE_BYTES, KV_DTYPES, MLA_PATHS  # noqa: F401  (MLA_PATHS: re-exported)
from mlactl.util.errors import MlactlError

LSE_BYTES = 4  # softmax statistics are fp32
PATHS = ("expand", "expand_chunked", "absorb", "mha")
OPS = {
    "expand": ("kv_expand", "attention"),
    "expand_chunked": ("kv_expand", "attention", "lse_merge"),
    "absorb": ("q_absorb", "attention", "out_absorb"),
    "mha": ("attention",),
}


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


@dataclass(frozen=True)
class CostModel:
    cfg: MLAConfig
    kv_dtype: str = "bf16"  # the cache: latent + RoPE key (and the MHA cache of `mha`)
    dtype: str = "bf16"  # activations, weights and expanded K/V; also the compute dtype
    chunk: int = DEFAULT_CHUNK  # prefix tokens per chunk of expand_chunked

    def __post_init__(self):
        if self.kv_dtype not in KV_DTYPES:
            raise MlactlError(f"unknown kv dtype {self.kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
        if self.dtype not in ACT_DTYPES:
            raise MlactlError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(ACT_DTYPES)}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise MlactlError(f"--chunk must be a positive integer, got {self.chunk!r}")

    # -- per-pair and per-token figures (the numbers docs/design.md quotes) --------------------------

    def pair_flops(self, path: str) -> int:
        """FLOPs of one (query, key) pair in the attention op: QK^T plus PV, all heads."""
        c = self.cfg
        if path == "absorb":
            return 2 * c.H * (c.r + c.dR) + 2 * c.H * c.r
        if path in ("expand", "expand_chunked", "mha"):
            return 2 * c.H * (c.dC + c.dR) + 2 * c.H * c.dV
        raise MlactlError(f"unknown path {path!r}; paths: {', '.join(PATHS)}")

    def expand_token_flops(self) -> int:
        """FLOPs to up-project one cached latent into every head's k_nope and v."""
        c = self.cfg
        return 2 * c.r * c.H * (c.dC + c.dV)

    def absorb_token_flops(self) -> int:
        """FLOPs of q_absorb plus out_absorb for one new token."""
        c = self.cfg
        return 2 * c.H * c.dC * c.r + 2 * c.H * c.r * c.dV

    def latent_row_bytes(self) -> int:
        """Cache bytes per token and layer: latent plus RoPE key."""
        return (self.cfg.r + self.cfg.dR) * DTYPE_BYTES[self.kv_dtype]

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
                Op(
                    "lse_merge",
                    # scale both partial outputs by their weights and add: 3 FLOPs per element
                    flops=merge_rows * 3 * dV,
                    # read two partials (output + lse), write one
                    bytes=merge_rows * 3 * (dV * a + LSE_BYTES),
                    weight_bytes=zero,
                ),
            ]
        if path == "absorb":
            w_uk = zero + H * dC * r * a
            w_uv = zero + H * r * dV * a
            return [
                Op(
                    "q_absorb",
                    flops=2 * H * dC * r * nq,
                    # read q_nope, W_UK; write the latent query
                    bytes=nq * H * dC * a + w_uk + nq * H * r * a,
                    weight_bytes=w_uk,
                ),
                Op(
                    "attention",
                    flops=self.pair_flops(path) * pairs,
                    # read the latent cache once for all heads, the queries (latent + RoPE);
                    # write the latent output
                    bytes=nk * (r + dR) * kv + nq * H * (r + dR) * a + nq * H * r * a,
                    weight_bytes=zero,
                ),
                Op(
                    "out_absorb",
                    flops=2 * H * r * dV * nq,
                    # read the latent output, W_UV; write out
                    bytes=nq * H * r * a + w_uv + nq * H * dV * a,
                    weight_bytes=w_uv,
                ),
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

    # -- memory --------------------------------------------------------------------------------

    def kv_cache_bytes(self, batch, new, prefix):
        """Latent cache of the whole context, one layer (replicated on every TP rank)."""
        return np.asarray(batch, np.float64) * (np.asarray(new, np.float64) + prefix) * self.latent_row_bytes()

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
        if path == "expand":
            tokens = n + p
        elif path == "expand_chunked":
            tokens = np.maximum(n, np.minimum(p, self.chunk))
        elif path in ("absorb", "mha"):
            tokens = np.zeros_like(n + p)
        else:
            raise MlactlError(f"unknown path {path!r}; paths: {', '.join(PATHS)}")
        return b * tokens * per_token

    def resident_bytes(self, path: str, batch, new, prefix):
        """What a path needs in memory at once, one layer: the latent cache it reads (every path
        reads it) plus the largest expanded K/V it holds."""
        return self.kv_cache_bytes(batch, new, prefix) + self.peak_expanded_bytes(path, batch, new, prefix)

    # -- crossover by FLOPs --------------------------------------------------------------------

    def asymptotic_crossover(self) -> float | None:
        """New tokens above which expand takes fewer FLOPs than absorb, as the prefix grows without
        bound: 2*r*H*(dC+dV) / (pair_absorb - pair_expand). None if absorb is never costlier per pair."""
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
    def total_params(self) -> int:
        """Every parameter of the model (embedding and LM head untied), norms left out."""
        w = self.weights
        routed = w.moe_layers * w.experts * self.expert_params
        return self.dense_params + self.router_params + routed + self.kv_b_params + 2 * w.vocab * w.hidden

    @cached_property
    def model_bytes(self) -> float:
        """Weight bytes per GPU: the linear layers (and W_UK, W_UV) in the weight dtype; the
        embedding, the LM head and the router in bf16."""
        w = self.weights
        bf16 = DTYPE_BYTES["bf16"]
        linear = self.total_params - self.router_params - 2 * w.vocab * w.hidden
        return (linear * w.weight_bytes + (self.router_params + 2 * w.vocab * w.hidden) * bf16) / self.tp

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

    def head_flops(self, sampled):
        """The LM head for the tokens that sample, per GPU."""
        return 2.0 * sampled * self.weights.vocab * self.weights.hidden / self.tp

    def head_bytes(self, sampled):
        """The LM head read once (bf16) where a step samples, per GPU."""
        return (sampled > 0) * 1.0 * self.weights.vocab * self.weights.hidden * DTYPE_BYTES["bf16"] / self.tp
