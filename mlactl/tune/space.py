"""What `mlactl tune kernels` searches: per kernel, its shape buckets and its launch space.

Each kernel is a KernelSpec: the buckets of a model (shapes as the launcher's tuned-config lookup
keys them), inputs for a bucket, how to run it with a config and as its twin, the launcher's own
default, the candidate configs pruned before compiling (shared memory against the device's
limit, tile rows against the rows there are), and its FLOPs and bytes, from cost.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from mlactl.model.cost import CostModel
from mlactl.tune import inputs

HOPPER_SMEM = 227 * 1024  # opt-in shared memory per block when the device does not say
SHIPPED_CAPABILITY = 90  # the GPU the shipped defaults are asked for (H100/H200: sm_90)
# the sparse decode of a model without DSA fields is tuned at DeepSeek-V3.2's top-k (its index
# heads and dim only name the cache layout here)
SPARSE_TOPK = 2048
SPARSE_INDEX = (64, 128)


@dataclass(frozen=True)
class KernelSpec:
    name: str  # as in tuned-config file names and the launcher's lookup
    buckets: Callable  # (cfg, quick, device_type) -> [shape dict]
    make_inputs: Callable  # (cfg, shape, kv_dtype, dtype, device) -> kwargs
    run: Callable  # (kwargs, config | None) -> output tensor
    twin: Callable  # (kwargs) -> output tensor
    space: Callable  # (cfg, shape, kv_dtype, dtype, smem) -> [config]
    cost_op: Callable  # (cost_model, shape) -> cost.Op
    dtype_name: Callable  # (kv_dtype, dtype) -> the tuned-config file's dtype
    # (cfg, shape, kv_dtype, dtype) -> the config the launcher ships for the shape (no tuned
    # file), in the space's keys: what `candidates` puts first, so every sweep times it
    shipped: Callable | None = None


QUICK_CANDIDATES = 8  # configs a --quick sweep keeps per bucket, the shipped defaults among them


def _pow2_at_least(x: int, low: int = 1) -> int:
    p = low
    while p < x:
        p *= 2
    return p


# -- absorb decode --------------------------------------------------------------------------------


def _decode_buckets(cfg, quick, device_type):
    if device_type != "cuda":  # the interpreter / a CPU: pipeline checks on tiny shapes
        return [{"B": 2, "H": cfg.H, "S_q": 1, "ctx": 100}]
    batches, contexts = ((128,), (8192,)) if quick else ((1, 32, 128), (1024, 8192, 32768))
    shapes = [{"B": b, "H": cfg.H, "S_q": 1, "ctx": c} for b in batches for c in contexts]
    if not quick:  # multi-token prediction / short extends
        shapes.append({"B": 32, "H": cfg.H, "S_q": 4, "ctx": 8192})
    return shapes


def _decode_inputs(cfg, shape, kv_dtype, dtype, device):
    page = inputs.PAGE if device.type == "cuda" else 16
    return inputs.decode_inputs(cfg, shape["B"], shape["S_q"], shape["ctx"], kv_dtype, dtype, device, page=page)


def _decode_run(kwargs, config):
    from mlactl.kernels.decode import mla_decode

    return mla_decode(**kwargs, config=config)[0]


def _decode_twin(kwargs):
    from mlactl.kernels.decode_naive import mla_decode_naive

    return mla_decode_naive(**kwargs)[0]


def _decode_space(cfg, shape, kv_dtype, dtype, smem):
    from mlactl.kernels.decode import smem_bytes

    rows = shape["S_q"] * shape["H"]
    most_rows = max(16, _pow2_at_least(rows))
    row = cfg.r + cfg.dR
    q_bytes = inputs.torch_dtype(dtype).itemsize
    kv_bytes = 1 if kv_dtype == "fp8" else q_bytes
    found = []
    # SPLIT_SCORE 1: the score tile split across warps, p through a scratch slot (kernels/decode.py,
    # _score_and_accumulate); it issues each tensor-core multiply-add once where the plain loop
    # computes the score twice (issued_mma_over_needed in `mlactl tune compile`)
    for block_h, block_n, warps, stages, split in itertools.product(
        (16, 32, 64), (16, 32, 64), (4, 8), (1, 2, 3), (0, 1)
    ):
        if block_h > most_rows:
            continue  # taller tiles than rows are padding only
        fp8 = kv_dtype == "fp8"
        if smem is not None and smem_bytes(block_h, block_n, stages, row, q_bytes, kv_bytes, fp8, cfg.r, split) > smem:
            continue
        found.append(
            {"BLOCK_H": block_h, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "SPLIT_SCORE": split}
        )
    return found


def _decode_shipped(cfg, shape, kv_dtype, dtype):
    from mlactl.kernels.decode import default_config

    # the launcher's heuristic at the page the GPU runs use; its split count is left to the
    # launcher (the space has none: tune's second stage tries split counts)
    return default_config(shape, cfg.r, cfg.dR, inputs.PAGE, dtype, kv_dtype)


def decode_split_space(shape, page: int) -> list[int]:
    """Split counts worth trying for a bucket: powers of two up to its pages (at most 64)."""
    pages = max(1, -(-shape["ctx"] // page))
    return [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= pages]


# -- expand prefill -------------------------------------------------------------------------------


def _prefill_buckets(cfg, quick, device_type):
    if device_type != "cuda":
        return [{"H": cfg.H, "L": 64}]
    lengths = (4096,) if quick else (1024, 4096, 8192)
    return [{"H": cfg.H, "L": n} for n in lengths]


def _prefill_inputs(cfg, shape, kv_dtype, dtype, device):
    return inputs.prefill_inputs(cfg, shape["L"], dtype, device)


def _prefill_run(kwargs, config):
    from mlactl.kernels.prefill import mla_prefill

    return mla_prefill(**kwargs, config=config)[0]


def _prefill_twin(kwargs):
    from mlactl.kernels.prefill_naive import mla_prefill_naive

    return mla_prefill_naive(**kwargs)[0]


def _prefill_shipped(cfg, shape, kv_dtype, dtype):
    from mlactl.kernels.prefill import default_config

    return default_config(SHIPPED_CAPABILITY, cfg.dC + cfg.dR, cfg.dV, dtype, shape["L"])


def _prefill_space(cfg, shape, kv_dtype, dtype, smem):
    from mlactl.kernels.prefill import smem_bytes

    elt = inputs.torch_dtype(dtype).itemsize
    found = []
    for block_m, block_n, warps, stages in itertools.product((64, 128), (32, 64, 128), (4, 8), (1, 2, 3)):
        config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
        if smem is not None and smem_bytes(config, cfg.dC + cfg.dR, cfg.dV, elt) > smem - 8 * 1024:
            continue
        if block_m == 128 and warps == 4 and block_n == 128:
            continue  # a [128, 128] fp32 score tile on 4 warps spills
        found.append(config)
    return found


# -- lse merge ------------------------------------------------------------------------------------


def _merge_buckets(cfg, quick, device_type):
    if device_type != "cuda":
        return [{"H": cfg.H, "T": 64}]
    return [{"H": cfg.H, "T": t} for t in ((4096,) if quick else (512, 8192))]


def _merge_inputs(cfg, shape, kv_dtype, dtype, device):
    return inputs.merge_inputs(shape["T"], shape["H"], cfg.dV, dtype, device)


def _merge_run(kwargs, config):
    from mlactl.kernels.merge import merge_attn_states

    return merge_attn_states(**kwargs, config=config)[0]


def _merge_twin(kwargs):
    from mlactl.kernels.merge import merge_attn_states_naive

    return merge_attn_states_naive(**kwargs)[0]


def _merge_shipped(cfg, shape, kv_dtype, dtype):
    from mlactl.kernels.merge import default_config

    return default_config(shape["H"], cfg.dV)


def _merge_space(cfg, shape, kv_dtype, dtype, smem):
    block_d = _pow2_at_least(cfg.dV)
    heads = _pow2_at_least(shape["H"])
    return [
        {"BLOCK_H": h, "num_warps": w}
        for h, w in itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8))
        if h <= heads and h * block_d <= 16384 and w * 32 <= h * block_d
    ]


# -- sparse absorb decode (DSA) ---------------------------------------------------------------------


def _sparse_buckets(cfg, quick, device_type):
    topk = cfg.topk or SPARSE_TOPK
    if device_type != "cuda":
        return [{"B": 2, "H": cfg.H, "S_q": 1, "topk": min(topk, 64)}]
    batches = (64,) if quick else (1, 16, 64, 128)
    return [{"B": b, "H": cfg.H, "S_q": 1, "topk": topk} for b in batches]


def _sparse_inputs(cfg, shape, kv_dtype, dtype, device):
    page = inputs.PAGE if device.type == "cuda" else 16
    context = 4 * shape["topk"]  # each query picks its top-k among a context four times longer
    return inputs.sparse_decode_inputs(
        cfg, shape["B"], shape["S_q"], shape["topk"], context, kv_dtype, dtype, device, page=page
    )


def _sparse_run(kwargs, config):
    from mlactl.kernels.sparse_decode import mla_sparse_decode

    return mla_sparse_decode(**kwargs, config=config)[0]


def _sparse_twin(kwargs):
    from mlactl.kernels.sparse_decode_naive import mla_sparse_decode_naive

    return mla_sparse_decode_naive(**kwargs)[0]


def _sparse_shipped(cfg, shape, kv_dtype, dtype):
    from mlactl.kernels.sparse_decode import default_config

    return default_config(shape, kv_dtype)


def _sparse_space(cfg, shape, kv_dtype, dtype, smem):
    most_rows = max(16, _pow2_at_least(shape["H"]))
    return [
        {"BLOCK_H": bh, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
        for bh, bn, w, st in itertools.product((16, 32, 64), (16, 32, 64), (4, 8), (1, 2))
        if bh <= most_rows
    ]


def _file_dtype(kv_dtype, dtype):
    return "fp8" if kv_dtype == "fp8" else dtype


KERNELS = {
    "mla_decode": KernelSpec(
        "mla_decode",
        _decode_buckets,
        _decode_inputs,
        _decode_run,
        _decode_twin,
        _decode_space,
        # the absorb path's attention op: S_q new tokens after ctx - S_q cached
        lambda cost, s: cost.ops("absorb", s["B"], s["S_q"], s["ctx"] - s["S_q"])[1],
        _file_dtype,
        _decode_shipped,
    ),
    "mla_prefill": KernelSpec(
        "mla_prefill",
        _prefill_buckets,
        _prefill_inputs,
        _prefill_run,
        _prefill_twin,
        _prefill_space,
        # the expand path's attention op over one causal sequence, no prefix
        lambda cost, s: cost.ops("expand", 1, s["L"], 0)[1],
        lambda kv_dtype, dtype: dtype,
        _prefill_shipped,
    ),
    "merge_attn_states": KernelSpec(
        "merge_attn_states",
        _merge_buckets,
        _merge_inputs,
        _merge_run,
        _merge_twin,
        _merge_space,
        # one merge of two partials: expand_chunked's lse_merge with a prefix of one chunk
        lambda cost, s: cost.ops("expand_chunked", 1, s["T"], 1)[2],
        lambda kv_dtype, dtype: dtype,
        _merge_shipped,
    ),
    "mla_sparse_decode": KernelSpec(
        "mla_sparse_decode",
        _sparse_buckets,
        _sparse_inputs,
        _sparse_run,
        _sparse_twin,
        _sparse_space,
        # sparse_absorb's attention: every query over its top-k rows (the context is longer)
        lambda cost, s: cost.sparse_attention(s["B"] * s["S_q"], s["B"] * s["S_q"] * s["topk"]),
        _file_dtype,
        _sparse_shipped,
    ),
}


def default_kernels(cfg) -> list[str]:
    """The kernels `mlactl tune` sweeps when none is named: all of them for a DSA model, all but
    the sparse decode (which a dense MLA model never runs) otherwise."""
    return [k for k in KERNELS if cfg.is_dsa or k != "mla_sparse_decode"]


def cost_model(cfg, kernel: str, kv_dtype: str, dtype: str) -> CostModel:
    """Prefill and merge read expanded operands in the activation dtype, whatever the cache's. The
    sparse decode reads DSA rows (FlashMLA's 656-byte fp8 layout), whatever model is tuned."""
    if kernel == "mla_sparse_decode" and not cfg.is_dsa:
        cfg = replace(cfg, topk=SPARSE_TOPK, index_heads=SPARSE_INDEX[0], index_dim=SPARSE_INDEX[1])
    return CostModel(cfg, kv_dtype=kv_dtype if kernel in ("mla_decode", "mla_sparse_decode") else dtype, dtype=dtype)


def spread_order(items: list) -> list:
    """The same items, in an order whose every prefix spans the list: index 0, then the middle,
    then the quarters... (bit-reversed strides). A sweep the budget cuts short has still tried
    every kind of tile, not only the first few (the docs' interpreter sweep was cut after six
    configs, all of BLOCK_N 16, in the space's plain order)."""
    order, seen, step = [], set(), 1
    while step < len(items):
        step *= 2
    while step >= 1:
        for i in range(0, len(items), step):
            if i not in seen:
                seen.add(i)
                order.append(i)
        step //= 2
    return [items[i] for i in order]


def shipped_configs(spec: KernelSpec, cfg, shape: dict, kv_dtype: str, dtype: str, keys=None) -> list[dict]:
    """The launcher's shipped config for the shape, as a candidate: only the keys the space's
    configs have (`keys`; all but num_splits when not given). [] when the kernel has none or its
    launcher cannot say (a model the heuristic does not cover)."""
    if spec.shipped is None:
        return []
    try:
        full = spec.shipped(cfg, shape, kv_dtype, dtype)
    except (KeyError, ValueError, TypeError):  # a launcher's changed signature must not stop a sweep
        return []
    wanted = set(keys) if keys else set(full) - {"num_splits"}
    return [{k: v for k, v in full.items() if k in wanted}]


def candidates(spec: KernelSpec, cfg, shape: dict, kv_dtype: str, dtype: str, smem, quick: bool) -> list[dict]:
    """What a sweep tries for one bucket, in order: the shipped config first (so it is compiled
    and timed before any budget can cut the sweep), then the space in `spread_order`; with
    `quick`, QUICK_CANDIDATES in all. The shipped config is kept even where the space's own
    shared-memory estimate would leave it out: it is what runs."""
    space = spec.space(cfg, shape, kv_dtype, dtype, smem)
    keys = set().union(*(c.keys() for c in space)) if space else None
    first = shipped_configs(spec, cfg, shape, kv_dtype, dtype, keys)
    rest = spread_order([c for c in space if c not in first])
    if quick:
        rest = rest[: max(0, QUICK_CANDIDATES - len(first))]
    return first + rest
