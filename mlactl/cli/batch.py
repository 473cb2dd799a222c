"""`mlactl batch`: a mixed batch from a CSV of requests, each request's path and the totals."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlactl.cli.common import (
    DTYPES,
    calibration_json,
    calibration_line,
    choice,
    cli_errors,
    emit,
    load_calibration,
    load_hardware,
    load_model,
    one_int,
    output_format,
)
from mlactl.cli.options import (
    CalibrationOpt,
    ChunkOpt,
    DtypeOpt,
    EngineOptionOpt,
    EnginesOpt,
    FormatOpt,
    HardwareOpt,
    KvDtypeOpt,
    MeasuredOpt,
    ModelOpt,
    OutputOpt,
    TpOpt,
)
from mlactl.decide import analysis
from mlactl.decide.engines import context_for, parse_engines
from mlactl.decide.requests import read_requests
from mlactl.output import render, report
from mlactl.util.defaults import DEFAULT_CHUNK, KV_DTYPES

batch_app = typer.Typer(add_completion=False)


@batch_app.command(name="batch")
@cli_errors
def batch_cmd(
    requests: Annotated[
        Path,
        typer.Argument(
            help="CSV with a header and columns new and prefix (or context), optionally count (or batch): "
            "alike requests per row."
        ),
    ],
    model: ModelOpt = "deepseek-v3",
    hardware: HardwareOpt = "h800",
    measured: MeasuredOpt = False,
    tp: TpOpt = "1",
    kv_dtype: KvDtypeOpt = "bf16",
    dtype: DtypeOpt = "bf16",
    chunk: ChunkOpt = str(DEFAULT_CHUNK),
    engines: EnginesOpt = None,
    engine_option: EngineOptionOpt = None,
    calibration: CalibrationOpt = None,
    fmt: FormatOpt = None,
    output: OutputOpt = None,
):
    """A mixed batch from a CSV of requests: the path of each, and the batch total per strategy.

    Each engine's rule is applied to the whole batch the engine's way: SGLang judges the extend
    requests together on their summed prefix (decode requests run as their own batch), vLLM
    reorders the batch and takes its leading short requests as decodes (docs/engines.md). Each
    rule prints the backend it resolved to for this GPU and cache dtype, and why.

    Example: mlactl batch requests.csv --hardware h200   (requests.csv: new,prefix / 1,8000 / 512,0 ...)
    """

    fmt = output_format(fmt, output)
    cfg = load_model(model, tp)
    hw = load_hardware(hardware, measured)
    kv = choice(kv_dtype, "--kv-dtype", KV_DTYPES)
    engine_params = parse_engines(engines, engine_option, context_for(cfg, hw, kv))
    cal = load_calibration(calibration, hw)
    new, prefix, count = read_requests(requests, fmt)
    result = analysis.analyze_batch(
        cfg,
        hw,
        new,
        prefix,
        count,
        kv_dtype=kv,
        dtype=choice(dtype, "--dtype", DTYPES),
        chunk=one_int(chunk, "--chunk"),
        engines=engine_params,
        calibration=cal,
    )
    emit(
        fmt,
        output,
        json_data=lambda: dict(report.batch_json(result), **calibration_json(cal)),
        write_csv=lambda fh: report.write_batch_csv(fh, result),
        tables=([calibration_line(cal)] if cal is not None else []) + list(render.batch_tables(result)),
    )
