"""Layer 2, the results store: what `mlactl tune` measured (store.py: one versioned JSON file per
run, its schema and its readers) and which file a measured policy reads (measured.py).

It sits below the decisions, which read measurements, and far below the tuner (`mlactl.tune`),
which writes them. The store's functions are re-exported here, where `mlactl.results` had them
before the package had layers.
"""

from mlactl.results.measured import find_crossovers, find_results
from mlactl.results.store import (
    SCHEMA,
    SCHEMA_VERSION,
    SECTIONS,
    check_matches,
    load,
    measured_crossovers,
    paths_frame,
    validate,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "SECTIONS",
    "check_matches",
    "find_crossovers",
    "find_results",
    "load",
    "measured_crossovers",
    "paths_frame",
    "validate",
]
