"""The calibrated time of one op: the roofline with fitted efficiencies and the terms the data earns.

    t = [t_fixed + t_quant + t_align + t_request + t_combine + t_kvcast + t_row
         + max(roofline(F * pad / u, B + B_split; eta_c * peak, eta_m * bw), t_iter * waves * iters)] * near

(with `pipe`, roofline(C, M) is max(C, M) + min(C, M) / waves)

F and B are cost.py's FLOPs and bytes of the op; roofline() is mlactl.model.roofline's max(F/peak,
B/bw) (with `sum`, its two sides added instead). The terms, each switched on per fit (`terms`)
and kept only where it lowers the held-out error (docs/calibration.md has the figures):

fixed   t_fixed: launch and setup, 11-15 us for FA3's MLA decode on an H200 (aiconfigurator)
pad     the kernel computes whole 64-row tiles: rows of one tile are the query tokens times the
        heads that share a KV head (all H for absorb's MQA, 1 for expand's MHA), so 16 heads of
        one decode token cost a 64-row tile: F * 4
waves   CTAs run in waves over the SMs; a last partial wave leaves SMs idle: compute time is
        divided by u = ctas / (waves * sm_count)
split   split-KV (absorb's attention): with fewer CTAs than SMs the kernel splits the context
        into s pieces (at most one per 64-key block) to fill the SMs; each piece writes and the
        merge reads back an fp32 partial output and lse per (token, head):
        B_split = 2 * s * rows * (dV_out*4 + 4)
kvpad   the cache is read in whole 64-token pages: cache bytes * ceil(ctx/64)*64/ctx
serial  a CTA walks its KV blocks one after another: t_iter per block, per wave of CTAs; with
        few CTAs this latency, not bandwidth, bounds the time (t_iter fitted). DSA's indexer and
        top-k too: the indexer's CTAs hold INDEXER_TILE_ROWS rows packed over the batch and walk
        every key of each request they span; top-k gives each query row a CTA
combine a split launch is followed by a kernel that merges the pieces: t_combine where s > 1
request per-request setup (page table, scheduling): t_request * batch, not overlapped; SGLang's
        decode of 1024 requests, 1 head, context 2 takes 58 us on an H200 where its bytes need 1
quant   a pass over the activations before the GEMM, not overlapped with it: their bf16 bytes at
        eta_q of the bandwidth (projections only; aiconfigurator's fp8 GEMMs quantise per token
        inside the timing)
sum     compute and memory time added instead of overlapped: a timed call that converts its
        operands before it computes overlaps neither
tile128 the attention kernel's tiles are 128 query rows by 128 keys, not 64 by 64: pad, waves,
        kvpad and serial count in 128s. TRT-LLM's fmha_v2 names its kernels by tile (e.g.
        `..._flash_attention_fp16_128_128_S_qkv_...`); which tile these tables ran is read from
        the held-out error, not the collector: on TRT-LLM's B200 expand prefill 11% -> 6% median
kvcast  a pass over the cache keys the launch reads, before the kernel and not overlapped with
        it: their cache bytes at eta_x of the bandwidth. SGLang's FA3 decode with an fp8 cache
        on an H200 takes the same time per key at 16 heads as at 128 (2.05 vs 2.22 ms for a
        million keys): a per-key pass (converting the fp8 cache), not the heads' FLOPs, bounds it
qrow    t_row per query row (token x head), not overlapped: TRT-LLM 1.3's fp8 decode on a B200
        at context 2 takes 45, 85 and 146 us for 1024 requests of 16, 32 and 128 heads, where
        the bytes of q and out need 4-33 us: a per-row step (the query's fp8 conversion, say)
align   rows (tokens) not a multiple of 4: t_align more (projections). GEMMs reading fp32 row
        scales by TMA need 16-byte rows; vLLM's DeepGEMM on a B200 takes ~175 us at m = 4, 8, 12
        and ~240 us at every m between
near    a projection's time times exp(-median log residual) of the NEAR_K nearest measured
        shapes within NEAR_RADIUS octaves (of rows and heads, aligned with aligned): GEMM
        libraries pick kernels by shape buckets, so time steps where no smooth term can follow
        (SGLang's fp8 GEMM on an H200, n = 256: 6.1 us at m = 128, 8.7 us at m = 129). The
        residuals of the fit's own points are stored in params["near"]
ops     a whole path's attention at eta_c and its other ops at eta_p, each its own roofline, added
        (they run one after another and reach different fractions of peak)
scores  a whole path's unfused attention (torch twins) writing and re-reading its fp32 scores:
        4 passes over batch x new x keys x heads values at eta_s of the bandwidth, not overlapped
l2      a projection's memory at eta_m * l2_gain (1-4) where the launch's bytes fit in the GPU's L2
        (params["l2_bytes"], the profile's l2_mib): aiconfigurator repeats each call on the same
        tensors (B200 torch.bmm out_absorb: 6.4-8.0 TB/s up to ~92 MB, 4.8-5.9 from 126 MB).
        On a top-k the walk and the memory at l2_gain where one chunk's bytes fit (the collector
        replays each chunk on its logits; topk_l2_gain): an H100 walks a wave of selecting CTAs
        at 10K keys in 3.1-3.5 us where the logits are at most 21 MB, 3.6-3.9 us from 160 MB
        (but 4.2-4.4 us at 41-42 MB, inside its 50 MB: less of the L2 holds them)
slots   a sparse attention walks all top-k index slots of a query (the ones pointing at no key
        too): its FLOPs and KV iterations are top-k keys', not min(top-k, context)'s (walked())
reuse   a sparse attention's rows selected by several queries of one request are read once: the
        cache bytes are the request's distinct rows, not one read per selection (walked())
hblock  a sparse attention's kernel on this GPU (SPARSE_BLOCKS): the query heads padded to its
        head block, a CTA's 64 of them (pad, waves), and its key block of top-k slots a step
        (serial). FlashMLA's sparse prefill computes 64 heads by 64 keys a CTA on Hopper and 128
        by 128 over a pair of CTAs on Blackwell, where SGLang and aiconfigurator pad 64 heads to
        128: the same 64-head launch runs at ~575 TFLOP/s on an H200, a B200 and a GB200 alike
        (aiconfigurator 0.12, SGLang 0.5.14, 4,096+ query tokens), and one query token of 2,048
        slots takes 57 us on an H200 (32 steps) and 30 us on a B200 (16). The block sizes are the
        GPU's, kept in the params (head_block, key_block), not fitted; a transfer also sets
        `reuse` by the target's architecture (SPARSE_REUSE)
dgtile  a single GEMM (kv_expand, DSA's indexer projections) run by DeepGEMM on a Hopper: pad and
        waves count the block_m x block_n tiles DeepGEMM's SM90 heuristic picks for its m x n
        (deepgemm_tile), not 64 x 128 ones. SGLang's fp8_block kv_expand on an H200 at n = 16,384:
        256 x 128 tiles from m = 1,024 on (4 waves there, 16 at m = 4,096), 4.4-4.9 us a wave
pipe    compute and memory overlapped across the tiles each SM runs in turn (a persistent GEMM
        loads the next tile and stores the last while it computes): of one tile only the
        lesser side is exposed, max(C, M) + min(C, M) / waves; one wave is `sum`, many the
        roofline's max. Fitted on SGLang's DeepGEMM rows m <= 1,024 (1-16 waves), it predicts
        the rows above within 12% / 30% (H100) and 11% / 33% (H200), blocked median / p90
rowsel  DSA's top-k selects only for the query rows that see more keys than it keeps (top-k):
        a row of at most top-k keys keeps them all (aiconfigurator times a launch of only such
        rows at 0). The selecting rows are its walking CTAs, each walking its own causal
        context: FLOPs and logits read are those rows' pairs, the walk their mean context.
        SGLang's fused top-2048 on an H200 takes 50 us for 4,096 new tokens (2,048 select) and
        4.0 us for one decode token of 2,048 cached
ctawave t_cta per wave of walking CTAs (the indexer's, the top-k's), on top of t_iter per key
        block: a CTA's setup before its walk. Top-k on an H200 at 2,048 cached keys: 5.3, 9.0,
        17 and 37 us for 256, 512, 1,024 and 2,048 new tokens, ~2 us a wave of 132 rows where
        the keys they walk need ~0.6
rowwave t_rowwave per wave of all a top-k's query rows, selecting or not: each row writes its top-k
        indices (a row that keeps all its keys writes them too). One request of 2,048 new tokens
        and no cache (nothing selects) takes 11 us on an H200, 16 waves of 132 rows
apart   a top-k CTA's setup (ctawave) and its rows' index writes (rowwave) added to the walk and
        the memory time, not under their max: SGLang's fused top-k runs one 1,024-thread CTA an
        SM (128 KB of dynamic shared memory), which clears its histograms, walks its row's logits
        twice, then writes the row's 2,048 indices, one phase after another. Without it the setup
        hides under a long walk's memory time; the H200's fit below 8K keys then took the setup
        for slow memory (eta_m 0.30) and predicted the rows of 131K-203K keys 25-40% fast
reread  a top-k CTA reads its row's logits twice (a coarse histogram, then the threshold pass),
        the second time from its SM's L1 where the row fits in the 92 KB the kernel's shared
        memory leaves (TOPK_L1_BYTES: 23,552 keys), else from memory again: the logit bytes
        counted twice past it (topk_passes). An H100's wave of selecting CTAs takes 0.17-0.23 ns
        longer for each key more up to 24.5K keys, 0.35-0.44 ns from 33K on (two reads, 2.8 TB/s)
chunk   SGLang's indexer holds its fp32 logits, [query rows, every key of the batch], in a workspace
        of LOGITS_FREE_FRACTION of the GPU's free memory (params["logits_budget_bytes"], from the
        profile's memory) and runs a larger launch in chunks of rows, each row then its own
        sequence; aiconfigurator's collector sums the chunks' times. Per chunk, t_seq for each
        row and sequence of the launch, over the SMs (logit_chunks, chunk_seconds): quadratic
        in a chunk's rows. H200, 2,048 cached: 32 requests of 1,024 new tokens take 1.59 ms in
        one launch, of 2,048 (two chunks, 57K and 8K rows) 5.25 ms, twice the rows at 3.3x
fa3split the split count FA3 picks (flash-attention hopper/heuristics.h, num_splits_heuristic,
        commit 13d0fd9c): none when the CTAs fill 80% of the SMs or there are <= 4 KV blocks;
        else the fewest splits within 85% of the best wave efficiency (ctas*s/SMs over its
        ceiling), at most min(128, SMs, KV blocks). `split` alone fills the SMs with
        ceil(SMs/ctas) pieces, which spills 8 requests on 132 SMs (17 pieces) into a second wave
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields, replace

import numpy as np

from mlactl.decide.calibration.terms import (  # noqa: F401  (re-exported: the classes and terms' names)
    ATTENTION_CLASSES,
    BASE_TERMS,
    MQA_CLASSES,
    OP_CLASSES,
    PATH_CLASSES,
    PROJECTIONS,
    SPARSE_TERMS,
    TERMS,
    WALKERS,
    Terms,
    relevant_terms,
)
from mlactl.model.cost import LOGIT_BYTES
from mlactl.model.roofline import roofline_time

TILE_ROWS = 64  # rows of a CTA's query tile in FA3/FlashMLA-style kernels (and our Triton ones)
PROJ_TILE_N = 128  # output columns of a GEMM CTA tile (projections)
BIG_TILE = 128  # rows and keys of a tile under `tile128`
DECODE_MAX_NEW = 8  # query tokens per request that decode kernels (and decode fits) serve
KV_BLOCK = 64  # keys per KV block: the page size of SGLang/TRT-LLM MLA caches and FA3's n-block
ALIGN_ROWS = 4  # `align`: rows (tokens) a GEMM's fp32 row scales need for 16-byte TMA alignment
# `near`: the k nearest measured shapes within a radius (octaves of rows and heads) correct a
# projection's prediction; away from every measured shape the parametric model stands alone
NEAR_K = 6
NEAR_RADIUS = 1.0
# the indexer (DeepGEMM's fp8_mqa_logits) gives a CTA 128 rows: 128 / index heads query tokens (4
# at GLM-5's 32 heads), the batch's tokens packed one after another, and the CTA walks every key
# its tokens see, one KV block after another. aiconfigurator's H200 table shows both: with a few
# tokens the time is 3.5 us + 4.0 ns per key (12, 66 and 525 us at 2K, 16K and 131K keys), and
# one token each of 4 requests (one CTA spanning the four requests' keys) takes 4x one request's
# (257 against 65 us at 16K keys); 4 tokens of each of 1 to 64 requests take the same 66-70 us
INDEXER_TILE_ROWS = 128
# `chunk`: SGLang's Indexer (0.5.14, layers/attention/dsa, and aiconfigurator's collector at
# ai-dynamo/aiconfigurator@e23be5a7 collector/sglang/glm5_dsa_sparse_modules.py,
# _glm5_score_rows_per_chunk) bounds the fp32 logits [query rows, batch keys] by
# min(free x SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION (0.2), total x 0.3) and never chunks below
# 8M logits. The datasheet's capacity (decimal GB) stands in for the free memory: the tables
# split between 17.2 and 8.6 GB on the H100 (16 GB here) and 30.1 and 21.5 GB on the H200 (28.2)
LOGITS_FREE_FRACTION = 0.2
LOGITS_UNCHUNKED = 8_000_000
# `reread`: SGLang's fused top-k (sgl-kernel csrc/elementwise/topk.cu, sgl-project/sglang @
# 06c48ca8) gives its one CTA an SM 128 KB of dynamic shared memory (kSmem) and about 11 KB of
# static (two 384-bin histograms, the row's 2,048 indices); of a Hopper or Blackwell SM's 256 KB
# of L1 and shared memory the carve-out that holds 139 KB is 164 KB, which leaves 92 KB of L1:
# a row of up to 23,552 fp32 logits, read by the histogram pass, is still there for the
# threshold pass
TOPK_L1_BYTES = 92 * 1024
# `hblock`: FlashMLA's sparse prefill kernel (flash_mla_sparse_fwd) by architecture, (query heads,
# top-k slots) of one step: deepseek-ai/FlashMLA csrc/sm90/prefill/sparse/fwd.cu at e77c3068,
# lines 21-22 (B_H = B_TOPK = 64, one CTA per 64 heads of a token) and csrc/sm100/prefill/sparse/
# fwd.cu at 4cad6fb1, lines 50-51 (B_H = B_TOPK = 128 "for 2 CTAs", 64 heads each). Callers pad q
# to the head block: SGLang's NSA backend (python/sglang/srt/layers/attention/nsa_backend.py,
# _forward_flashmla_sparse, at 005e8bf8: "a multiple of 64 (Hopper) or 128 (Blackwell)") and
# aiconfigurator's collector (ai-dynamo/aiconfigurator@095f58a5,
# collector/sglang/glm5_dsa_sparse_modules.py, line 485: 128 heads where sm_major >= 10)
SPARSE_BLOCKS = {"sm90": (64, 64), "sm100": (128, 128)}
# and whether that kernel's reads of the rows a request's queries share come once (`reuse`): on
# Hopper they do (with one read per selection the H100's table would need 4.8 TB/s, over its
# 3.35); on Blackwell the time follows one read per selection: fitted with `reuse` the B200's and
# GB200's tables miss the targets (random p90 29-34%, blocked median 24-26%), without it they
# meet them (15.5-20.1%, 6.2-10.3%). `calibrate transfer` sets the term by the target's
# architecture for a fit with `hblock`
SPARSE_REUSE = {"sm90": True, "sm100": False}


def sparse_blocks(arch: str | None) -> tuple[int, int] | None:
    """`hblock`: (head block, key block) of the sparse attention kernel on this architecture, or
    None where SPARSE_BLOCKS does not know it (the term then does nothing)."""
    return SPARSE_BLOCKS.get(arch or "")


def head_padded(params: dict, terms, pts: Points) -> tuple[Points, int | None]:
    """`hblock`: a sparse attention's points as its kernel computes them, the heads padded to the
    GPU's head block (FLOPs with them), and its key block; the points as they are and None
    without the term or the GPU's blocks."""
    hb, kb = params.get("head_block"), params.get("key_block")
    if pts.op != "sparse_attention" or not Terms.of(terms).hblock or not hb or not kb:
        return pts, None
    heads = np.asarray(pts.heads, dtype=np.float64)
    padded = np.ceil(heads / hb) * hb
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(heads > 0, padded / heads, 1.0)
    return replace(pts, heads=padded, flops=np.asarray(pts.flops, dtype=np.float64) * factor), int(kb)


