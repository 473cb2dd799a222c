"""A plain, non-editable install runs from any folder: profiles ship inside the wheel and the
`kernels/` folder installs as mlactl.kernels.

The wheel goes into a fresh virtual environment that borrows this environment's dependencies
through a .pth line (so no download), never this checkout: its site-packages come first, and the
editable install's finder of this checkout is not loaded there.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs_from_another_folder(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        cwd=tmp_path,
    )
    wheel = next(dist.glob("mlactl-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # no PYTHONPATH: with the source tree on it, pip would see this mlactl as installed and skip it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLACTL_HOME")}
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        env=env,
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env["MLACTL_HOME"] = str(tmp_path / "home")
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import mlactl, mlactl.kernels.configs as c, mlactl.profiles as p; "
            "print(mlactl.__file__); print(p.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=elsewhere,
        env=env,
    ).stdout.split()
    assert all(str(site) in w for w in where), where
    out = subprocess.run(
        [str(venv / "bin" / "mlactl"), "analyze", "--hardware", "h200", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=elsewhere,
        env=env,
    ).stdout
    data = json.loads(out)
    assert data["hardware"]["name"] == "h200" and len(data["rows"]) == 18
    listed = subprocess.run(
        [str(venv / "bin" / "mlactl"), "list"], capture_output=True, text=True, check=True, cwd=elsewhere, env=env
    ).stdout
    assert "mi300x" in listed
    # the front door and the transfer error model ship too
    shipped = subprocess.run(
        [
            str(python),
            "-c",
            "import mlactl; from mlactl.decide.calibration import transfer; "
            "print(mlactl.crossover(hardware='h200', prefix=[0]).to_json()['crossover']['asymptotic_new'] > 170, "
            "len(transfer.error_model()['errors']) > 0)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=elsewhere,
        env=env,
    ).stdout.split()
    assert shipped == ["True", "True"]
