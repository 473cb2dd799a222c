"""vLLM's rule: its params type, resolved for a context, and its path rule, vectorised over
requests and over scheduler steps.

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

from dataclasses import dataclass

import numpy as np

from mlactl.decide.engines.params import DSA_PATH_NAMES, Context, EngineParams, Swept, as_rows
from mlactl.decide.engines.rulesets import VLLMDSA, RuleSet, VLLMBackend
from mlactl.util.errors import MlactlError

EXPAND, CHUNKED = "expand", "expand_chunked"
SPARSE, DENSE, MASKED = "sparse_absorb", "dense_expand", "masked_expand"
# Requests of one call expanded from their counts at most (a row of `count` alike requests is
# that many requests, and the reorder moves each one): 8M requests is ~0.5 GB of int64 arrays.
MAX_REQUESTS = 1 << 23
# vLLM's determine_chunked_prefill_workspace_size caps the context workspace at 64K tokens.
VLLM_WORKSPACE_CAP = 64 * 1024
REORDER = {3: "decode, extend, no-context prefill", 4: "decode, short extend, long extend, no-context prefill"}
PCP_NOTE = "prefill context parallelism: short extends still prefilling are prefills"
SPLIT = {
    "varlen": "requests of at most {t} new tokens with context are decodes until the first longer one",
    "uniform": "decodes are the leading requests whose query length equals the first's (at most {t})",
    "single": "only one-token queries are decodes",
}


@dataclass(frozen=True)
class VLLMParams(EngineParams, family="vllm"):
    """vLLM's rule resolved: `backend` runs every batch, `threshold` is its decode threshold in
    force; the split's query-length support, the context workspace and block; a DSA model's
    dense and masked MHA."""

    query_len: str = ""  # single | uniform | varlen
    workspace: int = 0  # context tokens expanded at once, over all prefills with context
    block: int = 0  # KV block, the unit the context chunk rounds down to
    short_extends_as_decodes: bool = True  # False under prefill context parallelism
    # DSA: prefills may run MHA (dense up to topk, masked from the table's row)
    mha: bool = False
    masked_row: tuple | None = None  # least query length per bucket (None: never), or no row
    masked_ok: bool = False  # masked MHA available here (architecture, cache dtype, dims, no DCP)

    @classmethod
    def build(cls, name: str, rs: RuleSet, values: dict, given: tuple[str, ...], ctx: Context, fixed: dict):
        dsa: VLLMDSA | None = rs.dsa if ctx.model_kind == "dsa" else None  # type: ignore[assignment]
        why: list[str] = []
        arch = ctx.arch
        if values["backend"] is not None:
            b = _set_backend(rs, ctx, values["backend"].upper())
            reason = "set" if dsa else ""
        else:
            if arch not in rs.priorities:
                why.append(f"no vllm default is known for {arch or ctx.hardware}; the sm90 priorities are assumed")
                arch = "sm90"
            b, reason = _default(rs, ctx, arch, values["decode_context_parallel_size"], dsa is not None, why)
        notes: list[str] = []
        t = _decode_threshold(
            values, b, values["reorder_batch_threshold"] or builder_threshold(b, arch, ctx.heads), notes
        )
        block = values["block_size"] or b.block
        workspace = _workspace(rs, values, ctx, block, sparse=dsa is not None)
        pcp = values.get("prefill_context_parallel_size", 1) > 1
        head = b.name if reason else f"{b.name} (set)"
        what = "every token sparse MQA" if dsa and not dsa.mha else f"threshold {t}"
        first = f"{rs.name} {ctx.where} → {head} ({what})" + (f": {reason}" if reason else "")
        if dsa:
            lines, fields = _dsa_rule(rs, dsa, values, ctx, arch, b, t, workspace, block)
            lines += [PCP_NOTE] if pcp and dsa.mha else []
        else:
            lines, fields = [PCP_NOTE] if pcp else [], {}
            lines.append(
                _split_line(rs, b, t, "after the reorder, ")
                + f"; context expands in chunks of the {workspace:,}-token workspace over the prefills with context, "
                f"rounded down to the {block}-token block"
            )
        return cls(
            name,
            rs,
            values,
            given,
            ctx,
            (first, *why, *notes, *lines),
            backend=b.name,
            threshold=t,
            query_len=b.query_len,
            workspace=workspace,
            block=block,
            short_extends_as_decodes=not pcp,
            **fields,
        )

    @property
    def vllm_dsa(self) -> VLLMDSA:
        """The vLLM rule set's DSA data."""
        assert isinstance(self.ruleset.dsa, VLLMDSA), self.ruleset.name
        return self.ruleset.dsa

    def dsa_json(self) -> dict:
        row = self.masked_row
        return {
            "mha": self.mha,
            "dense_up_to": self.topk if self.mha else None,
            "masked_available": self.masked_ok,
            "masked_min_query_len": list(row) if row is not None else None,
            "masked_buckets": list(self.vllm_dsa.buckets) if row is not None else None,
        }

    @property
    def swept(self) -> Swept:
        return Swept("reorder_batch_threshold", self.threshold, None, "query_len", "a request's new tokens")

    def step_counts(self, new, prefix, count, step, decode) -> np.ndarray:
        """Per row of many steps: a [R, 3] count of the row's requests on each of self.paths (a row
        of alike requests can straddle the end of the decodes); `decode` marks the requests done
        prefilling."""
        rows = len(new)
        from_row = _expand_rows(count)
        paths = request_paths(self, new[from_row], prefix[from_row], step[from_row], decode[from_row])
        out = np.zeros((rows, 3), dtype=np.int64)
        for j, name in enumerate(self.paths):
            out[:, j] = np.bincount(from_row, weights=paths == name, minlength=rows).astype(np.int64)
        return out

    def grid_paths(self, batch, new, prefix) -> np.ndarray:
        """Each point a step of `batch` alike requests: all decodes when the query is at most the
        threshold (the longest query is, or they are uniform), else all prefills."""
        batch, new, prefix = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (batch, new, prefix)))
        if self.is_dsa:
            prefill = dsa_step_paths(self, batch, new, prefix + new, np.minimum(prefix, dsa_chunk(self)))
        else:
            prefill = np.where(prefix > 0, CHUNKED, EXPAND)
        return np.where(new <= self.threshold, self.decode_path, prefill)

    def chunk_sizes(self, prefills_with_context) -> np.ndarray:
        return context_chunk(self, np.maximum(np.asarray(prefills_with_context, dtype=np.int64), 1))