def op_class(path: str, op: str) -> str:
    """The calibration class of cost.py's op `op` on `path`: each kind of attention is its own
    class (dense_expand's is a plain causal MHA, expand's kind); other ops are their own."""
    if op == "attention":
        return {
            "absorb": "absorb_attention",
            "sparse_absorb": "sparse_attention",
            "masked_expand": "masked_attention",
        }.get(path, "expand_attention")
    return op


@dataclass(frozen=True)
class Points:
    """Instances of one op class: cost.py's FLOPs and bytes, and the shape the extra terms need.

    batch: requests; new: query tokens per request; context: keys per request; heads: H on this
    GPU; out_dim: the value width each (token, head) writes (r for absorb, dV for expand).
    """

    op: str
    flops: np.ndarray
    bytes: np.ndarray
    batch: np.ndarray
    new: np.ndarray
    context: np.ndarray
    heads: np.ndarray
    out_dim: np.ndarray
    cache_bytes: np.ndarray  # keys and values an attention op reads (latent or per-head); else 0
    time_s: np.ndarray | None = None
    group: np.ndarray | None = field(default=None, compare=False)  # k-fold keeps a group together
    # a whole path's attention op alone (the rest = flops/bytes less these), for `ops`
    attn_flops: np.ndarray | None = None
    attn_bytes: np.ndarray | None = None
    # a sparse attention's index slots per query (the model's top-k), for `slots`, and the keys of
    # a request's context its queries select from, for `reuse`; a top-k's too (`rowsel`); else None
    slots: np.ndarray | None = None
    pool: np.ndarray | None = None
    # the indexer's heads (its rows per query token), for its tile model; else None
    index_heads: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.flops)

    def take(self, idx) -> Points:
        def pick(a):
            return None if a is None else np.asarray(a)[idx]

        return replace(self, **{f.name: pick(getattr(self, f.name)) for f in fields(self) if f.name != "op"})


