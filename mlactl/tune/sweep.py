"""The three measurements of `mlactl tune`: ceilings, kernel configs, and the two paths.

Everything measured goes into the run's ResultsStore as soon as it is measured; what the store
already holds is not measured again (resume). A time budget bounds each sweep: what it cuts is
listed in the returned `skipped`, never silently dropped.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from mlactl.decide.analysis import crossover_table
from mlactl.decide.calibration.model import step_counts
from mlactl.decide.calibration.sources import points_for
from mlactl.kernels import configs as tuned_configs
from mlactl.kernels.configs import ENV_OFF
from mlactl.model import hardware
from mlactl.model.cost import CostModel
from mlactl.model.roofline import op_time, path_time
from mlactl.tune import ceilings, common, noise
from mlactl.tune import compile as stage
from mlactl.tune import space as spaces
from mlactl.tune import store as store_mod
from mlactl.tune.common import relative_error
from mlactl.tune.inputs import paged_batch
from mlactl.tune.timing import is_unstable, time_interleaved, time_stable_all

# Relative error a candidate may have against the twin, by (dtype, fp8 cache).
TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 3e-2, "fp8": 6e-2}
DEFAULT_PREFIXES = {"cuda": "0,4K,16K,32K", "cpu": "0,256,1K"}
DEFAULT_NEW = {"cuda": "1:4096:*2", "cpu": "1:256:*2"}
QUICK_PREFIXES = {"cuda": "0,8K", "cpu": "0,512"}
QUICK_NEW = {"cuda": "1:4096:*4", "cpu": "1:256:*4"}
REFINE_STEPS = 4  # bisection steps between the last new count absorb won and the first expand won
# Steps are claims (docs/calibration.md): where a path's attention changes its count of query
# tiles or of waves of CTAs, calibrated time may step; tune paths measures the count just before
# and at each of the STEP_SAMPLES steps nearest the roofline crossover, so a calibration fitted
# to the run has sampled them.
STEP_SAMPLES = 4
MEMORY_SHARE = 0.5  # a point whose inputs and intermediates need more of the free memory is skipped
# A --quick sweep compiles (Triton + ptxas, 3-7 s a config for the 64-row decode on sm_90) for at
# most this long per bucket, and never for more than a third of the time left: the compile stage
# once took every candidate in turn with no budget, longer than the whole --quick run.
QUICK_COMPILE_BUDGET_S = 20.0
COMPILE_SHARE = 1 / 3
spread_order = spaces.spread_order  # kept here too: the sweep's order of candidates


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
    repeats: int = 2  # re-measurements of an unstable timing (--repeats)
    unstable: int = 0  # timings still unstable after them
    # seconds the compile stage may take per bucket: None = QUICK_COMPILE_BUDGET_S with --quick,
    # no limit without (the deadline still holds)
    compile_budget_s: float | None = None
    # seconds the last kernel trial that passed took (its launch, check and timing): what the
    # first trial of the next bucket is predicted to take, before the bucket has a time of its own
    trial_s: float = 0.0

    def out_of_time(self, predicted_s: float = 0.0) -> bool:
        """Past the deadline, or too close to it to start a unit predicted to take this long."""
        return time.monotonic() + predicted_s > self.deadline

    def time(self, fn, quick: bool = False):
        """Time one call; no repetition or re-measurement starts that would end past the deadline."""
        return self.time_all({"fn": fn}, quick)["fn"]

    def time_all(self, fns: dict, quick: bool = False) -> dict:
        """`time` for calls compared with each other (the paths at one shape): timed in turns."""
        kw = dict(device=self.device, warm=self.warm, deadline=self.deadline)
        if quick:
            return time_interleaved(fns, budget_s=0, warmup=1, min_repeats=3, **kw)
        timings = time_stable_all(fns, self.repeats, budget_s=self.timing_budget_s, **kw)
        self.unstable += sum(is_unstable(t) for t in timings.values())
        return timings

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

    versions = common.versions()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
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
    entry["trial_s"] = time.monotonic() - start  # launch, check and timing: the next trial's guess
    return entry


def tune_kernels(ctx: Context, names=None, configs_override=None, write_configs: bool = True) -> list[dict]:
    """Sweep every bucket of every kernel. Returns the kernel entries measured (or resumed)."""

    names = list(names or spaces.default_kernels(ctx.cfg))
    smem = _smem_limit(ctx.device, ctx.hw)
    done = []
    for name in names:
        spec = spaces.KERNELS[name]
        cost = spaces.cost_model(ctx.cfg, name, ctx.kv_dtype, ctx.dtype)
        file_dtype = spec.dtype_name(ctx.kv_dtype, ctx.dtype)
        for shape in spec.buckets(ctx.cfg, ctx.quick, ctx.device.type):
            bucket = tuned_configs.bucket_key(**shape)
            if ctx.out_of_time(ctx.trial_s):  # its first trial would end past the deadline
                ctx.skipped.append(f"{name} {bucket}: time budget spent")
                continue
            entry = _tune_bucket(ctx, spec, shape, bucket, cost, smem, configs_override)
            if entry is None:
                continue
            done.append(entry)
            if write_configs:
                write_best_config(ctx, name, file_dtype, bucket, entry)
    return done


def write_best_config(ctx: Context, name: str, file_dtype: str, bucket: str, entry: dict) -> None:
    """Keep a bucket's best config in the tuned-config file of the store's device, when it is at
    least as fast as the launcher's own default (the twins have no configs to keep)."""

    best = entry.get("best")
    if (
        best is not None
        and ctx.backend == "triton"  # the twins have no configs; the interpreter's times mean nothing
        and entry.get("best_median_s", math.inf) <= (entry.get("default_median_s") or math.inf)
    ):
        store_mod.write_tuned_config(
            name,
            ctx.store.data["device"]["name"],
            file_dtype,
            bucket,
            best,
            ctx.store.data["versions"].get("triton") or "",
        )


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
    # what the next trial is predicted to take: the last one of this bucket that passed (a failed
    # or wrong config stops before its timing), else the run's last (ctx.trial_s)
    last_trial_s = _last_trial_s(entry, ctx.trial_s)

    def passed(result: dict) -> None:
        nonlocal last_trial_s
        if result["status"] == "ok" and "trial_s" in result:
            last_trial_s = ctx.trial_s = result["trial_s"]

    if "default_median_s" not in entry:
        if ctx.out_of_time(last_trial_s):  # no time for the launcher's own config: none for the rest
            ctx.skipped.append(f"{spec.name} {bucket}: the launcher default and every candidate (time budget)")
            ctx.store.add("kernels", entry)  # the twin's timing, measured
            return entry
        default = _try_config(ctx, spec, kwargs, None, reference, tol)
        passed(default)
        entry["default_median_s"] = default.get("median_s", math.inf) if default["status"] == "ok" else None
        entry["default_status"] = (
            default["status"] if default["status"] == "ok" else f"{default['status']}: {default['reason']}"
        )
        entry["default_timing"] = default  # the shipped default's whole timing, on disk before any candidate
        ctx.store.add("kernels", entry)

    if configs_override is not None:
        candidates = list(configs_override)
    else:  # the shipped config first, then the space spread out (--quick: a few of it)
        candidates = spaces.candidates(spec, ctx.cfg, shape, ctx.kv_dtype, ctx.dtype, smem, ctx.quick)
        candidates = compile_stage(ctx, spec, shape, bucket, candidates, entry)  # spills, smem: no GPU time
    tried = {_key(c["config"]) for c in entry["configs"]}

    def trial(config: dict) -> None:
        """Time one config, keep it in the entry and the store (a kill loses only this one)."""
        result = _try_config(ctx, spec, kwargs, config, reference, tol)
        passed(result)
        entry["configs"].append(result)
        tried.add(_key(config))
        _update_best(entry)
        ctx.store.add("kernels", entry)

    with ctx.task(f"{spec.name} {bucket}", len(candidates)) as advance:
        for config in candidates:
            if _key(config) not in tried:
                if ctx.out_of_time(last_trial_s):  # do not start a trial that would end past it
                    left = sum(_key(c) not in tried for c in candidates)
                    ctx.skipped.append(f"{spec.name} {bucket}: {left} configs (time budget)")
                    break
                trial(config)
            advance()
        if (
            spec.name == "mla_decode"
            and configs_override is None
            and entry.get("best")
            and not ctx.out_of_time(last_trial_s)
        ):
            page = kwargs["kv_cache"].shape[1]
            for splits in spaces.decode_split_space(shape, page):  # second stage: split-KV factor
                config = dict(entry["best"], num_splits=splits)
                if _key(config) not in tried:
                    if ctx.out_of_time(last_trial_s):
                        ctx.skipped.append(f"{spec.name} {bucket}: split-KV stage (time budget)")
                        break
                    trial(config)
    _update_best(entry)
    ctx.store.add("kernels", entry)
    kwargs = reference = None  # free the bucket's tensors before emptying the cache
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def _last_trial_s(entry: dict, otherwise: float) -> float:
    """Seconds the bucket's last trial that passed took (a resumed entry's too), else `otherwise`."""
    trials = [entry.get("default_timing") or {}, *entry.get("configs", [])]
    took = [t["trial_s"] for t in trials if t.get("status") == "ok" and "trial_s" in t]
    return took[-1] if took else otherwise


