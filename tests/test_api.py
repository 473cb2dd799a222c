"""docs/python-api.md runs as written: each ```python block in order, in one namespace; a block's
`# ...` lines right after a print are the output it states (`...` matches anything), checked
against what it printed. The figures it states were worked out apart from the code under test:
170.7 is DeepSeek-V3's asymptotic crossover by hand (docs/design.md), the best paths and engine
losses are the golden files' (tests/golden/, recorded before the front door existed)."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def stated(block: str) -> list[str]:
    """The output lines a block states: its `# ` comment lines that follow a print call."""
    out, after_print = [], False
    for line in block.splitlines():
        if line.startswith("# ") and after_print:
            out.append(line[2:])
            continue
        after_print = line.lstrip().startswith("print(") or (after_print and line.startswith("    "))
    return out


def test_the_doc_has_examples_that_state_their_output():
    assert len(BLOCKS) >= 6
    assert sum(len(stated(b)) for b in BLOCKS) >= 8


def test_every_example_runs_and_prints_what_the_doc_says(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    namespace: dict = {}
    for i, block in enumerate(BLOCKS):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(block, f"docs/python-api.md block {i + 1}", "exec"), namespace)
        printed = buf.getvalue().splitlines()
        for line in stated(block):
            pattern = ".*".join(re.escape(part) for part in line.split("..."))
            assert any(re.fullmatch(pattern, p.rstrip()) for p in printed), (i + 1, line, printed)


def test_the_result_is_the_commands_document():
    """The front door and `mlactl analyze -f json` give one document (a second route: the CLI)."""
    import json

    from typer.testing import CliRunner

    import mlactl
    from mlactl.cli import app

    args = ["--hardware", "h200", "--new", "1,300", "--prefix", "0,16K", "--batch", "1,8"]
    cli = json.loads(CliRunner().invoke(app, ["analyze", *args, "-f", "json"]).stdout)
    api = mlactl.analyze(hardware="h200", new=[1, 300], prefix="0,16K", batch=[1, 8]).to_json()
    cli.pop("mlactl_version", None)
    api.pop("mlactl_version", None)
    assert api == cli


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param("mlactl.analyze(new=[0])", "--new", id="new-zero"),
        pytest.param("mlactl.analyze(prefix=[1], context=[2])", "either --prefix or --context", id="both"),
        pytest.param("mlactl.crossover(batch=True)", "--batch", id="bool"),
        pytest.param("mlactl.engine_loss(engines=['tgi'])", "unknown engine 'tgi'", id="engine"),
        pytest.param(
            "mlactl.analyze(kv_dtyp='fp8')",
            "mlactl.analyze() takes no setting 'kv_dtyp' (did you mean kv_dtype?)",
            id="typo",
        ),
        pytest.param(
            "mlactl.crossover(engines='sglang')", "mlactl.crossover() takes no setting 'engines'", id="no-engines"
        ),
        pytest.param(  # settings already resolved: a typo beside them is still refused, not ignored
            "mlactl.engine_loss(setup=mlactl.api.common._setup('t', None, None, {}), tpp=8)",
            "mlactl.engine_loss() takes no setting 'tpp' (did you mean tp?)",
            id="typo-with-setup",
        ),
    ],
)
def test_bad_input_raises_the_one_line_error(call, message):
    import mlactl

    with pytest.raises(mlactl.MlactlError, match=re.escape(message)):
        eval(call, {"mlactl": mlactl})


def test_importing_mlactl_loads_no_heavy_module_and_no_job_until_used():
    code = (
        "import sys, mlactl\n"
        "print(sorted(m for m in ('torch', 'triton', 'matplotlib', 'pandas', 'mlactl.api.grid') if m in sys.modules))\n"
        "mlactl.crossover\n"
        "print('mlactl.api.grid' in sys.modules, 'mlactl.api.replay' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True False"]
