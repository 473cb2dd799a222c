"""SGLang's rule: its params type, resolved for a context, and its path rule, vectorised over
batches and over scheduler steps.

SGLang judges a whole forward batch at once (attention_backend_handler.py): the scheduler runs a
step's decodes as one decode batch and its other requests as one extend batch (with
`--enable-mixed-chunk` the decodes join the extend batch), and the handler of the backend that
runs the batch picks one method for all of its requests from the batch's sums:

    sum_prefix  = sum of extend_prefix_lens (cached tokens)
    sum_seq     = sum of seq_lens (cached + new)
    tokens      = sum of extend_seq_lens (new tokens: what a piecewise CUDA graph captures)

Methods map onto mlactl's paths: MLA -> absorb, MHA_ONE_SHOT and MHA -> expand,
MHA_CHUNKED_KV -> expand_chunked.

A DSA model (DeepSeek-V3.2) runs on the dsa backend, whose handler reads the backend's own
decision (set_dsa_prefill_impl): an extend batch runs dense MHA (MHA_ONE_SHOT -> dense_expand)
when its longest sequence (max of seq_lens) is at most the dense threshold and its summed
sequences fit the chunk capacity, on SM90/SM100 with a bf16 or fp8_e4m3 cache and outside a
captured prefill graph; everything else, decodes included, runs MLA: the sparse MQA
(sparse_absorb).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mlactl.decide.engines.params import DSA_PATH_NAMES, Context, EngineParams, Swept, as_rows, is_decode
from mlactl.decide.engines.rulesets import Default, RuleSet, SGLangBackend, SGLangDSA
from mlactl.util.errors import MlactlError

ABSORB, EXPAND, CHUNKED = "absorb", "expand", "expand_chunked"
SPARSE, DENSE = "sparse_absorb", "dense_expand"
BACKEND_KEYS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
# options of the dense rules that the DSA ones never read
MLA_ONLY = (
    "chunked_prefix_cache_threshold",
    "disable_chunked_prefix_cache",
    "flashinfer_mla_disable_ragged",
    "enable_deterministic_inference",
    "enable_prefill_context_parallel",
)
# what an extend batch runs on each handler (dense MLA models), given the chunked prefix cache
# (`cpc`), its threshold and the one-shot capacity
_HANDLER_RULE = {
    "generic": "an extend batch whose summed prefix is 0{mha_from} expands {how}; other batches absorb",
    "fa3": "an extend batch whose summed prefix is 0{mha_from} expands {one_shot}; other batches absorb",
    "trtllm": "{trtllm}; decodes absorb",
    "fa4": "every batch runs chunked expand (handle_attention_fa4)",
    "aiter": "every extend batch runs MHA (expand, never chunked); decodes absorb",
    "triton": "an extend batch whose summed prefix is 0 expands (never chunked); others absorb",
}


@dataclass(frozen=True)
class SGLangParams(EngineParams, family="sglang"):
    """SGLang's rule resolved: `backend` runs the extend batches, `decode_backend` the decode
    batches; `threshold` is the summed prefix from which an extend expands (a DSA model's: the
    dense threshold, also `dense_threshold`)."""

    decode_backend: str = ""
    capacity: int = 0  # most summed tokens of a one-shot expand (DSA: of a dense one)
    chunked_prefix_cache: bool = True
    graph_max_tokens: int = 0  # 0 when the piecewise graph is off
    # DSA: dense MHA for an extend batch whose longest sequence is at most dense_threshold (and
    # the conditions dense_ok folds in: architecture, cache dtype, no DSA prefill CP)
    dense_threshold: int = 0
    dense_ok: bool = False
    json_backends = ("backend", "decode_backend")

    @classmethod
    def build(cls, name: str, rs: RuleSet, values: dict, given: tuple[str, ...], ctx: Context, fixed: dict):
        dsa: SGLangDSA | None = rs.dsa if ctx.model_kind == "dsa" else None  # type: ignore[assignment]
        why: list[str] = []
        for key in BACKEND_KEYS:  # a DSA model runs only on the dsa backend, a dense one never
            used = values[key]
            if used is None or (rs.backends[used].handler == "dsa") == (dsa is not None):
                continue
            if dsa:
                how = f"{name} fixes {key}={used}" if key in fixed else f"{key}={used}"
                raise MlactlError(
                    f"{rs.name}: {ctx.model} is a DSA model, which SGLang runs on its dsa backend (nsa before the "
                    f"rename); {how} has no sparse attention (select {rs.engine} and leave the backend to the rule)"
                )
            raise MlactlError(
                f"{rs.name}: {used} is the backend of DSA models (DeepSeek-V3.2); {ctx.model} is a dense MLA model"
            )
        backend = values["attention_backend"]
        if backend is not None:
            head = f"{backend} (set)"
        elif dsa:
            backend = dsa.backend
            head = f"{backend} (default for DSA models: server_args sets it when no backend is given)"
        else:
            d, note = _default(rs, ctx)
            backend = values["attention_backend"] = d.backend
            head = f"{backend} (default: {d.reason})"
            why += [note] if note else []
            if not d.confirmed:
                why.append(f"default {backend} not confirmed in the source (docs/engines.md)")
        prefill = values["prefill_attention_backend"] or backend
        decode = values["decode_attention_backend"] or backend
        arch = ctx.arch
        if dsa and arch is None:
            why.append("architecture unknown: taken as sm90 (SGLang checks the device's SM)")
            arch = "sm90"
        flag = next(k for k in rs.options if k.endswith("piecewise_cuda_graph"))
        # on by default on CUDA where the flag disables it; not confirmed for HIP
        graph = values[flag] if flag.startswith("enable") else not values[flag] and arch != "rocm"
        rule = _dsa_rule if dsa else _mla_rule
        lines, fields = rule(rs, values, given, ctx, arch, prefill, decode, flag, graph)
        first = f"{rs.name} {ctx.where} → {head}"
        if prefill != backend or decode != backend:
            first += f"; extends on {prefill}, decodes on {decode}"
        why = [first, *why, *lines]
        return cls(name, rs, values, given, ctx, tuple(why), backend=prefill, decode_backend=decode, **fields)

    @property
    def sglang_dsa(self) -> SGLangDSA:
        """The SGLang rule set's DSA data."""
        assert isinstance(self.ruleset.dsa, SGLangDSA), self.ruleset.name
        return self.ruleset.dsa

    @property
    def decode_info(self) -> SGLangBackend:
        return self.ruleset.backends[self.decode_backend or self.backend]

    @property
    def decode_path(self) -> str:
        """The path of a decode batch on the decode backend (every handler but fa4's returns MLA;
        a DSA model's decodes run the sparse MQA)."""
        if self.is_dsa:
            return SPARSE
        return CHUNKED if self.decode_info.handler == "fa4" else ABSORB

    def dsa_json(self) -> dict:
        return {"dense_threshold": self.dense_threshold, "dense_possible": self.dense_ok}

    @property
    def swept(self) -> Swept:
        if self.is_dsa:
            return Swept(
                self.sglang_dsa.threshold_option,
                self.dense_threshold,
                self.topk,
                "longest_sequence",
                "the longest sequence of an extend batch",
            )
        return Swept(
            "chunked_prefix_cache_threshold",
            self.threshold,
            None,
            "summed_prefix",
            "the summed prefix of an extend batch",
        )

    def with_threshold(self, t) -> SGLangParams:
        return replace(self, dense_threshold=t) if self.is_dsa else replace(self, threshold=t)

    @property
    def reads_threshold(self) -> bool:
        """Whether the threshold can change a path: where the handler compares the summed prefix
        with it (not triton, trtllm_mla, fa4 or aiter, and not with the chunked prefix cache off
        or a switch that makes every extend absorb), asked of the rule itself on an extend batch
        of summed prefix 1 above the prefill graph at thresholds 1 and 2; a DSA model's dense
        threshold wherever dense MHA can run at all (dense_ok)."""
        if self.is_dsa:
            return self.dense_ok
        new = [max(self.graph_max_tokens, 0) + 1]
        at = [replace(self, threshold=t).step_paths(new, [1], [1], [0], [False])[0] for t in (1, 2)]
        return bool(at[0] != at[1])

    def step_paths(self, new, prefix, count=None, step=None, decode=None) -> np.ndarray:
        """The path of every row of many scheduler steps at once.

        Args:
            new, prefix: [R] int, new and cached tokens of each row.
            count: [R] int, alike requests a row stands for (default 1).
            step: [R] int, the step (scheduler batch) each row belongs to (default: all one step).
            decode: [R] bool, rows that are decodes (default: one new token after a prefix).

        Returns:
            [R] path names.
        """
        new, prefix, count, step, decode = as_rows(new, prefix, count, step, decode)
        n = len(new)
        out = np.full(n, self.decode_path, dtype=object)
        if n == 0:
            return out.astype(str)
        steps, inverse = np.unique(step, return_inverse=True)
        extend = ~decode
        if self.values["enable_mixed_chunk"]:  # a step with any extend is one extend batch, decodes included
            has_extend = np.bincount(inverse, weights=extend, minlength=len(steps)) > 0
            extend = has_extend[inverse]
        order = np.argsort(inverse, kind="stable")
        starts = np.searchsorted(inverse[order], np.arange(len(steps)))

        def per_step(values, reduce=np.add) -> np.ndarray:
            return reduce.reduceat(np.where(extend, values, 0)[order], starts)

        if self.is_dsa:  # the longest sequence, the summed sequences, the new tokens
            longest = per_step(np.where(count > 0, prefix + new, 0), np.maximum)
            paths = dsa_extend_paths(self, longest, per_step(count * (prefix + new)), per_step(count * new))
        else:
            sums = [per_step(count * prefix), per_step(count * (prefix + new)), per_step(count * new)]
            paths = extend_paths(self, *sums)
        out[extend] = paths[inverse[extend]]
        return out.astype(str)

    def step_counts(self, new, prefix, count, step, decode) -> np.ndarray:
        paths = self.step_paths(new, prefix, count, step, decode)
        return np.stack([np.where(paths == name, count, 0) for name in self.paths], axis=1)

    def grid_paths(self, batch, new, prefix) -> np.ndarray:
        """Each point a step of `batch` alike requests (vectorised over points)."""
        batch, new, prefix = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (batch, new, prefix)))
        if self.is_dsa:
            ext = dsa_extend_paths(self, prefix + new, batch * (prefix + new), batch * new)
        else:
            ext = extend_paths(self, batch * prefix, batch * (prefix + new), batch * new)
        return np.where(is_decode(new, prefix), self.decode_path, ext)


