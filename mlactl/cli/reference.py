"""The command-line reference as Markdown, read off the CLI itself: every command, its help, its
usage line and a table of its arguments and options with their defaults.

    python -m mlactl.cli.reference > docs/cli.md

docs/cli.md is this output, committed; tests/test_cli_reference.py fails when the two differ, so
the reference cannot drift from `--help`.
"""

from __future__ import annotations

from typing import Any

import typer
import typer.main

from mlactl.cli import app

HEADER = """\
# Command-line reference

Every `mlactl` command with its arguments and options, generated from the CLI itself
(`python -m mlactl.cli.reference > docs/cli.md`; a test fails when this file and `--help`
disagree). Sizes take lists and ranges: `1,64,512`, `0:32K:4K` (ends included), `1:4096:*2`
(geometric); K = 1024, M = 1024². Bad input is one `Error:` line and exit status 2.
"""


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(param) -> str:
    if getattr(param, "is_flag", False) or param.default is None or getattr(param, "show_default", True) is False:
        return ""
    if isinstance(param.default, (list, tuple)):
        return ", ".join(str(v) for v in param.default) if param.default else ""
    return f"`{param.default}`"


def _row(param, ctx) -> str | None:
    if getattr(param, "hidden", False) or param.name == "help":
        return None
    if param.param_type_name == "argument":
        name = f"`{_cell(param.make_metavar(ctx) if param.metavar is None else param.metavar)}`"
        meaning = getattr(param, "help", "") or ""
        required = "required" if param.required else "optional"
        return f"| {name} | argument, {required} | {_default(param)} | {_cell(meaning)} |"
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    value = "" if getattr(param, "is_flag", False) else f"`{_cell(param.metavar or param.type.name.upper())}`"
    repeat = " (repeatable)" if getattr(param, "multiple", False) else ""
    return f"| {names} | {value}{repeat} | {_default(param)} | {_cell(param.help or '')} |"


def _command(command, ctx, path: list[str]) -> list[str]:
    out = [f"## `{' '.join(path)}`", ""]
    if command.help:
        out += [command.help.strip(), ""]
    pieces = " ".join(command.collect_usage_pieces(ctx))
    out += ["```text", f"{' '.join(path)} {pieces}".rstrip(), "```", ""]
    rows = [r for r in (_row(p, ctx) for p in command.params) if r]
    if rows:
        out += ["| argument or option | value | default | meaning |", "|---|---|---|---|", *rows, ""]
    for name in getattr(command, "list_commands", lambda ctx: [])(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or getattr(sub, "hidden", False):
            continue
        out += _command(sub, typer.Context(sub, info_name=name, parent=ctx), [*path, name])
    return out


def markdown() -> str:
    """The whole reference: the root's options, then each command (and sub-command) in turn."""
    root: Any = typer.main.get_command(app)  # the root group (LazyGroup)
    ctx = typer.Context(root, info_name="mlactl")
    rows = [r for r in (_row(p, ctx) for p in root.params) if r]
    lines = [HEADER, "## `mlactl`", "", "```text", "mlactl [OPTIONS] COMMAND [ARGS]...", "```", ""]
    lines += ["| argument or option | value | default | meaning |", "|---|---|---|---|", *rows, ""]
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        lines += _command(command, typer.Context(command, info_name=name, parent=ctx), ["mlactl", name])
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