def _set_backend(rs: RuleSet, ctx: Context, backend: str) -> VLLMBackend:
    """The backend `--engine-option vllm.backend=...` names, refused (one line) where vLLM would
    not run it: a dense backend for a DSA model or a sparse one for a dense model, another
    architecture, a cache dtype it does not take."""
    b: VLLMBackend = rs.backends[backend]
    if b.sparse and ctx.model_kind != "dsa":
        raise MlactlError(
            f"{rs.name}: {backend} is a sparse MLA backend, for DSA models (DeepSeek-V3.2); "
            f"{ctx.model} is a dense MLA model"
        )
    if not b.sparse and ctx.model_kind == "dsa":
        sparse = ", ".join(c.name.lower() for c in rs.backends.values() if c.sparse)
        raise MlactlError(
            f"{rs.name}: {ctx.model} is a DSA model, which runs on a sparse MLA backend ({sparse}); "
            f"{backend.lower()} is not one"
        )
    if ctx.arch is not None and ctx.arch not in b.arch:
        raise MlactlError(
            f"{rs.name}: {backend} does not run on {ctx.hardware} ({ctx.arch}); it runs on {', '.join(b.arch)}"
        )
    if ctx.kv_dtype not in b.kv_dtypes:
        raise MlactlError(f"{rs.name}: {backend} takes no {ctx.kv_dtype} cache (it takes {', '.join(b.kv_dtypes)})")
    return b


