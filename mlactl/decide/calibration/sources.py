"""Calibration points from `mlactl tune` results files and from a plain CSV.

Results files: each `paths` row (one path timed end to end) is a point of the class
`path:<path>`; each `kernels` entry of mla_decode (absorb's attention) or mla_prefill (expand's
attention) gives its best config's median as a point of that attention class.

CSV (docs/calibration.md): a header, then one measured op per line.

    op,batch,new,prefix,time_s[,heads][,source][,dtype]
    absorb_attention,64,1,8191,4.1e-05,128,flashmla,bf16

op is one of OP_CLASSES or path:<path>; heads overrides the model's H on that row; dtype is the
KV-cache dtype for attention (bf16, fp8) and the compute dtype otherwise. FLOPs and bytes come
from cost.py with the model given to `mlactl calibrate --model`.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from mlactl.decide.calibration.model import OP_CLASSES, PATH_CLASSES, Points, op_class
from mlactl.model.config import MLAConfig
from mlactl.model.cost import OPS, CostModel, sparse_pairs
from mlactl.util import numbers
from mlactl.util.errors import MlactlError
from mlactl.util.io import read_text

CSV_REQUIRED = ("op", "batch", "new", "prefix", "time_s")
MAX_TIME_S = 3600.0  # one op measured for an hour is not a kernel time
MAX_HEADS = 1 << 16
KERNEL_OPS = {"mla_decode": "absorb_attention", "mla_prefill": "expand_attention"}


def home_path(cost: CostModel, op: str) -> tuple[str, str]:
    """(path, op name) op class `op` is read from by default on `cost`'s model: the first of its
    paths that runs it, those that chunk the prefix (an lse merge) last (expand's kv_expand, not
    expand_chunked's, which reads the weights once per chunk)."""
    for path in sorted(cost.paths, key=lambda q: "lse_merge" in OPS[q]):
        for name in OPS[path]:
            if op_class(path, name) == op:
                return path, name
    have = sorted({op_class(q, o) for q in cost.paths for o in OPS[q]})
    raise MlactlError(f"op {op!r} is not one of {cost.cfg.name}'s op classes: {', '.join(have)}")


def points_for(cost: CostModel, op: str, batch, new, prefix, time_s, group=None, path: str | None = None) -> Points:
    """cost.py's figures for op class `op` at the given shapes (arrays), as `path` runs it (the
    class's own path by default; expand_chunked's kv_expand reads the weights once per chunk)."""
    b, n, p = (np.asarray(a, dtype=np.float64) for a in (batch, new, prefix))
    H, cfg = float(cost.cfg.H), cost.cfg
    attn = None
    if op.startswith("path:"):
        ops = cost.ops(op.split(":", 1)[1], b, n, p)
        flops, nbytes = sum(o.flops for o in ops), sum(o.bytes for o in ops)
        out_dim, cache = cfg.dV, cost.kv_cache_bytes(b, n, p)
        attn = [(o.flops, o.bytes) for o in ops if o.name == "attention"][0]
    else:
        default, name = home_path(cost, op)
        found = [o for o in cost.ops(path or default, b, n, p) if o.name == name][0]
        flops, nbytes = found.flops, found.bytes
        out_dim = {"kv_expand": cfg.dC + cfg.dV, "q_absorb": cfg.r, "absorb_attention": cfg.r}.get(op, cfg.dV)
        if op == "absorb_attention":
            cache = cost.kv_cache_bytes(b, n, p)
        elif op in ("expand_attention", "masked_attention"):  # per-head K and V, as an MHA cache holds them
            cache = cost.mha_cache_bytes(b, n, p)
        elif op == "sparse_attention":  # the selected rows each query reads
            out_dim = cfg.r
            cache = sparse_pairs(n, p, cfg.index().topk) * b * cost.latent_row_bytes()
        elif op == "indexer":  # the index rows of the whole context
            cache = b * (n + p) * cost.index_row_bytes()
        elif op == "indexer_proj":
            d = cfg.index()
            out_dim = d.heads * d.dim + d.dim + d.heads
        elif op == "indexer_key":
            out_dim = cfg.index().dim
        if op not in ("absorb_attention", "expand_attention", "masked_attention", "sparse_attention", "indexer"):
            cache = np.zeros_like(b * n)
    shape = np.broadcast_shapes(np.shape(b), np.shape(n), np.shape(p))
    keys = n + p
    if op == "sparse_attention":  # the keys a query's kernel walks: its selected ones, on average
        keys = sparse_pairs(n, p, cfg.index().topk) / np.maximum(n, 1.0)
    full = [np.broadcast_to(np.asarray(a, dtype=np.float64), shape).copy() for a in (flops, nbytes, b, n, keys)]
    parts = {}
    if attn is not None:
        parts = {
            k: np.broadcast_to(np.asarray(v, dtype=np.float64), shape).copy()
            for k, v in zip(("attn_flops", "attn_bytes"), attn)
        }
    # the top-k slots each query walks, the keys it selects from (a sparse attention's, a top-k's)
    sparse = op in ("sparse_attention", "topk")
    slots = np.full(shape, float(cfg.index().topk)) if sparse else None
    pool = np.broadcast_to(n + p, shape).astype(np.float64) if sparse else None
    flops_a, bytes_a, batch_a, new_a, context_a = full
    return Points(
        op,
        flops=flops_a,
        bytes=bytes_a,
        batch=batch_a,
        new=new_a,
        context=context_a,
        heads=np.full(shape, H),
        out_dim=np.full(shape, float(out_dim)),
        cache_bytes=np.broadcast_to(cache, shape).astype(np.float64),
        time_s=None if time_s is None else np.asarray(time_s, dtype=np.float64),
        group=group,
        slots=slots,
        pool=pool,
        index_heads=np.full(shape, float(cfg.index().heads)) if op == "indexer" else None,
        **parts,
    )


def _concat(parts: list[Points]) -> Points:
    fields: tuple[str, ...] = ("flops", "bytes", "batch", "new", "context", "heads", "out_dim", "cache_bytes", "time_s")
    if all(p.attn_flops is not None for p in parts):
        fields += ("attn_flops", "attn_bytes")
    if all(p.slots is not None for p in parts):
        fields += ("slots", "pool")
    if all(p.index_heads is not None for p in parts):
        fields += ("index_heads",)
    cat = {k: np.concatenate([getattr(p, k) for p in parts]) for k in fields}
    return Points(parts[0].op, **cat)


def results_points(data: dict, where: str) -> dict[tuple[str, str, str], Points]:
    """{(class, source, dtype): points} of one loaded results file."""
    cfg = MLAConfig(**{k: v for k, v in data["model"].items() if k in MLAConfig.__dataclass_fields__})
    cost = CostModel(cfg, kv_dtype=data.get("kv_dtype", "bf16"), dtype=data.get("dtype", "bf16"))
    source = f"mlactl-{data.get('backend', 'triton')}"
    out: dict[tuple[str, str, str], list[Points]] = {}
    rows = [r for r in data.get("paths", []) if r.get("status", "ok") == "ok" and r.get("median_s")]
    for path in ("expand", "expand_chunked", "absorb"):
        mine = [r for r in rows if r["path"] == path]
        if mine:
            pts = points_for(
                cost,
                f"path:{path}",
                [r["batch"] for r in mine],
                [r["new"] for r in mine],
                [r["prefix"] for r in mine],
                [r["median_s"] for r in mine],
            )
            out.setdefault((pts.op, source, cost.kv_dtype), []).append(pts)
    for entry in data.get("kernels", []):
        op = KERNEL_OPS.get(entry.get("kernel"))
        shape, t = entry.get("shape") or {}, entry.get("best_median_s")
        if op is None or not t or not all(k in shape for k in ("B", "S_q", "ctx")):
            continue
        new = shape["S_q"]
        pts = points_for(cost, op, [shape["B"]], [new], [shape["ctx"] - new], [t])
        out.setdefault((op, source, cost.kv_dtype), []).append(pts)
    if not out:
        raise MlactlError(f"{where} holds no path or kernel timings to calibrate from (run `mlactl tune paths`)")
    return {k: _concat(v) for k, v in out.items()}


def csv_points(path: str | Path, cfg: MLAConfig) -> dict[tuple[str, str, str], Points]:

    text = read_text(path, "CSV")
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in CSV_REQUIRED if c not in header]
    if missing:
        raise MlactlError(f"{path}: missing columns {', '.join(missing)} (need {','.join(CSV_REQUIRED)})")
    groups: dict[tuple[str, str, str, float], list[tuple[float, float, float, float]]] = {}
    for line, row in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        op = row["op"]
        if op not in OP_CLASSES + PATH_CLASSES:
            raise MlactlError(f"{path}: line {line}: unknown op {op!r}; ops: {', '.join(OP_CLASSES + PATH_CLASSES)}")
        # one bounded parser (mlactl.util.numbers): ASCII digits, no inf or nan, each in its range
        at = f"{path}: line {line}"
        b, n, p = (
            float(numbers.integer(row[k], f"{at}: {k}", lo)) for k, lo in (("batch", 1), ("new", 1), ("prefix", 0))
        )
        t = numbers.real(row["time_s"], f"{at}: time_s", 0.0, MAX_TIME_S, above=True)
        heads = float(numbers.integer(row["heads"], f"{at}: heads", 1, MAX_HEADS) if row.get("heads") else cfg.H)
        key = (op, row.get("source") or "csv", row.get("dtype") or "bf16", heads)
        groups.setdefault(key, []).append((b, n, p, t))
    if not groups:
        raise MlactlError(f"{path}: no rows after the header")
    out: dict[tuple[str, str, str], list[Points]] = {}
    for (op, source, dtype, heads), rows in groups.items():
        kv = dtype if dtype in ("bf16", "fp16", "fp8", "fp32") else "bf16"
        cost = CostModel(replace(cfg, H=int(heads)), kv_dtype=kv, dtype="bf16" if kv == "fp8" else kv)
        arr = np.asarray(rows)
        out.setdefault((op, source, dtype), []).append(points_for(cost, op, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]))
    return {k: _concat(v) for k, v in out.items()}
