"""How the root command ends: every failure is one line on stderr and exit status 2, a closed
pipe is a quiet exit, and warnings (a bad file skipped) are one `Warning:` line each."""

from __future__ import annotations

import codecs
import os
import signal
import sys
import warnings

import typer

from mlactl.util import safe
from mlactl.util.errors import MlactlWarning

try:  # typer >= 0.24 carries its own click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors  # type: ignore[no-redef]

# 128 + SIGPIPE: what the shell reports for `cat` or `seq` whose reader went away.
EXIT_PIPE = 141


def _show(message, category, filename, lineno, file=None, line=None):
    """A warning as one printable `Warning: ...` line on stderr, without the source line Python
    adds (a name in it with an escape or a newline cannot colour the terminal or break the line)."""
    sys.stderr.write(f"Warning: {safe.text(safe.excerpts(str(message)), 2000)}\n")


def _quiet_pipe() -> None:
    """stdout's reader is gone: point stdout at /dev/null so the interpreter's final flush
    does not print 'Exception ignored ... BrokenPipeError'."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a test runner's stdout has no file descriptor
        pass


def run_root(main, args, prog_name, complete_var, standalone_mode, **extra):
    """Run click's `main` without its own error printing, and print errors as one line."""
    with warnings.catch_warnings():  # restored on return: a library caller's settings are its own
        warnings.simplefilter("default", MlactlWarning)  # each warning once per command, not per lookup
        warnings.showwarning = _show
        code = _run(main, args, prog_name, complete_var, **extra)
    if standalone_mode:
        sys.exit(code)
    return code


def _run(main, args, prog_name, complete_var, **extra) -> int:
    try:
        rv = main(args, prog_name, complete_var, standalone_mode=False, **extra)
        code = rv if isinstance(rv, int) else 0
    except click_errors.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help())  # bare `mlactl` or `mlactl plot`: the help, as before
        code = 2
    except click_errors.UsageError as exc:
        hint = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        typer.echo(
            f"Error: {safe.text(safe.excerpts(exc.format_message().replace(chr(10), ' ')), 2000)}{hint}", err=True
        )
        code = 2
    except click_errors.ClickException as exc:
        typer.echo(f"Error: {safe.text(safe.excerpts(exc.format_message().replace(chr(10), ' ')), 2000)}", err=True)
        code = 2
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        code = 130
    except BrokenPipeError:
        _quiet_pipe()
        code = EXIT_PIPE
    return code


# 128 + SIGTERM: what the shell reports for a process that SIGTERM ended.
EXIT_TERM = 143
_MAIN_PID: list[int] = []


def _terminated(signum, frame):
    """SIGTERM in the command's process: end its worker processes, then unwind as an exception, so
    a file being written keeps its old content (atomic_open removes its temporary file), a lock
    is released, and no worker outlives the command. In a forked worker: end at once."""
    if not _MAIN_PID or os.getpid() != _MAIN_PID[0]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    processes = sys.modules.get("multiprocessing")  # never imported: no worker to end
    for child in processes.active_children() if processes is not None else ():
        child.terminate()
    sys.stderr.write("Error: terminated (SIGTERM); any file being written keeps its old content\n")
    raise SystemExit(EXIT_TERM)


def exit_on_sigterm() -> None:
    """Make SIGTERM end the command the way an error does (`_terminated`); the CLI's entry point
    calls it once, a library caller keeps its own handler."""
    _MAIN_PID[:] = [os.getpid()]
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminated)


# What mlactl's tables print beyond ASCII, as a terminal or file that is not UTF-8 (LC_ALL=C)
# gets it: readable, never a UnicodeEncodeError; anything else becomes its \u escape.
ASCII_FOR = {
    "µ": "u", "✗": "x", "–": "-", "—": "-", "†": "+", "‡": "++", "≥": ">=", "≤": "<=", "…": "...",
    "→": "->", "×": "x", "·": ".", "’": "'", "“": '"', "”": '"', "²": "^2", "±": "+-", "≈": "~",
}  # fmt: skip


def _ascii(exc: UnicodeError):
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    return "".join(ASCII_FOR.get(ch, ch.encode("ascii", "backslashreplace").decode()) for ch in bad), exc.end


codecs.register_error("mlactl-ascii", _ascii)


def plain_streams() -> None:
    """On a stream whose encoding is not UTF-8 (`LC_ALL=C` with Python's UTF-8 mode off), write
    what it cannot encode as ASCII_FOR says instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding and encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="mlactl-ascii")
