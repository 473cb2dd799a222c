"""aiconfigurator's measured kernel tables as calibration points.

NVIDIA's aiconfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships the latencies
its collectors measured in the `aiconfigurator-core` package (0.12) as

    systems/data/<system>/{mla,mla_bmm,gemm}/<framework>/<version>/*.parquet

What each table times, read from the collector code (ai-dynamo/aiconfigurator, collector/,
files at the commits named; docs/calibration.md has the whole mapping):

context_mla_perf     sglang/collect_mla.py (046f0d64): isl new tokens, prefix 0, causal. On
                     Hopper the FA3 backend runs the ABSORB kernel (head dim 576 = r + dR,
                     value 512 = r, one KV head); on Blackwell (kernel_source trtllm_mla) it is
                     EXPAND (192 / 128). trtllm/collect_mla.py (070f5afd): EXPAND (head dim
                     dC + dR = 192, value dV = 128, per-head K/V).
generation_mla_perf  both: ABSORB, one new token after `step` cached ones (context step + 1).
                     `num_heads` is the heads on one GPU (num_heads // tp_size).
mla_bmm_perf         sglang/collect_mla_bmm.py (32b65071): mla_gen_pre = q_absorb
                     (tokens x heads x dC -> r), mla_gen_post = out_absorb (r -> dV).
gemm_perf            generic GEMMs m x n x k; the rows with k = r = 512 and n = H * (dC + dV)
                     are kv_expand for H heads (m = tokens).
*_module_perf, wideep_*  the whole MLA module (projections, norms, RoPE) or DeepEP's layout:
                     not one op of cost.py, so not fitted here.

DeepSeek Sparse Attention (DSA) has its own folder, sparse_attention/<framework>/<version>/.
Its kernel-level tables time one op each, at GLM-5's dims (GlmMoeDsaForCausalLM in
aiconfigurator_core 0.12 sdk/operations/dsa.py DSA_MODEL_DIMS: 64 heads, 32 index heads of
128, top-2048), read from collector/sglang/glm5_dsa_sparse_modules.py (ai-dynamo/aiconfigurator
@1f8d4701): `isl` new tokens per request after `step` cached, `batch_size` requests.

glm5_mqa_logits   indexer: deep_gemm.fp8_mqa_logits, token i of a request scores the
                  step + i keys before it (causal), 32 index heads of 128
glm5_topk         topk: SGLang's fused top-2048 over those logits; two score mixes are timed,
                  `flat` (all ties, the worst case) and `top_last` (clear winners): top_last is
                  read. A context of at most 2048 has nothing to select: latency 0, dropped
glm5_dsa_attn     sparse_attention: flash_mla_sparse_fwd, EVERY query of a request reads
                  min(2048, step + isl) rows (not the causal min(step + i, 2048)) of a bf16
                  cache; 64 heads (rates at 128 would pass the GPU's bf16 peak). The kernel
                  walks all 2048 index slots whatever the rows (on Hopper the time does not
                  change with them): the points carry the slots and the request's n + p rows
                  for the `slots` and `reuse` terms

dsa_{context,generation}_module (DeepSeek-V3.2 and GLM-5, every framework) time the whole DSA
attention module -- the q/kv down-projections, o_proj and norms beside the indexer and the
attention -- so, like the MLA module tables, they are not fitted; dsv4_* are DeepSeek-V4's
(compressed keys), another model.

Latencies in the tables are milliseconds.

One table's rows are not kernel times: vLLM's fp8_block GEMMs are timed outside a CUDA graph
(collector/vllm/collect_gemm.py:247 at 095f58a5, `use_cuda_graph=gemm_type != "fp8_block"`,
since 4bed48d9), so each call carries the host's launch path: DeepGEMM's shortest kv_expand
row is 79 us on an H200 and 155 us on a B200, against 2.5-5.6 us for the same GEMM in bf16 or
per-tensor fp8 timed in a graph, and its rows stay near that up to m = 512. The engines run
these GEMMs inside CUDA graphs. EAGER names such tables, `eager` says why, and neither
calibration nor the forward tables use their rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlactl.decide.calibration.model import Points
from mlactl.decide.calibration.sources import _concat, points_for
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.util.errors import MlactlError

TABLES = {  # folder/file stem -> what it holds; only these are read
    "mla/context_mla_perf": "attention, context (prefill)",
    "mla/generation_mla_perf": "attention, generation (decode)",
    "mla_bmm/mla_bmm_perf": "q_absorb and out_absorb",
    "gemm/gemm_perf": "kv_expand (k = 512 GEMMs)",
}
# DSA's kernel-level tables (read where a system has them; see the module docstring)
DSA_TABLES = {
    "sparse_attention/glm5_mqa_logits_module_perf": "indexer (GLM-5 dims)",
    "sparse_attention/glm5_topk_module_perf": "topk (GLM-5 dims)",
    "sparse_attention/glm5_dsa_attn_module_perf": "sparse_attention (GLM-5 dims)",
}
DSA_OPS = {"glm5_mqa_logits_module_perf": "indexer", "glm5_topk_module_perf": "topk"}
DSA_ROWS = 500  # rows of a DSA table fitted (_sparse_points)
# GLM-5's dims (aiconfigurator_core sdk/operations/dsa.py DSA_MODEL_DIMS["GlmMoeDsaForCausalLM"]);
# H comes from each row
GLM5 = dict(
    hidden=6144, q_lora_rank=2048, r=512, dC=192, dR=64, dV=256, layers=1, topk=2048, index_heads=32, index_dim=128
)
COLUMNS = {
    "mla": ("kernel_source", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "latency"),
    "sparse_attention": ("kernel_source", "num_heads", "batch_size", "isl", "step", "latency"),
    "mla_bmm": ("op_name", "kernel_source", "bmm_dtype", "num_tokens", "num_heads", "latency"),
    "gemm": ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"),
}
KV_DTYPES = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}
# DeepSeek-V3's MLA dims, which every collector above uses; H varies per row
DSV3 = dict(hidden=7168, q_lora_rank=1536, r=512, dC=128, dR=64, dV=128, layers=1)
EXPAND_KERNELS = ("trtllm_mla",)  # sglang's Blackwell context kernel (expand); see above
MS = 1e-3
# (framework, table folder, dtype) whose collector times each call outside a CUDA graph, and
# the line of the collector that says so
EAGER = {("vllm", "gemm", "fp8_block"): "collector/vllm/collect_gemm.py:247 at 095f58a5"}
# a fit's source ends in its phase, so the time function picks decode's fit for one new token
PHASES = {"context_mla_perf": ":prefill", "generation_mla_perf": ":decode"}


def eager(framework: str, folder: str, dtype: str) -> str | None:
    """Why a table's rows of `dtype` are not kernel times (timed outside a CUDA graph), or None."""
    where = EAGER.get((framework, folder, dtype))
    if where is None:
        return None
    return f"timed outside a CUDA graph (ai-dynamo/aiconfigurator {where}): the host's launch path, not the kernel"


