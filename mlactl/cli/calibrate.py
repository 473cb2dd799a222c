"""`mlactl calibrate`: fit calibrated time to measurements and write a calibration file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from mlactl.cli.common import choice, cli_errors, emit, load_model, output_format
from mlactl.cli.options import FormatOpt, ModelOpt, TpOpt
from mlactl.decide.calibration import run, store
from mlactl.model import hardware as hwmod
from mlactl.util.errors import MlactlError

calibrate_app = typer.Typer(
    help="Fit calibrated time to measured kernels: tune results, aiconfigurator's tables or a CSV.",
)


SOURCES = ("results", "aiconfigurator", "csv")


def pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


@calibrate_app.command()
@cli_errors
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
    version: Annotated[
        Optional[str], typer.Option("--version", help="Framework version (default: the newest of each table).")
    ] = None,
    data_dir: Annotated[
        Optional[Path],
        typer.Option("--data-dir", help="A folder laid out as aiconfigurator's (default: the installed package's)."),
    ] = None,
    hardware: Annotated[
        Optional[str],
        typer.Option(
            "--hardware", "-g", help="Profile the fit divides by (default: from the system or the results file)."
        ),
    ] = None,
    model: ModelOpt = "deepseek-v3",
    tp: TpOpt = "1",
    name: Annotated[Optional[str], typer.Option("--name", help="Calibration name (default: hardware-source).")] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--dir", help="Write the file here (default: $MLACTL_HOME/calibrations/).")
    ] = None,
    fmt: FormatOpt = None,
):
    """Fit calibrated time per op class and write a calibration file; print the fit quality.

    Per op class: n, the terms kept, median and p90 of |predicted/measured - 1|, in-sample and held out (5-fold).

    Paths timed side by side (tune paths) are fitted together, each shape's common drift taken out first.

    Use the file with --calibration NAME on analyze, crossover, batch and plot.

    Example: mlactl calibrate --from aiconfigurator --system h200_sxm --framework sglang
    """

    fmt = output_format(fmt, None)
    if fmt == "csv":
        raise MlactlError("mlactl calibrate writes table or json")
    choice(source, "--from", SOURCES)
    hw = None
    if hardware is not None:
        hw = hwmod.resolve(hardware)
    if source == "aiconfigurator":
        if files:
            raise MlactlError("--from aiconfigurator takes no files: give --system and --framework")
        if not system or not framework:
            raise MlactlError("--from aiconfigurator needs --system (e.g. h200_sxm) and --framework (e.g. sglang)")
        default, hw, desc, groups = run.from_aiconfigurator(system, framework, version, data_dir, hw)
    else:
        if system or framework or version or data_dir:
            raise MlactlError("--system, --framework, --version and --data-dir go with --from aiconfigurator")
        if not files:
            raise MlactlError(f"--from {source} needs a file: mlactl calibrate --from {source} FILE")
        for f in files:
            if not f.is_file():
                raise MlactlError(f"{f}: no such file")
        if source == "results":
            default, hw, desc, groups = run.from_results(files, hw)
        else:
            if len(files) != 1:
                raise MlactlError("--from csv takes one file")
            if hw is None:
                raise MlactlError("--from csv needs --hardware NAME|FILE: the profile the times were measured on")
            default, hw, desc, groups = run.from_csv(files[0], load_model(model, tp), hw)
    data, fits = run.build(name or default, hw, desc, groups)
    path = store.write(data, out_dir)

    def json_data():
        return {
            "calibration": {"name": data["name"], "hardware": data["hardware"], "path": str(path)},
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

        t = Table(title=f"Calibration {data['name']} (hardware {hw.name}); |predicted/measured - 1|")
        for col in ("op", "source", "dtype", "n", "terms", "in-sample median", "p90", "held-out median", "p90"):
            wide = col in ("source", "terms")  # a fit's source ends in its phase (:decode, :prefill)
            t.add_column(
                col,
                justify="left" if col in ("op", "source", "dtype", "terms") else "right",
                overflow="fold" if wide else "ellipsis",
            )
        for f in fits:
            t.add_row(
                f.op,
                f.source,
                f.dtype,
                str(f.n),
                "+".join(f.terms),
                pct(f.in_sample["median"]),
                pct(f.in_sample["p90"]),
                pct(f.held_out["median"]),
                pct(f.held_out["p90"]),
            )
        out: list = [t]
        for drift in {id(f.drift): f.drift for f in fits if f.drift}.values():
            out.append(
                f"{' and '.join(drift['paired_with'])} were timed side by side at {drift['shapes']} shapes and fitted "
                f"together: each shape's common drift (median {pct(drift['median_abs'])}, largest "
                f"{pct(drift['max_abs'])}) was taken out first; the errors are against the drift-free times"
            )
        return out + [f"written: {path}  (use: --calibration {data['name']} --hardware {hw.name})"]

    emit(fmt, None, json_data=json_data, tables=tables() if fmt == "table" else ())