def _default(rs: RuleSet, ctx: Context, arch: str, dcp: int, sparse: bool, why: list[str]) -> tuple[VLLMBackend, str]:
    """The backend vLLM picks on `arch` for the model's attention (sparse or dense), and why:
    check_and_update_config's forced sm100 default for dense MLA, else the first backend of
    cuda.py's priorities of the kind that runs on the architecture and takes the cache dtype
    (where none does, vLLM would not start: the rule of the first one is shown)."""
    kv = ctx.kv_dtype
    if arch == "sm100" and not sparse:
        if ctx.qk_nope_head_dim == 128 and dcp == 1:
            name, reason = "FLASHINFER_MLA", "forced on sm100 (qk_nope_head_dim 128, DCP off)"
        else:
            name, reason = "CUTLASS_MLA", "sm100 with DCP or qk_nope_head_dim != 128"
        if not rs.defaults_confirmed:
            why.append(f"sm100 default {name} not confirmed at this commit (docs/engines.md)")
        return rs.backends[name], reason
    kind = [c for c in (rs.backends[n] for n in rs.priorities[arch]) if c.sparse == sparse]
    here = [c for c in kind if arch in c.arch]
    fit = [c for c in here if kv in c.kv_dtypes]
    if sparse:
        if fit:
            return fit[0], f"the first sparse backend in cuda.py's {arch} priorities that runs here with a {kv} cache"
        shown = (kind or [c for c in rs.backends.values() if c.sparse])[0]
        return shown, f"no vLLM sparse MLA backend runs on {arch} with a {kv} cache (vLLM would not start); shown"
    skipped = here[: here.index(fit[0])] if fit else here
    if not fit:  # vLLM would refuse to start; show the rule it has for a 16-bit cache
        why.append(f"no vLLM MLA backend on {arch} takes a {kv} cache (vLLM would not start); {here[0].name} shown")
    passed = ", ".join(f"{c.name} takes no {kv} cache" for c in skipped)
    return (fit or here)[0], f"first {arch} priority that takes a {kv} cache" + (f"; {passed}" if passed else "")


def builder_threshold(b: VLLMBackend, arch: str | None, heads: int) -> int:
    """The backend's builder's decode threshold: a sparse builder's for `heads` query heads per
    GPU on `arch`, else its one threshold."""
    for where, pairs, other in b.heads_thresholds:
        if where in (arch, "*"):
            return dict(pairs).get(heads, other)
    return b.threshold


def _decode_threshold(values: dict, b: VLLMBackend, t: int, notes: list[str]) -> int:
    """The decode threshold in force from `t` (the backend's or the one set): raised to hold a
    speculative step (1 + k, or 1 + 2k with parallel drafting) where the backend takes more than
    one-token queries, and 1 under DCP on a backend without DCP varlen; each change noted."""
    k = values["num_speculative_tokens"]
    if k and b.query_len != "single":
        spec = 1 + (2 if values["parallel_drafting"] else 1) * k
        if spec > t:
            notes.append(f"speculation: threshold max({t}, {spec}) = {spec}")
        t = max(t, spec)
    dcp = values["decode_context_parallel_size"]
    if dcp > 1 and not b.dcp_varlen and t != 1:
        notes.append(f"DCP {dcp} on a backend without DCP varlen: threshold 1")
        t = 1
    return t


