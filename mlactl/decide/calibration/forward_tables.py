"""The forward's ops outside attention, timed from aiconfigurator-core's measured tables.

Replay's clock prices each op of cost.ForwardCost at its roofline. Where aiconfigurator-core's
tables measured the same op on the same GPU, this module times it from them instead
(`mlactl replay --forward-tables SYSTEM/FRAMEWORK[/VERSION]`):

  the linear ops      gemm/<framework>/<version>/gemm_perf.parquet: the op's GEMMs
                      (ForwardCost.gemms: rows x k -> n per GPU, its weights' dtype), each at the
                      table's kernel for that dtype (fp8 weights: the fp8_block rows, else fp8;
                      bf16: bfloat16; vLLM's fp8_block rows, timed outside a CUDA graph, are
                      passed over: see aiconfigurator.EAGER). The table is a grid of n and k:
                      an (n, k) between grid values is interpolated linearly in n and in k
                      from the four around it, each a curve in m. An MLP adds SiLU*up between
                      its two GEMMs at the bandwidth (it reads 2 width and writes width a row).
  the routed experts  moe/<framework>/<version>/moe_perf.parquet: the rows of this model's
                      experts (hidden, inter_size, top-k, experts) at moe_tp_size = TP,
                      moe_ep_size 1, balanced routing, the weights' dtype; a curve in the
                      step's tokens.
  the all-reduces     comm/<framework>/<version>/custom_allreduce_perf.parquet at num_gpus = TP,
                      bf16, message_size the elements reduced (tokens x hidden, as
                      aiconfigurator-core 0.12 sdk/models/llama.py builds its CustomAllReduce
                      from the hidden size); a step where every token samples (decodes only)
                      takes the CUDA-graph rows, as the engines replay decode batches in CUDA
                      graphs, any other the eager rows.

A curve is piecewise linear between measured points; below the first it is the first (a
launch costs at least that), past the last it grows in proportion to its variable (a GEMM, a
MoE or a collective that large is throughput-bound). What no table measured (the logits'
gather; a shape outside the grid; a TP the collective was not measured at) stays at the
roofline, and `basis` says which, op by op.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlactl.decide.calibration import aiconfigurator as ac
from mlactl.decide.calibration.run import SYSTEM_PROFILES
from mlactl.model.cost import DTYPE_BYTES, ForwardCost
from mlactl.model.hardware import HardwareProfile
from mlactl.util.errors import MlactlError

MS = 1e-3
# the table's gemm_dtype rows for a weight dtype, in order of preference
GEMM_DTYPES = {"fp8": ("fp8_block", "fp8"), "bf16": ("bfloat16",), "fp16": ("float16", "bfloat16")}
MOE_DTYPES = {"fp8": ("fp8_block", "fp8"), "bf16": ("bfloat16",), "fp16": ("float16", "bfloat16")}
GEMM_COLUMNS = ("kernel_source", "gemm_dtype", "m", "n", "k", "latency")
MOE_COLUMNS = (
    "kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
    "moe_tp_size", "moe_ep_size", "distribution", "latency",
)  # fmt: skip
COMM_COLUMNS = ("kernel_source", "allreduce_dtype", "num_gpus", "message_size", "latency")


@dataclass(frozen=True)
class Curve:
    """Seconds at measured points `x` (ascending): linear between them, the first below them,
    in proportion to x past the last."""

    x: np.ndarray
    seconds: np.ndarray

    def at(self, v: float) -> float:
        x, y = self.x, self.seconds
        if v >= x[-1]:
            return float(y[-1] * v / x[-1])
        return float(np.interp(v, x, y))


@dataclass(frozen=True)
class Measured:
    """One op's time for one run of it, from the tables: its curves, each over "tokens",
    "sampled" or "message" (tokens x hidden), summed; `bytes_per_row` more per token at the
    bandwidth (an MLP's SiLU*up); for the all-reduce a second set (`graph`) for decode steps."""

    parts: tuple[tuple[str, Curve], ...]
    basis: str
    bytes_per_row: float = 0.0
    graph: tuple[tuple[str, Curve], ...] = ()


class ForwardTables:
    """The measured ops of one forward (`ops`) and, for every op of ForwardCost, where its
    time comes from (`basis`)."""

    def __init__(self, source: str, ops: dict[str, Measured], basis: dict[str, str], hidden: int, bandwidth: float):
        self.source, self.ops, self.basis = source, ops, basis
        self.hidden, self.bandwidth = hidden, bandwidth

    def seconds(self, name: str, tokens: float, sampled: float) -> float | None:
        """One run of op `name` in a step of `tokens` tokens of which `sampled` sample; None
        where the tables did not measure it."""
        m = self.ops.get(name)
        if m is None:
            return None
        parts = m.graph if m.graph and tokens == sampled else m.parts
        at = {"tokens": tokens, "sampled": sampled, "message": tokens * self.hidden}
        t = 0.0
        for var, curve in parts:
            v = at[var]
            if v > 0:
                t += curve.at(v)
        return t + m.bytes_per_row * tokens / self.bandwidth


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """SYSTEM/FRAMEWORK[/VERSION] -> its parts; anything else is one error line."""
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise MlactlError(f"--forward-tables {spec!r}: expected SYSTEM/FRAMEWORK[/VERSION], e.g. h200_sxm/sglang")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _folder(data_dir: Path, system: str, kind: str, framework: str, version: str | None) -> tuple[str, Path] | None:
    base = data_dir / system / kind / framework
    have = sorted((p.name for p in base.iterdir() if p.is_dir()), key=ac._version_key) if base.is_dir() else []
    if not have:
        return None
    v = version if version is not None else have[-1]
    return (v, base / v) if v in have else None


def _curve(x, seconds) -> Curve:
    order = np.argsort(np.asarray(x, dtype=np.float64), kind="stable")
    xs = np.asarray(x, dtype=np.float64)[order]
    ys = np.asarray(seconds, dtype=np.float64)[order]
    keep = np.concatenate([np.diff(xs) > 0, [True]])  # a repeated x: its last row
    return Curve(xs[keep], ys[keep])


def _bracket(values: np.ndarray, v: float) -> tuple[float, float] | None:
    """The grid values either side of v (the same one twice where v is on the grid)."""
    if v < values[0] or v > values[-1]:
        return None
    hi = int(np.searchsorted(values, v))
    if values[hi] == v:
        return float(v), float(v)
    return float(values[hi - 1]), float(values[hi])


def gemm_curve(frame, k: int, n: int) -> tuple[Curve, str] | None:
    """The curve in m of a k -> n GEMM from one kernel's rows, interpolated linearly in n between
    the measured n around it and, at each of those, in k between the k measured there; None when
    (n, k) lies outside what was measured."""
    bn = _bracket(np.unique(frame["n"].to_numpy(dtype=np.float64)), n)
    if bn is None:
        return None
    corners = []
    spans = []
    for nv in dict.fromkeys(bn):
        at_n = frame[frame["n"] == nv]
        bk = _bracket(np.unique(at_n["k"].to_numpy(dtype=np.float64)), k)
        if bk is None:
            return None
        wn = 1.0 if bn[0] == bn[1] else (n - bn[0]) / (bn[1] - bn[0])
        wn = wn if nv == bn[1] else 1.0 - wn
        for kv in dict.fromkeys(bk):
            rows = at_n[at_n["k"] == kv]
            wk = 1.0 if bk[0] == bk[1] else (k - bk[0]) / (bk[1] - bk[0])
            wk = wk if kv == bk[1] else 1.0 - wk
            corners.append((wn * wk, _curve(rows["m"].to_numpy(), rows["latency"].to_numpy() * MS)))
        spans.append(bk)
    ms = np.unique(np.concatenate([c.x for _, c in corners]))
    seconds = np.array([sum(w * c.at(m) for w, c in corners) for m in ms])
    exact = bn[0] == bn[1] and all(b[0] == b[1] for b in spans)
    if exact:
        how = "measured"
    else:
        ks = sorted({v for b in spans for v in b})
        how = f"interpolated from n {bn[0]:g}-{bn[1]:g}, k {ks[0]:g}-{ks[-1]:g}"
    return Curve(ms, seconds), how


def _gemm(frame, dtype: str, k: int, n: int, framework: str) -> tuple[str, tuple[Curve, str]] | None:
    """The first kernel (by the dtype's preference, then by name) whose grid covers k -> n; rows
    timed outside a CUDA graph (aiconfigurator.eager) are passed over."""
    for gdt in GEMM_DTYPES.get(dtype, (dtype,)):
        if ac.eager(framework, "gemm", gdt):
            continue
        rows = frame[frame["gemm_dtype"] == gdt]
        for kernel in sorted(rows["kernel_source"].unique()):
            got = gemm_curve(rows[rows["kernel_source"] == kernel], k, n)
            if got is not None:
                return str(kernel), got
    return None


def _pick(frame, column: str, prefer: tuple[str, ...]):
    """The rows of the first preferred value of `column` present, and the value (or None)."""
    for value in prefer:
        rows = frame[frame[column] == value]
        if len(rows):
            return rows, value
    return frame.iloc[:0], None


def _one_kernel(rows):
    """One kernel's rows: the first kernel_source in order where several measured the same."""
    kernels = sorted(rows["kernel_source"].unique())
    return rows[rows["kernel_source"] == kernels[0]], kernels[0]


def load(fc: ForwardCost, hw: HardwareProfile, spec: str, data_dir: str | Path | None = None) -> ForwardTables:
    """The tables of SYSTEM/FRAMEWORK[/VERSION] (`spec`; the newest version by default) for
    the forward of `fc` on `hw`. The system must be `hw`'s GPU: a clock from another GPU's
    measurements is not this one's."""
    system, framework, version = parse_spec(spec)
    root = ac.default_data_dir() if data_dir is None else Path(data_dir)
    if not (root / system).is_dir():
        have = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise MlactlError(f"--forward-tables: unknown system {system!r} in {root}; available: {', '.join(have)}")
    profile = SYSTEM_PROFILES.get(system)
    if profile is not None and profile != hw.name:
        raise MlactlError(
            f"--forward-tables {spec}: measured on {profile}, but the replay runs on {hw.name}: give the "
            f"tables of {hw.name}'s system"
        )
    gemm = _folder(root, system, "gemm", framework, version)
    if gemm is None:
        raise MlactlError(
            f"--forward-tables {spec}: no gemm tables for {framework}"
            f"{'' if version is None else ' ' + version} under {root / system / 'gemm'}"
        )
    version = gemm[0]
    source = f"aiconfigurator-core {system}/{framework} {version}"
    w, cfg = fc.weights, fc.cfg
    ops: dict[str, Measured] = {}
    basis: dict[str, str] = {}

    frame = ac.read_table(gemm[1] / "gemm_perf.parquet", "gemm", GEMM_COLUMNS)
    act = DTYPE_BYTES[fc.act_dtype]
    for name, gemms in fc.gemms().items():
        parts, hows, why = [], [], ""
        for rows_var, k, n, dtype in gemms:
            found = _gemm(frame, dtype, k, n, framework)
            if found is None:
                why = f"no {dtype} GEMM kernel measured k {k} -> n {n} (or a grid around it)"
                break
            kernel, (curve, how) = found
            parts.append((rows_var, curve))
            hows.append(f"{kernel} {k}->{n} {how}")
        passed = sorted(
            {
                g
                for _, _, _, dt in gemms
                for g in GEMM_DTYPES.get(dt, (dt,))
                if ac.eager(framework, "gemm", g) and (frame["gemm_dtype"] == g).any()
            }
        )
        notes = [f"{framework}'s {g} rows passed over (timed outside a CUDA graph)" for g in passed]
        if why:
            basis[name] = "; ".join([f"roofline: {why}", *notes])
            continue
        hows += notes
        silu = 3.0 * gemms[1][1] * act if len(gemms) == 2 else 0.0  # an MLP: SiLU*up over `width`
        ops[name] = Measured(tuple(parts), f"{source} gemm: " + "; ".join(hows), silu)
        basis[name] = ops[name].basis + (" + SiLU*up at the bandwidth" if silu else "")

    if w.moe_layers:
        moe = _folder(root, system, "moe", framework, version)
        if moe is None:
            basis["routed_experts"] = f"roofline: no moe table for {framework} {version}"
        else:
            mf = ac.read_table(moe[1] / "moe_perf.parquet", "moe", MOE_COLUMNS)
            sel = mf[
                (mf["hidden_size"] == w.hidden)
                & (mf["inter_size"] == w.moe_intermediate)
                & (mf["topk"] == w.top_k)
                & (mf["num_experts"] == w.experts)
                & (mf["moe_tp_size"] == cfg.tp)
                & (mf["moe_ep_size"] == 1)
                & (mf["distribution"] == "balanced")
            ]
            sel, mdt = _pick(sel, "moe_dtype", MOE_DTYPES.get(w.dtype, (w.dtype,)))
            if mdt is None:
                basis["routed_experts"] = (
                    f"roofline: no {w.dtype} rows of {w.experts} experts x {w.moe_intermediate} (top {w.top_k}) "
                    f"at moe_tp_size {cfg.tp}"
                )
            else:
                sel, kernel = _one_kernel(sel)
                curve = _curve(sel["num_tokens"].to_numpy(), sel["latency"].to_numpy() * MS)
                ops["routed_experts"] = Measured(
                    (("tokens", curve),), f"{source} moe: {kernel} {mdt}, tp {cfg.tp}, balanced"
                )
                basis["routed_experts"] = ops["routed_experts"].basis

    if cfg.tp == 1:
        basis["all_reduce"] = "none at tp 1"
    else:
        comm = _folder(root, system, "comm", framework, version)
        path = None if comm is None else comm[1] / "custom_allreduce_perf.parquet"
        if path is None or not path.is_file():
            basis["all_reduce"] = f"roofline: no custom_allreduce table for {framework} {version}"
        else:
            cf = ac.read_table(path, "custom_allreduce", COMM_COLUMNS)
            sel = cf[(cf["num_gpus"] == cfg.tp) & (cf["allreduce_dtype"] == "bfloat16")]
            if not len(sel):
                basis["all_reduce"] = f"roofline: not measured at {cfg.tp} GPUs"
            else:
                kernels = sorted(sel["kernel_source"].unique())
                graph = [k for k in kernels if "graph" in k.lower()]
                eager = [k for k in kernels if "graph" not in k.lower()] or graph

                def curve_of(kernel: str) -> Curve:
                    rows = sel[sel["kernel_source"] == kernel]
                    return _curve(rows["message_size"].to_numpy(), rows["latency"].to_numpy() * MS)

                ops["all_reduce"] = Measured(
                    (("message", curve_of(eager[0])),),
                    f"{source} custom_allreduce: {eager[0]}" + (f", decode steps {graph[0]}" if graph else ""),
                    graph=(("message", curve_of(graph[0])),) if graph else (),
                )
                basis["all_reduce"] = ops["all_reduce"].basis
    for op in fc.ops(1.0, 1.0):
        basis.setdefault(op.name, "roofline: no table measures it")
    return ForwardTables(source, ops, basis, w.hidden, hw.bandwidth)
