"""The one place replay asks the engines' rules which path each request of a step runs.

Everything replay needs from mlactl.decide.engines (the versioned rule sets, `ENGINE@VERSION`)
goes through here: parsing `--engines` and `--engine-option` into rules resolved for the model,
GPU and cache dtype; which scheduler forms an engine's steps (SGLang's or vLLM's, and whether
SGLang mixes its decodes into the extend batch: its own `enable_mixed_chunk`); the path of every
row of many steps at once (`engines.step_counts`: SGLang sums each step's extend batch, vLLM
reorders and splits each step's requests); the chunk an engine's own expand_chunked runs at
(`engines.chunk_sizes`); and the thresholds at which a step's paths can change (for the exact
sweep). Switching to another rule API is a change to this module only.

Rows of a step are passed as vLLM's persistent batch holds them after the previous step's
reorder: the running decodes first, then the prompt chunks in the scheduler's order
(docs/replay.md, "How it differs from the engines").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mlactl.decide import engines as rules
from mlactl.decide.engines import EngineParams
from mlactl.decide.engines import sglang as sglang_rule
from mlactl.decide.engines import vllm as vllm_rule
from mlactl.model.cost import DSA_PATHS, MLA_PATHS
from mlactl.util.errors import MlactlError

VLLM, SGLANG = "vllm", "sglang"
# Rows of one call to vLLM's rule at most: its reorder follows each request (engines.vllm.MAX_REQUESTS).
MAX_ROWS_PER_CALL = 1 << 22
MEMO_STEPS = 1 << 16  # vLLM steps' answers kept by OneStep (a few MB)
THRESHOLD_MAX = np.iinfo(np.int64).max  # a threshold no sum reaches


class _Resolved:
    """An Engine's attribute that is its resolved rule's (`params`, at a dotted path)."""

    def __init__(self, path: str):
        self.path = path.split(".")

    def __get__(self, engine, owner=None) -> Any:
        value = engine.params
        for part in self.path:
            value = getattr(value, part)
        return value


@dataclass(frozen=True)
class Engine:
    """An engine's rule as resolved for the model, GPU and cache dtype, and how its scheduler
    batches steps. `sweeps`: whether the rule reads its threshold at all (see `parse`)."""

    params: EngineParams
    sweeps: bool = True

    name = _Resolved("engine")  # as selected: sglang, sglang@0.5.14, sglang-triton, vllm@0.33.0
    family = _Resolved("family")  # whose scheduler forms the steps: vLLM's or SGLang's (-triton, -trtllm)
    version = _Resolved("version")
    label = _Resolved("label")  # the engine and the options set, e.g. sglang(enable_mixed_chunk=true)
    citation = _Resolved("citation")
    why = _Resolved("why")  # the resolved backend and what the rule does, a line each (backend first)
    sweep_option = _Resolved("swept.option")
    compares = _Resolved("swept.compares")

    @property
    def mixed_chunk(self) -> bool:
        """SGLang's --enable-mixed-chunk: the running decodes join the extend batch."""
        return self.family == SGLANG and bool(self.params.values.get("enable_mixed_chunk", False))

    @property
    def threshold(self) -> int | None:
        """The threshold in force that the sweep tries, or None for a rule that does not read one."""
        return int(self.params.swept.value) if self.sweeps else None

    @property
    def threshold_max(self) -> int | None:
        """The largest threshold the rule takes (SGLang's dense one on a DSA model: index_topk), or None."""
        most = self.params.swept.maximum
        return None if most is None else int(most)

    def with_threshold(self, t: int) -> Engine:
        return replace(self, params=self.params.with_threshold(t))

    def to_json(self) -> dict:
        """The rule as resolved: name, engine, version, label, source, backend (and SGLang's decode
        backend), threshold, every option's value, the options set, and why."""
        return self.params.to_json()


def parse(
    engines: str | None, options: list[str] | None = None, cfg=None, hw=None, kv_dtype: str = "bf16"
) -> list[Engine]:
    """`--engines a,b@VERSION` and `--engine-option [ENGINE.]KEY=VALUE` into one Engine each (all
    four engines by default), each rule resolved for the model `cfg`, the hardware profile `hw`
    and the cache dtype (either may be None: the rule sets' default context). Raises MlactlError
    (one line) on anything the rule sets cannot take."""
    if engines is None:
        engines = ",".join(rules.default_selection(cfg))
    params = rules.parse_engines(engines, options, rules.context_for(cfg, hw, kv_dtype))
    return [Engine(p, sweeps=p.reads_threshold) for p in params]


def decode_path(e: Engine) -> str:
    """The path of a step of decodes only (every rule here gives all its decodes one path:
    SGLang's decode batch handler, vLLM's decodes done prefilling within any threshold)."""
    return str(step_paths(e, np.array([1]), np.array([1]), np.array([0]), np.array([True]), 1)[0])


