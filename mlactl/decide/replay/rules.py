"""The one place replay asks the engines' rules which path each request of a step runs.

Everything replay needs from mlactl.decide.engines goes through here: parsing `--engines` and
`--engine-option`, which scheduler batches an engine's steps (SGLang's or vLLM's), the path of
every row of many steps at once, the chunk an engine's own expand_chunked runs at, and the
thresholds at which a step's paths can change (for the exact sweep). Switching to another rule
API is a change to this module only.

Scheduler settings are engine options too: `sglang.enable_mixed_chunk=true` (SGLang's server
argument of that name, default false) lets the decodes join the extend batch; the rules of
today's mlactl.decide.engines do not know it, so it is taken here before they parse the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from mlactl.decide import engines as rules
from mlactl.decide.engines import EngineParams
from mlactl.model.cost import MLA_PATHS
from mlactl.util.errors import MlactlError

VLLM, SGLANG = "vllm", "sglang"
DEFAULT_ENGINES = rules.ENGINES  # replay judges all four by default
SCHEDULER_OPTIONS = ("enable_mixed_chunk",)
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# Engines whose threshold the sweep tries, and what it compares the threshold with.
SWEPT = {"sglang": "the summed prefix of an extend batch", "vllm": "a request's new tokens"}


@dataclass(frozen=True)
class Engine:
    """An engine's rule with its parameters, and how its scheduler batches steps."""

    params: EngineParams
    mixed_chunk: bool = False

    @property
    def name(self) -> str:
        return self.params.engine

    @property
    def family(self) -> str:
        """Whose scheduler forms the steps: vLLM's, or SGLang's (sglang, -triton, -trtllm)."""
        return VLLM if self.params.engine == VLLM else SGLANG

    @property
    def label(self) -> str:
        """The engine and its non-default settings, e.g. `sglang(threshold=4096,enable_mixed_chunk)`."""
        base = self.params.label
        if not self.mixed_chunk:
            return base
        return base[:-1] + ",enable_mixed_chunk)" if base.endswith(")") else base + "(enable_mixed_chunk)"

    @property
    def citation(self) -> str:
        return self.params.citation

    @property
    def threshold(self) -> int | None:
        """The threshold the sweep tries, or None for a rule without one."""
        return self.params.threshold if self.name in SWEPT else None

    def with_threshold(self, t: int) -> Engine:
        return replace(self, params=replace(self.params, threshold=t))

    def options(self) -> dict:
        """The rule's settings for JSON, scheduler settings included."""
        out = {k: getattr(self.params, k) for k in self.params.options}
        out["enable_mixed_chunk"] = self.mixed_chunk
        return out


def _flag(text: str, option: str) -> bool:
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise MlactlError(f"--engine-option {option}: expected true or false, got {text!r}")


def parse(
    engines: str | None, options: list[str] | None = None, cfg=None, hw=None, kv_dtype: str = "bf16"
) -> list[Engine]:
    """`--engines a,b` and `--engine-option [ENGINE.]KEY=VALUE` into one Engine each (all four
    engines by default). A bare enable_mixed_chunk goes to every SGLang engine selected. The
    model, hardware and cache dtype are what versioned rule sets resolve a backend for (issue
    19); today's rules have one backend default each and do not need them."""
    names = ",".join(DEFAULT_ENGINES) if engines is None else engines
    rule_options, mixed = [], {}
    for text in options or []:
        key, eq, value = text.partition("=")
        engine, dot, bare = key.strip().rpartition(".")
        if eq and bare in SCHEDULER_OPTIONS:
            mixed[engine if dot else None] = _flag(value, text)
        else:
            rule_options.append(text)
    params = rules.parse_engines(names, rule_options)
    chosen = [Engine(p) for p in params]
    for target, on in mixed.items():
        hit = [e for e in chosen if e.family == SGLANG and (target is None or e.name == target)]
        if not hit:
            where = target or "the engines selected"
            raise MlactlError(f"--engine-option enable_mixed_chunk: {where} has no SGLang scheduler")
        chosen = [replace(e, mixed_chunk=on) if e in hit else e for e in chosen]
    return chosen


def decode_path(e: Engine) -> str:
    """The path of a step of decodes only (one row asked; every rule here gives all its decodes one path)."""
    return str(step_paths(e, np.array([1]), np.array([1]), np.array([0]), np.array([True]), 1)[0])


