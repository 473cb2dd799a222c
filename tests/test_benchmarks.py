"""benchmarks/: every script still imports what it uses from mlactl and answers `--help`.

No test runs a benchmark (a timing never decides a test), so a renamed or removed library name
would break a script without any test failing; this imports each one and builds its parser.
"""

from __future__ import annotations

import ast
import importlib
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))


def test_the_benchmarks_are_found():
    assert {"bench_analyze.py", "bench_replay.py", "bench_transfer.py", "gpu_check.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_imports_and_answers_help(script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert stop.value.code == 0, capsys.readouterr().err
    assert "usage:" in capsys.readouterr().out


def mlactl_imports(script: str) -> list[tuple[str, str]]:
    """(module, name) of every `from mlactl... import name` in the script, inside functions too
    (scripts import the library late, after parsing their options)."""
    tree = ast.parse((BENCHMARKS / script).read_text())
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlactl"
        for alias in node.names
    ]


@pytest.mark.parametrize("script", [s for s in SCRIPTS if mlactl_imports(s)])
def test_every_name_a_benchmark_imports_from_mlactl_exists(script):
    missing = []
    for module, name in mlactl_imports(script):
        try:
            found = importlib.import_module(module)
        except ImportError:
            missing.append(module)
            continue
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script} imports what mlactl no longer has: {', '.join(missing)}"
