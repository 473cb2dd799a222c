"""Test tiers (docs/design.md, "Tests"): pure math and CLI; kernels under the Triton interpreter on a CPU;
GPU tests marked `gpu`, skipped without CUDA.

Without a CUDA GPU, Triton kernels run in the interpreter. It must be chosen before triton
compiles anything, so it is set here, before any test module imports the kernels.
"""

import os
import shutil


def _has_cuda() -> bool:
    if not shutil.which("nvidia-smi") and not os.path.exists("/dev/nvidia0"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