def _to_code(e: Engine) -> np.ndarray:
    """mlactl.decide.engines reports counts in the rule's path_names order (absorb, expand,
    expand_chunked; DSA's sparse_absorb, dense_expand, masked_expand); replay's codes index paths(e)."""
    order = paths(e)
    return np.array([order.index(name) for name in rules.path_names(e.params)], dtype=np.int8)


def _rule_codes(e: Engine, new, prefix, step, decode, threshold=None) -> np.ndarray:
    """[rows] int8 codes of the rule's path of each row; `threshold` ([rows], the same within a
    step) replaces the rule's threshold step by step. Rows grouped by step, ascending."""
    p = e.params
    if threshold is not None:
        t = np.asarray(threshold, dtype=np.int64)
        if e.family == SGLANG:  # compared with each step's sums: one value per step, in np.unique order
            _, first = np.unique(step, return_index=True)
            t = t[first]
        # an array stands in for the number: both rules compare it element by element
        p = e.params.with_threshold(t)
    counts = rules.step_counts(p, new, prefix, None, step, decode)
    return _to_code(e)[np.argmax(counts, axis=1)] if len(counts) else np.zeros(0, dtype=np.int8)


def step_paths(e: Engine, new, prefix, step, decode, nsteps: int, threshold=None) -> np.ndarray:
    """The path of every row of many steps: [rows] of names.

    new, prefix: [rows] tokens; step: [rows] the step of each row (0..nsteps-1); decode: [rows]
    whether the row is a decode (a running request done prefilling: one new token) rather than
    a prompt chunk; within a step the decodes come first. SGLang runs a step's decodes as a
    decode batch and its chunks as one extend batch judged on its sums (with enable_mixed_chunk
    a step with a chunk is one extend batch, decodes included); vLLM reorders each step's
    requests and splits them into decodes and prefills by query length. `threshold`: [rows], the
    threshold each row's step is judged at (the same within a step), else the rule's own.
    """
    return np.asarray(paths(e))[step_codes(e, new, prefix, step, decode, nsteps, threshold, all_steps=True)]


