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


def _pin_blas_kernels() -> bool:
    """Fits are least squares through LAPACK, and their last bits depend on which kernels
    OpenBLAS picks for the CPU; where two term sets score within those bits of each other, the
    choice between them does too. The figures the tests pin were worked out with OpenBLAS's
    SkylakeX (AVX-512) kernels, so a CPU that has AVX-512 runs those, whatever the environment
    asks (some machines here set OPENBLAS_CORETYPE=Haswell); one without keeps its own (no other
    BLAS reads the variable). It must be set before numpy loads OpenBLAS, and subprocesses the
    tests start inherit it. Returns whether it was set."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return False
    if not {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
        return False
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    return True


BLAS_PINNED = _pin_blas_kernels()  # tests/test_golden.py pins a fit only where this holds
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


# -- what the CLI tests share (imported as `from conftest import run, error_line, mooncake`) -------

from typer.testing import CliRunner  # noqa: E402

from mlactl.cli import app  # noqa: E402

runner = CliRunner()


def run(*args, ok=True):
    """`mlactl ARGS` in this process (each argument as text); with `ok`, it must exit 0."""
    result = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def error_line(result, warnings: bool = False) -> str:
    """The one `Error: ...` line a refused command prints (exit status 2); with `warnings`,
    `Warning: ...` lines may stand beside it."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip() and not (warnings and ln.startswith("Warning: "))]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def mooncake(path, rows) -> str:
    """A Mooncake trace at `path`; rows: (timestamp ms, input, output, hash_ids)."""
    import json

    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": list(h)}) + "\n"
            for t, i, o, h in rows
        )
    )
    return str(path)


# == what the command, chart and table tests share (`from conftest import plain, render, ...`) ==========
# Also the `home` fixture: $MLACTL_HOME in the test's own folder (a file's own `home` overrides it).

import io  # noqa: E402
import re  # noqa: E402

from rich.console import Console  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """$MLACTL_HOME in the test's folder, and no folder of tuned configs from the environment."""
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLACTL_TUNED_DIR", raising=False)
    return tmp_path / "home"


def plain(text: str) -> str:
    """`text` without its ANSI escape codes."""
    return ANSI.sub("", text)


def render(table, width: int) -> str:
    """A rich table as the text a console `width` columns wide prints, without colour."""
    con = Console(file=io.StringIO(), width=width, no_color=True, record=True)
    con.print(table)
    return con.export_text()


def cpu_results(**extra) -> dict:
    """A results file as `mlactl tune --backend torch` writes one on a CPU with no hardware
    profile: the teaching model at tp 8, fp32 compute and cache, a measured crossover of 16 new
    tokens at prefix 0. `extra` replaces top-level fields."""
    from mlactl.model.config import from_name

    data = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "created": "2026-11-30T10:00:00Z",
        "device": {"name": "cpu", "type": "cpu", "hardware": None},
        "backend": "torch",
        "timing": {"method": "wall-clock"},
        "model": from_name("teaching").with_tp(8).to_dict(),
        "kv_dtype": "fp32",
        "dtype": "fp32",
        "crossovers": [{"batch": 1, "prefix": 0, "measured": 16, "measured_status": "found"}],
    }
    data.update(extra)
    return data


def save_calibration(home, name="fit-h200", hardware_name="h200"):
    """Saves, in $MLACTL_HOME (`home`), a calibration `name` for `hardware_name`: every op one
    fixed term (5 µs, eta_c 0.6, eta_m 0.8). Returns the name."""
    from mlactl.decide.calibration import store as cal_store

    fits = [
        {"op": op, "source": "t", "dtype": "bf16", "terms": ["fixed"]}
        | {"params": {"t_fixed_s": 5e-6, "eta_c": 0.6, "eta_m": 0.8}}
        for op in ("kv_expand", "expand_attention", "lse_merge", "q_absorb", "absorb_attention", "out_absorb")
    ]
    cal_store.save(
        {"schema": "mlactl.calibration", "schema_version": 1, "name": name, "hardware": hardware_name} | {"fits": fits}
    )
    return name
