"""`mlactl.batch`: one mixed batch from a CSV of requests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mlactl.api.common import Result, Settings, _engines, _setup
from mlactl.decide import analysis as analysis_mod
from mlactl.decide import setup as settings
from mlactl.decide.analysis import BatchAnalysis
from mlactl.decide.engines import context_for, parse_engines
from mlactl.decide.requests import read_requests
from mlactl.decide.setup import Setup
from mlactl.output import report
from mlactl.util import progress

if TYPE_CHECKING:
    from typing_extensions import Unpack


def batch(
    requests: str | Path,
    model: str | None = None,
    hardware: str | None = None,
    *,
    layers: int | str = 1,
    fmt: str | None = None,
    setup: Setup | None = None,
    **given: Unpack[Settings],
) -> Result[BatchAnalysis]:
    """`mlactl batch`: a mixed batch from a CSV of requests (new, prefix or context, count): each
    request's path and the batch total per strategy and engine, under the `Settings` (tp,
    kv_dtype, dtype, chunk, calibration, engines, engine_options). `value` is a BatchAnalysis."""
    s = _setup("batch", model, hardware, given, setup=setup)
    chosen = parse_engines(*_engines(given), context_for(s.cfg, s.hw, s.kv_dtype))
    with progress.task(f"reading {requests}"):
        new, prefix, count = read_requests(requests, fmt or "csv")
    with progress.task(f"analysing {len(new):,} requests"):
        result = analysis_mod.analyze_batch(
            s.cfg,
            s.hw,
            new,
            prefix,
            count,
            kv_dtype=s.kv_dtype,
            dtype=s.dtype,
            chunk=s.chunk,
            engines=chosen,
            calibration=s.calibration,
            layers=s.cfg.layers if str(layers).strip().lower() == "all" else settings.one_int(layers, "--layers"),
        )
    return Result(
        result,
        s,
        lambda: dict(report.batch_json(result), **report.calibration_json(s.calibration)),
        lambda fh: report.write_batch_csv(fh, result),
    )
