"""How the root command ends: every failure is one line on stderr and exit status 2, a closed
pipe is a quiet exit, and warnings (a bad file skipped) are one `Warning:` line each."""

from __future__ import annotations

import os
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
    sys.stderr.write(f"Warning: {safe.text(message, 2000)}\n")


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
        typer.echo(f"Error: {safe.text(exc.format_message().replace(chr(10), ' '), 2000)}{hint}", err=True)
        code = 2
    except click_errors.ClickException as exc:
        typer.echo(f"Error: {safe.text(exc.format_message().replace(chr(10), ' '), 2000)}", err=True)
        code = 2
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        code = 130
    except BrokenPipeError:
        _quiet_pipe()
        code = EXIT_PIPE
    return code
