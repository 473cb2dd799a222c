"""mlactl: expand or absorb? Cost model, kernels and tuner for Multi-head Latent Attention.

The package is built in layers; a layer imports only the layers below it (import-linter's
contracts in pyproject.toml say so, and CI checks them):

    cli       the command line: parse, call the library, render
    output    tables, JSON and CSV, charts (output/plot/)
    tune      measuring kernels, paths and ceilings on a device (writes results/)
    kernels   the Triton kernels, their torch twins, and mla_attention (its `auto` asks decide/)
    decide    engines' rules, policies, calibration, workloads and the analysis of a grid
    results   the results store: what tune measured, as versioned JSON files
    model     MLA configs, hardware profiles, shapes, cost.py (FLOPs, bytes), roofline
    util      errors, safe file I/O, limits, schema checks, folders, defaults

docs/design.md draws the same picture and says what each layer promises the ones above it.
"""

from mlactl import _compat

__version__ = "0.1.0"

_compat.install()
