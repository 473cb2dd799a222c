"""What every command shares when it runs: errors as one line, the guards of its inputs and
outputs, parsing one value, resolving the shared options (model, hardware, calibration, dtypes,
and the settings a results file or a calibration brings) once, and writing a table, JSON or CSV
to stdout or a file."""

from __future__ import annotations

import functools
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from mlactl.cli.options import Opts, given_options  # noqa: F401 - given_options: for the commands
from mlactl.decide.calibration import store as calibrations
from mlactl.decide.calibration.store import Calibration
from mlactl.model import config as models
from mlactl.model import hardware as profiles
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.shapes import parse_sizes
from mlactl.output import progress as progress_bar
from mlactl.output.render import calibration_line  # noqa: F401 - for the commands
from mlactl.output.report import calibration_json, dumps  # noqa: F401 - for the commands
from mlactl.results import measured
from mlactl.results import store as results
from mlactl.util import io as files
from mlactl.util import progress, safe
from mlactl.util.defaults import ACT_DTYPES, KV_DTYPES, OUTPUT_FORMATS
from mlactl.util.errors import MlactlError
from mlactl.util.io import atomic_open

FORMATS = OUTPUT_FORMATS
DTYPES = ACT_DTYPES
# An error line is a sentence, not a name: longer than a name may be, never more than one line.
MAX_ERROR = 2000


def error_line(message) -> str:
    """`Error: ...` as printable text (mlactl.util.safe.text): a path or a name with an ANSI
    escape or a newline in it cannot colour the terminal or start a line of its own. A message
    that holds several errors on purpose (a trace's bad lines, each `\nError: ...`) keeps them
    as lines, each printable."""
    parts = str(message).split("\nError: ")
    return "\n".join(f"Error: {safe.text(part, MAX_ERROR)}" for part in parts)


def cli_errors(fn):
    """Run a command inside its guards: the files it reads are remembered (no output may replace
    one), long tasks get a progress bar on stderr when it is a terminal, and a library error
    becomes one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with files.command_scope(), progress.showing(progress_bar.display()):
                return fn(*args, **kwargs)
        except MlactlError as exc:
            typer.echo(error_line(exc), err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            if isinstance(exc, BrokenPipeError):
                raise  # the reader went away: LazyGroup.main exits quietly
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            typer.echo(error_line(f"{where}{exc.strerror or exc}"), err=True)
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


@dataclass
class Setup:
    """What a command's shared options (mlactl.cli.options.Opts) resolve to."""

    cfg: MLAConfig
    hw: HardwareProfile
    calibration: Optional[Calibration]
    kv_dtype: str
    dtype: str
    chunk: int
    notes: list[str] = field(default_factory=list)  # where a setting came from, plain text (markup_notes)
    results: list[dict] = field(default_factory=list)  # results files read (each with "_path")

    def cost(self) -> CostModel:
        return CostModel(self.cfg, kv_dtype=self.kv_dtype, dtype=self.dtype, chunk=self.chunk)

    def markup_notes(self) -> list[str]:
        """The notes as lines for a rich console (names in them escaped)."""
        return [safe.markup(n, MAX_ERROR) for n in self.notes]


