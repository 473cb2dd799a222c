"""What every command shares when it runs: errors as one line, the guards of its inputs and
outputs, parsing one value, resolving the shared options (model, hardware, calibration, dtypes,
and the settings a results file or a calibration brings) once, and writing a table, JSON or CSV
to stdout or a file."""

from __future__ import annotations

import functools
import io
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from mlactl.cli.options import Opts, given_options, shared  # noqa: F401 - given_options: for the commands
from mlactl.decide import setup as settings
from mlactl.decide.setup import Setup
from mlactl.output.render import calibration_line  # noqa: F401 - for the commands
from mlactl.output.report import calibration_json, dumps  # noqa: F401 - for the commands
from mlactl.output.tables import fit_any
from mlactl.util import io as files
from mlactl.util import progress, safe
from mlactl.util.defaults import ACT_DTYPES, OUTPUT_FORMATS
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
    return "\n".join(f"Error: {safe.text(safe.excerpts(part), MAX_ERROR)}" for part in parts)


def _progress_display():
    """Bars on stderr when it is a terminal (rich.progress is imported only then: a command in a
    pipe or a script starts without it), else None."""
    console = Console(stderr=True, emoji=False)
    if not console.is_terminal:
        return None
    from mlactl.output import progress as progress_bar

    return progress_bar.display(console)


def cli_errors(fn):
    """Run a command inside its guards: the files it reads are remembered (no output may replace
    one), long tasks get a progress bar on stderr when it is a terminal, and a library error
    becomes one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with files.command_scope(), progress.showing(_progress_display()):
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


def command(app: typer.Typer, name: str | None, *names: str, end: tuple[str, ...] = (), **override):
    """Register a function as `app`'s command `name` (None: the function's name), run inside
    cli_errors, with the shared options `names` and `end` (mlactl.cli.options.shared; `override`
    replaces a definition). With none, it takes only its own options.

        @command(analyze_app, "analyze", *MACHINE, end=OUTPUT)
        def analyze(opts: Opts, batch: BatchOpt = "1", ...): ...
    """

    def register(fn):
        if names or end or override:
            fn = shared(*names, end=end, **override)(fn)
        return app.command(name=name)(cli_errors(fn))

    return register


one_int = settings.one_int
choice = settings.choice


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


def store_listing(command: str, fmt, output, folder: Optional[Path], default: Path, what: str, writer: str):
    """What `calibrate list` and `tune list` share: (the format, table or json; the folder, --dir
    checked or else `default`; the line to print where it holds none of `what`)."""
    fmt = output_format(fmt, output)
    if fmt == "csv":
        raise MlactlError(f"{command} writes table or json")
    if folder is not None and not folder.is_dir():
        raise MlactlError(f"--dir {safe.text(folder)}: {'not a folder' if folder.exists() else 'no such folder'}")
    where = folder if folder is not None else default
    none = f"no {what} in {safe.markup(where)}" + ("" if folder is not None else f" yet: `{writer}` writes them there")
    return fmt, where, none


def load_model(model: str, tp: str):
    return settings.load_model(model, tp)


def resolve(opts: Opts, results_files=(), find_results: bool = False) -> Setup:
    """The model, hardware, calibration and dtypes of a run, the one way every command and the
    Python API take them (mlactl.decide.setup): an option the user did not type is not given,
    and falls back to the command's own default."""
    shared = ("model", "hardware", "tp", "kv_dtype", "dtype")
    return settings.setup(
        **{k: (getattr(opts, k) if opts.typed(k) else None) for k in shared},
        chunk=opts.chunk,
        calibration=opts.calibration,
        measured_ceilings=opts.measured,
        results_files=results_files,
        find_results=find_results,
        defaults={k: getattr(opts, k) for k in shared},
    )


def console(output: Optional[Path] = None):
    """The console tables print on: stdout's (or a recording for -o). No emoji codes: a name
    like `:fire:` from a file prints as written (rich's markup escape does not cover them).
    Piped or to a file there are no colours, so rich's number highlighting is off there: it
    only compiles and runs its regexes (about 10 ms of a one-shape analyze)."""
    if output is None:
        con = Console(emoji=False)
        if not con.is_terminal:  # piped: rich would assume 80 columns and fold the tables
            con = Console(width=max(con.width, 132), emoji=False, highlight=False)
        return con
    return Console(record=True, file=io.StringIO(), width=132, emoji=False, highlight=False)


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
        width = con.width if output is None and con.is_terminal else None
        for item in tables:
            con.print(fit_any(item, width))  # a terminal's width: stacked, never a number cut
        if output is not None:
            with atomic_open(output, "w") as fh:
                fh.write(con.export_text())


def table_width(output: Optional[Path]) -> tuple[int, bool]:
    """The width tables must fit, and whether it is a terminal's (where columns may be dropped);
    piped or written to a file, the tables print every value in full within 132 columns."""
    width = fit_width(output)
    return (132, False) if width is None else (width, True)
