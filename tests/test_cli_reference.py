"""docs/cli.md is the CLI's own help, generated: it must match the code, and hold every command
and option a user can type."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from mlactl.cli import app
from mlactl.cli.reference import markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_committed_reference_matches_the_cli():
    assert DOC.read_text() == markdown(), "regenerate it: python -m mlactl.cli.reference > docs/cli.md"


def test_reference_names_every_command_and_option():
    text = DOC.read_text()
    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="mlactl")
    seen = 0
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        subs = [(name, command)]
        sub_ctx = typer.Context(command, info_name=name, parent=ctx)
        for sub in getattr(command, "list_commands", lambda c: [])(sub_ctx):
            subs.append((f"{name} {sub}", command.get_command(sub_ctx, sub)))
        for path, cmd in subs:
            section = text.split(f"## `mlactl {path}`\n", 1)[1].split("\n## ", 1)[0]
            for param in cmd.params:
                if param.param_type_name == "option" and param.name != "help":
                    assert f"`{param.opts[0]}`" in section, (path, param.opts[0])
                    seen += 1
    assert seen > 100  # the whole CLI, not a few commands
    # a table cell never splits on a metavar's '|'
    assert "`NAME\\|PATH`" in text and not re.search(r"`NAME\|PATH`", text)