class OneStep:
    """The rule asked about one step at a time, as the scheduler's clock does after forming each
    step (a hundred thousand times a trace): `paths(B, decode_prefix_sum, new, prefix)` gives the
    path of the step's B decodes (one path: every rule here runs a step's decodes alike) and of
    each of its prompt chunks (`new`, `prefix`: lists, in the scheduler's order).

    SGLang's handler is asked about the step's extend batch by its sums, the way it reads one
    (mlactl.decide.engines.sglang.extend_paths: summed prefix, summed sequence, new tokens; on a
    DSA model dsa_extend_paths: longest sequence, summed sequence, new tokens, for which the
    scheduler passes its decodes' longest prefix where they join the batch); vLLM's rule
    (engines.step_counts) about the step with one decode row for the B, each row's prefix as
    whether it has context, each query longer than the threshold as one past it, and the answer
    kept for the next step alike: its reorder and split read a request's context only as there
    or not, compare a long query only with the threshold (a first request past it makes no
    decodes), and treat B alike decodes as one (tests/test_replay.py checks the answers against
    the whole step's). On a DSA model that split is the dense rule's; the step's prefills then
    take one path from their longest query and sequence, their count and longest context chunk
    (engines.vllm.dsa_step_paths), asked each step."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.decode = decode_path(engine)
        self.memo: dict[tuple, tuple[str, list[str]]] = {}
        p = engine.params
        self.dsa = p.is_dsa
        # vLLM's split of a DSA step is the dense rule's (the DSA rule then maps it)
        self.split = replace(p, ctx=replace(p.ctx, model_kind="mla"), paths=rules.PATH_NAMES) if self.dsa else p
        self.chunk = vllm_rule.dsa_chunk(p) if self.dsa and isinstance(p, vllm_rule.VLLMParams) else 0

    def paths(
        self, B: int, decode_prefix_sum: int, new: list[int], prefix: list[int], decode_prefix_max: int = 0
    ) -> tuple[str, list[str]]:
        e, p = self.engine, self.engine.params
        if not new:
            return self.decode, []
        if isinstance(p, sglang_rule.SGLangParams):
            mixed = e.mixed_chunk and B > 0
            tokens = sum(new) + (B if mixed else 0)
            sum_prefix = sum(prefix) + (decode_prefix_sum if mixed else 0)
            if self.dsa:
                longest = max(q + c for q, c in zip(new, prefix))
                if mixed:
                    longest = max(longest, decode_prefix_max + 1)
                method = str(sglang_rule.dsa_extend_paths(p, [longest], [sum_prefix + tokens], [tokens])[0])
            else:
                method = str(sglang_rule.extend_paths(p, [sum_prefix], [sum_prefix + tokens], [tokens])[0])
            return (method if mixed else self.decode), [method] * len(new)
        assert isinstance(p, vllm_rule.VLLMParams)  # the two families (engines.FAMILIES)
        over = p.threshold + 1
        short = [min(q, over) for q in new]
        key = (B > 0, *short, *(c > 0 for c in prefix))
        got = self.memo.get(key)
        if got is None:
            d = 1 if B else 0
            rows_new = np.array([1] * d + short, dtype=np.int64)
            rows_prefix = np.array([1] * d + [1 if c > 0 else 0 for c in prefix], dtype=np.int64)
            decode = np.array([True] * d + [False] * len(new))
            counts = rules.step_counts(self.split, rows_new, rows_prefix, None, None, decode)
            order = MLA_PATHS if self.dsa else paths(e)
            code = _TO_MLA if self.dsa else _to_code(e)
            names = [order[c] for c in code[np.argmax(counts, axis=1)]]
            got = (names[0] if d else self.decode), names[d:]
            if len(self.memo) >= MEMO_STEPS:
                self.memo.clear()
            self.memo[key] = got
        if not self.dsa:
            return got
        # the DSA rule: decodes sparse; the step's prefills together (dense, masked or sparse)
        prefill = [j for j, name in enumerate(got[1]) if name != "absorb"]
        if not prefill:
            return self.decode, [self.decode] * len(new)
        q = max(new[j] for j in prefill)
        seq = max(new[j] + prefix[j] for j in prefill)
        ctx = max(min(prefix[j], self.chunk) for j in prefill)
        path = str(vllm_rule.dsa_step_paths(p, [len(prefill)], [q], [seq], [ctx])[0])
        rest = [path if j in prefill else self.decode for j in range(len(new))]
        return self.decode, rest


_TO_MLA = np.array([MLA_PATHS.index(p) for p in rules.PATH_NAMES], dtype=np.int8)


def step_codes(e: Engine, new, prefix, step, decode, nsteps: int, threshold=None, all_steps=False) -> np.ndarray:
    """`step_paths` as indices into paths() ([rows] int8). A step of decodes only runs them all
    on decode_path(e), so the rule is asked about the steps with a prompt chunk only (all of
    them with `all_steps`). Rows are grouped by step in ascending order (pricing.rows_of); they
    go to the rule in slices of whole steps, at most MAX_ROWS_PER_CALL rows each."""
    new, prefix = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    step, decode = np.asarray(step, dtype=np.int64), np.asarray(decode, dtype=bool)
    if len(step) > 1 and (np.diff(step) < 0).any():
        raise MlactlError("internal error: replay's rows are not grouped by step")
    out = np.full(len(step), path_code(e, decode_path(e)) if len(step) and not all_steps else 0, dtype=np.int8)
    ask = np.ones(len(step), dtype=bool) if all_steps else _in_chunk_steps(step, decode, nsteps)
    where = np.flatnonzero(ask)
    t = None if threshold is None else np.asarray(threshold)
    lo = 0
    while lo < len(where):
        hi = min(lo + MAX_ROWS_PER_CALL, len(where))
        if hi < len(where):  # back to the start of the step the slice would cut
            first = np.searchsorted(step[where], step[where[hi]], side="left")
            hi = int(first) if first > lo else hi
        rows = where[lo:hi]
        out[rows] = _rule_codes(e, new[rows], prefix[rows], step[rows], decode[rows], None if t is None else t[rows])
        lo = hi
    return out


def codes(names, e: Engine | None = None) -> np.ndarray:
    """Path names as indices into paths(e)."""
    names = np.asarray(names)
    order = paths(e)
    out = np.full(len(names), -1, dtype=np.int8)
    for k, p in enumerate(order):
        out[names == p] = k
    if (out < 0).any():
        raise MlactlError(f"a rule chose a path replay does not price: {sorted(set(names[out < 0].tolist()))}")
    return out


def own_chunk(e: Engine, paths, prefix, step, nsteps: int) -> np.ndarray | None:
    """[rows]: the prefix tokens per chunk of the engine's own chunked path (expand_chunked; a
    DSA model's masked_expand), for each row (vLLM: the workspace over the step's prefills with
    context), or None where mlactl's --chunk stands in (SGLang). `paths`: [rows] codes (step_codes)."""
    if e.family != VLLM:
        return None
    with_context = (np.asarray(paths) == path_code(e, chunked_path(e))) & (np.asarray(prefix) > 0)
    count = np.bincount(step, weights=with_context, minlength=nsteps).astype(np.int64)
    chunks = rules.chunk_sizes(e.params, np.maximum(count, 1))
    return None if chunks is None else np.asarray(chunks)[step]


