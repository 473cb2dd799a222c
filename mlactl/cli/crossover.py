"""`mlactl crossover`: for each prefix, the new-token count from which expand beats absorb."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import typer

from mlactl.cli.common import calibration_json, calibration_line, cli_errors, emit, one_int, output_format, resolve
from mlactl.cli.options import MACHINE, OUTPUT, BatchOpt, Opts, shared
from mlactl.decide import analysis
from mlactl.model.shapes import parse_sizes
from mlactl.output import render, report
from mlactl.output.csvout import write_csv
from mlactl.util import safe
from mlactl.util.errors import MlactlError

crossover_app = typer.Typer(add_completion=False)


@crossover_app.command(name="crossover")
@cli_errors
@shared(*MACHINE, end=OUTPUT)
def crossover_cmd(
    opts: Opts,
    batch: BatchOpt = "1",
    prefix: Annotated[
        str, typer.Option("--prefix", "-p", help="Prefixes to solve for: list or range.")
    ] = "0,1K,4K,8K,16K,32K,64K,128K",
    max_new: Annotated[
        str, typer.Option("--max-new", help="Search the roofline crossover up to this many new tokens.")
    ] = "128K",
):
    """For each prefix, the new-token count from which expand beats absorb, by FLOPs and by roofline.

    With --calibration, by calibrated time, each with its 80% interval, e.g. 133 (133–292); a crossover
    whose deciding ops were not measured there (extrapolated, or at roofline) is marked † and named.

    A DSA model (deepseek-v3.2) has windows instead: the new-token counts where masked MHA
    (masked_expand) beats sparse absorb, by FLOPs and by time, or none; and where dense MHA
    (context at most top-k) does.

    Example: mlactl crossover --hardware h200 --batch 1,64 --prefix 0:64K:8K
    (DSA: mlactl crossover --model deepseek-v3.2 --hardware h200 --prefix 0,1K,4K,8K)
    """

    fmt = output_format(opts.fmt, opts.output)
    setup = resolve(opts)
    cfg, hw, cal = setup.cfg, setup.hw, setup.calibration
    model_cost = setup.cost()
    hw.peak_flops(model_cost.dtype)
    pairs = [(b, p) for b in parse_sizes(batch, "--batch") for p in parse_sizes(prefix, "--prefix", minimum=0)]
    if len(pairs) > analysis.MAX_CROSSOVER_PREFIXES:
        raise MlactlError(f"{len(pairs)} (batch, prefix) pairs; at most {analysis.MAX_CROSSOVER_PREFIXES} at once")
    result = analysis.crossover_table(model_cost, hw, pairs, max_new=one_int(max_new, "--max-new"), calibration=cal)

    def json_data():
        return {
            "schema": "mlactl.crossover",
            "schema_version": report.SCHEMA_VERSION,
            "model": dict(cfg.to_dict(), softmax_scale=cfg.softmax_scale),
            "hardware": hw.to_dict(),
            "kv_dtype": model_cost.kv_dtype,
            "dtype": model_cost.dtype,
            "chunk": model_cost.chunk,
            "crossover": report.crossover_json(result),
            **calibration_json(cal),
        }

    def csv_data(fh):
        if result.windows:
            write_csv(fh, *window_columns(result.windows))
            return
        rows = result.rows
        header = ["batch", "prefix", "by_flops", "by_time", "by_time_chunked"]
        cols = [[r.batch for r in rows], [r.prefix for r in rows]] + [
            [np.nan if v is None else v for v in (getattr(r, k) for r in rows)] for k in header[2:]
        ]
        if cal is not None:  # the 80% intervals' ends (empty: past --max-new)
            for k in ("by_time", "by_time_chunked"):
                spans = [getattr(r, f"{k}_interval") or (None, None) for r in rows]
                header += [f"{k}_lo", f"{k}_hi"]
                cols += [[np.nan if s[i] is None else s[i] for s in spans] for i in (0, 1)]
        write_csv(fh, header, [np.asarray(c, dtype=np.float64) for c in cols])

    header = (
        f"[bold]{safe.markup(cfg.name)}[/] on [bold]{safe.markup(hw.display)}[/] "
        f"({'measured' if hw.using_measured else 'nominal'}), kv cache {model_cost.kv_dtype}"
    )
    lines = [header] + ([calibration_line(cal)] if cal is not None else []) + setup.markup_notes()
    emit(fmt, opts.output, json_data=json_data, write_csv=csv_data, tables=[*lines, render.crossover_table(result)])


def window_columns(windows) -> tuple[list[str], list[np.ndarray]]:
    """A DSA model's windows as CSV columns: first, last and count of each window (empty: none)."""
    header, cols = ["batch", "prefix"], [[w.batch for w in windows], [w.prefix for w in windows]]
    for name, key in (
        ("masked_by_flops", "masked_by_flops"),
        ("masked_by_time", "masked_by_time"),
        ("dense_by_time", "dense_by_time"),
    ):
        for part in ("first", "last", "count"):
            header.append(f"{name}.{part}")
            cols.append([np.nan if getattr(w, key) is None else getattr(getattr(w, key), part) for w in windows])
    return header, [np.asarray(c, dtype=np.float64) for c in cols]
