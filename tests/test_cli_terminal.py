"""The command line as a user's shell meets it: `python -m mlactl` runs it, a mistyped command
gets a did-you-mean, shell completion completes commands and options, every command's help reads
alike (kinds, defaults, no completion options below the root), and every table and help is whole
at 80 columns in a pseudo-terminal."""

import json
import re
import sys

import pytest
from conftest import plain, runner

from mlactl.cli import app

COMMANDS = [
    [],
    ["analyze"],
    ["crossover"],
    ["batch"],
    ["list"],
    ["engines"],
    ["calibrate"],
    ["tune"],
    ["tune", "ceilings"],
    ["tune", "kernels"],
    ["tune", "paths"],
    ["tune", "compile"],
    ["plot"],
    ["plot", "roofline"],
    ["plot", "crossover"],
    ["plot", "pathmap"],
    ["plot", "tune"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c) or "root")
def test_help_reads_alike(command):
    out = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = out.output
    assert "<str>" not in text and "<int>" not in text
    if command:  # completion is offered once, on the root (`mlactl --install-completion`)
        assert "install-completion" not in text and "show-completion" not in text
    for line in text.splitlines():
        assert not ("(default" in line and "[default:" in line), line
    assert "{requests}" not in text


def test_help_kinds_and_defaults():
    text = runner.invoke(app, ["analyze", "--help"], env={"COLUMNS": "250"}).output
    assert re.search(r"--tp\s+INT", text) and re.search(r"--new\s+-n\s+RANGE", text)
    assert re.search(r"--output\s+-o\s+PATH", text)
    assert "(default: 0,8K,32K)" in text
    usage = runner.invoke(app, ["batch", "--help"], env={"COLUMNS": "250"}).output
    assert "batch [OPTIONS] REQUESTS.CSV" in usage


def test_python_dash_m_mlactl_runs_the_cli():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "mlactl", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mlactl ")


@pytest.mark.parametrize("typed, meant", [("analyse", "analyze"), ("cross", "crossover"), ("replya", "replay")])
def test_mistyped_command_gets_did_you_mean(typed, meant):
    out = runner.invoke(app, [typed])
    assert out.exit_code == 2
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"did you mean {meant}?" in lines[0], out.output


def test_shell_completion_is_offered_and_completes_commands():
    shown = runner.invoke(app, ["--show-completion", "bash"], prog_name="mlactl")
    assert shown.exit_code == 0 and "_mlactl_completion" in shown.output
    env = {"_MLACTL_COMPLETE": "complete_bash", "COMP_WORDS": "mlactl ana", "COMP_CWORD": "1"}
    assert runner.invoke(app, [], env=env, prog_name="mlactl").output.split() == ["analyze"]
    env = {"_MLACTL_COMPLETE": "complete_bash", "COMP_WORDS": "mlactl analyze --hard", "COMP_CWORD": "2"}
    assert runner.invoke(app, [], env=env, prog_name="mlactl").output.split() == ["--hardware"]
    # sub-commands do not repeat them
    assert "--install-completion" not in runner.invoke(app, ["analyze", "--help"]).output


# -- every command whole at 80 columns, in a pseudo-terminal ---------------------------------------


def in_terminal(args, cwd, columns: int = 80, timeout: float = 180.0) -> str:
    """`python -m mlactl ARGS` in a pseudo-terminal `columns` wide (as a user's shell runs it:
    rich sees a terminal and its size), its output without ANSI codes."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(cwd)
        env = dict(os.environ, COLUMNS=str(columns), LINES="50", TERM="xterm", NO_COLOR="1")
        env.pop("TTY_COMPATIBLE", None)
        os.execvpe(sys.executable, [sys.executable, "-m", "mlactl", *args], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    else:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(fd)
    return plain(out.decode("utf-8", "replace")).replace("\r\n", "\n")


def _trace_lines(n: int = 120) -> str:
    rows = []
    for i in range(n):  # tests/test_golden.py's trace, shorter
        tokens = 600 + 997 * (i % 7) + (9000 if i % 13 == 5 else 0)
        blocks, shared = -(-tokens // 512), min(i % 5, -(-tokens // 512) - 1)
        ids = list(range(1, shared + 1)) + [1000 * (i + 1) + b for b in range(blocks - shared)]
        rows.append({"timestamp": 100 * i, "input_length": tokens, "output_length": 20 + 37 * (i % 4), "hash_ids": ids})
    return "".join(json.dumps(r) + "\n" for r in rows)


TABLES_80 = [
    ["analyze"],
    ["analyze", "--hardware", "h200", "--new", "1,256,4096", "--prefix", "0,32K", "--ops"],
    ["crossover", "--max-new", "64"],
    ["batch", "req.csv"],  # new=512 was `5…`
    ["engines"],
    ["replay", "trace.jsonl"],  # `10,…`, `1.…`, `375…`, `sglang-t…`
    ["list"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", TABLES_80 + [[*c, "--help"] for c in COMMANDS] + [["replay", "--help"]],
                         ids=lambda a: "-".join(a))  # fmt: skip
def test_every_table_and_help_is_whole_at_80_columns(tmp_path, home, args):
    (tmp_path / "req.csv").write_text("new,prefix,count\n1,8000,32\n1,300,16\n512,0,1\n64,4096,2\n3000,12000,1\n")
    (tmp_path / "trace.jsonl").write_text(_trace_lines())
    text = in_terminal(args, tmp_path)
    assert "Traceback" not in text and "Error" not in text, text
    assert "…" not in text, text  # nothing cut: no number, name or example shortened
    assert max(len(line) for line in text.splitlines()) <= 80, text
    if args == ["batch", "req.csv"]:
        assert "512" in text and "3000" in text