def resolve(opts: Opts, results_files=(), find_results: bool = False) -> Setup:
    """The model, hardware, calibration and dtypes of a run, the one way every command takes
    them. A setting the user did not type comes, in this order, from the first results file
    (`results_files`, or with `find_results` the newest `mlactl tune paths` left for this
    model: its model, tp, dtypes and hardware, as `analyze --results` always took them), from
    the calibration (the hardware it was fitted on), else from the option's default. A typed
    option that contradicts a file is an error naming both."""
    values = {k: getattr(opts, k) for k in ("model", "tp", "dtype", "kv_dtype", "hardware")}
    given = {k: (v if opts.typed(k) else None) for k, v in values.items()}
    notes: list[str] = []
    loaded = [dict(results.load(p), _path=str(p)) for p in results_files]
    if find_results and not loaded:
        loaded = [_newest_results(opts, given)]
        given.update(model=opts.model, tp=opts.tp)  # looked up for these: the file's own name may differ
    if loaded:
        picked = measured.adopt(loaded[0], loaded[0]["_path"], given)
        values.update(model=picked.model, tp=str(picked.tp), dtype=picked.dtype, kv_dtype=picked.kv_dtype)
        values["hardware"] = picked.hardware or values["hardware"]
        given["hardware"] = given["hardware"] or picked.hardware
        notes += picked.notes
    cal = calibrations.resolve(opts.calibration) if opts.calibration is not None else None
    if cal is not None and given["hardware"] is None:
        values["hardware"] = cal.hardware
        notes.append(f"hardware {cal.hardware}: the profile calibration {cal.name} was fitted on")
    hw = profiles.resolve(values["hardware"], measured=opts.measured)
    if cal is not None:
        calibrations.check_hardware(cal, hw.name)
        if hw.using_measured:
            raise MlactlError(
                f"calibration {cal.name!r} was fitted against {hw.name}'s nominal ceilings: drop --measured "
                "(its efficiencies already say how far from the datasheet the kernels run)"
            )
        calibrations.check_ceilings(cal, hw)
    return Setup(
        cfg=load_model(values["model"], values["tp"]),
        hw=hw,
        calibration=cal,
        kv_dtype=choice(values["kv_dtype"], "--kv-dtype", KV_DTYPES),
        dtype=choice(values["dtype"], "--dtype", DTYPES),
        chunk=one_int(opts.chunk, "--chunk"),
        notes=notes,
        results=loaded,
    )


def _newest_results(opts: Opts, given: dict) -> dict:
    """The newest results file `mlactl tune paths` left for the model asked (mlactl.results.measured)."""
    cfg = load_model(opts.model, opts.tp)
    dims = {k: getattr(cfg, k) for k in measured.DIMS}
    hw_name = profiles.resolve(given["hardware"]).name if given["hardware"] else None
    data, path = measured.find(dims, given["kv_dtype"], hw_name)
    if data is None:
        where = f" on {hw_name}" if hw_name else ""
        kv = f", kv {given['kv_dtype']}" if given["kv_dtype"] else ""
        raise MlactlError(
            f"no measured crossovers for {cfg.name} (H={cfg.H}{kv}){where}: "
            "run `mlactl tune paths` there, or pass --results FILE"
        )
    return dict(data, _path=str(path))


def console(output: Optional[Path] = None):
    """The console tables print on: stdout's (or a recording for -o). No emoji codes: a name
    like `:fire:` from a file prints as written (rich's markup escape does not cover them)."""
    if output is None:
        con = Console(emoji=False)
        if not con.is_terminal:  # piped: rich would assume 80 columns and fold the tables
            con = Console(width=max(con.width, 132), emoji=False)
        return con
    return Console(record=True, file=io.StringIO(), width=132, emoji=False)


def fit_width(output: Optional[Path] = None) -> Optional[int]:
    """The width tables must fit: the terminal's, or None (piped or to a file: full values)."""
    con = console(output)
    return con.width if output is None and con.is_terminal else None


def emit(fmt: str, output: Optional[Path], *, json_data=None, write_csv=None, tables=()):
    """Write json/csv/table output to stdout or, atomically, to a file."""

    if fmt in ("json", "csv") and (output is not None or not sys.stdout.isatty()):
        # a million rows take seconds; a spinner on the terminal meanwhile (not amid rows printed to it)
        with progress.task(f"writing {fmt}"):
            _emit(fmt, output, json_data, write_csv, tables)
    else:
        _emit(fmt, output, json_data, write_csv, tables)


def _emit(fmt: str, output: Optional[Path], json_data, write_csv, tables) -> None:
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


def table_width(output: Optional[Path]) -> tuple[int, bool]:
    """The width tables must fit, and whether it is a terminal's (where columns may be dropped);
    piped or written to a file, the tables print every value in full within 132 columns."""
    width = fit_width(output)
    return (132, False) if width is None else (width, True)
