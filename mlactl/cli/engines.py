"""`mlactl engines`: what each engine's path rule loses on a workload, and the best thresholds.

Parse, call mlactl.decide.workload, render with mlactl.output.engines. No math here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mlactl.api import engines as api
from mlactl.cli import complete
from mlactl.cli.common import command, emit, output_format, resolve
from mlactl.cli.options import MACHINE, OUTPUT, BatchOpt, EngineOptionOpt, Opts
from mlactl.decide.engines.catalog import catalog
from mlactl.output.engines import list_tables, rules_json, tables
from mlactl.util.errors import MlactlError

engines_app = typer.Typer(add_completion=False)


@command(engines_app, "engines", *MACHINE, end=OUTPUT)
def engines_cmd(
    workload: Annotated[
        Optional[Path],
        typer.Argument(
            help="CSV of shapes: header with new and prefix (or context), optionally batch and weight "
            "(or count). Without it, the grid of --batch/--new/--prefix, every shape weight 1."
        ),
    ] = None,
    opts: Opts = Opts(),
    batch: BatchOpt = "1",
    new: Annotated[str, typer.Option("--new", "-n", help="Grid: new tokens per request, list or range.")] = (
        "1,16,64,256,1024,4096"
    ),
    prefix: Annotated[str, typer.Option("--prefix", "-p", help="Grid: cached tokens, list or range.")] = (
        "0,1K,4K,8K,16K,32K"
    ),
    engines: Annotated[
        Optional[str],
        typer.Option(
            "--engines",
            help="Engine rules to judge, comma-separated: ENGINE or ENGINE@VERSION (see --list; "
            "default: sglang, sglang-triton, sglang-trtllm, vllm, the newest of each; for a DSA model "
            "sglang and vllm).",
            autocompletion=complete.engines,
        ),
    ] = None,
    list_rules: Annotated[
        bool,
        typer.Option(
            "--list",
            help="List every rule set instead: its backends, default backend per GPU architecture and "
            "cache dtype, options with their defaults, and source.",
        ),
    ] = False,
    engine_option: EngineOptionOpt = None,
):
    """What each engine's own path rule loses on a workload, where it loses most, and the
    threshold that would lose least on this hardware (SGLang's summed-prefix threshold, vLLM's
    decode threshold; for a DSA model SGLang's dense threshold and each bucket of vLLM's
    masked-MHA table), found by trying every value that changes a path.

    Rules are versioned (ENGINE@VERSION; a bare name is the newest) and resolved for the GPU's
    architecture and the cache dtype: each prints the backend it runs and why. `--list` shows
    every rule set; docs/engines.md cites each rule's source.

    Times are roofline times of the paths that fit in memory, or calibrated times with
    --calibration (docs/calibration.md).

    A DSA model (deepseek-v3.2) is judged on its paths (sparse_absorb, masked_expand,
    dense_expand) by each engine's DSA rule.

    Example: mlactl engines --model deepseek-v3.2 --hardware b200 --tp 8

    Example: mlactl engines workload.csv --hardware h200   (workload.csv: batch,new,prefix,weight / 64,1,4096,100 ...)

    Example: mlactl engines --list
    """

    fmt = output_format(opts.fmt, opts.output)
    if list_rules:
        if workload is not None:
            raise MlactlError("--list lists the rule sets; give it without a workload")
        if fmt == "csv":
            raise MlactlError("mlactl engines --list writes table or json")
        data = catalog()
        emit(
            fmt,
            opts.output,
            json_data=lambda: rules_json(data),
            tables=list_tables(data),
        )
        return
    setup = resolve(opts)
    answer = api.engine_loss(
        setup=setup,
        workload=workload,
        batch=batch,
        new=new,
        prefix=prefix,
        engines=engines,
        engine_options=engine_option or (),
    )
    emit(
        fmt,
        opts.output,
        json_data=answer.to_json,
        write_csv=answer.write_csv,
        tables=tables(answer.value, setup.markup_notes()),
    )