def own_chunk_size(e: Engine, prefills_with_context: int) -> int | None:
    """`own_chunk` for one step with this many rows on its chunked path with a prefix."""
    if e.family != VLLM:
        return None
    chunks = rules.chunk_sizes(e.params, [max(int(prefills_with_context), 1)])
    return None if chunks is None else int(np.asarray(chunks)[0])


def breakpoints(e: Engine, new, prefix, step, decode, nsteps: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, threshold) pairs: for each step the thresholds above 1 at which its paths can
    change, so that at any threshold t a step runs what it runs at the largest of its values
    not above t (or at 1).

    SGLang compares its threshold with an extend batch's summed prefix s (MHA from t <= s: a
    change at s + 1), where the rule reads it at all (a step whose paths are the same at 1 and
    at the largest threshold has no value: inside the prefill graph, for one). vLLM compares it
    with each request's new tokens q (q <= t: its reorder region and the split; a change at q).
    The split's all-decodes shortcut for a UNIFORM backend (t <= 1) adds no value of its own: it
    applies only where every query is one token, and the uniform split without it makes those
    all decodes too. tests/test_replay.py asks the rule at every threshold near a step's values
    and checks it against these."""
    new, prefix, step = (np.asarray(a, dtype=np.int64) for a in (new, prefix, step))
    decode = np.asarray(decode, dtype=bool)
    if e.params.swept.against == "longest_sequence":  # SGLang's dense threshold on a DSA model
        return _dense_breakpoints(e, new, prefix, step, decode, nsteps)
    if e.family == VLLM:
        at = new > 1
        pairs = np.unique(np.stack([step[at], new[at]], axis=1), axis=0) if at.any() else np.zeros((0, 2), np.int64)
        return pairs[:, 0], pairs[:, 1]
    extend = _extend_rows(e, step, decode, nsteps)
    sums = np.bincount(step, weights=np.where(extend, prefix, 0), minlength=nsteps).astype(np.int64)
    has = np.bincount(step, weights=extend, minlength=nsteps) > 0
    # only where the rule reads it: not inside the prefill graph, for one
    steps = _moved(e, new, prefix, step, decode, nsteps, np.flatnonzero(has & (sums > 0)), THRESHOLD_MAX)
    return steps, sums[steps] + 1


def _dense_breakpoints(e: Engine, new, prefix, step, decode, nsteps: int) -> tuple[np.ndarray, np.ndarray]:
    """SGLang's dense threshold on a DSA model: an extend batch runs dense MHA from t = its
    longest sequence S (S <= t), where its other conditions hold: a change at S, for the steps
    whose paths differ between 1 and index_topk (the most the threshold takes)."""
    extend = _extend_rows(e, step, decode, nsteps)
    longest = np.zeros(nsteps, dtype=np.int64)
    np.maximum.at(longest, step[extend], (prefix + new)[extend])
    steps = _moved(e, new, prefix, step, decode, nsteps, np.flatnonzero(longest > 1), e.threshold_max)
    return steps, longest[steps]


def _in_chunk_steps(step, decode, nsteps: int) -> np.ndarray:
    """[rows]: whether the row's step has a prompt chunk."""
    return (np.bincount(step, weights=~decode, minlength=nsteps) > 0)[step]


def _extend_rows(e: Engine, step, decode, nsteps: int) -> np.ndarray:
    """[rows]: the rows of each step's extend batch (SGLang): its prompt chunks, and with
    enable_mixed_chunk every row of a step that has one."""
    return _in_chunk_steps(step, decode, nsteps) if e.mixed_chunk else ~decode


def _moved(e: Engine, new, prefix, step, decode, nsteps: int, steps: np.ndarray, top) -> np.ndarray:
    """Those of `steps` whose paths differ between the thresholds 1 and `top`."""
    if not len(steps):
        return steps
    ask = np.isin(step, steps)
    low, high = (
        step_codes(e, new[ask], prefix[ask], step[ask], decode[ask], nsteps, np.full(int(ask.sum()), t))
        for t in (1, top)
    )
    moved = np.zeros(nsteps, dtype=bool)
    moved[step[ask][low != high]] = True
    return steps[moved[steps]]


def paths(e: Engine | None = None) -> tuple[str, ...]:
    """The paths a rule can choose and the references are taken from: the model's (MLA's; a DSA
    model's sparse_absorb, masked_expand, dense_expand)."""
    return tuple(DSA_PATHS if e is not None and e.params.is_dsa else MLA_PATHS)


def chunked_path(e: Engine | None = None) -> str:
    """The path an engine may run at its own chunk: expand_chunked; a DSA model's masked_expand."""
    return "expand_chunked" if e is None else e.params.chunked_path


def path_code(e: Engine | None, name: str) -> int:
    return paths(e).index(name)
