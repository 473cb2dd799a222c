"""One interface over every engine's rule: paths of grid points, of a mixed batch, and of many
scheduler steps at once; the chunk size an engine expands context at; what a choice loses.

Each resolved rule answers by its own engine's rule (`SGLangParams`, sglang.py: a step's extend
batch judged on its sums; `VLLMParams`, vllm.py: each step's requests reordered and split), in
one array pass; replay calls `step_counts` with arrays of rows and a step index.
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.engines.params import EngineParams, as_rows, is_decode

__all__ = ["is_decode"]  # mlactl's convention for a decode, beside the path functions


def path_names(p: EngineParams) -> tuple[str, str, str]:
    """The paths rule `p` assigns, in the order of step_counts' columns."""
    return p.paths


def grid_paths(p: EngineParams, batch, new, prefix) -> np.ndarray:
    """The engine's path at each grid point, each a step of `batch` alike requests."""
    return p.grid_paths(batch, new, prefix)


def step_counts(p: EngineParams, new, prefix, count=None, step=None, decode=None) -> np.ndarray:
    """[R, 3]: how many of each row's `count` requests run each of path_names(p) (absorb, expand,
    expand_chunked; for a DSA model sparse_absorb, dense_expand, masked_expand), for rows of many
    steps (`step`: the step of each row; `decode`: SGLang's decode rows, vLLM's requests done
    prefilling; default one new token after a prefix)."""
    return p.step_counts(*as_rows(new, prefix, count, step, decode))


def step_paths(p: EngineParams, new, prefix, count=None, step=None, decode=None) -> np.ndarray:
    """The path of each row of many steps; a row whose alike requests take two paths (vLLM's
    split can fall inside it) gets the path of most of them, ties to the first in path_names(p).
    Use `step_counts` where the split matters."""
    counts = step_counts(p, new, prefix, count, step, decode)
    return np.asarray(p.paths)[np.argmax(counts, axis=1)] if len(counts) else np.array([], dtype=str)


def batch_paths(p: EngineParams, new, prefix, count=None) -> np.ndarray:
    """The path of each request row of one mixed batch (one step)."""
    return step_paths(p, new, prefix, count)


def chunk_sizes(p: EngineParams, prefills_with_context) -> np.ndarray | None:
    """Context tokens per chunk of the engine's own `expand_chunked` (a DSA model's
    `masked_expand`), given how many prefills with context share the step, or None where
    mlactl's `--chunk` stands in (SGLang)."""
    return p.chunk_sizes(prefills_with_context)


def time_of(chosen: np.ndarray, times: dict[str, np.ndarray]) -> np.ndarray:
    """Time of the chosen path per point, from per-path times (+inf where a path does not fit).

    `times` is whatever time model is in use (roofline or calibrated): this and `time_lost` are
    the only places a loss is computed from it."""
    chosen = np.asarray(chosen)
    out = np.zeros(np.shape(chosen), dtype=np.float64)
    for path, t in times.items():
        out = np.where(chosen == path, np.broadcast_to(t, out.shape), out)
    return out


def time_lost(chosen: np.ndarray, times: dict[str, np.ndarray], best: np.ndarray | None = None) -> np.ndarray:
    """Time the chosen path loses against the fastest path that fits (+inf if it does not fit,
    and where nothing fits). `best` (default: the fastest of `times`) is the time to beat."""
    if best is None:
        best = np.min(np.stack([np.broadcast_to(t, np.shape(chosen)) for t in times.values()]), axis=0)
    mine = time_of(chosen, times)
    best = np.minimum(best, mine)  # an engine's own chunking can beat ours
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(best), mine - best, np.inf)
