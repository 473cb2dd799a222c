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
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (a red CI is a change's doing and
# reproduces); MLACTL_FUZZ_PROFILE=long draws new ones (tests/test_fuzz.py sets its sizes).
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("fresh", derandomize=False, database=None)
settings.load_profile("fresh" if os.environ.get("MLACTL_FUZZ_PROFILE") == "long" else "fixed")

# Small enough for a CPU, with absorb much costlier per pair than expand (as in DeepSeek):
# pair_absorb / pair_expand = 2176 / 384, so expand wins from a few dozen new tokens.
SMALL = {
    "model_type": "small-mla",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "kv_lora_rank": 128,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "num_hidden_layers": 2,
}


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