def _default(rs: RuleSet, ctx: Context) -> tuple[Default, str]:
    """The default backend for ctx's architecture and model, and a note when it is assumed."""
    arch, note = ctx.arch, ""
    if arch is None or not any(d.arch == arch for d in rs.defaults):
        note = f"no {rs.engine} default is known for {ctx.arch or 'this GPU'}; the sm90 default is assumed"
        arch = "sm90"
    d = next((d for d in rs.defaults if d.arch == arch and d.model_arch in (None, ctx.model_arch)), None)
    assert d is not None, f"{rs.name} has no default for {arch}"
    return d, note


def _mla_rule(rs: RuleSet, values, given, ctx: Context, arch, prefill, decode, flag, graph):
    """The dense rule's lines (after the first) and fields: the prefill backend's handler."""
    lines = []
    b: SGLangBackend = rs.backends[prefill]
    cpc = not values["disable_chunked_prefix_cache"] and b.chunked_prefix_cache
    if graph and flag.startswith("disable") and flag not in given and prefill == "trtllm_mla":
        if ctx.model_arch == "DeepseekV3ForCausalLM":
            graph = False
            lines.append(
                "piecewise graph off for DeepseekV3ForCausalLM on trtllm_mla (assumed; not found in server_args.py)"
            )
    max_tokens = values["piecewise_cuda_graph_max_tokens"] if graph else 0
    thr, cap = values["chunked_prefix_cache_threshold"], values["max_kv_chunk_capacity"]
    chunked = "every extend batch runs chunked expand" if cpc else "only extend batches with prefix 0 expand (chunked)"
    one_shot = f"(one-shot up to {cap:,} summed tokens, else chunked)"
    rule = _HANDLER_RULE[b.handler].format(
        mha_from=f" or >= {thr}" if cpc else "",
        how=one_shot if b.one_shot else "(chunked)",
        one_shot=one_shot,
        trtllm=chunked,
    )
    lines.append(f"{prefill}: {rule}")
    if not cpc and b.chunked_prefix_cache:
        lines.append("chunked prefix cache off (disable_chunked_prefix_cache)")
    elif not b.chunked_prefix_cache and b.handler in ("generic", "fa3", "trtllm"):
        lines.append(f"chunked prefix cache off: {prefill} is not among the backends that support it")
    if values["enable_deterministic_inference"] and b.handler in ("fa3", "triton"):
        lines.append(f"deterministic inference on {prefill}: every batch absorbs")
    if values["flashinfer_mla_disable_ragged"] and b.ragged_switch:
        lines.append(f"flashinfer_mla_disable_ragged on {prefill}: every extend absorbs")
    if values["enable_prefill_context_parallel"] and b.prefill_cp:
        lines.append(f"prefill context parallelism on {prefill}: every extend absorbs")
    if max_tokens and (b.graph_mla or b.graph_mha):
        path = "absorb" if b.graph_mla else "expand (MHA)"
        lines.append(f"piecewise CUDA graph on: extend batches of <= {max_tokens} new tokens run {path}")
    if values["enable_mixed_chunk"]:
        lines.append("mixed chunk on: a step's decodes join its extend batch, their prefixes count in the sum")
    if rs.backends[decode].handler == "fa4":
        lines.append(f"decodes on {decode}: chunked expand (handle_attention_fa4 returns MHA_CHUNKED_KV)")
    return lines, dict(threshold=thr, capacity=cap, chunked_prefix_cache=cpc, graph_max_tokens=max_tokens)


