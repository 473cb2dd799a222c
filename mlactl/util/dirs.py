"""Where mlactl keeps what a user measured: one folder, $MLACTL_HOME, default
$XDG_DATA_HOME/mlactl or ~/.local/share/mlactl. Not a cache: nothing here is thrown away."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mlactl.util import safe
from mlactl.util.errors import MlactlError

ENV_HOME = "MLACTL_HOME"


def home() -> Path:
    """$MLACTL_HOME, else $XDG_DATA_HOME/mlactl, else ~/.local/share/mlactl: an absolute folder, or
    one line saying why there is none (a file in its place, a home directory that cannot be
    resolved: `~` left as it is would put the store in a folder named `~` wherever mlactl ran)."""
    given = os.environ.get(ENV_HOME)
    if given:
        path = Path(given).expanduser()
        where = f"${ENV_HOME} ({safe.text(given)})"
    else:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        path = Path(base) / "mlactl"
        where = f"mlactl's folder {safe.text(path)}"
        if not path.is_absolute():
            raise MlactlError(
                f"cannot find your home directory (HOME is not set and the user has none): "
                f"set ${ENV_HOME} to the folder mlactl keeps its measurements in"
            )
    if path.exists() and not path.is_dir():
        raise MlactlError(f"{where} is not a folder: point ${ENV_HOME} at a folder (or move the file away)")
    return path


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