def compile_budget(ctx: Context) -> float:
    """Seconds the compile stage may spend on the next bucket: the budget asked for (or, with
    --quick, QUICK_COMPILE_BUDGET_S), never more than COMPILE_SHARE of the time to the deadline."""
    budget = ctx.compile_budget_s
    if budget is None:
        budget = QUICK_COMPILE_BUDGET_S if ctx.quick else math.inf
    left = ctx.deadline - time.monotonic()
    return max(0.0, min(budget, COMPILE_SHARE * left if math.isfinite(left) else math.inf))


def _compile_in_process(ctx: Context) -> bool:
    """Whether the compile stage can run in this process: Triton's JIT (not its interpreter) is
    what this process launches with, so no child needs to start and import torch per config."""
    return ctx.backend == "triton" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def compile_stage(ctx: Context, spec, shape: dict, bucket: str, candidates: list[dict], entry: dict) -> list[dict]:
    """The candidates that compile for this GPU without spilling and fit its shared memory, one
    config at a time, in the order given (the shipped config first), under `compile_budget`: a
    config is not started when the last one's compile time would take the stage past it. What
    each compile found goes into entry["compiled"] and the store as it comes (a kill keeps it);
    configs the budget left uncompiled are not timed, and are listed in entry["compile_budget_cut"]
    and ctx.skipped. Without a GPU the stage knows (a CPU run, the interpreter) nothing is compiled
    (mlactl.tune.compile.drop_by_compile decides that)."""
    arch = stage.cuda_arch(ctx.device) if ctx.backend == "triton" else None
    if arch is None or not candidates:
        return stage.drop_by_compile(ctx, spec, shape, candidates, entry)
    why = stage.available()
    if why:
        ctx.skipped.append(f"{spec.name}: compile stage not run ({why}); configs kept untested")
        return candidates
    budget = compile_budget(ctx)
    stop_at = time.monotonic() + budget
    compiled = entry.setdefault("compiled", [])
    kept: list[dict] = []
    last_s = 0.0
    for i, config in enumerate(candidates):
        if time.monotonic() + last_s > stop_at:
            cut = candidates[i:]
            entry["compile_budget_cut"] = cut
            entry["compile_budget_s"] = budget
            ctx.skipped.append(
                f"{spec.name} {bucket}: {len(cut)} configs not compiled, not timed "
                f"(compile budget {budget:.0f} s spent)"
            )
            break
        started = time.monotonic()
        if _compile_in_process(ctx):
            cfg = ctx.cfg
            case = stage.Case(spec.name, shape, config, arch=arch, dtype=ctx.dtype, kv_dtype=ctx.kv_dtype, r=cfg.r,
                              dR=cfg.dR, dC=cfg.dC, dV=cfg.dV, label="candidate")  # fmt: skip
            result = stage.compile_one(case)
            reason = stage.verdict(result)
            if reason is None:
                kept.append(config)
            else:
                entry.setdefault("compile_dropped", []).append({"config": config, "reason": reason})
                ctx.skipped.append(f"{spec.name} {config}: dropped before timing, {reason}")
        else:
            kept += stage.drop_by_compile(ctx, spec, shape, [config], entry, arch=arch)
            result, reason = {}, next((d["reason"] for d in entry.get("compile_dropped", [])
                                       if d["config"] == config), None)  # fmt: skip
        last_s = time.monotonic() - started
        compiled.append(
            {
                "config": config,
                "seconds": last_s,
                "dropped": reason,
                **{k: result.get(k) for k in ("registers", "spill_bytes", "smem_bytes") if k in result},
            }
        )
        ctx.store.add("kernels", entry)
    return kept


