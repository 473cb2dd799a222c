"""What every measurement records and how every output is compared: shared by the sweeps of
`mlactl tune` and `benchmarks/gpu_check.py`, so a results file and a GPU check say the same."""

from __future__ import annotations

import math
import platform
import subprocess
from pathlib import Path

from mlactl import __version__


def versions(git_dir: Path | None = None) -> dict:
    """python, torch, triton, mlactl and CUDA versions (None where absent); with `git_dir`, also
    the checkout's commit (None outside a git checkout)."""
    out: dict = {"python": platform.python_version(), "mlactl": __version__}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda  # None on a CPU build
    except ImportError:
        out["torch"] = out["cuda"] = None
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    if git_dir is not None:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=git_dir, text=True, capture_output=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
        out["git_commit"] = commit or None
    return out


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| (L2 over all elements, in fp32); inf when out has a NaN or an
    infinity, the absolute error when ref is all zeros."""
    out, ref = out.float(), ref.float()
    if not bool(out.isfinite().all()):
        return math.inf
    denom = ref.norm().item()
    return (out - ref).norm().item() / (denom if denom > 0 else 1.0)