def default_data_dir() -> Path:
    try:
        import aiconfigurator_core
    except ImportError:
        raise MlactlError(
            "aiconfigurator-core is not installed: `pip install 'mlactl[calibrate]'`, or pass --data-dir DIR "
            "(a folder laid out as <system>/{mla,mla_bmm,gemm}/<framework>/<version>/*.parquet)"
        ) from None
    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def _children(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


@dataclass(frozen=True)
class Table:
    system: str
    framework: str
    version: str
    name: str  # e.g. "mla/generation_mla_perf"
    path: Path


def find_tables(data_dir: Path, system: str, framework: str, version: str | None = None) -> list[Table]:
    """The tables this module reads for one system and framework (newest version of each folder
    unless `version` is given). Unknown system/framework/version: an error listing what exists."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise MlactlError(f"--data-dir {data_dir}: no such folder")
    systems = [s for s in _children(data_dir) if any((data_dir / s / k).is_dir() for k in COLUMNS)]
    if not systems:
        raise MlactlError(
            f"{data_dir} holds no aiconfigurator tables (expected <system>/{{mla,mla_bmm,gemm}}/<framework>/"
            "<version>/*.parquet)"
        )
    if system not in systems:
        raise MlactlError(f"unknown system {system!r} in {data_dir}; available: {', '.join(systems)}")
    frameworks = sorted({f for k in COLUMNS for f in _children(data_dir / system / k)})
    if framework not in frameworks:
        raise MlactlError(f"unknown framework {framework!r} for {system}; available: {', '.join(frameworks)}")
    versions = sorted({v for k in COLUMNS for v in _children(data_dir / system / k / framework)})
    if version is not None and version not in versions:
        raise MlactlError(f"unknown version {version!r} of {framework} for {system}; available: {', '.join(versions)}")
    found = []
    for name in (*TABLES, *DSA_TABLES):
        folder, stem = name.split("/")
        have = _children(data_dir / system / folder / framework)
        pick = [version] if version is not None else sorted(have, key=_version_key)[-1:]
        for v in pick:
            path = data_dir / system / folder / framework / v / f"{stem}.parquet"
            if path.is_file():
                found.append(Table(system, framework, v, name, path))
    if not found:
        raise MlactlError(
            f"no MLA tables for {system}/{framework}{'' if version is None else ' ' + version} in {data_dir} "
            f"(looked for {', '.join(n + '.parquet' for n in TABLES)})"
        )
    return found


def _version_key(v: str):

    return [int(x) if x.isdigit() else -1 for x in re.split(r"[.a-z]+", v) if x] + [v]


def read_table(path: Path, kind: str, columns: tuple[str, ...] | None = None):
    """A parquet table as a frame, checked for the columns a `kind` of table needs (COLUMNS[kind],
    or `columns`)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MlactlError("reading aiconfigurator tables needs pyarrow: `pip install 'mlactl[calibrate]'`") from None
    try:
        frame = pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise MlactlError(f"{path}: not a readable parquet table ({exc})") from None
    need = COLUMNS[kind] if columns is None else columns
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise MlactlError(f"{path}: missing columns {', '.join(missing)} (a {kind} table needs {', '.join(need)})")
    if len(frame) == 0:
        raise MlactlError(f"{path}: the table has no rows")
    return frame


def _cost(heads: int, kv_dtype: str = "bf16") -> CostModel:
    cfg = MLAConfig("aiconfigurator-dsv3", H=int(heads), **DSV3)
    return CostModel(cfg, kv_dtype=kv_dtype, dtype="bf16")


def _op_points(op_name: str, frame, batch, new, prefix, kv_dtype) -> Points:
    """cost.py's op at each row (sources.points_for, on the op's own path); heads differ per row,
    so cost is evaluated per head count."""
    heads = frame["num_heads"].to_numpy(np.float64)
    t = frame["latency"].to_numpy(np.float64) * MS
    groups = [np.flatnonzero(heads == h) for h in np.unique(heads)]
    parts = [points_for(_cost(int(heads[g[0]]), kv_dtype), op_name, batch[g], new[g], prefix[g], t[g]) for g in groups]
    return _concat(parts).take(np.argsort(np.concatenate(groups), kind="stable"))


def table_points(table: Table) -> dict[tuple[str, str, str], Points]:
    """{(op class, kernel source, dtype): points} of one table."""
    folder = table.name.split("/")[0]
    frame = read_table(table.path, folder)
    frame = frame[np.isfinite(frame["latency"].to_numpy(np.float64)) & (frame["latency"] > 0)]
    out: dict[tuple[str, str, str], Points] = {}
    if folder == "mla":
        context = table.name.endswith("context_mla_perf")
        for (src, kvd), sub in frame.groupby(["kernel_source", "kv_cache_dtype"]):
            kv = KV_DTYPES.get(str(kvd))
            if kv is None:
                continue
            b = sub["batch_size"].to_numpy(np.float64)
            if context:  # isl new tokens, nothing cached
                n, p = sub["isl"].to_numpy(np.float64), np.zeros(len(sub))
            else:  # one new token after `step` cached ones
                n, p = np.ones(len(sub)), sub["step"].to_numpy(np.float64)
            expand = context and (table.framework == "trtllm" or str(src) in EXPAND_KERNELS)
            pts = _op_points("expand_attention" if expand else "absorb_attention", sub, b, n, p, kv)
            out[(pts.op, str(src), kv)] = pts
    elif folder == "mla_bmm":
        names = {"mla_gen_pre": "q_absorb", "mla_gen_post": "out_absorb"}
        for (name, src, dt), sub in frame.groupby(["op_name", "kernel_source", "bmm_dtype"]):
            if name not in names:
                continue
            op = names[name]
            # the weights are bf16 in cost.py's count; fp8 tables get their own parameters
            tokens = sub["num_tokens"].to_numpy(np.float64)
            pts = _op_points(op, sub, tokens, np.ones(len(sub)), np.zeros(len(sub)), "bf16")
            out[(op, str(src), KV_DTYPES.get(str(dt), str(dt)))] = pts
    elif folder == "sparse_attention":
        out.update(_sparse_points(table, frame))
    elif folder == "gemm":
        per_head = DSV3["dC"] + DSV3["dV"]
        frame = frame[(frame["k"] == DSV3["r"]) & (frame["n"] % per_head == 0)]
        frame = frame.assign(num_heads=frame["n"] // per_head)
        for (src, dt), sub in frame.groupby(["kernel_source", "gemm_dtype"]):
            m = sub["m"].to_numpy(np.float64)
            pts = _op_points("kv_expand", sub, np.ones(len(sub)), m, np.zeros(len(sub)), "bf16")
            out[("kv_expand", str(src), KV_DTYPES.get(str(dt), str(dt)))] = pts
    return out


def _sparse_points(table: Table, frame) -> dict[tuple[str, str, str], Points]:
    """A DSA kernel-level table (GLM-5 dims) as the points of its op class: at most DSA_ROWS rows
    of it, a fixed random sample. The tables hold 1,800-3,600 rows of a dozen batch sizes and
    context lengths each; selecting the sparse attention's terms over all 3,025 rows of H100's
    took 938 s on the project's shared 2-core machine (benchmarks/results/calibrate-dsa.json has
    the figures at DSA_ROWS)."""
    stem = table.name.split("/")[1]
    if "score_mode" in frame.columns:  # top-k: the representative score mix (module docstring)
        frame = frame[frame["score_mode"] == "top_last"]
    if len(frame) > DSA_ROWS:
        frame = frame.sample(DSA_ROWS, random_state=0)
    out: dict[tuple[str, str, str], Points] = {}
    for (src, heads), sub in frame.groupby(["kernel_source", "num_heads"]):
        cost = CostModel(MLAConfig("aiconfigurator-glm5", H=int(heads), **GLM5))
        b, n, p = (sub[c].to_numpy(np.float64) for c in ("batch_size", "isl", "step"))
        t = sub["latency"].to_numpy(np.float64) * MS
        if stem in DSA_OPS:
            op = DSA_OPS[stem]
            out[(op, str(src), "fp8" if op == "indexer" else "fp32")] = points_for(cost, op, b, n, p, t)
            continue
        # the collector's sparse attention: every query reads min(topk, context) rows
        keys = np.minimum(cost.cfg.index().topk, n + p)
        op_ = cost.sparse_attention(b * n, b * n * keys)
        out[("sparse_attention", str(src), "bf16")] = Points(
            "sparse_attention",
            np.asarray(op_.flops, dtype=np.float64),
            np.asarray(op_.bytes, dtype=np.float64),
            b,
            n,
            keys,
            np.full(len(sub), float(heads)),
            np.full(len(sub), float(cost.cfg.r)),
            b * n * keys * cost.latent_row_bytes(),
            time_s=t,
            slots=np.full(len(sub), float(cost.cfg.index().topk)),
            pool=n + p,
        )
    return out
