"""Plain-torch twin of `mla_prefill` (kernels/prefill.py): varlen attention of the expand path.

Read this first; the Triton kernel computes the same thing in tiles. The input checks shared by
the twin and the kernel live here too, because this module needs only torch.

The expand path runs ordinary multi-head attention whose key is split in two: a per-head
"nope" part `k_nope` (dC) and a RoPE part `k_rope` (dR) that all heads share. For query row i and
key j of one request (docs/design.md, "The math")::

    s[h, i, j] = (q[i, h, :dC] . k_nope[j, h] + q[i, h, dC:] . k_rope[j]) * scale
    lse[i, h]  = log sum_j exp(s[h, i, j])             (natural log; -inf when no key is seen)
    out[i, h]  = sum_j exp(s[h, i, j] - lse[i, h]) v[j, h]   (0 when no key is seen)

With `causal`, query i of a request with len_q queries and len_k keys sees the keys
j <= i + (len_k - len_q): the queries are the last len_q tokens of the context.
"""

from __future__ import annotations

import torch

from mlactl.kernels._checks import FLOAT_DTYPES, check_scale, check_tensor

# Score tensors of the twin are kept under this many fp32 elements (256 MiB) by looping over
# groups of heads: at DeepSeek-V3 shapes one request of 8K tokens would need 34 GB for all heads.
_TWIN_SCORE_ELEMENTS = 1 << 26


