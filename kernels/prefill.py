"""Varlen FlashAttention-style prefill for the MLA expand path (Triton). Twin: prefill_naive.py.

After the latents are expanded (kernels/expansion.py) the expand path is ordinary multi-head
attention with qk dim dC+dR and v dim dV. The key has two parts that are loaded and multiplied
as separate blocks: the per-head `k_nope` [T_k, H, dC] and the RoPE key `k_rope` [T_k, dR] that
all heads share (read from the one [T_k, dR] tensor by every head's program; never copied per
head). score = q_nope.k_nope + q_rope.k_rope, two dots into one fp32 accumulator.

FLOPs: 2*H*(dC+dR) + 2*H*dV per (query, key) pair (mlactl/cost.py, "expand attention").
Traffic per program: one [BLOCK_M, dC+dR] query block in, one [BLOCK_M, dV] block out; then
per key block [BLOCK_N, dC+dV] of its head's K/V and [BLOCK_N, dR] of the shared RoPE keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from mlactl.kernels import configs
from mlactl.kernels._checks import DTYPE_NAMES, check_device, interpreting
from mlactl.kernels._triton_compat import patch_interpreter_index
from mlactl.kernels.prefill_naive import validate_prefill

patch_interpreter_index()  # Triton 3.6's interpreter with numpy >= 2.4 (see _triton_compat)

# Defaults for Hopper (H200, sm_90), chosen from shared-memory arithmetic, not yet timed on a
# GPU. DeepSeek-V3 shapes: dC+dR = 192, dV = 128, bf16. Compiled for sm_90 with Triton 3.9
# (tests/test_prefill.py::test_compiles_for_hopper): 168 KB shared, 190 registers, no spills,
# wgmma with cp.async pipelining.
BLOCK_M = 128  # query rows per program: two warpgroups of wgmma M=64; halves K/V re-reads vs 64
BLOCK_N = 64  # keys per step: (192+128) x 64 x 2 B = 40 KB per stage, so 3 stages fit
NUM_WARPS = 8  # two warpgroups share the 128 query rows; the [128, 128] fp32 acc is 64 regs/thread
NUM_STAGES = 3  # 3 x 40 KB of K/V + 48 KB of Q = 168 KB of the 227 KB per block on sm_90
# Under TRITON_INTERPRET=1 every tile op is a numpy call: fewer, larger tiles run faster.
INTERPRET_BLOCK_M = 32
INTERPRET_BLOCK_N = 32

_LOG2E = 1.4426950408889634
_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
_DTYPE_NAMES = DTYPE_NAMES  # mlactl.kernels._checks
# Heuristic configs that failed with OutOfResources, replaced by a smaller one: key -> config.
_FALLBACKS: dict[tuple, dict] = {}
_SMEM_BY_ARCH = {(8, 0): 163 * 1024, (8, 7): 163 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024}


@triton.jit
def _load_tile(ptrs, m_rows, m_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a 2-D tile, masking only what the constexpr flags ask for (unmasked loads vectorise)."""
    if MASK_ROWS:
        if MASK_COLS:
            b = tl.load(ptrs, mask=m_rows[:, None] & m_cols[None, :], other=0.0)
        else:
            b = tl.load(ptrs, mask=m_rows[:, None], other=0.0)
    else:
        if MASK_COLS:
            b = tl.load(ptrs, mask=m_cols[None, :], other=0.0)
        else:
            b = tl.load(ptrs)
    return b


