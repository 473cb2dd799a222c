"""The three measurements of `mlactl tune`: ceilings, kernel configs, and the two paths.

Everything measured goes into the run's ResultsStore as soon as it is measured; what the store
already holds is not measured again (resume). A time budget bounds each sweep: what it cuts is
listed in the returned `skipped`, never silently dropped.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import time
import warnings
from dataclasses import dataclass, field

from mlactl import __version__
from mlactl.tune import space as spaces
from mlactl.tune.timing import time_call

BACKENDS = ("triton", "torch", "interpret")
# Relative error a candidate may have against the twin, by (dtype, fp8 cache).
TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 3e-2, "fp8": 6e-2}
DEFAULT_PREFIXES = {"cuda": "0,4K,16K,32K", "cpu": "0,256,1K"}
DEFAULT_NEW = {"cuda": "1:4096:*2", "cpu": "1:256:*2"}
QUICK_PREFIXES = {"cuda": "0,8K", "cpu": "0,512"}
QUICK_NEW = {"cuda": "1:4096:*4", "cpu": "1:256:*4"}
REFINE_STEPS = 4  # bisection steps between the last new count absorb won and the first expand won
MEMORY_SHARE = 0.5  # a point whose inputs and intermediates need more of the free memory is skipped


@dataclass
class Context:
    """What every sweep needs: model, device, backend, dtypes, the store, a clock, a reporter."""

    cfg: object  # MLAConfig with H per GPU
    device: object  # torch.device
    backend: str
    kv_dtype: str
    dtype: str
    store: object  # ResultsStore
    hw: object | None  # HardwareProfile to predict with, if any
    warm: bool = False
    quick: bool = False
    deadline: float = math.inf
    progress: object = None  # rich Progress or None
    skipped: list[str] = field(default_factory=list)
    timing_budget_s: float = 0.1

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def time(self, fn, quick: bool = False):
        if quick:
            return time_call(fn, device=self.device, warm=self.warm, budget_s=0, warmup=1, min_repeats=3)
        return time_call(fn, device=self.device, warm=self.warm, budget_s=self.timing_budget_s)

    @contextlib.contextmanager
    def task(self, description: str, total: int):
        if self.progress is None:
            yield lambda: None
            return
        task = self.progress.add_task(description, total=total)
        try:
            yield lambda: self.progress.advance(task)
        finally:
            self.progress.update(task, completed=total)


def environment(device, backend: str) -> tuple[dict, dict, dict]:
    """(device, versions, timing) headers of a results file."""
    import torch

    from mlactl import hardware

    versions = {"python": platform.python_version(), "torch": torch.__version__, "mlactl": __version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        versions["cuda"] = torch.version.cuda
        info = {
            "name": name,
            "type": "cuda",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
        }
    else:
        name = "cpu"
        info = {"name": name, "type": "cpu", "processor": platform.processor() or platform.machine()}
    profile = hardware.detect(name) if device.type == "cuda" else None
    info["hardware"] = profile.name if profile else None
    timing = {"method": "cuda-events" if device.type == "cuda" else "wall-clock", "meaningful": backend != "interpret"}
    return info, versions, timing


def relative_error(out, ref) -> float:
    out, ref = out.float(), ref.float()
    if not bool(out.isfinite().all()):
        return math.inf
    denom = ref.norm().item()
    return (out - ref).norm().item() / (denom if denom > 0 else 1.0)


def _failure(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300]


def _smem_limit(device, hw) -> int | None:
    if device.type != "cuda":
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    found = getattr(props, "shared_memory_per_block_optin", 0)
    if found:
        return int(found)
    if hw is not None and hw.smem_per_sm_kib:
        return int(hw.smem_per_sm_kib * 1024) - 1024
    return spaces.HOPPER_SMEM


# -- kernels -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _heuristics_only():
    """Launchers skip tuned configs inside: config=None then means the launcher's heuristic."""
    import os

    from mlactl.kernels.configs import ENV_OFF

    old = os.environ.get(ENV_OFF)
    os.environ[ENV_OFF] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ[ENV_OFF]
        else:
            os.environ[ENV_OFF] = old


