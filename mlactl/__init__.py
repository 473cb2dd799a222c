"""mlactl: expand or absorb? Cost model, kernels and tuner for Multi-head Latent Attention.

The package is built in layers; a layer imports only the layers below it (import-linter's
contracts in pyproject.toml say so, and CI checks them):

    cli       the command line: parse, call the front door, render
    api       the front door: one function a job, returning the results the commands render
    output    tables, JSON and CSV, charts (output/plot/)
    tune      measuring kernels, paths and ceilings on a device (writes results/)
    kernels   the Triton kernels, their torch twins, and mla_attention (its `auto` asks decide/)
    decide    engines' rules, policies, calibration, workloads and the analysis of a grid
    results   the results store: what tune measured, as versioned JSON files
    model     MLA configs, hardware profiles, shapes, cost.py (FLOPs, bytes), roofline
    util      errors, safe file I/O, limits, schema checks, folders, defaults

docs/design.md draws the same picture and says what each layer promises the ones above it.

The front door (mlactl/api/, docs/python-api.md): `mlactl.analyze`, `mlactl.crossover`,
`mlactl.batch`, `mlactl.engine_loss` and `mlactl.replay` return the results the commands render,
with `.to_json()` and `.to_pandas()`. They load on first use, so `import mlactl` stays cheap.
"""

import importlib

from mlactl import _compat

__version__ = "0.2.0"

_compat.install()

# name -> the module of the front door that holds it (imported on first use)
_FRONT_DOOR = {
    "analyze": "mlactl.api.grid",
    "crossover": "mlactl.api.grid",
    "batch": "mlactl.api.batch",
    "engine_loss": "mlactl.api.engines",
    "replay": "mlactl.api.replay",
    "Result": "mlactl.api.common",
    "Settings": "mlactl.api.common",
    "Machine": "mlactl.api.common",
    "MlactlError": "mlactl.util.errors",
}
__all__ = sorted(_FRONT_DOOR)


def __getattr__(name: str):
    if name in _FRONT_DOOR:  # the front door loads on first use
        return getattr(importlib.import_module(_FRONT_DOOR[name]), name)
    raise AttributeError(f"module 'mlactl' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_FRONT_DOOR))