@triton.jit
def _attend_keys(
    acc,
    l_i,
    m_i,
    b_qn,
    b_qr,
    p_kn,
    p_kr,
    p_v,
    s_kn_t,
    s_kr_t,
    s_v_t,
    o_m,
    o_n,
    m_dc,
    m_dr,
    m_dv,
    lo,
    hi,
    len_k,
    delta,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAD_DC: tl.constexpr,
    PAD_DR: tl.constexpr,
    PAD_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax over the key blocks [lo, hi). MASKED blocks apply the key bound and, with
    CAUSAL, the diagonal; the others are wholly visible to every row and load without masks.
    p_kn, p_kr, p_v are pointer tiles at key 0 of the request ([BLOCK_N, BLOCK_D*])."""
    for start_n in range(lo, hi, BLOCK_N):
        off_n = tl.cast(start_n, tl.int64)
        o_k = start_n + o_n
        m_k = o_k < len_k
        b_kn = _load_tile(p_kn + off_n * s_kn_t, m_k, m_dc, MASKED, PAD_DC)  # [BLOCK_N, BLOCK_DC]
        b_kr = _load_tile(p_kr + off_n * s_kr_t, m_k, m_dr, MASKED, PAD_DR)  # [BLOCK_N, BLOCK_DR]
        b_s = tl.dot(b_qn, tl.trans(b_kn), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        b_s = tl.dot(b_qr, tl.trans(b_kr), b_s, input_precision=PRECISION)
        b_s = b_s * qk_scale  # log2 units: exp2 below is exp of the scaled score
        if MASKED:
            m_s = m_k[None, :]
            if CAUSAL:
                m_s = m_s & (o_k[None, :] <= o_m[:, None] + delta)  # [BLOCK_M, BLOCK_N]
            b_s = tl.where(m_s, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_shift = m_new
        if MASKED:
            # a row that has seen no key yet keeps m = -inf; shift it by 0, not -inf (-inf - -inf = NaN)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        b_p = tl.math.exp2(b_s - m_shift[:, None])  # [BLOCK_M, BLOCK_N]
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        b_v = _load_tile(p_v + off_n * s_v_t, m_k, m_dv, MASKED, PAD_DV)  # [BLOCK_N, BLOCK_DV]
        acc = acc * alpha[:, None]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision=PRECISION)  # [BLOCK_M, BLOCK_DV]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _mla_prefill_kernel(
    p_q,
    p_kn,
    p_kr,
    p_v,
    p_o,
    p_lse,
    p_cu_q,
    p_cu_k,
    p_order,
    s_q_t,
    s_q_h,
    s_kn_t,
    s_kn_h,
    s_kr_t,
    s_v_t,
    s_v_h,
    s_o_t,
    s_o_h,
    s_lse_t,
    s_lse_h,
    qk_scale,
    DC: tl.constexpr,
    DR: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DC: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # grid (query block, head, request), query blocks fastest. Block 0 is a request's LAST
    # query block, the one that sees the most keys, and requests come longest first (p_order):
    # each head's long causal blocks start first and its short ones fill the tail, while the
    # programs in flight together share the K/V of a few heads in L2 (4 MB per head at 8K tokens).
    i_j = tl.program_id(0)
    i_h = tl.program_id(1)
    i_b = tl.load(p_order + tl.program_id(2))
    q_start = tl.load(p_cu_q + i_b)
    len_q = tl.load(p_cu_q + i_b + 1) - q_start
    k_start = tl.load(p_cu_k + i_b)
    len_k = tl.load(p_cu_k + i_b + 1) - k_start
    num_m = tl.cdiv(len_q, BLOCK_M)
    if i_j >= num_m:
        return
    i_m = num_m - 1 - i_j
    delta = len_k - len_q  # causal: query i sees keys j <= i + delta

    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.arange(0, BLOCK_N)
    o_dc = tl.arange(0, BLOCK_DC)
    o_dr = tl.arange(0, BLOCK_DR)
    o_dv = tl.arange(0, BLOCK_DV)
    m_m = o_m < len_q
    m_dc = o_dc < DC
    m_dr = o_dr < DR
    m_dv = o_dv < DV

    p_q = p_q + q_start.to(tl.int64) * s_q_t + i_h * s_q_h
    r_q = o_m.to(tl.int64)[:, None] * s_q_t
    b_qn = _load_tile(p_q + r_q + o_dc[None, :], m_m, m_dc, True, BLOCK_DC != DC)  # [BLOCK_M, BLOCK_DC]
    b_qr = _load_tile(p_q + DC + r_q + o_dr[None, :], m_m, m_dr, True, BLOCK_DR != DR)  # [BLOCK_M, BLOCK_DR]

    # pointer tiles at the request's key 0; the key loop adds start_n * stride
    p_kn = (
        p_kn + k_start.to(tl.int64) * s_kn_t + i_h * s_kn_h + o_n[:, None] * s_kn_t + o_dc[None, :]
    )  # [BLOCK_N, BLOCK_DC]
    p_kr = p_kr + k_start.to(tl.int64) * s_kr_t + o_n[:, None] * s_kr_t + o_dr[None, :]  # [BLOCK_N, BLOCK_DR]
    p_v = p_v + k_start.to(tl.int64) * s_v_t + i_h * s_v_h + o_n[:, None] * s_v_t + o_dv[None, :]  # [BLOCK_N, BLOCK_DV]

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if CAUSAL:
        # keys < i_m*BLOCK_M + delta + 1 are visible to every row of the block; keys at or past
        # the last row's diagonal are visible to none and are never loaded
        n_full = i_m * BLOCK_M + delta + 1
        hi = tl.minimum(len_k, (i_m + 1) * BLOCK_M + delta)
    else:
        n_full = len_k
        hi = len_k
    mid = (n_full // BLOCK_N) * BLOCK_N
    # two runs of the one loop body: key blocks [0, mid) unmasked, then [mid, hi) masked
    for MASKED in tl.static_range(2):
        if MASKED:
            lo_run, hi_run = mid, hi
        else:
            lo_run, hi_run = 0, mid
        acc, l_i, m_i = _attend_keys(
            acc, l_i, m_i, b_qn, b_qr, p_kn, p_kr, p_v, s_kn_t, s_kr_t, s_v_t, o_m, o_n, m_dc, m_dr, m_dv,
            lo_run, hi_run, len_k, delta, qk_scale,
            MASKED, CAUSAL, BLOCK_DC != DC, BLOCK_DR != DR, BLOCK_DV != DV, BLOCK_N, PRECISION,
        )  # fmt: skip

    seen = l_i > 0.0  # rows that saw no key (non-causal, len_k = 0): out 0, lse -inf
    l_safe = tl.where(seen, l_i, 1.0)
    b_o = acc / l_safe[:, None]  # [BLOCK_M, BLOCK_DV]
    # m_i and log2(l_i) are in log2 units of the scaled score; times ln 2 gives the natural lse
    b_lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    p_o = p_o + q_start.to(tl.int64) * s_o_t + i_h * s_o_h
    tl.store(
        p_o + o_m.to(tl.int64)[:, None] * s_o_t + o_dv[None, :],
        b_o.to(p_o.dtype.element_ty),
        mask=m_m[:, None] & m_dv[None, :],
    )
    tl.store(p_lse + (q_start + o_m).to(tl.int64) * s_lse_t + i_h * s_lse_h, b_lse, mask=m_m)


def _check_config(config) -> dict:
    """A launch config over the defaults; BLOCK_M and BLOCK_N feed tl.dot, so at least 16."""
    configs.check_config(
        config, "config", pow2={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1}, positive=("num_stages",)
    )
    return {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES, **config}


def smem_bytes(cfg: dict, d_qk: int, dV: int, elt: int) -> int:
    """Rough shared memory of one program: the Q block plus num_stages buffers of K and V."""
    return elt * (cfg["BLOCK_M"] * d_qk + cfg["num_stages"] * cfg["BLOCK_N"] * (d_qk + dV))


def _heuristic_config(device: torch.device, d_qk: int, dV: int, elt: int, max_len_q: int) -> dict:
    if interpreting() or device.type != "cuda":
        return {"BLOCK_M": INTERPRET_BLOCK_M, "BLOCK_N": INTERPRET_BLOCK_N, "num_warps": 4, "num_stages": 1}
    if elt == 4:
        # fp32 is a correctness path: exact ("ieee") dots on FMA units spill above 32 x 32 tiles
        return {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    props = torch.cuda.get_device_properties(device)
    # opt-in shared memory per block; older torch lacks the field: take it from the arch
    smem = getattr(props, "shared_memory_per_block_optin", 0) or _SMEM_BY_ARCH.get(
        (props.major, props.minor), 99 * 1024
    )
    cfg = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES}
    if max_len_q <= 64:  # short query runs (chunks, near-decode) waste half of a 128-row block
        cfg.update(BLOCK_M=64, num_warps=4)
    if props.major < 9:
        cfg["num_stages"] = 2  # no TMA/wgmma pipeline to feed; Ampere-class smem is 100-164 KB
    # shrink until the estimate fits, leaving 8 KB for Triton's own scratch
    while smem_bytes(cfg, d_qk, dV, elt) > smem - 8 * 1024:
        if cfg["num_stages"] > 2:
            cfg["num_stages"] -= 1
        elif cfg["BLOCK_N"] > 32:
            cfg["BLOCK_N"] //= 2
        elif cfg["BLOCK_M"] > 64:
            cfg.update(BLOCK_M=cfg["BLOCK_M"] // 2, num_warps=4)
        elif cfg["num_stages"] > 1:
            cfg["num_stages"] = 1
        elif cfg["BLOCK_M"] > 16 or cfg["BLOCK_N"] > 16:
            cfg["BLOCK_M"] = max(16, cfg["BLOCK_M"] // 2)
            cfg["BLOCK_N"] = max(16, cfg["BLOCK_N"] // 2)
        else:
            break
    return cfg


def default_config(capability: int, d_qk: int, dV: int, dtype: str, max_len_q: int) -> dict:
    """The heuristic config for a GPU of compute capability `capability` (90 = sm_90), no GPU needed
    (the compile stage of `mlactl tune` builds it for that target)."""
    elt = {"fp32": 4}.get(dtype, 2)
    if elt == 4:
        return {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    cfg = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES}
    if max_len_q <= 64:
        cfg.update(BLOCK_M=64, num_warps=4)
    if capability < 90:
        cfg["num_stages"] = 2
    smem = _SMEM_BY_ARCH.get(divmod(capability, 10), 99 * 1024)
    while smem_bytes(cfg, d_qk, dV, elt) > smem - 8 * 1024 and cfg["BLOCK_N"] > 16:
        if cfg["num_stages"] > 2:
            cfg["num_stages"] -= 1
        else:
            cfg["BLOCK_N"] //= 2
    return cfg


def _constants(cfg: dict, dC: int, dR: int, dV: int, causal: bool, fp32: bool) -> dict:
    """The kernel's constexpr arguments: one definition for the launch and the compile stage."""
    return dict(
        DC=dC,
        DR=dR,
        DV=dV,
        BLOCK_DC=max(16, triton.next_power_of_2(dC)),
        BLOCK_DR=max(16, triton.next_power_of_2(dR)),
        BLOCK_DV=max(16, triton.next_power_of_2(dV)),
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        CAUSAL=bool(causal),
        PRECISION="ieee" if fp32 else "tf32",
    )


def compile_spec(config: dict, dC: int, dR: int, dV: int, dtype: str, causal: bool = True):
    """What `mlactl tune compile` needs to build the kernel for a GPU target without launching it:
    (jit function, signature, constants, argument names divisible by 16, compile options)."""
    names = _mla_prefill_kernel.arg_names
    ptrs = ("p_q", "p_kn", "p_kr", "p_v", "p_o")
    consts = _constants(config, dC, dR, dV, causal, dtype == "fp32")

    def kind(n):
        if n in consts:
            return "constexpr"
        if n in ptrs:
            return f"*{dtype}"
        if n == "p_lse":
            return "*fp32"
        if n.startswith("p_"):
            return "*i32"
        return "fp32" if n == "qk_scale" else "i32"

    sig = {n: kind(n) for n in names}
    aligned = [n for n in names if n.startswith("p_") or (n.startswith("s_") and n != "s_lse_h")]
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    return _mla_prefill_kernel, sig, consts, aligned, options


def _smaller(cfg: dict) -> dict | None:
    """The next smaller config after an OutOfResources failure, or None if there is none."""
    if cfg["num_stages"] > 1:
        return {**cfg, "num_stages": cfg["num_stages"] - 1}
    if cfg["BLOCK_N"] > 16:
        return {**cfg, "BLOCK_N": cfg["BLOCK_N"] // 2}
    if cfg["BLOCK_M"] > 16:
        return {**cfg, "BLOCK_M": cfg["BLOCK_M"] // 2}
    return None


def pick_config(
    device: torch.device, dtype: torch.dtype, H: int, d_qk: int, dV: int, max_len_q: int, max_len_k: int, config=None
) -> tuple[dict, bool]:
    """(config, is_heuristic): the argument, else a tuned config, else the heuristic."""
    if config is not None:
        return _check_config(config), False
    if device.type == "cuda" and not interpreting():
        tuned = configs.lookup(
            "mla_prefill", torch.cuda.get_device_name(device), _DTYPE_NAMES[dtype], H=H, L=max(1, max_len_k)
        )
        if tuned is not None:
            try:
                return _check_config({k: v for k, v in tuned.items() if k in _CONFIG_KEYS}), False
            except ValueError:
                pass  # a malformed tuned entry must not fail a launch; fall back to the heuristic
    elt = torch.finfo(dtype).bits // 8
    cfg = _heuristic_config(device, d_qk, dV, elt, max_len_q)
    return _FALLBACKS.get((device.index, dtype, d_qk, dV, *sorted(cfg.items())), cfg), True


def mla_prefill(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    *,
    causal: bool = True,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen MLA prefill attention of the expand path (FlashAttention-style, one Triton launch).

    Any strides with a unit last dimension. Reads cu_seqlens to the host to check them and size
    the grid (one small synchronising copy).

    Args:
        q: [T_q, H, dC + dR] queries, packed over requests (fp16, bf16 or fp32).
        k_nope: [T_k, H, dC] per-head no-RoPE keys.
        k_rope: [T_k, dR] RoPE keys shared by all heads.
        v: [T_k, H, dV] per-head values.
        cu_seqlens_q: [B + 1] int32 query offsets of the requests.
        cu_seqlens_k: [B + 1] int32 key offsets of the requests.
        scale: softmax scale, 1/sqrt(dC + dR) for MLA.
        causal: query i of a request sees keys j <= i + (len_k - len_q) (end-aligned); needs
            len_q <= len_k per request.
        max_seqlen_q, max_seqlen_k: optional upper bounds, checked against the real lengths.
        config: {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} (any subset); default the
            tuned config for this GPU (configs.lookup), else a heuristic.
        out: optional [T_q, H, dV] buffer in q's dtype.

    Returns:
        (out [T_q, H, dV] in q's dtype, lse [T_q, H] fp32 natural log of the scaled scores); a
        row that sees no key gets out 0 and lse -inf.

    Raises:
        ValueError: on any bad input, before anything is launched.
    """
    scale, lens_q, lens_k = validate_prefill(
        q, k_nope, k_rope, v, cu_seqlens_q, cu_seqlens_k, scale, causal, max_seqlen_q, max_seqlen_k, out
    )
    device = check_device(
        q=q, k_nope=k_nope, k_rope=k_rope, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, out=out
    )
    T_q, H, d_qk = q.shape
    dC, dR, dV = k_nope.shape[2], k_rope.shape[1], v.shape[2]
    B = len(lens_q)
    if H > 65535 or B > 65535:
        raise ValueError(f"q has {H} heads and {B} requests; the grid allows at most 65535 of each")
    if out is None:
        out = torch.empty(T_q, H, dV, dtype=q.dtype, device=device)
    lse = torch.empty(T_q, H, dtype=torch.float32, device=device)
    if T_q == 0:
        return out, lse

    max_len_q, max_len_k = max(lens_q), max(lens_k)
    cfg, heuristic = pick_config(device, q.dtype, H, d_qk, dV, max_len_q, max_len_k, config)
    # longest requests first (work ~ len_q * len_k), so their heavy blocks start first
    order = sorted(range(B), key=lambda b: -lens_q[b] * max(1, lens_k[b]))
    order_t = torch.tensor(order, dtype=torch.int32, device=device)
    while True:
        grid = (triton.cdiv(max_len_q, cfg["BLOCK_M"]), H, B)
        try:
            _mla_prefill_kernel[grid](
                q,
                k_nope,
                k_rope,
                v,
                out,
                lse,
                cu_seqlens_q,
                cu_seqlens_k,
                order_t,
                q.stride(0),
                q.stride(1),
                k_nope.stride(0),
                k_nope.stride(1),
                k_rope.stride(0),
                v.stride(0),
                v.stride(1),
                out.stride(0),
                out.stride(1),
                lse.stride(0),
                lse.stride(1),
                scale * _LOG2E,
                **_constants(cfg, dC, dR, dV, causal, q.dtype == torch.float32),
                num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"],
            )
            return out, lse
        except OutOfResources as exc:
            smaller = _smaller(cfg) if heuristic else None
            if smaller is None:
                raise ValueError(f"config {cfg} does not fit this GPU: {exc}") from None
            _FALLBACKS[(device.index, q.dtype, d_qk, dV, *sorted(cfg.items()))] = smaller
            cfg = smaller


__all__ = ["mla_prefill", "pick_config", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "NUM_STAGES"]