def decode_like(new, prefix) -> np.ndarray:
    """Where a decode fit applies (aiconfigurator's generation table): a cached prefix and at
    most DECODE_MAX_NEW new tokens a request; everywhere else the prefill (context) fit does. The
    one place this choice is written: a decode table is memory-bound and says little about
    compute."""
    return (np.asarray(prefix) > 0) & (np.asarray(new) <= DECODE_MAX_NEW)


def by_phase(on_decode, fits, seconds):
    """`seconds(fit)` of a class's (decode, prefill) fits: decode's where `on_decode`, prefill's
    elsewhere (one call where both are one fit). time.op_seconds (per point) and
    steps.PathLaunches (a launch whose rows are all decode-like) choose by it."""
    decode, prefill = fits
    t_prefill = seconds(prefill)
    if decode is prefill:
        return t_prefill
    return np.where(on_decode, seconds(decode), t_prefill)


def _tile(op: str, terms) -> int:
    """Query rows (and keys) of one attention tile under these terms."""
    if op == "indexer":
        return INDEXER_TILE_ROWS
    return BIG_TILE if Terms.of(terms).tile128 and op in ATTENTION_CLASSES else TILE_ROWS


def _rows_and_ctas(pts: Points, tile: int = TILE_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Query rows per tile group and the CTAs one launch starts (before any split)."""
    b, n, h = pts.batch, pts.new, pts.heads
    if pts.op in MQA_CLASSES:  # MQA: every head of a token shares the latent cache
        rows = n * h
        ctas = b * np.ceil(rows / tile)
    elif pts.op in ("expand_attention", "masked_attention"):  # MHA: one tile group per (request, head)
        rows = n
        ctas = b * h * np.ceil(rows / tile)
    elif pts.op in ("q_absorb", "out_absorb"):  # one GEMM per head over the batch's tokens
        rows = b * n
        ctas = h * np.ceil(rows / TILE_ROWS) * np.ceil(pts.out_dim / PROJ_TILE_N)
    elif pts.op == "kv_expand":  # one GEMM: tokens x H*(dC+dV)
        rows = b * pts.context
        ctas = np.ceil(rows / TILE_ROWS) * np.ceil(h * pts.out_dim / PROJ_TILE_N)
    elif pts.op == "indexer" and pts.index_heads is not None:  # rows packed over the batch (INDEXER_TILE_ROWS)
        rows = b * n * pts.index_heads
        ctas = np.ceil(rows / INDEXER_TILE_ROWS)
    elif pts.op == "topk":  # one CTA selects one query's top-k (TOPK_KEY_BLOCK keys a step)
        rows = np.full_like(pts.flops, float(TILE_ROWS))
        ctas = b * n
    elif pts.op in ("indexer_proj", "indexer_key"):  # GEMMs over the batch's new tokens
        rows = b * n
        ctas = np.ceil(rows / TILE_ROWS) * np.ceil(pts.out_dim / PROJ_TILE_N)
    else:  # lse_merge and whole paths: elementwise or mixed; no tile model
        rows = np.full_like(pts.flops, float(TILE_ROWS))
        ctas = np.full_like(pts.flops, np.inf)
    return rows, ctas


def rows_of(pts: Points) -> np.ndarray:
    """A projection's GEMM rows (tokens: batch x new, or batch x context for kv_expand); query
    tokens (batch x new) for any other op class."""
    if pts.op in PROJECTIONS:
        return np.asarray(_rows_and_ctas(pts)[0], dtype=np.float64)
    return np.asarray(pts.batch, dtype=np.float64) * np.asarray(pts.new, dtype=np.float64)


def step_counts(pts: Points, sm_count: int | None, tile: int = TILE_ROWS) -> np.ndarray:
    """[n, 2] what a predicted time steps with: the padding of query rows to whole tiles (padded
    rows over rows), and the waves of CTAs over the SMs (0 without an SM count). Time steps up
    where either grows from one point to the next."""
    rows, ctas = _rows_and_ctas(pts, tile)
    rows = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    pad = np.ceil(rows / tile) * tile / rows
    waves = np.ceil(np.where(np.isfinite(ctas), ctas, 0.0) / sm_count) if sm_count else np.zeros_like(pad)
    return np.stack([np.ravel(pad), np.ravel(waves)], axis=-1)


_FA3_CACHE: dict = {}  # split counts depend on the shapes only; a fit asks for them ~1000 times


def fa3_splits(ctas, n_blocks, sm_count: int, max_splits: int = 128) -> np.ndarray:
    """FA3's split count (see `fa3split` above), vectorised over points."""
    ctas, n_blocks = np.broadcast_arrays(
        np.maximum(np.asarray(ctas, dtype=np.float64), 1.0), np.asarray(n_blocks, dtype=np.float64)
    )
    shape = ctas.shape  # the time function passes grids (crossover: prefixes x new tokens)
    ctas, n_blocks = ctas.ravel(), n_blocks.ravel()
    key = (sm_count, max_splits, shape, ctas.tobytes(), n_blocks.tobytes())
    if key in _FA3_CACHE:
        return _FA3_CACHE[key]
    cap = np.minimum(np.minimum(max_splits, sm_count), n_blocks)
    s = np.arange(1, min(max_splits, sm_count) + 1, dtype=np.float64)[None, :]
    waves = ctas[:, None] * s / sm_count
    eff = np.where(s <= cap[:, None], waves / np.ceil(waves), 0.0)
    good = eff >= 0.85 * eff.max(axis=1, keepdims=True)
    pick = s[0, np.argmax(good, axis=1)]  # the first (fewest) splits that qualify
    out = np.where((ctas >= 0.8 * sm_count) | (n_blocks <= 4), 1.0, pick).reshape(shape)
    if len(_FA3_CACHE) > 64:
        _FA3_CACHE.clear()
    _FA3_CACHE[key] = out
    return out


def _splits(
    pts: Points, ctas: np.ndarray, sm_count: int, block: int = KV_BLOCK, fa3: bool = False, smooth: bool = False
) -> np.ndarray:
    """Split-KV factor: fill the SMs when the CTAs are fewer, at most one piece per KV block.
    `smooth`: the continuous count (SMs / CTAs, at most one piece per key block), without its steps."""
    if smooth:
        few = np.isfinite(ctas) & (ctas < sm_count) & (pts.op in MQA_CLASSES)
        c = np.where(few, np.maximum(ctas, 1.0), 1.0)
        return np.where(few, np.clip(sm_count / c, 1.0, np.maximum(pts.context / block, 1.0)), 1.0)
    if fa3 and pts.op in MQA_CLASSES:
        c = np.where(np.isfinite(ctas), ctas, float(sm_count))
        return fa3_splits(c, np.ceil(pts.context / block), sm_count)
    few = np.isfinite(ctas) & (ctas < sm_count)
    c = np.where(few, np.maximum(ctas, 1.0), 1.0)
    s = np.minimum(np.ceil(sm_count / c), np.ceil(pts.context / block))
    return np.where(few & (pts.op in MQA_CLASSES), np.maximum(s, 1.0), 1.0)


def predict(
    params: dict, terms, pts: Points, peak: float, bandwidth: float, sm_count: int | None, smooth: bool = False
) -> np.ndarray:
    """Calibrated seconds of each point (see the module docstring for the terms). `smooth`: the same
    fit with its counts (tiles, waves, KV blocks, splits) continuous instead of whole: the time
    without the steps those counts make (`steps are claims`, docs/calibration.md)."""
    t = Terms.of(terms)
    t_fixed, t_compute, t_memory, serial = components(params, t, pts, peak, bandwidth, sm_count, smooth)
    added = added_seconds(params, t, pts, bandwidth, sm_count, smooth)
    waves = tile_waves(pts, t, sm_count, smooth) if t.pipe and pts.op in PROJECTIONS and sm_count else None
    scores = score_seconds(params, pts, bandwidth) if t.scores and pts.op.startswith("path:") else None
    near = pts if near_applies(params, t, pts.op) else None
    return combined(params, t, t_fixed, added, t_compute, t_memory, serial, waves, scores, near)


def near_applies(params: dict, terms: Terms, op: str) -> bool:
    """Whether a fit's `near` correction acts on op class `op` (a projection, with a table)."""
    return terms.near and op in PROJECTIONS and bool(params.get("near"))


def combined(params: dict, terms: Terms, fixed, added, compute, memory, serial, waves=None, scores=None, near=None):
    """The one way a fit's parts make a time: the fixed and added seconds, then compute and memory
    as the fit combines them (overlapped, the larger; added, with `sum`; with `pipe` and `waves`,
    the tiles each SM runs in turn, of one tile the lesser side exposed), at least the serial
    seconds; then a whole path's unfused `scores`, and the `near` factor at Points `near`.
    `predict` gives it each point's parts; a launch of several rows (steps.PathLaunches) their
    sums, its waves and near factor at the launch's summed shape."""
    if waves is not None:
        busy = np.maximum(compute, memory) + np.minimum(compute, memory) / waves
    else:
        busy = compute + memory if terms.sum else np.maximum(compute, memory)
    t = fixed + added + np.maximum(busy, serial)
    if scores is not None:
        t = t + scores
    if near is not None:
        t = t * near_factor(params["near"], near)
    return t


# `dgtile`: the tile DeepGEMM's SM90 heuristic gives an fp8 GEMM with 1D2D (per-128 block)
# scales and a bf16 output (deepseek-ai/DeepGEMM, csrc/jit_kernels/heuristics/common.hpp,
# get_best_config, commit 02edd319; the SM90ArchSpec of csrc/jit_kernels/heuristics/sm90.hpp of
# the same v2 series): block_m from 64, 128, 256 (and 16, 32 where m <= 16, 32), block_n from
# 16 to 256 in 16s, where a 1D2D block_n above 128 must be 144, 160 or 192 and block_m and
# block_n are not both above 128; of those the fewest waves over the SMs, then the fullest last
# wave, then (a tie) the smaller block_m or block_n of the same other side, or the larger
# block_n where both differ and neither passes the shape. The kernel is persistent: each SM
# runs its tiles one after another.
DG_BLOCK_M = (64, 128, 256)
DG_BLOCK_N = tuple(range(16, 257, 16))
DG_WIDE_N = (144, 160, 192)  # the 1D2D block_n above 128 the heuristic allows
GEMM_OPS = ("kv_expand", "indexer_proj", "indexer_key")  # one GEMM per launch (no batch of heads)
_DG_CACHE: dict[tuple[int, int, int], tuple[int, int]] = {}


def deepgemm_tile(m: int, n: int, sm_count: int) -> tuple[int, int]:
    """(block_m, block_n) DeepGEMM's SM90 heuristic picks for an m x n fp8 GEMM (see above)."""
    key = (m, n, sm_count)
    if key not in _DG_CACHE:
        block_ms = DG_BLOCK_M + tuple(b for b in (16, 32) if m <= b)
        best: tuple[int, int, int, int] | None = None  # block_m, block_n, waves, last-wave CTAs
        for bm in block_ms:
            for bn in DG_BLOCK_N:
                if (bn > 128 and bn not in DG_WIDE_N) or (bm > 128 and bn > 128):
                    continue
                blocks = -(-m // bm) * -(-n // bn)
                waves, last = -(-blocks // sm_count), blocks % sm_count or sm_count
                if best is None or waves < best[2]:
                    take = True
                elif waves > best[2]:
                    take = False
                elif last != best[3]:
                    take = last > best[3]
                else:
                    take = (
                        (bm == best[0] and bn < best[1])
                        or (bn == best[1] and bm < best[0])
                        or (bm != best[0] and bn > best[1] and bn <= n and bm <= m)
                    )
                if take:
                    best = (bm, bn, waves, last)
        assert best is not None
        _DG_CACHE[key] = best[:2]
    return _DG_CACHE[key]


def gemm_shape(pts: Points) -> tuple[np.ndarray, np.ndarray]:
    """A single GEMM's (m, n): rows (tokens) and output columns (kv_expand: H * (dC + dV))."""
    rows = np.asarray(_rows_and_ctas(pts)[0], dtype=np.float64)
    cols = pts.out_dim * (pts.heads if pts.op == "kv_expand" else 1.0)
    return rows, np.broadcast_to(np.asarray(cols, dtype=np.float64), rows.shape)


def deepgemm_tiles(pts: Points, sm_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(m, n, block_m, block_n) of each point, the blocks by `deepgemm_tile`."""
    rows, cols = gemm_shape(pts)
    m = np.maximum(np.round(np.ravel(rows)), 1).astype(np.int64)
    n = np.maximum(np.round(np.ravel(cols)), 1).astype(np.int64)
    shapes, back = np.unique(np.stack([m, n], axis=1), axis=0, return_inverse=True)
    tiles = np.array([deepgemm_tile(int(a), int(b), sm_count) for a, b in shapes], dtype=np.float64)
    picked = tiles[np.reshape(back, -1)]
    return rows, cols, picked[:, 0].reshape(rows.shape), picked[:, 1].reshape(rows.shape)


def tile_model(pts: Points, terms, sm_count: int | None, tile: int = TILE_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """(padded work over work, CTAs) of one launch: the query rows padded to whole tiles and the
    CTAs of `_rows_and_ctas`, or with `dgtile` for a single GEMM DeepGEMM's blocks: both sides
    padded to whole block_m x block_n tiles, one CTA a tile."""
    if Terms.of(terms).dgtile and pts.op in GEMM_OPS and sm_count:
        m, n, bm, bn = deepgemm_tiles(pts, sm_count)
        mb, nb = np.ceil(m / bm), np.ceil(n / bn)
        return mb * bm * nb * bn / np.maximum(m * n, 1.0), mb * nb
    rows, ctas = _rows_and_ctas(pts, tile)
    with np.errstate(divide="ignore", invalid="ignore"):
        pad = np.where(rows > 0, np.ceil(rows / tile) * tile / rows, 1.0)
    return pad, ctas


def tile_waves(pts: Points, terms, sm_count: int, smooth: bool = False) -> np.ndarray:
    """`pipe`: the tiles each SM runs one after another (waves of CTAs over the SMs), at least
    one: a launch of no rows (0 CTAs) is one wave, not a division of its 0 seconds by 0."""
    ctas = tile_model(pts, terms, sm_count)[1]
    return np.maximum(_whole(np.where(np.isfinite(ctas), ctas, 1.0) / sm_count, smooth), 1.0)


def topk_rows(pts: Points) -> tuple[np.ndarray, np.ndarray]:
    """`rowsel`: (rows of a request that select, their mean causal context). Query i of n after p
    cached ones sees p + i keys; the first m = clip(top-k - p, 0, n) see at most top-k and keep
    them all, the other n - m select, seeing p + (m + 1 + n) / 2 keys on average."""
    n = np.asarray(pts.new, dtype=np.float64)
    p = np.asarray(pts.context, dtype=np.float64) - n
    k = np.asarray(pts.slots, dtype=np.float64)
    m = np.clip(k - p, 0.0, n)
    return n - m, p + (m + 1.0 + n) / 2.0


def topk_passes(pts: Points, terms=()) -> np.ndarray:
    """`reread`: the passes a top-k CTA makes over memory for its row's logits: it reads them
    twice (a coarse histogram, then the threshold pass), the second time from its SM's L1 where
    the row (its walked keys' fp32 logits) fits in the L1 the kernel's shared memory leaves
    (TOPK_L1_BYTES), else from memory again."""
    keys = np.asarray(walked_keys(pts, terms), dtype=np.float64)
    return np.where(keys * LOGIT_BYTES > TOPK_L1_BYTES, 2.0, 1.0)


def topk_l2_gain(params: dict, terms, pts: Points, once) -> np.ndarray:
    """`l2` on a top-k: params["l2_gain"] where the logits one chunk of the launch reads (`once`,
    the launch's bytes read once, over its chunks) fit in the GPU's L2 (params["l2_bytes"]),
    else 1. aiconfigurator times each chunk by replaying it on the same logits, so a chunk
    that fits finds them in L2."""
    once = np.asarray(once, dtype=np.float64)
    if not Terms.of(terms).l2 or pts.op != "topk" or not params.get("l2_bytes"):
        return np.ones(once.shape)
    chunks = np.ones(once.shape)
    if Terms.of(terms).chunk and params.get("logits_budget_bytes"):
        chunks = logit_chunks(pts, params["logits_budget_bytes"])[1]
    return np.where(once / chunks <= params["l2_bytes"], params["l2_gain"], 1.0)


def logits_budget(memory_bytes: float | None) -> float | None:
    """`chunk`: the bytes of fp32 logits SGLang's indexer holds at once on a GPU of this memory."""
    return None if not memory_bytes else LOGITS_FREE_FRACTION * float(memory_bytes)


def logit_chunks(pts: Points, budget: float) -> tuple[np.ndarray, np.ndarray]:
    """`chunk`: (query rows a chunk, chunks) of a top-k launch whose logits are [batch x new rows,
    batch x context keys] fp32: one chunk below LOGITS_UNCHUNKED logits or within `budget`."""
    rows = np.asarray(pts.batch * pts.new, dtype=np.float64)
    keys = np.asarray(pts.batch * pts.context, dtype=np.float64)
    per = np.maximum(np.floor(budget / np.maximum(keys * LOGIT_BYTES, 1.0)), 1.0)
    whole = (rows * keys < LOGITS_UNCHUNKED) | (per >= rows)
    per = np.where(whole, rows, per)
    return per, np.where(rows > 0, np.ceil(rows / np.maximum(per, 1.0)), 1.0)


def chunk_seconds(params: dict, pts: Points, sm_count: int) -> np.ndarray:
    """`chunk`: t_seq per row and sequence of each chunk, over the SMs; a launch in one chunk has
    its requests' sequences, a chunked one makes each row its own (so a chunk of r rows costs
    t_seq r^2 / SMs); each chunk after the first is a launch with its own t_fixed."""
    per, chunks = logit_chunks(pts, params["logits_budget_bytes"])
    rows = np.asarray(pts.batch * pts.new, dtype=np.float64)
    last = rows - (chunks - 1) * per
    pairs = np.where(chunks > 1, (chunks - 1) * per * per + last * last, rows * pts.batch)
    return params["t_seq_s"] * pairs / sm_count + params.get("t_fixed_s", 0.0) * (chunks - 1)


def walked_keys(pts: Points, terms=()) -> np.ndarray:
    """Keys one CTA walks: its requests' context. The indexer's CTA holds INDEXER_TILE_ROWS rows
    of tokens packed across requests, so with fewer tokens a request than it holds it spans
    ceil(tokens it holds / new) requests (at most the batch) and walks all their keys. With
    `rowsel` a top-k row walks its own causal context, the selecting rows' mean (topk_rows)."""
    terms = Terms.of(terms)
    ctx = np.asarray(pts.context, dtype=np.float64)
    if pts.op == "topk" and terms.rowsel and pts.slots is not None:
        return topk_rows(pts)[1]
    if pts.op != "indexer" or pts.index_heads is None:
        return ctx
    per_cta = INDEXER_TILE_ROWS / np.asarray(pts.index_heads, dtype=np.float64)
    spans = np.minimum(np.ceil(per_cta / np.maximum(pts.new, 1.0)), np.maximum(pts.batch, 1.0))
    return ctx * np.maximum(spans, 1.0)


def walked(pts: Points, terms) -> Points:
    """A sparse attention's work as its kernel does it (other op classes, or neither term: as is).

    `reuse`: the queries of one request select their rows from the same n + p cached ones, so a
    row that several of them select is read from memory once and from L2 after: the cache bytes
    are the request's distinct rows, at most min(n + p, the rows its queries select), not one
    read per selection as cost.py counts (an upper bound). flash_mla_sparse_fwd at 64 heads takes
    0.49 us per query token with 2,048 rows on an H100 as on an H200 (aiconfigurator 0.12); read
    once per query, those rows alone would need 4.8 TB/s, over the H100's 3.35.
    `slots`: the kernel walks every one of a query's top-k index slots, the ones that point at no
    key (a context shorter than top-k: index -1) as well as the others, so its FLOPs and KV
    iterations per query are top-k keys', not min(top-k, context)'s: on an H200, 128 query tokens
    take 63-65 us whether they select 128 keys or 2,048.

    Applying it twice changes nothing."""
    terms = Terms.of(terms)
    if pts.op != "sparse_attention" or not (terms.slots or terms.reuse):
        return pts
    ctx = np.asarray(pts.context, dtype=np.float64)
    flops, nbytes = np.asarray(pts.flops, dtype=np.float64), np.asarray(pts.bytes, dtype=np.float64)
    if terms.reuse and pts.pool is not None:
        cache = np.asarray(pts.cache_bytes, dtype=np.float64)
        selected = pts.batch * pts.new * ctx  # rows read, one per selection
        with np.errstate(divide="ignore", invalid="ignore"):
            row = np.where(selected > 0, cache / selected, 0.0)
        distinct = pts.batch * np.minimum(np.asarray(pts.pool, dtype=np.float64), pts.new * ctx) * row
        nbytes = nbytes - cache + np.minimum(distinct, cache)
    if terms.slots and pts.slots is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.where(ctx > 0, np.maximum(np.asarray(pts.slots, dtype=np.float64) / ctx, 1.0), 1.0)
        flops, ctx = flops * f, ctx * f
    return replace(pts, flops=flops, bytes=nbytes, context=ctx, slots=None, pool=None)


def added_seconds(
    params: dict, terms, pts: Points, bandwidth: float, sm_count: int | None, smooth: bool = False
) -> np.ndarray:
    """Seconds each point adds outside the overlapped roofline: per-request setup, the combine
    launch after a split, a pass over the activations (quant) or over the cache keys (kvcast), a
    top-k's setup and index writes (apart)."""
    terms = Terms.of(terms)
    pts = walked(pts, terms)
    out = np.zeros(np.shape(pts.flops))
    if terms.request:  # per-request setup (page table, scheduling), not overlapped
        out = out + params["t_request_s"] * pts.batch
    if terms.combine and terms.split and sm_count and pts.op in MQA_CLASSES:
        tile = _tile(pts.op, terms)
        _, ctas = _rows_and_ctas(pts, tile)  # a split launch is followed by a combine kernel
        out = out + params["t_combine_s"] * (_splits(pts, ctas, sm_count, tile, terms.fa3split) > 1)
    if terms.kvcast and pts.op in ATTENTION_CLASSES:
        out = out + pts.cache_bytes / (params["eta_x"] * bandwidth)
    if terms.qrow and pts.op in ATTENTION_CLASSES:
        out = out + params["t_row_s"] * pts.batch * pts.new * pts.heads
    if terms.quant and pts.op in PROJECTIONS:
        out = out + quant_seconds(params, pts, bandwidth)
    if terms.chunk and pts.op == "topk" and sm_count and params.get("logits_budget_bytes"):
        out = out + chunk_seconds(params, pts, sm_count)
    if terms.apart and terms.serial and pts.op == "topk" and sm_count:
        _, ctas = walking_ctas(pts, terms, sm_count, _tile(pts.op, terms))
        waves = walking_waves(pts, terms, ctas, 1.0, sm_count, smooth)
        out = setup_seconds(params, terms, pts, waves, sm_count, smooth, to=out)
    if terms.align and pts.op in PROJECTIONS:  # rows not a multiple of ALIGN_ROWS: a padded copy
        out = out + params["t_align_s"] * (np.mod(_rows_and_ctas(pts)[0], ALIGN_ROWS) != 0)
    return out


def memory_eta(params: dict, terms, op: str, launch_bytes) -> np.ndarray:
    """The memory efficiency of a launch moving `launch_bytes`: eta_m, or with `l2` eta_m * l2_gain
    (at least 1: an L2 is no slower than HBM) where the launch's tensors fit in the GPU's L2
    (params["l2_bytes"], kept by the fit, not fitted) and a timing that repeats the call finds them
    there. Projections only."""
    nbytes = np.asarray(launch_bytes, dtype=np.float64)
    if not Terms.of(terms).l2 or op not in PROJECTIONS or not params.get("l2_bytes"):
        return np.full(nbytes.shape, params["eta_m"])
    gain = np.where(nbytes <= params["l2_bytes"], params["l2_gain"], 1.0)
    return params["eta_m"] * gain


def score_seconds(params: dict, pts: Points, bandwidth: float) -> np.ndarray:
    """`scores`: a kernel that is not fused (the torch twins) writes the fp32 scores, the softmax
    reads and writes them and the value product reads them: 4 passes over batch x new x keys x
    heads fp32 values, at eta_s of the bandwidth, not overlapped."""
    return 4 * 4 * pts.batch * pts.new * pts.context * pts.heads / (params["eta_s"] * bandwidth)


def near_features(pts: Points) -> np.ndarray:
    """Where a projection's shape lies for `near`: log2 rows, log2 heads, and whether the rows are
    unaligned (a different kernel path: an unaligned shape's neighbours are unaligned ones)."""
    rows = np.asarray(_rows_and_ctas(pts)[0], dtype=np.float64)
    heads = np.broadcast_to(np.asarray(pts.heads, dtype=np.float64), rows.shape)
    return np.stack(
        [np.log2(np.maximum(rows, 1.0)), np.log2(np.maximum(heads, 1.0)), (np.mod(rows, ALIGN_ROWS) != 0) * 1.0],
        axis=-1,
    ).reshape(-1, 3)


def near_table(params: dict, terms, pts: Points, peak: float, bandwidth: float, sm_count: int | None) -> dict:
    """The residuals `near` corrects with: each measured point's features and log(predicted /
    measured) under the parametric part of the fit (the terms less `near`)."""
    plain = Terms.of(terms).without("near")
    pred = predict(params, plain, pts, peak, bandwidth, sm_count)
    return {
        "features": np.round(near_features(pts), 6).tolist(),
        "log_residual": np.round(np.log(pred / np.asarray(pts.time_s)), 6).tolist(),
    }


# near_factor's answers per residual table, by feature row: a search (a crossover, a window)
# asks the same shapes again and again. Each entry holds its table, so an id is never reused
# while cached; at most NEAR_TABLES tables are kept, the oldest dropped first.
NEAR_TABLES = 32
NEAR_KNOWN = 1 << 18  # feature rows kept per table (a table past it starts again: a few MB at most)
_near_cache: dict[int, tuple[dict, dict[bytes, float]]] = {}


def _near_known(table: dict) -> dict[bytes, float]:
    entry = _near_cache.get(id(table))
    if entry is None or entry[0] is not table:
        while len(_near_cache) >= NEAR_TABLES:
            del _near_cache[next(iter(_near_cache))]
        entry = _near_cache[id(table)] = (table, {})
    return entry[1]


def near_factor(table: dict, pts: Points, chunk: int = 2048) -> np.ndarray:
    """exp(-median residual) of the NEAR_K nearest measured points within NEAR_RADIUS (those
    only); 1 where none is that near. Feature rows already answered for this table are not
    searched again."""
    x = np.asarray(table["features"], dtype=np.float64)
    r = np.asarray(table["log_residual"], dtype=np.float64)
    unique, back = np.unique(near_features(pts), axis=0, return_inverse=True)  # a grid repeats shapes
    known = _near_known(table)
    keys = [row.tobytes() for row in unique]
    factors = np.array([known.get(key, np.nan) for key in keys])
    todo = np.flatnonzero(np.isnan(factors))
    f = unique[todo]
    out = np.ones(len(f))
    k = min(NEAR_K, len(x))
    for start in range(0, len(f), chunk):
        part = f[start : start + chunk]
        d = np.sqrt(((part[:, None, :] - x[None, :, :]) ** 2).sum(axis=2))
        idx = np.argpartition(d, k - 1, axis=1)[:, :k]
        near = np.take_along_axis(d, idx, axis=1) <= NEAR_RADIUS
        res = np.where(near, r[idx], np.nan)
        with warnings.catch_warnings():  # a row with no near neighbour: all-NaN median, factor 1
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(res, axis=1)
        out[start : start + chunk] = np.where(np.isfinite(med), np.exp(-med), 1.0)
    factors[todo] = out
    if len(known) + len(todo) > NEAR_KNOWN:
        known.clear()
    known.update(zip((keys[i] for i in todo[:NEAR_KNOWN]), out.tolist()))
    out = factors[np.reshape(back, -1)]
    shape = np.shape(np.asarray(_rows_and_ctas(pts)[0]))
    return out.reshape(shape) if shape else out[0]


def quant_seconds(params: dict, pts: Points, bandwidth: float) -> np.ndarray:
    """A pass over the activations before the GEMM (per-token fp8 quantisation): their bf16
    bytes at eta_q of the bandwidth. Activation elements from cost.py's FLOPs: a GEMM of F
    FLOPs writing out_dim per row (per head for the BMMs) reads F / (2 out_dim) of them."""
    per_row_out = pts.out_dim * np.where(pts.op == "kv_expand", pts.heads, 1.0)
    return pts.flops / (2 * per_row_out) * 2 / (params["eta_q"] * bandwidth)


def walking_ctas(pts: Points, terms, sm_count: int | None, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """(pad, CTAs) of a launch (tile_model); with `rowsel` a top-k's CTAs are its selecting rows."""
    pad, ctas = tile_model(pts, terms, sm_count, tile)
    if Terms.of(terms).rowsel and pts.op == "topk" and pts.slots is not None:  # a CTA a selecting row
        ctas = pts.batch * topk_rows(pts)[0]
    return pad, ctas


def walking_waves(pts: Points, terms, ctas, splits, sm_count: int, smooth: bool = False) -> np.ndarray:
    """`serial`: waves of walking CTAs (split pieces included) over the SMs; with `rowsel` a top-k
    launch in which no row selects walks no wave."""
    finite = np.isfinite(ctas) & (ctas > 0)
    waves = _whole(np.where(finite, ctas, 1.0) * splits / sm_count, smooth)
    if Terms.of(terms).rowsel and pts.op == "topk":
        waves = np.where(ctas > 0, waves, 0.0)
    return waves


def setup_seconds(params: dict, terms, pts: Points, waves, sm_count: int, smooth: bool = False, to=0.0):
    """`to` plus `ctawave`'s t_cta a wave of walking CTAs and `rowwave`'s t_rowwave a wave of all
    a top-k's rows (added in that order: a fit's rounding, and so its path, stays as it was)."""
    terms = Terms.of(terms)
    out = to + np.zeros(np.shape(waves))
    if terms.ctawave and pts.op in WALKERS:  # each wave's CTAs set up before they walk
        out = out + params["t_cta_s"] * waves
    if terms.rowwave and pts.op == "topk":  # every row writes its indices
        out = out + params["t_rowwave_s"] * _whole(pts.batch * pts.new / sm_count, smooth)
    return out


def _whole(x, smooth: bool):
    """ceil(x), or with `smooth` x itself (at least 1): a count of tiles, waves or blocks, or its
    continuous stand-in."""
    return np.maximum(x, 1.0) if smooth else np.ceil(x)


def components(
    params: dict, terms, pts: Points, peak: float, bandwidth: float, sm_count: int | None, smooth: bool = False
):
    """(t_fixed, compute seconds, memory seconds, serial seconds) of each point: the parts
    `predict` combines, kept apart so a batch of requests in one launch can add them up.
    `smooth`: counts continuous (see `predict`)."""
    terms = Terms.of(terms)
    pts, key_block = head_padded(params, terms, walked(pts, terms))
    flops = np.asarray(pts.flops, dtype=np.float64)
    nbytes = np.asarray(pts.bytes, dtype=np.float64)
    serial = np.zeros_like(flops)
    attention = pts.op in ATTENTION_CLASSES
    tile = _tile(pts.op, terms)
    if attention and terms.kvpad:  # the cache is read in whole KV blocks (pages) per request
        padded = pts.context if smooth else np.ceil(pts.context / tile) * tile
        with np.errstate(divide="ignore", invalid="ignore"):
            nbytes = nbytes + np.where(pts.context > 0, pts.cache_bytes * (padded / pts.context - 1), 0.0)
    if terms.rowsel and pts.op == "topk" and pts.slots is not None:  # the selecting rows' pairs only
        rows, mean = topk_rows(pts)
        chosen = pts.batch * rows * mean
        nbytes = nbytes + (chosen - flops) * LOGIT_BYTES  # cost.py: one FLOP and one logit read a pair
        flops = chosen
    gain = topk_l2_gain(params, terms, pts, nbytes)  # 1 without `l2` (and for any other op class)
    if terms.reread and pts.op == "topk":  # the threshold pass reads a row that passes the L1 again
        nbytes = nbytes + (topk_passes(pts, terms) - 1.0) * flops * LOGIT_BYTES
    if terms.pad or terms.waves or terms.split or terms.serial:
        pad, ctas = walking_ctas(pts, terms, sm_count, tile)
        if terms.pad and not smooth:
            flops = flops * pad
        finite = np.isfinite(ctas) & (ctas > 0)
        s = np.ones_like(flops)
        if sm_count and terms.split:
            s = _splits(pts, ctas, sm_count, tile, terms.fa3split, smooth)
            # each piece writes an fp32 partial output and lse per (token, head); the merge reads them
            nbytes = nbytes + np.where(s > 1, 2 * s * pts.batch * pts.new * pts.heads * (pts.out_dim * 4 + 4), 0.0)
        if sm_count and terms.waves:  # the split pieces are CTAs too
            c = np.where(finite, ctas * s, 1.0)
            util = np.where(finite, c / (_whole(c / sm_count, smooth) * sm_count), 1.0)
            flops = flops / util
        if sm_count and terms.serial and (attention or pts.op in WALKERS):
            waves = walking_waves(pts, terms, ctas, s, sm_count, smooth)
            iters = _whole(walked_keys(pts, terms) / (s * (key_block or tile)), smooth)
            serial = params["t_iter_s"] * waves * iters / gain  # the walk reads the logits
            if not (terms.apart and pts.op == "topk"):  # else added (added_seconds)
                serial = setup_seconds(params, terms, pts, waves, sm_count, smooth, to=serial)
    if terms.ops and pts.op.startswith("path:") and pts.attn_flops is not None:
        # the path's ops run one after another: attention at eta_c, the rest (projections,
        # merge) at eta_p, each its own roofline (or sum, with `sum`), added; returned as compute
        combine = np.add if terms.sum else np.maximum
        fa, ba = np.asarray(pts.attn_flops, dtype=np.float64), np.asarray(pts.attn_bytes, dtype=np.float64)
        em = params["eta_m"] * bandwidth
        t_ops = combine(fa / (params["eta_c"] * peak), ba / em) + combine(
            (flops - fa) / (params["eta_p"] * peak), (nbytes - ba) / em
        )
        return params.get("t_fixed_s", 0.0), t_ops, np.zeros_like(t_ops), serial
    # roofline_time with only one side non-zero gives each side alone
    t_compute = roofline_time(flops, 0.0, params["eta_c"] * peak, 1.0)
    t_memory = roofline_time(0.0, nbytes, 1.0, params["eta_m"] * bandwidth)
    if terms.l2 and pts.op in PROJECTIONS:
        t_memory = nbytes / (memory_eta(params, terms, pts.op, pts.bytes) * bandwidth)
    if terms.l2 and pts.op == "topk":
        t_memory = t_memory / gain
    return params.get("t_fixed_s", 0.0), t_compute, t_memory, serial