def _try_config(ctx: Context, spec, kwargs, config, reference, tol) -> dict:
    """Run one config (None: the launcher's own heuristic, tuned files ignored): check it
    against the reference, then time it. Never raises: a failure is recorded with its reason."""
    entry = {"config": config, "status": "ok", "reason": ""}
    start = time.monotonic()
    try:
        with _heuristics_only() if config is None else contextlib.nullcontext():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = spec.run(kwargs, config)
            if config is not None and any("exceed shared memory" in str(w.message) for w in caught):
                return dict(entry, status="failed", reason="out of shared memory (launcher stepped down)")
            err = relative_error(out, reference)
            entry["rel_error"] = err
            if not err <= tol:
                return dict(entry, status="wrong", reason=f"relative error {err:.3g} > {tol:g} against the twin")
            entry["compile_and_check_s"] = time.monotonic() - start
            entry.update(ctx.time(lambda: spec.run(kwargs, config)).to_dict())
    except Exception as exc:  # compile errors, OutOfResources, invalid configs: recorded, not fatal
        return dict(entry, status="failed", reason=_failure(exc))
    return entry


def tune_kernels(ctx: Context, names=None, configs_override=None, write_configs: bool = True) -> list[dict]:
    """Sweep every bucket of every kernel. Returns the kernel entries measured (or resumed)."""
    from mlactl.kernels import configs as tuned_configs
    from mlactl.tune.store import write_tuned_config

    names = list(names or spaces.KERNELS)
    smem = _smem_limit(ctx.device, ctx.hw)
    done = []
    for name in names:
        spec = spaces.KERNELS[name]
        cost = spaces.cost_model(ctx.cfg, name, ctx.kv_dtype, ctx.dtype)
        file_dtype = spec.dtype_name(ctx.kv_dtype, ctx.dtype)
        for shape in spec.buckets(ctx.cfg, ctx.quick, ctx.device.type):
            bucket = tuned_configs.bucket_key(**shape)
            if ctx.out_of_time():
                ctx.skipped.append(f"{name} {bucket}: time budget spent")
                continue
            entry = _tune_bucket(ctx, spec, shape, bucket, cost, smem, configs_override)
            if entry is None:
                continue
            done.append(entry)
            best = entry.get("best")
            if (
                write_configs
                and best is not None
                and ctx.backend != "torch"
                and entry.get("best_median_s", math.inf) <= (entry.get("default_median_s") or math.inf)
            ):
                write_tuned_config(
                    name,
                    ctx.store.data["device"]["name"],
                    file_dtype,
                    bucket,
                    best,
                    ctx.store.data["versions"].get("triton") or "",
                )
    return done


def _tune_bucket(ctx, spec, shape, bucket, cost, smem, configs_override):
    import torch

    op = spec.cost_op(cost, shape)
    entry = ctx.store.find("kernels", kernel=spec.name, bucket=bucket) or {
        "kernel": spec.name,
        "bucket": bucket,
        "shape": shape,
        "flops": float(op.flops),
        "bytes": float(op.bytes),
        "configs": [],
    }
    if ctx.hw is not None:
        from mlactl.roofline import op_time

        entry["predicted_s"] = float(op_time(op, ctx.hw.peak_flops(ctx.dtype), ctx.hw.bandwidth).time_s)
    try:
        kwargs = spec.make_inputs(ctx.cfg, shape, ctx.kv_dtype, ctx.dtype, ctx.device)
        reference = spec.twin(kwargs)
    except (RuntimeError, MemoryError, ValueError) as exc:
        ctx.skipped.append(f"{spec.name} {bucket}: inputs or twin failed: {_failure(exc)}")
        return None
    tol = TOLERANCE["fp8" if ctx.kv_dtype == "fp8" and spec.name == "mla_decode" else ctx.dtype]

    if "twin_median_s" not in entry:  # a reference only: a few repetitions are enough
        entry["twin_median_s"] = ctx.time(lambda: spec.twin(kwargs), quick=True).median_s
    if ctx.backend == "torch":  # the twins have no launch space: one measurement per bucket
        entry.update(best=None, best_median_s=entry["twin_median_s"])
        ctx.store.add("kernels", entry)
        return entry
    if "default_median_s" not in entry:
        default = _try_config(ctx, spec, kwargs, None, reference, tol)
        entry["default_median_s"] = default.get("median_s", math.inf) if default["status"] == "ok" else None
        entry["default_status"] = (
            default["status"] if default["status"] == "ok" else f"{default['status']}: {default['reason']}"
        )

    if configs_override is not None:
        candidates = list(configs_override)
    else:
        candidates = spec.space(ctx.cfg, shape, ctx.kv_dtype, ctx.dtype, smem)
        if ctx.quick:  # every 4th: still every tile height and keys per tile, fewer warps/stages
            candidates = candidates[::4]
        candidates = spaces.drop_by_compile(ctx, spec, shape, candidates, entry)  # spills, smem: no GPU time
    tried = {_key(c["config"]) for c in entry["configs"]}
    with ctx.task(f"{spec.name} {bucket}", len(candidates)) as advance:
        for config in candidates:
            if _key(config) not in tried:
                if ctx.out_of_time():
                    left = sum(_key(c) not in tried for c in candidates)
                    ctx.skipped.append(f"{spec.name} {bucket}: {left} configs (time budget)")
                    break
                entry["configs"].append(_try_config(ctx, spec, kwargs, config, reference, tol))
                tried.add(_key(config))
                _update_best(entry)
                ctx.store.add("kernels", entry)
            advance()
        if spec.name == "mla_decode" and configs_override is None and entry.get("best") and not ctx.out_of_time():
            page = kwargs["kv_cache"].shape[1]
            for splits in spaces.decode_split_space(shape, page):  # second stage: split-KV factor
                config = dict(entry["best"], num_splits=splits)
                if _key(config) not in tried:
                    entry["configs"].append(_try_config(ctx, spec, kwargs, config, reference, tol))
                    tried.add(_key(config))
                    _update_best(entry)
                    ctx.store.add("kernels", entry)
    _update_best(entry)
    ctx.store.add("kernels", entry)
    kwargs = reference = None  # free the bucket's tensors before emptying the cache
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def _key(config) -> str:
    from mlactl.tune.store import config_key

    return config_key(config)