def step_paths(e: Engine, new, prefix, step, decode, nsteps: int, threshold=None) -> np.ndarray:
    """The path of every row of many steps: [rows] of names.

    new, prefix: [rows] tokens; step: [rows] the step of each row (0..nsteps-1); decode: [rows]
    whether the row is a decode (a running request's next token) rather than a prompt chunk.
    SGLang runs a step's decodes as a decode batch and its chunks as one extend batch judged on
    its sums (with enable_mixed_chunk a step with a chunk is one extend batch, decodes included);
    vLLM judges each request on its own query length.
    """
    new, prefix = np.asarray(new, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    # an array in place of the number (see step_codes); typed as the int it stands for
    params = e.params if threshold is None else replace(e.params, threshold=cast(int, np.asarray(threshold)))
    if e.family == VLLM:
        return rules.vllm_request_path(new, prefix, params)
    step, decode = np.asarray(step, dtype=np.int64), np.asarray(decode, dtype=bool)
    extend = _extend_rows(e, step, decode, nsteps)
    sum_prefix = np.bincount(step, weights=np.where(extend, prefix, 0), minlength=nsteps)
    sum_seq = np.bincount(step, weights=np.where(extend, prefix + new, 0), minlength=nsteps)
    return rules.sglang_batch_path(~extend, sum_prefix[step].astype(np.int64), sum_seq[step].astype(np.int64), params)


def step_codes(e: Engine, new, prefix, step, decode, nsteps: int, threshold=None) -> np.ndarray:
    """`step_paths` as indices into paths() ([rows] int8). A step of decodes only runs them all
    on decode_path(e) (SGLang's decode batch; vLLM's one-token queries are within any
    threshold), so the rule is asked about the steps with a prompt chunk only. `threshold`
    ([rows], the same within a step) prices steps under several thresholds in one call: today's
    rules compare their threshold element by element, so an array stands in for the number."""
    step, decode = np.asarray(step, dtype=np.int64), np.asarray(decode, dtype=bool)
    out = np.full(len(step), PATH_CODE[decode_path(e)], dtype=np.int8)
    chunky = np.bincount(step, weights=~decode, minlength=nsteps) > 0
    ask = chunky[step]
    if ask.any():
        local = np.cumsum(chunky) - 1
        t = None if threshold is None else np.asarray(threshold)[ask]
        names = step_paths(
            e, np.asarray(new)[ask], np.asarray(prefix)[ask], local[step[ask]], decode[ask], int(chunky.sum()), t
        )
        out[ask] = codes(names)
    return out


def codes(names) -> np.ndarray:
    """Path names as indices into paths()."""
    names = np.asarray(names)
    out = np.full(len(names), -1, dtype=np.int8)
    for k, p in enumerate(MLA_PATHS):
        out[names == p] = k
    if (out < 0).any():
        raise MlactlError(f"a rule chose a path replay does not price: {sorted(set(names[out < 0].tolist()))}")
    return out


def _extend_rows(e: Engine, step, decode, nsteps: int) -> np.ndarray:
    """Rows SGLang's rule judges as one extend batch per step."""
    if not e.mixed_chunk:
        return ~decode
    has_chunk = np.bincount(step, weights=~decode, minlength=nsteps) > 0
    return has_chunk[step]


def own_chunk(e: Engine, paths, prefix, step, nsteps: int) -> np.ndarray | None:
    """[rows]: the prefix tokens per chunk of the engine's own expand_chunked, for each row (the
    workspace over the step's prefills with context: vLLM), or None where mlactl's --chunk
    stands in (SGLang). `paths`: [rows] codes (step_codes)."""
    if e.family != VLLM:
        return None
    with_context = (np.asarray(paths) == PATH_CODE["expand_chunked"]) & (np.asarray(prefix) > 0)
    count = np.bincount(step, weights=with_context, minlength=nsteps).astype(np.int64)
    chunks = rules.chunk_sizes(e.params, np.maximum(count, 1))
    return None if chunks is None else np.asarray(chunks)[step]


def own_chunk_size(e: Engine, prefills_with_context: int) -> int | None:
    """`own_chunk` for one step with this many rows on expand_chunked with a prefix."""
    if e.family != VLLM:
        return None
    chunks = rules.chunk_sizes(e.params, [max(int(prefills_with_context), 1)])
    return None if chunks is None else int(np.asarray(chunks)[0])


def breakpoints(e: Engine, new, prefix, step, decode, nsteps: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, threshold) pairs: for each step the thresholds above 1 at which its paths can
    change, so that at any threshold t a step runs what it runs at the largest of its values
    not above t (or at 1). SGLang compares its threshold with an extend batch's summed prefix s
    (MHA from t <= s: a change at s + 1); vLLM with each request's new tokens q (absorb from
    t >= q: a change at q)."""
    new, prefix, step = (np.asarray(a, dtype=np.int64) for a in (new, prefix, step))
    if e.family == VLLM:
        at = new > 1
        pairs = np.unique(np.stack([step[at], new[at]], axis=1), axis=0) if at.any() else np.zeros((0, 2), np.int64)
        return pairs[:, 0], pairs[:, 1]
    decode = np.asarray(decode, dtype=bool)
    extend = _extend_rows(e, step, decode, nsteps)
    sums = np.bincount(step, weights=np.where(extend, prefix, 0), minlength=nsteps).astype(np.int64)
    has = np.bincount(step, weights=extend, minlength=nsteps) > 0
    steps = np.flatnonzero(has & (sums > 0))
    return steps, sums[steps] + 1


def paths() -> tuple[str, ...]:
    """The paths a rule can choose and the references are taken from."""
    return tuple(MLA_PATHS)


PATH_CODE = {p: k for k, p in enumerate(MLA_PATHS)}