def check_inner_stride(name: str, t: torch.Tensor) -> None:
    """The launchers accept any row/head strides but need unit stride in the last dimension."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dimension (call .contiguous() first)")


def check_same_device(**tensors) -> torch.device:
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"inputs are on different devices: {listed}")
    return next(iter(devices.values()))


def check_cu_seqlens(name: str, cu: torch.Tensor, total: int, total_name: str) -> list[int]:
    """Validate cumulative sequence lengths [B+1] int32 and return the per-request lengths.

    Reads the B+1 values to the host (one small copy): the lengths decide the grid and must be
    checked before a launch, where a wrong value would be an illegal access.
    """
    check_tensor(name, cu, 1, (torch.int32,), contiguous=False)
    if cu.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one value (B+1 offsets starting at 0), got shape (0,)")
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {values[0]}")
    lengths = [b - a for a, b in zip(values[:-1], values[1:])]
    for i, n in enumerate(lengths):
        if n < 0:
            raise ValueError(
                f"{name} must be non-decreasing, but {name}[{i + 1}]={values[i + 1]} < {name}[{i}]={values[i]}"
            )
    if values[-1] != total:
        raise ValueError(f"{name}[-1] is {values[-1]} but {total_name} has {total} tokens; they must match")
    return lengths


def _check_max_seqlen(name: str, given, lengths: list[int]) -> int:
    actual = max(lengths, default=0)
    if given is None:
        return actual
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {given!r}")
    if given < actual:
        raise ValueError(f"{name} is {given} but a request has {actual} tokens; it must be at least that")
    return given


def validate_prefill(q, k_nope, k_rope, v, cu_seqlens_q, cu_seqlens_k, scale, causal, max_seqlen_q, max_seqlen_k, out):
    """Checks shared by mla_prefill and mla_prefill_naive. Returns (scale, lens_q, lens_k).

    Devices are compared here; whether the device can run Triton is the launcher's check.
    """
    check_tensor("q", q, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("k_nope", k_nope, 3, FLOAT_DTYPES, contiguous=False)
    check_tensor("k_rope", k_rope, 2, FLOAT_DTYPES, contiguous=False)
    check_tensor("v", v, 3, FLOAT_DTYPES, contiguous=False)
    for name, t in (("k_nope", k_nope), ("k_rope", k_rope), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(
                f"{name} has dtype {str(t.dtype).replace('torch.', '')} but q has "
                f"{str(q.dtype).replace('torch.', '')}; they must match"
            )
    for name, t in (("q", q), ("k_nope", k_nope), ("k_rope", k_rope), ("v", v)):
        check_inner_stride(name, t)
    check_same_device(
        q=q, k_nope=k_nope, k_rope=k_rope, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, out=out
    )

    T_q, H, d_qk = q.shape
    T_k, _, dC = k_nope.shape
    dR = k_rope.shape[1]
    dV = v.shape[2]
    if H < 1:
        raise ValueError(f"q must have at least one head, got shape {tuple(q.shape)}")
    if k_nope.shape[1] != H:
        raise ValueError(f"k_nope.shape[1] is {k_nope.shape[1]} but must equal the heads of q ({H})")
    if v.shape[1] != H:
        raise ValueError(f"v.shape[1] is {v.shape[1]} but must equal the heads of q ({H})")
    if dC < 1 or dR < 1 or dV < 1:
        raise ValueError(f"dC, dR and dV must be positive, got dC={dC} (k_nope), dR={dR} (k_rope), dV={dV} (v)")
    if d_qk != dC + dR:
        raise ValueError(f"q.shape[2] is {d_qk} but must equal dC + dR = {dC} + {dR} (k_nope, k_rope)")
    if k_rope.shape[0] != T_k:
        raise ValueError(f"k_rope.shape[0] is {k_rope.shape[0]} but must equal the keys of k_nope ({T_k})")
    if v.shape[0] != T_k:
        raise ValueError(f"v.shape[0] is {v.shape[0]} but must equal the keys of k_nope ({T_k})")

    lens_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, T_q, "q")
    lens_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, T_k, "k_nope")
    if len(lens_q) != len(lens_k):
        raise ValueError(
            f"cu_seqlens_q has {len(lens_q) + 1} offsets but cu_seqlens_k has {len(lens_k) + 1}; both must be B+1"
        )
    if causal:
        for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
            if lq > lk:
                raise ValueError(
                    f"request {b} has {lq} queries (cu_seqlens_q) but only {lk} keys (cu_seqlens_k); "
                    "causal attention needs len_q <= len_k (the queries are the end of the context)"
                )
    _check_max_seqlen("max_seqlen_q", max_seqlen_q, lens_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k, lens_k)
    if out is not None:
        check_tensor("out", out, 3, contiguous=False)
        if tuple(out.shape) != (T_q, H, dV):
            raise ValueError(f"out has shape {tuple(out.shape)} but must be [T_q, H, dV] = {(T_q, H, dV)}")
        if out.dtype != q.dtype:
            raise ValueError(
                f"out has dtype {str(out.dtype).replace('torch.', '')} but must have q's "
                f"({str(q.dtype).replace('torch.', '')})"
            )
        check_inner_stride("out", out)
    return check_scale(scale), lens_q, lens_k


def mla_prefill_naive(
    q,
    k_nope,
    k_rope,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    scale,
    *,
    causal=True,
    max_seqlen_q=None,
    max_seqlen_k=None,
    out=None,
):
    """Varlen MLA prefill attention (expand path), one request at a time, in fp32.

    q:            [T_q, H, dC+dR]   queries of all requests, packed
    k_nope:       [T_k, H, dC]      per-head no-RoPE keys (W_UK c)
    k_rope:       [T_k, dR]         RoPE keys, shared by all heads
    v:            [T_k, H, dV]      per-head values (W_UV c)
    cu_seqlens_q: [B+1] int32       request b's queries are q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]
    cu_seqlens_k: [B+1] int32       same for the keys
    returns out [T_q, H, dV] in q's dtype, lse [T_q, H] fp32 (natural log of the scaled scores).
    max_seqlen_q/k are accepted for signature parity with the kernel and only checked.
    """
    scale, lens_q, lens_k = validate_prefill(
        q, k_nope, k_rope, v, cu_seqlens_q, cu_seqlens_k, scale, causal, max_seqlen_q, max_seqlen_k, out
    )
    T_q, H, _ = q.shape
    dC = k_nope.shape[2]
    if out is None:
        out = torch.empty(T_q, H, v.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.empty(T_q, H, dtype=torch.float32, device=q.device)
    q0 = k0 = 0
    for len_q, len_k in zip(lens_q, lens_k):
        q_n = q[q0 : q0 + len_q, :, :dC].float()  # [len_q, H, dC]
        q_r = q[q0 : q0 + len_q, :, dC:].float()  # [len_q, H, dR]
        k_n = k_nope[k0 : k0 + len_k].float()  # [len_k, H, dC]
        k_r = k_rope[k0 : k0 + len_k].float()  # [len_k, dR]
        v_b = v[k0 : k0 + len_k].float()  # [len_k, H, dV]
        i = torch.arange(len_q, device=q.device)[:, None]
        j = torch.arange(len_k, device=q.device)[None, :]
        hidden = (j > i + (len_k - len_q)) if causal else torch.zeros(len_q, len_k, dtype=torch.bool, device=q.device)
        group = max(1, _TWIN_SCORE_ELEMENTS // max(1, len_q * len_k))
        for h0 in range(0, H, group):
            hs = slice(h0, min(H, h0 + group))
            s = torch.einsum("qhc,khc->hqk", q_n[:, hs], k_n[:, hs])
            s = (s + torch.einsum("qhd,kd->hqk", q_r[:, hs], k_r)) * scale  # [h, len_q, len_k]
            s = s.masked_fill(hidden, float("-inf"))
            lse_b = torch.logsumexp(s, dim=-1) if len_k else s.new_full(s.shape[:2], float("-inf"))
            seen = torch.isfinite(lse_b)  # rows that see a key
            p = torch.exp(s - torch.where(seen, lse_b, 0.0)[..., None])  # [h, len_q, len_k]
            o = torch.einsum("hqk,khv->qhv", p, v_b[:, hs])  # [len_q, h, dV]
            out[q0 : q0 + len_q, hs] = o.to(out.dtype)
            lse[q0 : q0 + len_q, hs] = lse_b.transpose(0, 1)
        q0 += len_q
        k0 += len_k
    return out, lse