def _dsa_rule(rs: RuleSet, values, given, ctx: Context, arch, prefill, decode, flag, graph):
    """The DSA rule's lines (after the first) and fields: set_dsa_prefill_impl's use_mha."""
    d: SGLangDSA = rs.dsa  # type: ignore[assignment]
    lines = []
    topk = ctx.index_topk
    thr = values[d.threshold_option]
    if thr is None:
        thr = topk
    elif thr > topk:
        raise MlactlError(
            f"{rs.name}: {d.threshold_option}={thr} is above {ctx.model}'s index_topk ({topk}): SGLang would run "
            "dense attention over more keys than DSA's top-k, which mlactl does not price; give at most "
            f"{topk}"
        )
    cap = values["max_kv_chunk_capacity"]
    cp = values[d.cp_option]
    max_tokens = 0
    if graph and not d.graph_captures_dsa:
        if flag in given:
            lines.append(f"{flag} has no effect: the piecewise graph does not capture DSA models in this release")
    elif graph and d.graph_guard and not cp:  # prefill CP turns the graph off (attn_cp_size > 1)
        max_tokens = values["piecewise_cuda_graph_max_tokens"]
    lines.append(
        f"{prefill} (DSA): an extend batch whose longest sequence is at most {thr:,} tokens and whose summed "
        f"sequences are at most {cap:,} runs dense MHA (dense_expand: MHA_ONE_SHOT, the indexer writing only "
        "each new token's key); every other batch, and every decode, the sparse MQA (sparse_absorb)"
    )
    if values[d.threshold_option] is None:
        lines.append(f"dense threshold {thr:,}: the model's index_topk ({d.threshold_option} not set)")
    # what keeps dense MHA off, whatever the batch (dense_ok: none of it)
    off = [
        why
        for on, why in (
            (arch in d.archs, f"dense MHA runs only on SM90 and SM100: every batch sparse on {arch}"),
            (
                ctx.kv_dtype in d.kv_dtypes,
                f"dense MHA needs a bf16 or fp8_e4m3 cache: every batch sparse with {ctx.kv_dtype}",
            ),
            (not cp, f"{d.cp_option}: every extend runs the sparse MQA"),
        )
        if not on
    ]
    lines += off
    if max_tokens:
        lines.append(
            f"piecewise CUDA graph on: extend batches of <= {max_tokens} new tokens run sparse (MHA off in a graph)"
        )
    if values["enable_mixed_chunk"]:
        lines.append(
            "mixed chunk on: a step's decodes join its extend batch; their sequences count in its longest and sum"
        )
    ignored = [k for k in MLA_ONLY if k in given]
    if ignored:
        lines.append(f"not read by the DSA rule: {', '.join(ignored)}")
    return lines, dict(
        threshold=thr,
        capacity=cap,
        chunked_prefix_cache=False,
        graph_max_tokens=max_tokens,
        paths=DSA_PATH_NAMES,
        dense_threshold=thr,
        dense_ok=not off,
        topk=topk,
        dense_indexer=d.dense_indexer,
    )