def _workspace(rs: RuleSet, values: dict, ctx: Context, block: int, sparse: bool) -> int:
    """Context tokens vLLM expands at once: MLACommonMetadataBuilder's
    determine_chunked_prefill_workspace_size (rounded up to the block from 0.33,
    align_mla_chunked_context_workspace_size), or the sparse builder's, also capped at
    max_num_seqs x index_topk (SparseMLACommonMetadataBuilder)."""
    L = values["max_model_len"] or ctx.max_model_len
    seqs = values["max_num_seqs"]
    if sparse:
        return max(min(max(8 * L, 4 * seqs * block), VLLM_WORKSPACE_CAP, seqs * ctx.index_topk), block)
    workspace = max(min(max(8 * L, 4 * seqs * block), VLLM_WORKSPACE_CAP), seqs * block)
    if rs.workspace_round_up:  # align_mla_chunked_context_workspace_size
        workspace = -(-workspace // block) * block
    return workspace


def _split_line(rs: RuleSet, b: VLLMBackend, t: int, uniform: str = "") -> str:
    """How the backend's batch is reordered and split into decodes (`uniform`: said before the
    uniform split)."""
    split = (uniform if b.query_len == "uniform" else "") + SPLIT[b.query_len].format(t=t)
    return f"{b.name} ({b.query_len}): the batch is reordered {REORDER[rs.reorder_regions]}; {split}"


def _dsa_rule(rs: RuleSet, d: VLLMDSA, values, ctx: Context, arch, b: VLLMBackend, t, workspace, block):
    """The DSA rule's lines and fields: decodes sparse; a step's prefills dense, masked or sparse
    MHA, where the release has MHA for sparse models (MLAAttention.forward_impl)."""
    kv, dcp = ctx.kv_dtype, values["decode_context_parallel_size"]
    force = values.get("sparse_mla_force_mqa", False)
    mha = d.mha and not force
    row = d.masked.get(b.name, {}).get(ctx.tp)
    dims = (ctx.heads * ctx.tp, ctx.kv_lora_rank, ctx.qk_nope_head_dim, ctx.qk_rope_head_dim, ctx.v_head_dim)
    off = _masked_off(d, arch, kv, dims, dcp, row, b.name, ctx.tp)
    masked_ok = mha and off is None
    fields = dict(
        paths=DSA_PATH_NAMES,
        mha=mha,
        masked_row=row if masked_ok else None,
        masked_ok=masked_ok,
        topk=ctx.index_topk,
        dense_indexer=d.dense_indexer,
    )
    if not d.mha:
        return [
            f"{b.name}: every token runs the sparse MQA (sparse_absorb): MLAAttention.forward_impl sends a "
            "sparse impl's whole batch to forward_mqa"
        ], fields
    lines = [_split_line(rs, b, t) + "; decodes run the sparse MQA (sparse_absorb)"]
    if force:
        return [*lines, "sparse_mla_force_mqa: every prefill runs the sparse MQA too"], fields
    masked = (
        "masked MHA (masked_expand) when their longest query reaches "
        + ", ".join(f"{'never' if m is None else m} (seq <= {s:,})" for m, s in zip(row or (), d.buckets))
        + f" (TP {ctx.tp}) and their top-k masks fit the workspace, "
    )
    lines.append(
        f"a step's prefills run dense MHA (dense_expand) when their longest sequence is at most "
        f"{ctx.index_topk:,} (use_dense_mha), "
        + (masked if masked_ok else "")
        + "else every token of the step runs the sparse MQA"
    )
    if off is not None:
        lines.append("no masked MHA: " + off)
    lines.append(
        f"context expands in chunks of the {workspace:,}-token workspace (the sparse builder's), "
        f"rounded down to the {block}-token block; the indexer runs in full on every path"
    )
    return lines, fields


def _masked_off(d: VLLMDSA, arch, kv, dims, dcp, row, backend, tp: int) -> str | None:
    """Why masked MHA never fires here (the first unmet condition of forward_impl's
    use_masked_mha), or None where it may."""
    if arch not in d.masked_archs:
        return f"it needs SM100 and FlashAttention 4 (_is_masked_mha_available), not {arch}"
    if kv not in d.masked_kv_dtypes:
        return f"it needs an unquantized cache, not {kv}"
    if dims != d.masked_dims:
        return "it needs DeepSeek-V3.2's dims (128 heads over all GPUs, 512/128/64/128)"
    if dcp > 1:
        return "decode context parallelism is on"
    if row is None:
        return f"_DSV32_MASKED_MHA_THRESHOLDS has no row for {backend} at TP {tp}"
    return None


def request_paths(p: VLLMParams, new, prefix, step=None, done=None) -> np.ndarray:
    """The path of each request of many steps (arrays of one entry per request, in the order
    the scheduler lists them; `step`: [N] int, the step of each, default all one; `done`: [N]
    bool, requests done prefilling, default one new token after a prefix)."""
    q, ctx, _, step, done = as_rows(new, prefix, None, step, done)
    n = len(q)
    if n == 0:
        return np.array([], dtype=str)
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
        prefill = dsa_prefill_paths(p, q, ctx, decode, sid, heads)
    else:
        prefill = np.where(ctx > 0, CHUNKED, EXPAND)
    paths = np.where(decode, p.decode_path, prefill)
    out = np.empty(n, dtype=paths.dtype)
    out[order[perm]] = paths
    return out


def masked_min_query(p: VLLMParams, seq) -> np.ndarray:
    """_use_masked_mha's least query length for a longest prefill sequence (its bucket's entry of
    the table row); -1 where masked MHA never runs (no row, no entry, or past the last bucket)."""
    seq = np.asarray(seq, dtype=np.int64)
    if p.masked_row is None:
        return np.full(seq.shape, -1, dtype=np.int64)
    buckets = np.asarray(p.vllm_dsa.buckets, dtype=np.int64)
    row = np.array([-1 if m is None else m for m in p.masked_row] + [-1], dtype=np.int64)
    return row[np.searchsorted(buckets, seq, side="left")]  # the first bucket >= seq


def mask_fits(p: VLLMParams, prefills, max_query, max_chunk) -> np.ndarray:
    """_masked_mha_workspace_fits: the bit-packed top-k masks of a step's prefills (prefills x
    the longest query rounded up to its tile x words of the longest key run) fit the workspace."""
    prefills, q, c = (np.asarray(a, dtype=np.int64) for a in (prefills, max_query, max_chunk))
    tile = np.where(q <= 128, 128, 256)
    words = -(-np.maximum(q, c) // 32)
    return prefills * (-(-q // tile) * tile) * words <= p.vllm_dsa.mask_words


def dsa_step_paths(p: VLLMParams, prefills, max_query, max_seq, max_chunk) -> np.ndarray:
    """The path of each step's prefills (arrays, one entry per step): dense_expand where the
    longest sequence is at most topk, masked_expand where masked MHA fires, else sparse_absorb."""
    if not p.mha:
        return np.full(np.shape(prefills), SPARSE)
    least = masked_min_query(p, max_seq)
    masked = (
        p.masked_ok & (least >= 0) & (np.asarray(max_query) >= least) & mask_fits(p, prefills, max_query, max_chunk)
    )
    return np.where(np.asarray(max_seq) <= p.topk, DENSE, np.where(masked, MASKED, SPARSE))


def dsa_chunk(p: VLLMParams) -> int:
    """The longest run of context keys one chunk of a prefill holds: the workspace rounded down
    to the block (build_mla_chunked_context_metadata's max_context_chunk)."""
    return max(p.workspace // p.block * p.block, p.block)


def dsa_prefill_paths(p: VLLMParams, q, ctx, decode, sid, heads) -> np.ndarray:
    """Requests in step order after the reorder: each step's prefills take one path, the path
    of the step (a decode's entry is its step's too; request_paths sends decodes to decode_path)."""
    prefill = ~decode
    chunk = dsa_chunk(p)  # a context chunk's longest run of keys

    def per_step(values, reduce=np.maximum):
        return reduce.reduceat(np.where(prefill, values, 0), heads)[sid]

    return dsa_step_paths(
        p,
        per_step(np.ones_like(q), np.add),
        per_step(q),
        per_step(q + ctx),
        per_step(np.minimum(ctx, chunk)),
    )


def _expand_rows(count: np.ndarray) -> np.ndarray:
    total = int(count.sum()) if len(count) else 0
    if total > MAX_REQUESTS:
        raise MlactlError(
            f"{total:,} requests in one vLLM batch; the reorder is followed request by request, "
            f"up to {MAX_REQUESTS:,} at once"
        )
    return np.repeat(np.arange(len(count)), count)


def context_chunk(p: VLLMParams, prefills_with_context) -> np.ndarray:
    """Context tokens per chunk and prefill: the workspace split evenly over the prefills with
    context, rounded down to the block (MLACommonMetadataBuilder.build); 0 where there are none."""
    m = np.asarray(prefills_with_context, dtype=np.int64)
    chunk = (p.workspace // np.maximum(m, 1)) // p.block * p.block
    # vLLM asserts a chunk of at least one block; mlactl keeps one block where it would be 0
    return np.where(m > 0, np.maximum(chunk, p.block), 0)