def _key(config) -> str:

    return store_mod.config_key(config)


def _update_best(entry: dict) -> None:
    ok = [c for c in entry["configs"] if c["status"] == "ok"]
    if ok:
        best = min(ok, key=lambda c: c["median_s"])
        entry["best"], entry["best_median_s"] = best["config"], best["median_s"]


# -- ceilings --------------------------------------------------------------------------------------


def tune_ceilings(ctx: Context, write_profile: bool = True) -> dict:
    """Measure the matmul and copy ceilings; keep them in the run and as a measured profile."""

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
    outputs, found, runs = {}, {}, {}
    for path in wanted:
        entry = {"batch": b, "new": n, "prefix": p, "path": path, "status": "ok", "reason": ""}
        ops = cost.ops(path, b, n, p)
        entry["flops"] = float(sum(o.flops for o in ops))
        entry["bytes"] = float(sum(o.bytes for o in ops))
        if ctx.hw is not None:
            entry["predicted_s"] = float(path_time(ops, ctx.hw, ctx.dtype).time_s)
        try:
            outputs[path] = mla_attention(**args, path=path, chunk=chunk, backend=backend)
            runs[path] = functools.partial(mla_attention, **args, path=path, chunk=chunk, backend=backend)
        except Exception as exc:  # an out-of-memory or a kernel failure at one point is recorded
            entry.update(status="failed", reason=_failure(exc))
        rows[path] = entry
    try:  # the paths in turns: a crossover compares them under the same conditions
        timings = ctx.time_all(runs) if runs else {}
    except Exception as exc:
        timings = {}
        for path in runs:
            rows[path].update(status="failed", reason=_failure(exc))
    for path, timing in timings.items():  # each round's time too: the crossover's bootstrap resamples them
        rows[path].update(timing.to_dict(keep_times=True))
        found[path] = rows[path]["median_s"]
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


