"""benchmarks/: every script still imports what it uses from mlactl and answers `--help`.

No test runs a benchmark (a timing never decides a test), so a renamed or removed library name
would break a script without any test failing; this imports each one and builds its parser.
"""

from __future__ import annotations

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
