"""`mlactl batch`: a mixed batch from a CSV of requests, each request's path and the totals."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlactl.api import batch as api
from mlactl.cli.common import calibration_line, command, emit, output_format, resolve
from mlactl.cli.options import MACHINE, OUTPUT, EngineOptionOpt, EnginesOpt, LayersOpt, Opts
from mlactl.model.shapes import check_context
from mlactl.output import render

batch_app = typer.Typer(add_completion=False)


@command(batch_app, "batch", *MACHINE, end=OUTPUT)
def batch_cmd(
    requests: Annotated[
        Path,
        typer.Argument(
            help="CSV with a header and columns new and prefix (or context), optionally count (or batch): "
            "alike requests per row."
        ),
    ],
    opts: Opts,
    engines: EnginesOpt = None,
    engine_option: EngineOptionOpt = None,
    layers: LayersOpt = "1",
):
    """A mixed batch from a CSV of requests: the path of each, and the batch total per strategy.

    Each engine's rule is applied to the whole batch the engine's way: SGLang judges the extend
    requests together on their summed prefix (decode requests run as their own batch), vLLM
    reorders the batch and takes its leading short requests as decodes (docs/engines.md). Each
    rule prints the backend it resolved to for this GPU and cache dtype, and why.

    Example: mlactl batch requests.csv --hardware h200   (requests.csv: new,prefix / 1,8000 / 512,0 ...)
    """

    fmt = output_format(opts.fmt, opts.output)
    setup = resolve(opts)
    answer = api.batch(
        requests, setup=setup, engines=engines, engine_options=engine_option or (), layers=layers, fmt=fmt
    )
    check_context(setup.cfg, answer.value.new + answer.value.prefix)
    emit(
        fmt,
        opts.output,
        json_data=answer.to_json,
        write_csv=answer.write_csv,
        tables=[render.settings_line(setup.cfg, setup.hw, setup.kv_dtype, setup.dtype, answer.value.layers)]
        + ([calibration_line(setup.calibration)] if setup.calibration is not None else [])
        + setup.markup_notes()
        + list(render.batch_tables(answer.value)),
    )