def predicted_steps(cost, sm_count: int | None, batch: int, prefix: int, low: int, high: int) -> list[int]:
    """New-token counts n in (low, high] at which expand's or absorb's attention pads its query
    rows more, or needs more waves of CTAs over `sm_count` SMs, than at n - 1 (calibration.model.
    step_counts; none without SMs)."""
    if not sm_count or high <= low:
        return []
    n = np.arange(low, high + 1, dtype=np.float64)
    found: set[int] = set()
    for cls in ("expand_attention", "absorb_attention"):
        counts = step_counts(points_for(cost, cls, batch, n, prefix, None), sm_count)
        changed = np.any(counts[1:] > counts[:-1] + 1e-12, axis=1)
        found.update(int(v) for v in n[1:][changed])
    return sorted(found)


def step_samples(cost, hw, batch: int, prefix: int, news, most: int = STEP_SAMPLES) -> list[int]:
    """The counts just before and at the `most` predicted steps nearest the roofline crossover
    (within the sweep's range), not already in `news`."""
    if hw is None or not news:
        return []
    steps = predicted_steps(cost, hw.sm_count, batch, prefix, min(news), max(news))
    if not steps:
        return []
    near = crossover_table(cost, hw, [(batch, prefix)]).rows[0].by_time or max(news)
    chosen = sorted(steps, key=lambda n: (abs(n - near), n))[:most]
    return sorted({m for n in chosen for m in (n - 1, n) if m >= 1} - set(news))


def tune_paths(ctx: Context, batches, news, prefixes, chunk: int, refine: bool = True) -> list[dict]:
    """Both paths end to end over new-token counts for each (batch, prefix), and the counts just
    before and at the predicted steps nearest the crossover (`step_samples`); measured and
    predicted crossovers. Returns the crossover rows."""

    cost = CostModel(ctx.cfg, kv_dtype=ctx.kv_dtype, dtype=ctx.dtype, chunk=chunk)
    rows = []
    clock = _PointClock(cost)
    for b in batches:
        for p in prefixes:
            if ctx.out_of_time(clock.predict(b, news[0], p)):
                ctx.skipped.append(f"paths batch {b} prefix {p}: time budget spent")
                continue
            times: dict[int, dict[str, float]] = {}
            cut = False
            steps = step_samples(cost, ctx.hw, b, p, news)
            with ctx.task(f"paths batch {b} prefix {p}", len(news) + len(steps)) as advance:
                for n in sorted(set(news) | set(steps)):
                    if ctx.out_of_time(clock.predict(b, n, p)):
                        ctx.skipped.append(f"paths batch {b} prefix {p} new {n}: time budget spent")
                        cut = True
                        break
                    with clock.timing(b, n, p):
                        times[n] = _measure_point(ctx, cost, b, n, p, chunk)
                    advance()
            if refine:
                _refine(ctx, cost, b, p, chunk, times, clock)
            rows.append(crossover_row(ctx, cost, b, p, times, cut))
            if steps:
                rows[-1]["step_samples"] = steps
            store_crossovers(ctx, rows)
    return rows


