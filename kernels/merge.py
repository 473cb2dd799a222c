"""Merge two partial attention results by their log-sum-exp (Triton), plus its torch twin.

If o_a, lse_a is attention over one set of keys and o_b, lse_b over a disjoint set, attention
over the union is, per (token, head)::

    lse = log(exp(lse_a) + exp(lse_b))
    o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

An empty partial (a row that saw no key) has lse = -inf and weight 0, whatever its o holds;
when both sides are empty the result is o = 0, lse = -inf, never NaN. The chunked expand driver
(kernels/expansion.py) uses this to add prefix chunks to the new tokens' own attention.

Traffic: reads two [T, H, D] outputs and two [T, H] fp32 lse, writes one of each; no FLOPs worth
counting. Memory-bound: one program per (token, block of heads), D whole.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlactl.kernels import configs
from mlactl.kernels._checks import FLOAT_DTYPES, check_device, check_tensor, dtype_name
from mlactl.kernels._triton_compat import patch_interpreter_index
from mlactl.kernels.prefill_naive import check_inner_stride, check_same_device

patch_interpreter_index()  # Triton 3.6's interpreter with numpy >= 2.4 (see _triton_compat)

# Elements of o per program: 4096 (BLOCK_H x BLOCK_D) keeps 16 fp32 registers per thread at 4
# warps, enough bytes in flight per SM for a bandwidth-bound copy without spilling.
TILE_ELEMENTS = 4096
NUM_WARPS = 4  # a [BLOCK_H, BLOCK_D] tile of 4096 elements is 32 per thread: no more warps needed


@triton.jit
def _merge_kernel(
    p_oa,
    p_la,
    p_ob,
    p_lb,
    p_o,
    p_l,
    H,
    s_oa_t,
    s_oa_h,
    s_la_t,
    s_la_h,
    s_ob_t,
    s_ob_h,
    s_lb_t,
    s_lb_h,
    s_o_t,
    s_o_h,
    s_l_t,
    s_l_h,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, BLOCK_D)
    m_h = o_h < H
    m_hd = m_h[:, None] & (o_d < D)[None, :]  # [BLOCK_H, BLOCK_D]

    b_la = tl.load(p_la + i_t * s_la_t + o_h * s_la_h, mask=m_h, other=float("-inf"))  # [BLOCK_H]
    b_lb = tl.load(p_lb + i_t * s_lb_t + o_h * s_lb_h, mask=m_h, other=float("-inf"))  # [BLOCK_H]
    b_m = tl.maximum(b_la, b_lb)
    b_m = tl.where(b_m == float("-inf"), 0.0, b_m)  # both empty: exp(-inf - 0) = 0, not NaN
    w_a = tl.exp(b_la - b_m)
    w_b = tl.exp(b_lb - b_m)
    w_sum = w_a + w_b
    seen = w_sum > 0.0
    w_safe = tl.where(seen, w_sum, 1.0)

    b_oa = tl.load(p_oa + i_t * s_oa_t + o_h[:, None] * s_oa_h + o_d[None, :], mask=m_hd, other=0.0)
    b_ob = tl.load(p_ob + i_t * s_ob_t + o_h[:, None] * s_ob_h + o_d[None, :], mask=m_hd, other=0.0)
    # an empty side contributes nothing even if its o is garbage (0 * NaN would be NaN)
    b_o = tl.where((w_a > 0.0)[:, None], b_oa.to(tl.float32) * (w_a / w_safe)[:, None], 0.0)
    b_o += tl.where((w_b > 0.0)[:, None], b_ob.to(tl.float32) * (w_b / w_safe)[:, None], 0.0)  # [BLOCK_H, BLOCK_D]
    b_l = tl.where(seen, b_m + tl.log(w_safe), float("-inf"))

    tl.store(p_o + i_t * s_o_t + o_h[:, None] * s_o_h + o_d[None, :], b_o.to(p_o.dtype.element_ty), mask=m_hd)
    tl.store(p_l + i_t * s_l_t + o_h * s_l_h, b_l, mask=m_h)


def _validate(o_a, lse_a, o_b, lse_b, out):
    check_tensor("o_a", o_a, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("o_b", o_b, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("lse_a", lse_a, 2, (torch.float32,), contiguous=False)
    check_tensor("lse_b", lse_b, 2, (torch.float32,), contiguous=False)
    if o_b.shape != o_a.shape:
        raise ValueError(f"o_b has shape {tuple(o_b.shape)} but o_a has {tuple(o_a.shape)}; they must match")
    T, H, D = o_a.shape
    if H < 1 or D < 1:
        raise ValueError(f"o_a must have at least one head and one feature, got shape {tuple(o_a.shape)}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(t.shape) != (T, H):
            raise ValueError(f"{name} has shape {tuple(t.shape)} but must be [T, H] = {(T, H)} (from o_a)")
    check_inner_stride("o_a", o_a)
    check_inner_stride("o_b", o_b)
    if out is not None:
        check_tensor("out", out, 3, FLOAT_DTYPES, contiguous=False)
        if out.shape != o_a.shape:
            raise ValueError(f"out has shape {tuple(out.shape)} but must match o_a {tuple(o_a.shape)}")
        check_inner_stride("out", out)
    check_same_device(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b, out=out)


CONFIG_KEYS = ("BLOCK_H", "num_warps")


def default_config(H: int, D: int) -> dict:
    """Heads per program from TILE_ELEMENTS; what runs without a config or a tuned one."""
    block_d = triton.next_power_of_2(D)
    return {"BLOCK_H": min(triton.next_power_of_2(H), max(1, TILE_ELEMENTS // block_d)), "num_warps": NUM_WARPS}


def compile_spec(config: dict, D: int, dtype: str):
    """What `mlactl tune compile` needs to build the kernel for a GPU target without launching it:
    (jit function, signature, constants, argument names divisible by 16, compile options)."""
    names = _merge_kernel.arg_names
    out_ptrs = ("p_oa", "p_ob", "p_o")
    consts = {"D": D, "BLOCK_H": config["BLOCK_H"], "BLOCK_D": triton.next_power_of_2(D)}
    sig = {
        n: "constexpr" if n in consts else f"*{dtype}" if n in out_ptrs else "*fp32" if n.startswith("p_") else "i32"
        for n in names
    }
    aligned = [
        n for n in names if n.startswith("p_") or n in ("s_oa_t", "s_oa_h", "s_ob_t", "s_ob_h", "s_o_t", "s_o_h")
    ]
    return _merge_kernel, sig, consts, aligned, {"num_warps": config["num_warps"], "num_stages": 1}


def _check_config(config, source: str = "config") -> dict:
    return configs.check_config(config, source, pow2={key: 1 for key in CONFIG_KEYS})


def merge_attn_states(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention outputs over disjoint key sets by their lse (Triton).

    Args:
        o_a, o_b: [T, H, D] partial outputs (fp16, bf16 or fp32; may differ), unit last stride.
        lse_a, lse_b: [T, H] fp32 natural-log sums of exp of the scaled scores; -inf = no key.
        out: optional [T, H, D] buffer; its dtype is the result's (default o_a's). It may be o_a
            or o_b itself: every element is read before it is written.
        config: optional {"BLOCK_H": heads per program, "num_warps": ...} (mlactl tune).

    Returns:
        (o [T, H, D], lse [T, H] fp32), computed in fp32.

    Raises:
        ValueError: on any bad input, before anything is launched.
    """
    _validate(o_a, lse_a, o_b, lse_b, out)
    if config is not None:
        _check_config(config)
    device = check_device(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b, out=out)
    T, H, D = o_a.shape
    if out is None:
        out = torch.empty_like(o_a, memory_format=torch.contiguous_format)
    lse = torch.empty(T, H, dtype=torch.float32, device=device)
    if T == 0:
        return out, lse
    cfg = default_config(H, D)
    if config is None and device.type == "cuda":
        dtype = dtype_name(o_a.dtype)
        tuned = configs.lookup("merge_attn_states", torch.cuda.get_device_name(device), dtype, H=max(H, 1), T=T)
        try:
            cfg.update(_check_config(tuned, "tuned config") if tuned else {})
        except ValueError:
            pass  # a malformed tuned entry must not fail a launch
    cfg.update(config or {})
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_H = cfg["BLOCK_H"]
    grid = (T, triton.cdiv(H, BLOCK_H))
    _merge_kernel[grid](
        o_a,
        lse_a,
        o_b,
        lse_b,
        out,
        lse,
        H,
        o_a.stride(0),
        o_a.stride(1),
        lse_a.stride(0),
        lse_a.stride(1),
        o_b.stride(0),
        o_b.stride(1),
        lse_b.stride(0),
        lse_b.stride(1),
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        lse.stride(1),
        D=D,
        BLOCK_H=BLOCK_H,
        BLOCK_D=BLOCK_D,
        num_warps=cfg["num_warps"],
    )
    return out, lse


def merge_attn_states_naive(o_a, lse_a, o_b, lse_b, *, out=None):
    """Torch twin of merge_attn_states: the same shapes, dtypes and empty-side rules, in fp32.

    o_a, o_b: [T, H, D]; lse_a, lse_b: [T, H] fp32; returns (o [T, H, D], lse [T, H] fp32).
    """
    _validate(o_a, lse_a, o_b, lse_b, out)
    lse = torch.logaddexp(lse_a, lse_b)  # [T, H]; -inf when both are -inf
    seen = torch.isfinite(lse)
    lse_safe = torch.where(seen, lse, torch.zeros_like(lse))
    w_a = torch.exp(lse_a - lse_safe)[..., None]  # [T, H, 1]; 0 for an empty side
    w_b = torch.exp(lse_b - lse_safe)[..., None]
    o = torch.where(w_a > 0, w_a * o_a.float(), 0.0) + torch.where(w_b > 0, w_b * o_b.float(), 0.0)
    if out is None:
        out = torch.empty_like(o_a, memory_format=torch.contiguous_format)
    out.copy_(o)
    return out, lse
