"""`mlactl batch`: a mixed batch from a CSV of requests, each request's path and the totals."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlactl.cli.common import calibration_json, calibration_line, cli_errors, emit, output_format, resolve
from mlactl.cli.options import MACHINE, OUTPUT, EngineOptionOpt, EnginesOpt, Opts, shared
from mlactl.decide import analysis
from mlactl.decide.engines import context_for, parse_engines
from mlactl.decide.requests import read_requests
from mlactl.output import render, report
from mlactl.util import progress

batch_app = typer.Typer(add_completion=False)


@batch_app.command(name="batch")
@cli_errors
@shared(*MACHINE, end=OUTPUT)
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
    cal = setup.calibration
    engine_params = parse_engines(engines, engine_option, context_for(setup.cfg, setup.hw, setup.kv_dtype))
    with progress.task(f"reading {requests}"):
        new, prefix, count = read_requests(requests, fmt)
    with progress.task(f"analysing {len(new):,} requests"):
        result = analysis.analyze_batch(
            setup.cfg,
            setup.hw,
            new,
            prefix,
            count,
            kv_dtype=setup.kv_dtype,
            dtype=setup.dtype,
            chunk=setup.chunk,
            engines=engine_params,
            calibration=cal,
        )
    emit(
        fmt,
        opts.output,
        json_data=lambda: dict(report.batch_json(result), **calibration_json(cal)),
        write_csv=lambda fh: report.write_batch_csv(fh, result),
        tables=([calibration_line(cal)] if cal is not None else [])
        + setup.markup_notes()
        + list(render.batch_tables(result)),
    )