def _update_best(entry: dict) -> None:
    ok = [c for c in entry["configs"] if c["status"] == "ok"]
    if ok:
        best = min(ok, key=lambda c: c["median_s"])
        entry["best"], entry["best_median_s"] = best["config"], best["median_s"]


# -- ceilings --------------------------------------------------------------------------------------


def tune_ceilings(ctx: Context, write_profile: bool = True) -> dict:
    """Measure the matmul and copy ceilings; keep them in the run and as a measured profile."""
    from mlactl.tune import ceilings

    found = ctx.store.data.get("ceilings")
    if found and found.get("peak_tflops"):
        return found  # resumed: already measured in this run
    with ctx.task("ceilings", 1) as advance:
        measured = ceilings.measure(ctx.device, quick=ctx.quick)
        advance()
    result = {
        "peak_tflops": measured["peak_tflops"],
        "bandwidth_tbs": measured["bandwidth_tbs"],
        "details": measured["details"],
    }
    if write_profile and ctx.backend != "interpret":
        path = ceilings.write_measured_profile(ctx.store.data["device"]["name"], measured)
        result["profile"] = str(path)
    ctx.store.set_ceilings(result)
    return result


# -- paths ---------------------------------------------------------------------------------------


def _free_bytes(device) -> int:
    import os

    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _needed_bytes(ctx: Context, cost, b: int, n: int, p: int) -> float:
    """Inputs plus the largest intermediate of either path, as the cost model sees them; for the
    torch twins also their fp32 score matrices [H, new, context] per request."""
    needed = float(cost.kv_cache_bytes(b, n, p)) + 2 * float(cost.peak_expanded_bytes("expand", b, n, p))
    if ctx.backend == "torch":
        needed += 4.0 * ctx.cfg.H * n * (n + p) * (1 if ctx.device.type == "cuda" else b)
    return needed


def _paths_at(prefix: int, chunk: int) -> tuple[str, ...]:
    # expand_chunked differs from expand only once the prefix spans more than one chunk
    return ("expand", "absorb", "expand_chunked") if prefix > chunk else ("expand", "absorb")