def dsa_extend_paths(p: SGLangParams, max_seq, sum_seq, tokens) -> np.ndarray:
    """The path of a DSA model's extend batches: dense_expand where use_mha holds, else
    sparse_absorb (arrays, one entry per batch: longest sequence, summed sequences, new tokens)."""
    max_seq, sum_seq, tokens = (np.asarray(a, dtype=np.int64) for a in (max_seq, sum_seq, tokens))
    graph = (tokens <= p.graph_max_tokens) if p.graph_max_tokens else np.zeros(np.shape(tokens), dtype=bool)
    dense = p.dense_ok & ~graph & (max_seq <= p.dense_threshold) & (sum_seq <= p.capacity)
    return np.where(dense, DENSE, SPARSE)


def extend_paths(p: SGLangParams, sum_prefix, sum_seq, tokens) -> np.ndarray:
    """The path of extend batches (arrays, one entry per batch) on p's prefill backend."""
    sum_prefix, sum_seq, tokens = (np.asarray(a, dtype=np.int64) for a in (sum_prefix, sum_seq, tokens))
    shape = np.broadcast(sum_prefix, sum_seq, tokens).shape
    b = p.backend_info
    v = p.values
    graph = (tokens <= p.graph_max_tokens) if p.graph_max_tokens else np.zeros(shape, dtype=bool)
    if b.handler == "fa4":  # handle_attention_fa4: MHA_CHUNKED_KV whatever the batch
        return np.full(shape, CHUNKED)
    if b.handler == "aiter":  # MHA for every extend without speculation (and inside a graph)
        return np.full(shape, EXPAND)
    if b.handler == "triton":
        if v["enable_deterministic_inference"]:
            return np.full(shape, ABSORB)
        return np.where(~graph & (sum_prefix == 0), EXPAND, ABSORB)
    if b.handler == "trtllm":
        mha = np.full(shape, True) if p.chunked_prefix_cache else (sum_prefix == 0)
        return np.where(~graph & mha, CHUNKED, ABSORB)
    # _handle_attention_backend (fa3 first checks deterministic inference)
    if b.handler == "fa3" and v["enable_deterministic_inference"]:
        return np.full(shape, ABSORB)
    if (b.prefill_cp and v["enable_prefill_context_parallel"]) or (
        b.ragged_switch and v["flashinfer_mla_disable_ragged"]
    ):
        return np.full(shape, ABSORB)
    mha = (sum_prefix == 0) | ((sum_prefix >= p.threshold) if p.chunked_prefix_cache else False)
    one_shot = b.one_shot & (sum_seq <= p.capacity)
    return np.where(~graph & mha, np.where(one_shot, EXPAND, CHUNKED), ABSORB)
