"""`mlactl list`: the models and hardware profiles mlactl knows."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mlactl.cli.common import command, emit, fit_width, output_format
from mlactl.cli.options import OUTPUT, Option, Opts
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.output import render, report
from mlactl.util.errors import MlactlError

list_app = typer.Typer(add_completion=False)


# list writes two tables, so no CSV: its --format says so
FORMAT = Option(
    Annotated[
        Optional[str], typer.Option("--format", "-f", help="table or json (default: from --output's extension).")
    ],
    None,
)


@command(list_app, "list", *OUTPUT, fmt=FORMAT)
def list_cmd(opts: Opts):
    """The models and the hardware profiles mlactl knows.

    Example: mlactl list --format json
    """

    fmt, output = output_format(opts.fmt, opts.output), opts.output
    if fmt == "csv":
        raise MlactlError("mlactl list writes table or json (two tables do not make one CSV)")
    models = [(name, model.from_name(name)) for name in model.preset_names()]
    profiles = hardware.all_profiles()
    emit(
        fmt,
        output,
        json_data=lambda: report.list_json(models, profiles),
        tables=[render.models_table(models, fit_width(output)), render.hardware_table(profiles, fit_width(output))],
    )