def _measure_point(ctx: Context, cost, b: int, n: int, p: int, chunk: int) -> dict[str, float]:
    """Median time of each path at one point (from the store when already measured)."""
    import torch

    from mlactl.kernels.attention import mla_attention
    from mlactl.roofline import path_time
    from mlactl.tune.inputs import paged_batch

    wanted = _paths_at(p, chunk)
    rows = {path: ctx.store.find("paths", batch=b, new=n, prefix=p, path=path) for path in wanted}
    if all(r is not None for r in rows.values()):
        return {path: r["median_s"] for path, r in rows.items() if r.get("status") == "ok"}
    if _needed_bytes(ctx, cost, b, n, p) > MEMORY_SHARE * _free_bytes(ctx.device):
        ctx.skipped.append(f"paths batch {b} new {n} prefix {p}: needs more memory than is free")
        return {}
    backend = "torch" if ctx.backend == "torch" else "triton"
    batch = paged_batch(
        ctx.cfg, b, n, p, ctx.kv_dtype, ctx.dtype, ctx.device, page=16 if ctx.device.type != "cuda" else 64
    )
    args = batch.attention_args()
    outputs, found = {}, {}
    for path in wanted:
        entry = {"batch": b, "new": n, "prefix": p, "path": path, "status": "ok", "reason": ""}
        ops = cost.ops(path, b, n, p)
        entry["flops"] = float(sum(o.flops for o in ops))
        entry["bytes"] = float(sum(o.bytes for o in ops))
        if ctx.hw is not None:
            entry["predicted_s"] = float(path_time(ops, ctx.hw, ctx.dtype).time_s)
        try:
            outputs[path] = mla_attention(**args, path=path, chunk=chunk, backend=backend)
            run = functools.partial(mla_attention, **args, path=path, chunk=chunk, backend=backend)
            entry.update(ctx.time(run).to_dict())
            found[path] = entry["median_s"]
        except Exception as exc:  # an out-of-memory or a kernel failure at one point is recorded
            entry.update(status="failed", reason=_failure(exc))
        rows[path] = entry
    # the paths compute one function: a path that disagrees must not set the policy
    if "expand" in outputs:
        for path, out in outputs.items():
            err = relative_error(out, outputs["expand"])
            rows[path]["agreement"] = err
            if not err <= TOLERANCE["fp8" if ctx.kv_dtype == "fp8" else ctx.dtype]:
                rows[path].update(status="wrong", reason=f"differs from expand by {err:.3g}")
                found.pop(path, None)
    for entry in rows.values():
        ctx.store.add("paths", entry)
    batch = args = outputs = None  # free the point's tensors before emptying the cache
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return found


def measured_crossover(times: dict[int, dict[str, float]]) -> int | None:
    """The smallest measured new count from which expand beats absorb at every larger measured
    count too (robust to one noisy point); None if it does not win at the largest."""
    crossover = None
    for n in sorted(times, reverse=True):
        t = times[n]
        if "expand" not in t or "absorb" not in t:
            continue
        if t["expand"] < t["absorb"]:
            crossover = n
        else:
            break
    return crossover


def tune_paths(ctx: Context, batches, news, prefixes, chunk: int, refine: bool = True) -> list[dict]:
    """Both paths end to end over new-token counts for each (batch, prefix); measured and
    predicted crossovers. Returns the crossover rows."""
    from mlactl.analysis import crossover_table
    from mlactl.cost import CostModel

    cost = CostModel(ctx.cfg, kv_dtype=ctx.kv_dtype, dtype=ctx.dtype, chunk=chunk)
    rows = []
    for b in batches:
        for p in prefixes:
            if ctx.out_of_time():
                ctx.skipped.append(f"paths batch {b} prefix {p}: time budget spent")
                continue
            times: dict[int, dict[str, float]] = {}
            with ctx.task(f"paths batch {b} prefix {p}", len(news)) as advance:
                for n in news:
                    if ctx.out_of_time():
                        ctx.skipped.append(f"paths batch {b} prefix {p} new {n}: time budget spent")
                        break
                    times[n] = _measure_point(ctx, cost, b, n, p, chunk)
                    advance()
            if refine:
                _refine(ctx, cost, b, p, chunk, times)
            row = {
                "batch": b,
                "prefix": p,
                "measured": measured_crossover(times),
                "measured_new": sorted(times),
                "predicted_by_flops": cost.crossover_by_flops(p),
            }
            if ctx.hw is not None:
                row["predicted"] = crossover_table(cost, ctx.hw, [(b, p)]).rows[0].by_time
            ctx.store.add("crossovers", row)
            rows.append(row)
    return rows


def _refine(ctx, cost, b, p, chunk, times) -> None:
    """Bisect (geometrically) between the last count absorb won and the crossover."""
    for _ in range(REFINE_STEPS):
        hi = measured_crossover(times)
        below = [n for n in times if hi is not None and n < hi]
        if hi is None or not below or ctx.out_of_time():
            return
        lo = max(below)
        mid = min(max(round(math.sqrt(lo * hi)), lo + 1), hi - 1)
        if hi - lo <= 1 or mid in times:
            return
        times[mid] = _measure_point(ctx, cost, b, mid, p, chunk)
