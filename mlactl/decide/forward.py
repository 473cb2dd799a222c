"""The whole forward pass of a batch: attention by its best path on every layer, plus every op
outside attention (mlactl.model.cost.ForwardCost: the MLA projections, the dense MLP, the MoE
router and experts, the LM head, the all-reduces), each at its roofline.

An op outside attention takes count x (max(FLOPs / its dtype's peak, bytes / bandwidth) +
interconnect bytes / the link), the link being NVLink one way (the profile's nvlink_gbps / 2: a
ring sends and receives at once); at TP 1, or on a profile without nvlink_gbps, the collectives
are not priced and `comm_basis` says so. `mlactl replay`'s clock prices each step the same way
(mlactl.decide.replay.clock; tests/test_forward.py holds the two to each other).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlactl.model.config import MLAConfig
from mlactl.model.cost import ForwardCost
from mlactl.model.hardware import HardwareProfile
from mlactl.model.weights import ModelWeights


@dataclass(frozen=True)
class ForwardOpTimes:
    """One op outside attention over the whole forward (every layer it runs in), per row."""

    name: str
    count: int
    flops: np.ndarray
    bytes: np.ndarray
    comm_bytes: np.ndarray
    time_s: np.ndarray


@dataclass(frozen=True)
class Forward:
    """Per row: the whole forward's FLOPs, bytes and roofline seconds, attention's share (its
    best path, every layer), and the ops outside attention."""

    flops: np.ndarray
    bytes: np.ndarray
    time_s: np.ndarray
    attention_s: np.ndarray
    ops: list[ForwardOpTimes]
    comm_basis: str
    weight_dtype: str


def link_bytes_per_s(cfg: MLAConfig, hw: HardwareProfile) -> tuple[float, str]:
    """Bytes a second each GPU sends in a collective, and what that rests on."""
    if cfg.tp == 1:
        return float("inf"), "tp 1: no collectives"
    if hw.nvlink_gbps is None:
        return float("inf"), f"not priced: {hw.name} has no nvlink_gbps"
    return hw.nvlink_gbps * 1e9 / 2, f"roofline: NVLink {hw.nvlink_gbps:g} GB/s, {hw.nvlink_gbps / 2:g} GB/s each way"


def forward(
    cfg: MLAConfig,
    weights: ModelWeights,
    hw: HardwareProfile,
    dtype: str,
    batch,
    new,
    attention_s,
    attention_flops,
    attention_bytes,
) -> Forward:
    """The forward of `batch` requests of `new` tokens each (every request samples one token),
    its attention taking `attention_s` seconds, `attention_flops` and `attention_bytes` (every
    layer, from the analysis of the same rows)."""
    batch = np.asarray(batch, dtype=np.float64)
    tokens = batch * np.asarray(new, dtype=np.float64)
    link, basis = link_bytes_per_s(cfg, hw)
    ops = []
    for op in ForwardCost(cfg, weights, act_dtype=dtype).ops(tokens, batch):
        flops = np.broadcast_to(op.count * np.asarray(op.flops, dtype=np.float64), tokens.shape)
        nbytes = np.broadcast_to(op.count * np.asarray(op.bytes, dtype=np.float64), tokens.shape)
        comm = np.broadcast_to(op.count * np.asarray(op.comm_bytes, dtype=np.float64), tokens.shape)
        seconds = np.maximum(flops / hw.peak_flops(op.dtype), nbytes / hw.bandwidth) + comm / link
        ops.append(ForwardOpTimes(op.name, op.count, flops, nbytes, comm, seconds))
    attention_s = np.asarray(attention_s, dtype=np.float64)
    return Forward(
        flops=np.asarray(attention_flops, dtype=np.float64) + sum(o.flops for o in ops),
        bytes=np.asarray(attention_bytes, dtype=np.float64) + sum(o.bytes for o in ops),
        time_s=attention_s + sum(o.time_s for o in ops),
        attention_s=attention_s,
        ops=ops,
        comm_basis=basis,
        weight_dtype=weights.dtype,
    )
