"""`mlactl calibrate`: fit calibrated time to measurements and write a calibration file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mlactl.cli.common import choice, cli_errors, emit, fit_width, load_model, output_format
from mlactl.cli.options import Option, Opts, shared
from mlactl.decide.calibration import run, store
from mlactl.model import hardware as hwmod
from mlactl.output.calibrate_tables import fits_table, pct, terms_lines
from mlactl.util import progress, safe
from mlactl.util.errors import MlactlError

calibrate_app = typer.Typer(
    help="Fit calibrated time to measured kernels: tune results, aiconfigurator's tables or a CSV.",
)


SOURCES = ("results", "aiconfigurator", "csv")
# calibrate prints a table or JSON on stdout (the calibration itself is a file in --dir)
FORMAT = Option(Annotated[Optional[str], typer.Option("--format", "-f", help="table or json (default: table).")], None)
HARDWARE = Option(
    Annotated[
        Optional[str],
        typer.Option(
            "--hardware", "-g", help="Profile the fit divides by (default: from the system or the results file)."
        ),
    ],
    None,
)


@calibrate_app.command()
@cli_errors
@shared("hardware", "model", "tp", end=("fmt",), hardware=HARDWARE, fmt=FORMAT)
def calibrate(
    files: Annotated[
        Optional[list[Path]], typer.Argument(help="Results files (--from results) or one CSV (--from csv).")
    ] = None,
    source: Annotated[str, typer.Option("--from", help="results, aiconfigurator or csv.")] = "results",
    system: Annotated[
        Optional[str], typer.Option("--system", help="aiconfigurator system, e.g. h200_sxm, h100_sxm, b200_sxm.")
    ] = None,
    framework: Annotated[
        Optional[str], typer.Option("--framework", help="aiconfigurator framework: sglang, trtllm or vllm.")
    ] = None,
    framework_version: Annotated[
        Optional[str],
        typer.Option(
            "--framework-version", help="aiconfigurator framework version (default: the newest of each table)."
        ),
    ] = None,
    data_dir: Annotated[
        Optional[Path],
        typer.Option("--data-dir", help="A folder laid out as aiconfigurator's (default: the installed package's)."),
    ] = None,
    opts: Opts = Opts(),
    name: Annotated[Optional[str], typer.Option("--name", help="Calibration name (default: hardware-source).")] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--dir", help="Write the file here (default: $MLACTL_HOME/calibrations/).")
    ] = None,
):
    """Fit calibrated time per op class and write a calibration file; print the fit quality.

    Per op class: n, the terms kept, median and p90 of |predicted/measured - 1|, held out (5-fold) and in-sample.

    Paths timed side by side (tune paths) are fitted together, each shape's common drift taken out first.

    A calibration of the same name already there is kept aside (NAME.YYYYMMDD-HHMMSS.json), never overwritten.

    Use the file with --calibration NAME on analyze, crossover, batch, engines and plot (they take its hardware).

    Example: mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang
    """

    fmt = output_format(opts.fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate writes table or json")
    choice(source, "--from", SOURCES)
    hw = None
    if opts.hardware is not None:
        hw = hwmod.resolve(opts.hardware)
    if source == "aiconfigurator":
        if files:
            raise MlactlError("--from aiconfigurator takes no files: give --system and --framework")
        missing = [
            f"{o} (e.g. {e})"
            for o, v, e in (("--system", system, "h200_sxm"), ("--framework", framework, "sglang"))
            if not v
        ]
        if missing or system is None or framework is None:
            raise MlactlError(f"--from aiconfigurator needs {' and '.join(missing)}")
        with progress.task("reading aiconfigurator's tables"):
            default, hw, desc, groups = run.from_aiconfigurator(system, framework, framework_version, data_dir, hw)
    else:
        if system or framework or framework_version or data_dir:
            raise MlactlError("--system, --framework, --framework-version and --data-dir go with --from aiconfigurator")
        if not files:
            raise MlactlError(f"--from {source} needs a file: mlactl calibrate --from {source} FILE")
        if source == "results":
            with progress.task(f"reading {len(files)} results file(s)"):
                default, hw, desc, groups = run.from_results(files, hw)
        else:
            if len(files) != 1:
                raise MlactlError("--from csv takes one file")
            if hw is None:
                raise MlactlError("--from csv needs --hardware NAME|FILE: the profile the times were measured on")
            default, hw, desc, groups = run.from_csv(files[0], load_model(opts.model, opts.tp), hw)
    data, fits = run.build(name or default, hw, desc, groups)
    path, kept = store.save(data, out_dir)

    def json_data():
        return {
            "calibration": {
                "name": data["name"],
                "hardware": data["hardware"],
                "path": str(path),
                "replaced": None if kept is None else str(kept),  # where the earlier one was kept
            },
            "fits": [
                {
                    "op": f.op,
                    "source": f.source,
                    "dtype": f.dtype,
                    "terms": list(f.terms),
                    "n": f.n,
                    # `near`'s residual table stays in the file: here, how many points it holds
                    "params": {
                        k: ({"points": len(v["log_residual"])} if k == "near" else v) for k, v in f.params.items()
                    },
                    "in_sample": f.in_sample,
                    "held_out": f.held_out,
                    **({"drift": f.drift} if f.drift else {}),
                }
                for f in fits
            ],
        }

    def tables():
        out: list = [fits_table(data["name"], hw.name, fits, fit_width()), *terms_lines(fits)]
        for drift in {id(f.drift): f.drift for f in fits if f.drift}.values():
            out.append(
                f"{' and '.join(drift['paired_with'])} were timed side by side at {drift['shapes']} shapes and fitted "
                f"together: each shape's common drift (median {pct(drift['median_abs'])}, largest "
                f"{pct(drift['max_abs'])}) was taken out first; the errors are against the drift-free times"
            )
        if kept is not None:
            out.append(
                f"replaced: {safe.markup(path)} (the earlier calibration of this name is kept as {safe.markup(kept)})"
            )
        else:
            out.append(f"written: {safe.markup(path)}")
        out.append(
            f"use: --calibration {safe.markup(data['name'])}  (its hardware, {safe.markup(hw.name)}, comes with it)"
        )
        return out

    emit(fmt, None, json_data=json_data, tables=tables() if fmt == "table" else ())