def crossover_row(ctx: Context, cost, b: int, p: int, times: dict[int, dict[str, float]], cut: bool = False) -> dict:
    """The measured crossover of one (batch, prefix), with its status (found, never, or cut by the
    budget) and its bracket widened by noise, and the predicted ones. `store_crossovers` keeps it."""

    stable = measured_crossover(times)
    row = {
        "batch": b,
        "prefix": p,
        "measured": stable,
        "measured_status": noise.FOUND if stable is not None else (noise.BUDGET if cut else noise.NEVER),
        "measured_new": sorted(times),
        "predicted_by_flops": cost.crossover_by_flops(p),
        "first_stable": stable,
    }
    if stable is not None:
        points = {
            n: {path: ctx.store.find("paths", batch=b, new=n, prefix=p, path=path) for path in ("expand", "absorb")}
            for n in times
        }
        row["measured_low"], row["measured_high"] = noise.bracket(points, stable)
        found = noise.root_crossover(points, stable)
        # the root of a local fit of log(expand/absorb), with its bootstrap interval; where there
        # is no sign change to fit (expand wins from the smallest count), first_stable stands
        row["estimator"] = "local_root" if found else "first_stable"
        if found:
            row["measured"] = found["measured"]
            row["measured_root"] = found["root"]
            row["measured_interval"] = found["interval"]
            row["measured_window"] = found["window"]
    if ctx.hw is not None:
        row["predicted"] = crossover_table(cost, ctx.hw, [(b, p)]).rows[0].by_time
    return row


def store_crossovers(ctx: Context, rows: list[dict]) -> None:
    """Flag the rows whose crossover falls as the prefix grows, and keep them all in the store."""

    noise.flag_nonmonotone(rows)
    for row in rows:
        ctx.store.add("crossovers", row)


class _PointClock:
    """Predicts how long measuring a point will take, so that a sweep does not start one that
    would end past the deadline (--budget kept within ~5%). A point costs a fixed part (inputs,
    warm-up, a timing budget per path) plus a part that grows with its FLOPs: the line through
    the last two points measured, or the last time scaled by the square root of the FLOPs ratio,
    whichever is larger, and never below the quickest point seen. (On this project's 2-core CPU,
    teaching model, scaling by the FLOPs ratio alone over-predicted points by 2-3x and ended
    sweeps half-way through their budget.)"""

    def __init__(self, cost):
        self.cost = cost
        self.seen: list[tuple[float, float]] = []  # (flops, seconds) of the points measured

    def _flops(self, b: int, n: int, p: int) -> float:
        return float(sum(o.flops for path in ("expand", "absorb") for o in self.cost.ops(path, b, n, p)))

    def predict(self, b: int, n: int, p: int) -> float:
        if not self.seen:
            return 0.0
        flops = self._flops(b, n, p)
        (f1, t1), quickest = self.seen[-1], min(t for _, t in self.seen)
        guess = t1 * math.sqrt(flops / f1) if f1 > 0 else t1
        if len(self.seen) > 1 and self.seen[-2][0] != f1:
            f0, t0 = self.seen[-2]
            guess = max(guess, t1 + max(0.0, (t1 - t0) / (f1 - f0)) * (flops - f1))
        return max(guess, quickest)

    @contextlib.contextmanager
    def timing(self, b: int, n: int, p: int):
        start = time.monotonic()
        yield
        self.seen.append((self._flops(b, n, p), time.monotonic() - start))


def _refine(ctx, cost, b, p, chunk, times, clock=None) -> None:
    """Bisect (geometrically) between the last count absorb won and the crossover."""
    for _ in range(REFINE_STEPS):
        mid = next_refine_point(times)
        if mid is None or (ctx.out_of_time(clock.predict(b, mid, p)) if clock else ctx.out_of_time()):
            return
        with clock.timing(b, mid, p) if clock else contextlib.nullcontext():
            times[mid] = _measure_point(ctx, cost, b, mid, p, chunk)


def next_refine_point(times: dict[int, dict[str, float]]) -> int | None:
    """The new count to measure next between the last count absorb won and the crossover; None
    when there is nothing left to bisect."""
    hi = measured_crossover(times)
    below = [n for n in times if hi is not None and n < hi]
    if hi is None or not below:
        return None
    lo = max(below)
    mid = min(max(round(math.sqrt(lo * hi)), lo + 1), hi - 1)
    if hi - lo <= 1 or mid in times:
        return None
    return mid
