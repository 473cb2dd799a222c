"""The mlactl command line: parse, call the library, render. No math here.

Each command lives in its own module (analyze.py, crossover.py, batch.py, listing.py,
engines.py, calibrate.py, plot.py, tune.py), loaded only when that command runs, so `mlactl
analyze` pays for nothing else. The options they share are defined once (options.py), and so is
what they share when they run (common.py). Bad input anywhere becomes one line on stderr,
`Error: ...`, and exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer
import typer.core
import typer.main

from mlactl.cli.errors import exit_on_sigterm, plain_streams, run_root
from mlactl.cli.helptext import polish
from mlactl.cli.options import VersionOpt
from mlactl.util import safe
from mlactl.util.suggest import did_you_mean


class LazyGroup(typer.core.TyperGroup):
    """The root command group. A command's module is imported when that command runs (or its
    help is shown): the CLI's one kind of deferred import besides the heavy modules."""

    LAZY = {
        "analyze": ("mlactl.cli.analyze", "analyze_app"),
        "batch": ("mlactl.cli.batch", "batch_app"),
        "calibrate": ("mlactl.cli.calibrate", "calibrate_app"),
        "crossover": ("mlactl.cli.crossover", "crossover_app"),
        "engines": ("mlactl.cli.engines", "engines_app"),
        "list": ("mlactl.cli.listing", "list_app"),
        "plot": ("mlactl.cli.plot", "plot_app"),
        "replay": ("mlactl.cli.replay", "replay_app"),
        "tune": ("mlactl.cli.tune", "tune_app"),
    }

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            module, attr = self.LAZY[name]
            command = typer.main.get_command(getattr(importlib.import_module(module), attr))
            command.name = name
            self.commands[name] = command
        command = super().get_command(ctx, name)
        if command is not None:
            polish(command)
        return command

    def resolve_command(self, ctx, args):
        """An unknown command is one line with the nearest names: `mlactl analyse` asks
        whether `analyze` was meant."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            hint = did_you_mean(name, self.list_commands(ctx))
            ctx.fail(f"No such command {safe.text(name, 60)!r}.{hint}")
        return super().resolve_command(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Usage errors as one `Error:` line (not click's boxed usage), and a closed pipe
        (`mlactl analyze | head`) as a quiet exit, like other Unix tools."""
        return run_root(super().main, args, prog_name, complete_var, standalone_mode, **extra)


app = typer.Typer(
    cls=LazyGroup,
    help="Expand or absorb? Exact cost model, Triton kernels and autotuner for Multi-head Latent "
    "Attention (DeepSeek-V2/V3/R1, Kimi K2).",
    no_args_is_help=True,
    # `mlactl --install-completion` (bash, zsh, fish, PowerShell) and `--show-completion`: on the
    # root only (helptext.polish keeps them off every sub-command)
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def main_options(version: VersionOpt = False):
    """Expand or absorb? Exact cost model, Triton kernels and autotuner for MLA attention."""


def main() -> None:
    if sys.argv[1:2] != ["tune"]:
        # Outside tune, mlactl's arithmetic is elementwise numpy: starting OpenBLAS's thread pool
        # would only add ~60 ms to every start. A value the user set wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    exit_on_sigterm()
    plain_streams()
    app()


if __name__ == "__main__":
    main()
