"""Input checks shared by the kernel launchers: every bad input is a ValueError with one clear
line, raised before anything is launched (a wrong shape must never become an illegal access)."""

from __future__ import annotations

import os
from functools import lru_cache

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, name))
# mlactl's dtype names (mlactl.util.defaults: the CLI's, the JSON's, the tuned files') and torch's dtypes.
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def torch_name(dtype: torch.dtype) -> str:
    """torch's own short name, for messages about any dtype: float16, int32, float8_e4m3fn."""
    return str(dtype).replace("torch.", "")


def dtype_name(dtype: torch.dtype) -> str:
    """mlactl's name of a tensor dtype: bf16, fp16, fp32, or fp8 for any e4m3 variant."""
    if dtype in FP8_DTYPES:
        return "fp8"
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {torch_name(dtype)} has no mlactl name (bf16, fp16, fp32, fp8)")
    return DTYPE_NAMES[dtype]


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_tensor(name: str, t, ndim: int, dtypes=None, contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(torch_name(d) for d in dtypes)
        raise ValueError(f"{name} has dtype {torch_name(t.dtype)}; expected one of {allowed}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def latent_cache(kv_cache):
    """A paged latent cache given as [blocks, page, 1, row] (one MQA head) as [blocks, page, row];
    any other head count is an error. Anything else is returned as given, for check_tensor."""
    if isinstance(kv_cache, torch.Tensor) and kv_cache.dim() == 4:
        if kv_cache.shape[2] != 1:
            raise ValueError(
                f"kv_cache has {kv_cache.shape[2]} heads (shape {tuple(kv_cache.shape)}); the latent cache is "
                "shared by all H query heads, so it must have 1 (MQA)"
            )
        kv_cache = kv_cache.squeeze(2)
    return kv_cache


def check_unit_stride(**tensors) -> None:
    """Each tensor contiguous in its last dimension (the kernels' row loads assume it)."""
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")


def check_dim(name: str, t, dim: int, expected: int, what: str) -> None:
    if t.shape[dim] != expected:
        raise ValueError(
            f"{name}.shape[{dim}] is {t.shape[dim]} but must equal {what} ({expected}); shape {tuple(t.shape)}"
        )


def check_device(**tensors) -> torch.device:
    """All tensors on one device, and one that Triton can run on (CUDA, or the CPU interpreter)."""
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    unique = set(devices.values())
    if len(unique) > 1:
        listed = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"inputs are on different devices: {listed}")
    device = unique.pop()
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"Triton kernels need CUDA tensors, got {device}; set TRITON_INTERPRET=1 to run "
            "them in Triton's CPU interpreter, or use the torch twin"
        )
    return device


def check_positive(name: str, value) -> float:
    """`value` (a number or a 1-element tensor) as a float, if it is positive and finite."""
    try:
        x = float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
        raise ValueError(f"{name} must be a number or a scalar tensor, got {value!r}") from None
    if not (x > 0 and x != float("inf")):  # NaN fails x > 0
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return x


def check_scale(scale) -> float:
    """The softmax scale as a float (1/sqrt(dC + dR) for an MLA model)."""
    return check_positive("softmax scale", scale)


DEEPSEEK_ROW, DEEPSEEK_R = 576, 512  # r + dR of DeepSeek-V2/V3 and Kimi K2 rows: [c (512) | k_r (64)]


def latent_rank(row: int, r) -> int:
    """The latent rank r of a cache row of `row` numbers: `r` if given, 512 for a 576-wide row."""
    if r is None:
        if row != DEEPSEEK_ROW:
            raise ValueError(
                f"r (latent rank) cannot be inferred from a row of {row} numbers; pass r= "
                f"(only a {DEEPSEEK_ROW}-wide row defaults to r={DEEPSEEK_R})"
            )
        return DEEPSEEK_R
    if isinstance(r, bool) or not isinstance(r, int) or not 0 < r < row:
        raise ValueError(f"r must be an integer with 0 < r < {row} (the row width r + dR), got {r!r}")
    return r


def check_new_lens(new_lens, contexts: list[int], tokens: int, q_name: str = "q") -> list[int]:
    """new_lens [B] int32 against the context lengths and the packed query count; the counts."""
    if new_lens.shape[0] != len(contexts):
        raise ValueError(f"new_lens has {new_lens.shape[0]} entries but cache_seqlens has {len(contexts)}")
    news = new_lens.tolist()
    for b, (n, ctx) in enumerate(zip(news, contexts)):
        if n < 0 or n > ctx:
            raise ValueError(f"new_lens[{b}] is {n}; it must be in [0, cache_seqlens[{b}] = {ctx}]")
    if sum(news) != tokens:
        raise ValueError(f"new_lens sums to {sum(news)} but {q_name} has {tokens} tokens; they must match")
    return news


def out_and_lse(q, out, r: int, empty):
    """A decode launcher's outputs: `out` [B, S_q, H, r] in q's dtype (the caller's, checked, or a
    new one) and a new lse [B, S_q, H] in fp32, both from `empty(shape, dtype, device)`, the
    launcher's own allocator (tests poison it)."""
    B, S_q, H, _ = q.shape
    device = q.device
    if out is None:
        out = empty((B, S_q, H, r), q.dtype, device)
    else:
        check_tensor("out", out, 4, (q.dtype,), contiguous=False)
        if tuple(out.shape) != (B, S_q, H, r) or out.stride(-1) != 1 or out.device != device:
            raise ValueError(
                f"out must be [B, S_q, H, r] = {(B, S_q, H, r)} on {device} with a contiguous last dim, "
                f"got {tuple(out.shape)} on {out.device}"
            )
    return out, empty((B, S_q, H), torch.float32, device)


INTERPRETER_SMS = 8  # stand-in SM count under TRITON_INTERPRET=1 (only shapes the heuristic)


@lru_cache(maxsize=16)
def device_info(device: torch.device) -> tuple[str, int]:
    """(name, SM count) of the device a launch runs on: what tuned-config lookups and the
    split heuristics key on; on the CPU interpreter ("cpu", INTERPRETER_SMS)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return torch.cuda.get_device_name(device), props.multi_processor_count
    return "cpu", INTERPRETER_SMS
