"""What every command shares: errors as one line, parsing one value, loading the model, the
hardware and a calibration, and writing a table, JSON or CSV to stdout or a file."""

from __future__ import annotations

import functools
import io
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from mlactl.decide.calibration import store as calibrations
from mlactl.model import config as models
from mlactl.model import hardware as profiles
from mlactl.model.shapes import parse_sizes
from mlactl.output.report import dumps
from mlactl.results import measured
from mlactl.results import store as results
from mlactl.util.defaults import ACT_DTYPES, OUTPUT_FORMATS
from mlactl.util.errors import MlactlError
from mlactl.util.io import atomic_open

FORMATS = OUTPUT_FORMATS
DTYPES = ACT_DTYPES


def cli_errors(fn):
    """Turn a library error into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlactlError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            if isinstance(exc, BrokenPipeError):
                raise  # the reader went away: LazyGroup.main exits quietly
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            typer.echo(f"Error:{where} {exc.strerror or exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def one_int(text: str, option: str, minimum: int = 1) -> int:

    values = parse_sizes(text, option, minimum)
    if len(values) != 1:
        raise MlactlError(f"{option} takes one value, got {text!r}")
    return values[0]


def choice(text: str, option: str, choices) -> str:
    if text not in choices:
        raise MlactlError(f"{option} must be one of {', '.join(choices)}, got {text!r}")
    return text


def output_format(fmt: Optional[str], output: Optional[Path]) -> str:
    if fmt is None:
        suffix = output.suffix.lower().lstrip(".") if output else ""
        if suffix in ("json", "csv"):
            return suffix
        if suffix not in ("", "txt", "table"):
            raise MlactlError(
                f"--output {output}: cannot tell the format from '.{suffix}'; "
                "pass --format table, json or csv, or end the name in .json, .csv or .txt"
            )
        return "table"
    return choice(fmt, "--format", FORMATS)


def load_model(model: str, tp: str):
    return models.resolve(model).with_tp(one_int(tp, "--tp"))


def load_hardware(hardware: str, measured: bool):
    return profiles.resolve(hardware, measured=measured)


def console(output: Optional[Path] = None):
    if output is None:
        con = Console()
        if not con.is_terminal:  # piped: rich would assume 80 columns and fold the tables
            con = Console(width=max(con.width, 132))
        return con
    return Console(record=True, file=io.StringIO(), width=132)


def fit_width(output: Optional[Path] = None) -> Optional[int]:
    """The width tables must fit: the terminal's, or None (piped or to a file: full values)."""
    con = console(output)
    return con.width if output is None and con.is_terminal else None


def emit(fmt: str, output: Optional[Path], *, json_data=None, write_csv=None, tables=()):
    """Write json/csv/table output to stdout or, atomically, to a file."""

    if fmt == "json":
        text = dumps(json_data())
        if output is None:
            sys.stdout.write(text)
        else:
            with atomic_open(output, "w") as fh:
                fh.write(text)
    elif fmt == "csv":
        if output is None:
            sys.stdout.flush()
            write_csv(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            with atomic_open(output, "wb") as fh:
                write_csv(fh)
    else:
        con = console(output)
        for item in tables:
            con.print(item)
        if output is not None:
            with atomic_open(output, "w") as fh:
                fh.write(con.export_text())


def explicit(ctx, **values) -> dict:
    """Of these option values, the ones the user typed (None for those left at their default)."""

    def typed(name: str) -> bool:  # by name: typer ships its own copy of click's ParameterSource
        source = ctx.get_parameter_source(name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    return {k: v if typed(k) else None for k, v in values.items()}


def measured_results(ctx, path: Optional[Path], model, tp, dtype, kv_dtype, hardware):
    """The results file for --policy measured and the settings it brings: the one given, or the
    newest `mlactl tune paths` left for this model (mlactl.results.measured). Returns (data, settings
    {model, tp, dtype, kv_dtype, hardware}, notes)."""

    given = explicit(ctx, model=model, tp=tp, dtype=dtype, kv_dtype=kv_dtype, hardware=hardware)
    data: Optional[dict]
    if path is not None:
        data = results.load(path)
    else:
        cfg = load_model(model, tp)
        dims = {k: getattr(cfg, k) for k in measured.DIMS}
        hw_name = load_hardware(given["hardware"], False).name if given["hardware"] else None
        data, path = measured.find(dims, given["kv_dtype"], hw_name)
        if data is None:
            where = f" on {hw_name}" if hw_name else ""
            kv = f", kv {given['kv_dtype']}" if given["kv_dtype"] else ""
            raise MlactlError(
                f"no measured crossovers for {cfg.name} (H={cfg.H}{kv}){where}: "
                "run `mlactl tune paths` there, or pass --results FILE"
            )
        given.update(model=model, tp=tp)  # looked up for these: the file's own name may differ
    if not measured.usable_crossovers(data):
        raise MlactlError(f"{path} has no measured crossovers (it holds no `mlactl tune paths` run)")
    picked = measured.adopt(data, str(path), given)
    settings = {
        "model": picked.model,
        "tp": str(picked.tp),
        "dtype": picked.dtype,
        "kv_dtype": picked.kv_dtype,
        "hardware": picked.hardware or hardware,
    }
    return dict(data, _path=str(path)), settings, picked.notes


def table_width(output: Optional[Path]) -> tuple[int, bool]:
    """The width tables must fit, and whether it is a terminal's (where columns may be dropped);
    piped or written to a file, the tables print every value in full within 132 columns."""
    width = fit_width(output)
    return (132, False) if width is None else (width, True)


def load_calibration(spec: Optional[str], hw):
    """The calibration for --calibration (None without it), refused for another hardware."""
    if spec is None:
        return None

    cal = calibrations.resolve(spec)
    calibrations.check_hardware(cal, hw.name)
    if hw.using_measured:
        raise MlactlError(
            f"calibration {cal.name!r} was fitted against {hw.name}'s nominal ceilings: drop --measured "
            "(its efficiencies already say how far from the datasheet the kernels run)"
        )
    return cal


def calibration_line(cal) -> str:
    return f"times: calibrated with {cal.name} ({cal.path}); ops it lacks keep roofline time"


def calibration_json(cal) -> dict:
    """What a JSON output records about its times: roofline, or the calibration used."""
    if cal is None:
        return {"time": "roofline"}
    return {"time": "calibrated", "calibration": cal.describe()}
