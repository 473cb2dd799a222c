"""Where mlactl keeps what a user measured: one folder, $MLACTL_HOME, default
$XDG_DATA_HOME/mlactl or ~/.local/share/mlactl. Not a cache: nothing here is thrown away."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mlactl.util import safe

ENV_HOME = "MLACTL_HOME"


def home() -> Path:
    if os.environ.get(ENV_HOME):
        return Path(os.environ[ENV_HOME]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "mlactl"


def user_hardware_dir() -> Path:
    return home() / "hardware"


def results_dir() -> Path:
    return home() / "results"


def path_component(name: str, limit: int = 120) -> str:
    """`name` as one safe file or folder name (mlactl.util.safe.filename): '..', '/tmp/x' or
    '../../x' from a config.json's _name_or_path stays one name inside its folder."""
    return safe.filename(name, limit)


def device_slug(device_name: str) -> str:
    """'NVIDIA H200' -> 'NVIDIA_H200' (the engines' file-name spelling of a device, for tuned
    configs and results folders); never a path: '..' or '/x' become one safe name."""
    return path_component(re.sub(r"[^A-Za-z0-9.\-]+", "_", device_name.strip()))
