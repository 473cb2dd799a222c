"""`mlactl crossover`: for each prefix, the new-token count from which expand beats absorb."""

from __future__ import annotations

from typing import Annotated

import typer

from mlactl.api import grid as api
from mlactl.cli.common import command, emit, output_format, resolve
from mlactl.cli.options import MACHINE, OUTPUT, BatchOpt, Opts
from mlactl.output import render

crossover_app = typer.Typer(add_completion=False)


@command(crossover_app, "crossover", *MACHINE, end=OUTPUT)
def crossover_cmd(
    opts: Opts,
    batch: BatchOpt = "1",
    prefix: Annotated[
        str, typer.Option("--prefix", "-p", help="Prefixes to solve for: list or range.")
    ] = "0,1K,4K,8K,16K,32K,64K,128K",
    max_new: Annotated[
        str,
        typer.Option(
            "--max-new",
            help="Search the crossover up to this many new tokens (none found: `> N` in the table, "
            "an empty CSV field, null in JSON).",
        ),
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
    answer = api.crossover(setup=setup, batch=batch, prefix=prefix, max_new=max_new)
    result = answer.value
    emit(
        fmt,
        opts.output,
        json_data=answer.to_json,
        write_csv=answer.write_csv,
        tables=[
            *render.crossover_lines(setup.cost(), setup.hw, setup.calibration),
            *setup.markup_notes(),
            render.crossover_table(result),
        ],
    )
