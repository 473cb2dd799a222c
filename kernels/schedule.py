"""Balanced split-KV for mla_decode: each SM gets an equal share of the batch's KV tiles.

Today's rule (``decode.heuristic_config``) gives every request the same split count, sized by the
longest context: one 128K request among short ones splits every short one too, and the SM that
holds the long request's splits still finishes last. This planner follows the idea of FlashMLA's
scheduling metadata (deepseek-ai/FlashMLA, ``get_mla_metadata`` / ``get_mla_decoding_metadata``
in csrc, 2025): lay the requests end to end on one line of work, each costing its KV tiles plus a
fixed cost (the query tile it loads, the output it writes), and cut the line into ``P`` equal
parts, one per program of a persistent grid.

* A request lying inside one part is not split: its program writes the final output.
* A request a cut runs through is split there; only such requests get partial outputs, and the
  partial buffer is sized for the splits that can exist (at most ``2 (P - 1)``: each of the
  ``P - 1`` cuts adds at most one split and one split request), not ``B x splits``.
* A part's cost is at most ``ceil(W / P) + fixed`` (W: all tiles plus one fixed cost per
  request): the extra ``fixed`` is paid by a part that starts inside a request. (Moving cuts to
  the edges of short requests was tried: it made the worst part longer on every mix measured.)

The plan is built with torch ops on the device, with no host sync and fixed shapes for fixed
(B, P), so it can be captured in a CUDA graph with the kernels. All positions are in units of
one KV tile (BLOCK_N keys).

Cost of part p = its tiles + ``fixed`` per request piece it touches; makespan = the largest
cost of any part; `simulate` computes it by walking the plan as the kernel does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# FlashMLA's fixed cost of a request piece: 5 blocks of 64 keys at every head count
# (deepseek-ai/FlashMLA, csrc/flash_api.cpp, get_mla_metadata, commit 27710fa: block_size_n =
# Config::PAGE_BLOCK_SIZE = 64, fixed_overhead_num_blocks = Config::FIXED_OVERHEAD_NUM_BLOCKS = 5;
# its tile is always 64 rows, BLOCK_SIZE_M). Kept in keys, so that a plan in tiles of BLOCK_N
# keys charges the same time: 320 keys are 5 tiles of 64 or 10 of 32. bench_decode_schedules.py
# sets it to time the planner with the bytes alone against FlashMLA's cost on a GPU.
FIXED_OVERHEAD_KEYS = 5 * 64


def split_cost_tiles(rows: int, r: int, dR: int, block_n: int, q_bytes: int, kv_bytes: int) -> int:
    """Fixed cost of one request piece, in KV tiles of `block_n` keys: the larger of what it moves
    besides its keys and FlashMLA's fixed cost (FIXED_OVERHEAD_KEYS).

    By bytes, a piece loads its [rows, r + dR] query tile and writes a [rows, r] fp32 partial
    that the merge reads back: against one [BLOCK_N, r + dR] KV tile that is 4.6 tiles of 64 keys
    for DeepSeek-V3 at H = 128 in bf16 and 1.1 at H = 16. A piece also pays costs that do not
    scale with its rows (the pipeline filling before its first tile, the epilogue, the launch
    of the merge); FlashMLA charges 5 tiles of 64 keys at every head count for all of it, and
    so does this planner unless FIXED_OVERHEAD_KEYS is set lower.
    """
    tile = block_n * (r + dR) * kv_bytes
    extra = rows * (r + dR) * q_bytes + 2 * rows * r * 4
    by_bytes = max(1, round(extra / tile))
    return max(by_bytes, -(-FIXED_OVERHEAD_KEYS // block_n))


@dataclass
class Plan:
    """Where each of the P parts starts and ends on the line, and how each request is split.

    cuts:        [P + 1] int32 line positions; part p covers [cuts[p], cuts[p + 1])
    b_first/last:[P] int32 first and last request a part touches (last < first: an empty part)
    starts:      [B] int32 line position of each request (its fixed cost first, then its tiles)
    tiles:       [B] int32 KV tiles of each request (cdiv(seqlen, BLOCK_N))
    first_part:  [B] int32 part holding the request's first tile
    n_splits:    [B] int32 pieces of the request's tiles (1: not split, final output direct)
    slot:        [B] int32 first partial-output slot of a split request
    """

    cuts: torch.Tensor
    b_first: torch.Tensor
    b_last: torch.Tensor
    starts: torch.Tensor
    tiles: torch.Tensor
    first_part: torch.Tensor
    n_splits: torch.Tensor
    slot: torch.Tensor
    num_parts: int
    max_partials: int
    fixed: int


def max_partials(num_parts: int) -> int:
    """Partial-output slots a plan of `num_parts` can use: each of the P - 1 cuts adds at most
    one piece to a request already split and makes at most one more request split."""
    return max(1, 2 * (num_parts - 1))


def plan(seqlens: torch.Tensor, block_n: int, num_parts: int, fixed: int) -> Plan:
    """Cut the batch's work line into `num_parts` balanced parts (torch, on seqlens' device).

    seqlens: [B] int32 context lengths (0: an empty request, which still writes its output).
    """
    if num_parts < 1 or block_n < 1 or fixed < 0:
        raise ValueError(f"num_parts {num_parts} and block_n {block_n} must be >= 1, fixed {fixed} >= 0")
    dev = seqlens.device
    B = seqlens.shape[0]
    tiles = (seqlens.to(torch.int64) + block_n - 1) // block_n  # [B]
    cost = tiles + fixed  # [B]
    ends = torch.cumsum(cost, 0)  # [B]
    starts = ends - cost
    total = ends[-1] if B else torch.zeros((), dtype=torch.int64, device=dev)
    payload = torch.clamp((total + num_parts - 1) // num_parts, min=1)  # 0-d, stays on the device

    p = torch.arange(1, num_parts, device=dev, dtype=torch.int64)
    cut = torch.minimum(p * payload, total)  # [P - 1] inner cuts, wherever they fall
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    cuts = torch.cat([zero, cut, total.reshape(1)])  # [P + 1]
    x0, x1 = cuts[:-1], cuts[1:]
    if B:
        b_first = torch.searchsorted(ends, x0, right=True)
        b_last = torch.searchsorted(ends, x1 - 1, right=True)
        b_last = torch.where(x1 > x0, b_last, b_first - 1)
        # the part holding a request's first and last tile; pieces = parts in between
        tile_lo = starts + fixed
        first_part = torch.searchsorted(cuts[1:-1], tile_lo, right=True)
        last_part = torch.searchsorted(cuts[1:-1], torch.maximum(ends - 1, tile_lo), right=True)
        n_splits = torch.where(tiles > 0, last_part - first_part + 1, torch.ones_like(tiles))
        split = n_splits > 1
        slot = torch.cumsum(torch.where(split, n_splits, 0), 0) - torch.where(split, n_splits, 0)
    else:
        b_first = b_last = torch.zeros(num_parts, dtype=torch.int64, device=dev)
        b_last = b_last - 1
        first_part = n_splits = slot = tiles
    i32 = torch.int32
    return Plan(
        cuts.to(i32),
        b_first.to(i32),
        b_last.to(i32),
        starts.to(i32),
        tiles.to(i32),
        first_part.to(i32),
        n_splits.to(i32),
        slot.to(i32),
        num_parts,
        max_partials(num_parts),
        fixed,
    )


def simulate(pl: Plan) -> list[list[tuple[int, int, int, int]]]:
    """Walk the plan as the kernel's programs do: per part, its pieces (b, t0, t1, slot or -1).

    Plain Python on host copies, written apart from `plan`: the tests and the benchmark check
    the plan through it (every tile exactly once, the cost of each part).
    """
    cuts = pl.cuts.tolist()
    b_first, b_last = pl.b_first.tolist(), pl.b_last.tolist()
    starts, tiles = pl.starts.tolist(), pl.tiles.tolist()
    first_part, n_splits, slot = pl.first_part.tolist(), pl.n_splits.tolist(), pl.slot.tolist()
    parts = []
    for p in range(pl.num_parts):
        x0, x1 = cuts[p], cuts[p + 1]
        pieces = []
        for b in range(b_first[p], b_last[p] + 1):
            t0 = min(max(x0 - starts[b] - pl.fixed, 0), tiles[b])
            t1 = min(max(x1 - starts[b] - pl.fixed, 0), tiles[b])
            empty_owner = tiles[b] == 0 and x0 <= starts[b] < x1
            if t1 > t0 or empty_owner:
                s = slot[b] + p - first_part[b] if n_splits[b] > 1 else -1
                pieces.append((b, t0, t1, s))
        parts.append(pieces)
    return parts


def part_costs(parts, fixed: int) -> list[int]:
    """Tiles plus `fixed` per piece, per part."""
    return [sum(t1 - t0 + fixed for _, t0, t1, _ in pieces) for pieces in parts]


def uniform_costs(seqlens: list[int], block_n: int, splits: int, num_sms: int, fixed: int, rows_tiles: int = 1):
    """Per-SM cost of today's rule: every request cut into `splits` equal runs of whole tiles,
    its B x splits programs dealt in launch order, each to the SM that frees up first (how the
    hardware's block scheduler hands out a grid larger than one wave)."""
    work = []
    for n in seqlens:
        t = -(-n // block_n)
        per = -(-t // splits) if t else 0
        for s in range(splits):
            got = max(0, min(per, t - s * per))
            if got or s == 0:
                work.append(got + fixed)
    work = [w for w in work for _ in range(rows_tiles)]  # row tiles are launched fastest
    load = [0] * num_sms
    for w in work:
        i = min(range(num_sms), key=load.__getitem__)
        load[i] += w
    return load
