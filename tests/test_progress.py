"""Progress of long work: reported through mlactl/util/progress.py, shown by
mlactl/output/progress.py as a bar on a terminal's stderr, never in a pipe; without a display a
task costs nothing."""

import json

import pytest
from conftest import plain, runner, save_calibration

from mlactl.cli import app


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_long_work_shows_a_bar_on_a_terminal_only(home, terminal):
    env = {"MLACTL_PROGRESS_AFTER": "0", "COLUMNS": "100"}
    env["TTY_COMPATIBLE"] = "1" if terminal else "0"
    # a calibrated search over 256 prefixes: seconds of work
    name = save_calibration(home)
    out = runner.invoke(app, ["crossover", "--calibration", name, "--prefix", "0:255K:1K", "-f", "json"], env=env)
    assert out.exit_code == 0, out.stderr
    json.loads(out.stdout)  # stdout is the answer alone
    if terminal:
        assert "crossover search (expand against absorb)" in plain(out.stderr)
    else:
        assert out.stderr == ""


def test_progress_tasks_cost_nothing_without_a_display():
    from mlactl.util import progress

    with progress.task("anything", total=3) as bar:
        bar.advance(2)
    assert bar is progress.SILENT
