"""The inference engines' own path rules: which MLA path each engine runs for a batch.

Rule sets are data, one per release (`ENGINE@VERSION`, rulesets.py); a rule is resolved for a
context (GPU architecture, cache dtype, model: params.py) into an `EngineParams`, and small pure
functions apply it to grid points, mixed batches or many scheduler steps at once (sglang.py,
vllm.py, paths.py). docs/engines.md cites the source of every branch.
"""

from __future__ import annotations

from mlactl.decide.engines.params import (
    DEFAULT_ENGINES,
    Context,
    EngineParams,
    arch_of,
    context_for,
    default_params,
    is_engine,
    known_names,
    parse_engines,
    parse_policy,
    parse_value,
    resolve,
    ruleset_for,
)
from mlactl.decide.engines.paths import (
    DSA_PATH_NAMES,
    PATH_NAMES,
    batch_paths,
    chunk_sizes,
    grid_paths,
    is_decode,
    path_names,
    step_counts,
    step_paths,
    time_lost,
    time_of,
)
from mlactl.decide.engines.rulesets import NEWEST, RULESETS, SHORTHANDS, RuleSet
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
    "arch_of",
    "batch_paths",
    "chunk_sizes",
    "context_for",
    "default_params",
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
