"""The inference engines' own path rules: which MLA path each engine runs for a batch.

Rule sets are data, one per release (`ENGINE@VERSION`, rulesets.py). Every name of an engine
resolves through one path (params.py: `ruleset_for`, `parse_engines`, `resolve`) into a rule of
its engine's own params type (`SGLangParams`, sglang.py; `VLLMParams`, vllm.py), for a context
(GPU architecture, cache dtype, and the model, whose attention kind, dense MLA or DSA, the rule
set consults). The resolved rule answers for grid points, mixed batches or many scheduler steps
at once (paths.py), and says what it resolved to: its backend, its paths (`paths`,
`decode_path`, `chunked_path`), its threshold (`sweep`, `with_threshold`), its first why line
(`describe`). docs/engines.md cites the source of every branch.
"""

from __future__ import annotations

from mlactl.decide.engines.params import (
    DEFAULT_ENGINES,
    DSA_PATH_NAMES,
    PATH_NAMES,
    Context,
    EngineParams,
    Swept,
    arch_of,
    context_for,
    default_params,
    default_selection,
    is_decode,
    is_engine,
    known_names,
    parse_engines,
    parse_policy,
    parse_value,
    resolve,
    ruleset_for,
)
from mlactl.decide.engines.paths import (
    batch_paths,
    chunk_sizes,
    grid_paths,
    path_names,
    step_counts,
    step_paths,
    time_lost,
    time_of,
)
from mlactl.decide.engines.rulesets import NEWEST, RULESETS, SHORTHANDS, RuleSet
from mlactl.decide.engines.sglang import SGLangParams
from mlactl.decide.engines.vllm import VLLMParams
from mlactl.util.defaults import ENGINES

__all__ = [
    "DEFAULT_ENGINES",
    "DSA_PATH_NAMES",
    "ENGINES",
    "NEWEST",
    "PATH_NAMES",
    "RULESETS",
    "SHORTHANDS",
    "Context",
    "EngineParams",
    "RuleSet",
    "SGLangParams",
    "Swept",
    "VLLMParams",
    "arch_of",
    "batch_paths",
    "chunk_sizes",
    "context_for",
    "default_params",
    "default_selection",
    "grid_paths",
    "is_decode",
    "is_engine",
    "known_names",
    "parse_engines",
    "parse_policy",
    "parse_value",
    "path_names",
    "resolve",
    "ruleset_for",
    "step_counts",
    "step_paths",
    "time_lost",
    "time_of",
]
