"""The machine's own ceilings: achieved matmul TFLOP/s per dtype and device copy bandwidth.

Square matmuls on random data (zeros run faster than real data on some GPUs), timed by the
shared harness; copy bandwidth counts bytes read plus bytes written. The result is written as a
measured hardware profile: the nominal profile's fields plus a [measured] table.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

from mlactl.model import hardware
from mlactl.tune.timing import time_call
from mlactl.util import dirs
from mlactl.util.io import atomic_write

# (matmul n, copy bytes) per device type and mode: big enough to fill the device, small enough
# that `tune ceilings` takes seconds. 8192^3 bf16 is 1.1 TFLOP: ~1.4 ms on an H200.
SIZES = {
    ("cuda", False): (8192, 2 << 30),
    ("cuda", True): (4096, 1 << 30),
    ("cpu", False): (1024, 256 << 20),
    ("cpu", True): (512, 64 << 20),
}


def _dtypes(device) -> list[str]:
    import torch

    if device.type != "cuda":
        return ["fp32", "bf16"]
    found = ["bf16", "fp16"]
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= (8, 9) and hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm"):
        found.append("fp8")
    return found


def _matmul_fn(device, dtype: str, n: int):
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    if dtype == "fp8":
        a = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    from mlactl.kernels._checks import TORCH_DTYPES

    torch_dtype = TORCH_DTYPES[dtype]
    a = torch.randn(n, n, device=device, generator=gen, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, generator=gen, dtype=torch_dtype)
    out = torch.empty(n, n, device=device, dtype=torch_dtype)
    return lambda: torch.matmul(a, b, out=out)


def measure(device, quick: bool = False, on_step=None) -> dict:
    """{"peak_tflops": {dtype: TFLOP/s}, "bandwidth_tbs": TB/s, "details": {...}}."""
    import torch

    device = torch.device(device)
    n, copy_bytes = SIZES[(device.type if device.type == "cuda" else "cpu", quick)]
    budget = 0.05 if quick else 0.2
    peaks: dict[str, float] = {}
    details: dict[str, dict] = {}
    for dtype in _dtypes(device):
        try:
            timing = time_call(_matmul_fn(device, dtype, n), device=device, warm=True, budget_s=budget)
        except (RuntimeError, TypeError) as exc:  # a dtype this build cannot multiply
            details[f"matmul_{dtype}"] = {"status": "failed", "reason": str(exc).splitlines()[0]}
            continue
        peaks[dtype] = 2 * n**3 / timing.median_s / 1e12
        details[f"matmul_{dtype}"] = dict(timing.to_dict(), n=n, tflops=peaks[dtype])
        if on_step:
            on_step(f"matmul {dtype}: {peaks[dtype]:.1f} TFLOP/s")
    src = torch.randn(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device=device, warm=True, budget_s=budget)
    bandwidth = 2 * copy_bytes / timing.median_s / 1e12
    details["copy"] = dict(timing.to_dict(), bytes=copy_bytes, tbs=bandwidth)
    if on_step:
        on_step(f"copy: {bandwidth * 1e3:.0f} GB/s")
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {"peak_tflops": peaks, "bandwidth_tbs": bandwidth, "memory_gb": memory / 1e9, "details": details}


def device_name(device) -> str:
    """The CUDA device's name, or "cpu": what results, tuned configs and profiles are keyed by."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile_toml(profile: dict) -> str:
    """A flat profile dict (tables as nested dicts, one level or two) as TOML text."""
    lines: list[tuple[str, object]] = []
    tables: list[tuple[str, dict]] = []
    for key, value in profile.items():
        (tables if isinstance(value, dict) else lines).append((key, value))
    out = [f"{k} = {_toml_value(v)}" for k, v in lines]
    for name, table in tables:
        out.append(f"\n[{name}]")
        subtables = []
        for k, v in table.items():
            if isinstance(v, dict):
                subtables.append((k, v))
            else:
                out.append(f"{k} = {_toml_value(v)}")
        for k, v in subtables:
            out.append(f"\n[{name}.{k}]")
            out.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
    return "\n".join(out) + "\n"


def write_measured_profile(name_of_device: str, measured: dict, folder: Path | None = None) -> Path:
    """Write $MLACTL_HOME/hardware/<name>.toml: the matching shipped profile (or, for a device
    with none, the measurement itself as nominal) plus a [measured] table."""
    base = hardware.detect(name_of_device)
    stamp = time.strftime("%Y-%m-%d")

    def sig(x: float) -> float:  # 4 significant digits, whatever the scale (a CPU: 0.01 TFLOP/s)
        return float(f"{x:.4g}")

    table: dict = {
        "bandwidth_tbs": sig(measured["bandwidth_tbs"]),
        "device": name_of_device,
        "date": stamp,
        "peak_tflops": {k: sig(v) for k, v in measured["peak_tflops"].items()},
    }
    profile: dict
    if base is not None:
        profile = {
            "name": base.name,
            "display": base.display,
            "match": list(base.match),
            "memory_gb": base.memory_gb,
            "bandwidth_tbs": base.bandwidth_tbs,
        }
        for key in ("arch", "sm_count", "smem_per_sm_kib", "l2_mib"):
            if getattr(base, key) is not None:
                profile[key] = getattr(base, key)
        profile["sources"] = list(base.sources) + [f"[measured]: mlactl tune ceilings on {name_of_device}, {stamp}"]
        profile["peak_tflops"] = dict(base.peak_tflops)
    else:
        slug = re.sub(r"[^a-z0-9]+", "-", name_of_device.lower()).strip("-") or "device"
        display = name_of_device
        if name_of_device == "cpu":
            display = f"CPU ({platform.processor() or platform.machine()})"
        profile = {
            "name": slug,
            "display": display,
            "match": [name_of_device],
            "memory_gb": round(measured.get("memory_gb", 1.0), 1),
            "bandwidth_tbs": table["bandwidth_tbs"],
            "sources": [f"no datasheet profile: nominal = measured by mlactl tune ceilings, {stamp}"],
            "peak_tflops": dict(table["peak_tflops"]),
        }
    profile["measured"] = table
    folder = folder or dirs.user_hardware_dir()
    path = folder / f"{dirs.path_component(profile['name'])}.toml"  # a name, never a path
    atomic_write(path, profile_toml(profile), update=True)  # the user's profile of this device, read above
    hardware.load_profile(path)  # what we wrote must read back
    return path
