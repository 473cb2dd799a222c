"""Carrying a calibration to a GPU it was not measured on: `mlactl calibrate transfer`.

A fit (model.py) already keeps apart what belongs to the kernel and what to the GPU:

    the kernel's   t_fixed, t_iter, t_combine, t_request, t_row, t_align (seconds: launch and
                   setup, one KV block's latency, per request and per row costs), the tile shape
                   (pad, tile128), the split rule, and the efficiencies eta_c, eta_m, eta_q, eta_x
                   (fractions of the GPU's ceilings), l2_gain (L2 reads over HBM reads)
    the GPU's      peak FLOP/s, bandwidth, SM count (waves, splits, serial waves) and L2 size

so a transferred fit keeps the kernel's parameters and takes the target profile's ceilings, SMs,
L2 (`l2_bytes`) and, for a sparse attention, the kernel's head and key blocks on the target's
architecture (`hblock`: FlashMLA's sparse prefill pads 64 heads to 128 on Blackwell, and reads
a request's shared rows once on Hopper only: `reuse`). A time is then the same kernel at the
target's ceilings: per-SM and per-wave effects follow the target's SM count, an `l2` fit its L2.
One exception to "seconds are the kernel's": where a walking CTA's step is an MMA (the
indexer's: COMPUTE_STEPS), t_iter follows the SM's FLOP rate (`step_scale`). And one to
"efficiencies are fractions of the ceilings": where the memory side is its CTAs' loads rather
than the HBM's (the top-k's: SM_LOADS), eta_m keeps the memory rate a SM on a GPU with less
bandwidth a SM (`memory_scale`).

Terms that describe one kernel (KERNEL_TERMS) travel only where the engine runs that same kernel
on the target: FA3's split heuristic and SGLang FA3's pass over an fp8 cache are FA3's, on
Hopper; DeepGEMM's tile heuristic is its SM90 one. Which kernel the target runs is the engine's
default backend there, as mlactl.decide.engines resolves it (SGLang: fa3 on sm90, trtllm_mla on
sm100); where no rule set names the kernel (TRT-LLM, vLLM's GEMMs, mlactl's own kernels) it is
taken to be the source's. Where the target runs another kernel than the one measured, the fit
falls back to its best member without the kernel's terms (a term set that fitted about as well,
with its own parameters), else to its own parameters less those terms, and says which
(`transfer.rests_on` of each fit).

Intervals: the transfer error that leave-one-GPU-out measured (profiles/transfer/errors.json,
written by benchmarks/bench_transfer.py, read on first use) is log(measured / predicted) of fits
carried between the GPUs aiconfigurator has tables for, keyed by op class, dtype, the kernel the
target runs and whether it is another kernel, and the crossing (sm90>sm100; `error_keys`), each
key used from MIN_PAIRS pairs. Its median is taken out of the fit's times (every time in seconds
times exp(median), every efficiency over it: `scaled`, held within the physical limits), and the
fit's residual quantiles are widened, level by level, to the re-centred transfer quantiles.
"""

from __future__ import annotations

import copy
import datetime as _dt
import functools
import json
import math
from pathlib import Path

from mlactl import __version__
from mlactl import profiles as shipped_profiles
from mlactl.decide.calibration import run, store
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.fit import gpu_sizes
from mlactl.decide.calibration.model import (
    ATTENTION_CLASSES,
    SPARSE_REUSE,
    TILE_ROWS,
    sparse_blocks,
)
from mlactl.decide.calibration.store import Calibration, eta_limit, safe_name, validate
from mlactl.decide.calibration.terms import PARAMS
from mlactl.decide.engines import arch_of, context_for, default_params
from mlactl.decide.engines.sglang import SGLangParams
from mlactl.model.config import from_name
from mlactl.model.hardware import HardwareProfile
from mlactl.util.errors import MlactlError

ERROR_MODEL = Path(shipped_profiles.__file__).parent / "transfer" / "errors.json"


@functools.cache
def error_model() -> dict:
    """The shipped transfer error model: {"model": {"gpus", "levels", ...}, "errors": {key: entry}}."""
    return json.loads(ERROR_MODEL.read_text())


# terms that describe one kernel: (the kernel source they describe, or None for the fit's own
# kernel; the architecture they describe, or None for any)
KERNEL_TERMS = {
    "fa3split": ("flash_attention", "sm90"),  # flash-attention hopper/heuristics.h num_splits_heuristic
    "kvcast": ("flash_attention", "sm90"),  # SGLang's FA3 decode converts an fp8 cache first
    "dgtile": (None, "sm90"),  # DeepGEMM's SM90 block heuristic (model.deepgemm_tile), any DeepGEMM GEMM
}
# SGLang's attention backends (mlactl.decide.engines) as aiconfigurator names the kernel sources
SGLANG_KERNELS = {
    "fa3": "flash_attention",
    "trtllm_mla": "trtllm_mla",
    "flashinfer": "flashinfer",
    "flashmla": "flashmla",
    "cutlass_mla": "cutlass_mla",
    "triton": "triton",
    "fa4": "fa4",
    "aiter": "aiter",
}
# `near` (a projection's residuals at the nearest measured shapes) corrects what the parametric
# model misses of the kernel at those shapes (its tile quirks); NEAR_TRAVELS says whether that
# correction is carried too (benchmarks/bench_transfer.py measures both)
NEAR_TRAVELS = True
# the transfer error model's median (its `shift`) is taken out of a transferred fit's times: a
# fit carried from Hopper to Blackwell is, by op class, systematically slow or fast there
CORRECT = True
# An fp8-cache attention fit on a kernel the target does not run: the measured kernel's fp8 path
# (FA3 converts the cache first: kvcast) says nothing of the target's, so the same op's bf16 fit,
# at the fp8 cache's bytes, stands in. H200 SGLang -> B200 (trtllm_mla) fp8 decode: 67.4% / 174%
# median / p90 with the fp8 fit, 22.8% / 90.8% with the bf16 one (benchmarks/bench_transfer.py)
STAND_IN = "the same op's bf16 fit at the fp8 cache's bytes and key blocks"
# and walking the fp8 cache's key blocks, half the bytes a block: its t_iter (one key block's
# step) times STAND_IN_STEP, an fp8 element's byte over a bf16 one's two. The kernel the target
# runs shows it: SGLang's trtllm_mla decode steps 0.449 / 0.247 us (B200) and 0.644 / 0.487 us
# (GB200) a block of a bf16 / fp8 cache. H200 SGLang -> B200 and GB200 fp8 decode, raw p90:
# 90.8% and 90.1% with the bf16 step, 48.0% and 44.6% with half (benchmarks/bench_transfer.py)
STAND_IN_STEP = 0.5
MIN_PAIRS = 2  # a key of the transfer error model is used from this many (source, target) pairs
SAME, OTHER = "same kernel", "another kernel's fit"
MEMBER, DROPPED = "its best member without the dropped terms", "the dropped terms left out of its own parameters"


def kernel_of(fit: dict) -> str:
    """The kernel source a fit (a file's entry) was measured on (store.kernel_of its source)."""
    return store.kernel_of(fit.get("source"))


def phase_of(fit: dict) -> str | None:
    return store.phase_of(fit.get("source"))


def _sglang_backend(fit: dict, hw: HardwareProfile) -> tuple[str, str]:
    """(SGLang's default attention backend for this fit's op and phase on `hw`, the rule's name):
    a DSA model's for the sparse and masked attentions, DeepSeek-V3's for the others."""
    cfg = from_name("deepseek-v3.2") if fit["op"] in ("sparse_attention", "masked_attention") else None
    kv = "fp8" if "fp8" in str(fit.get("dtype", "")) else "bf16"
    p = default_params("sglang", context_for(cfg, hw, kv))
    assert isinstance(p, SGLangParams)
    return (p.decode_backend if phase_of(fit) == "decode" else p.backend), p.name


def target_kernel(framework: str | None, fit: dict, source: HardwareProfile, target: HardwareProfile):
    """(the kernel the target runs for this fit's op, how that was decided): the measured one
    where the engine's default backend is the same on both GPUs (or no rule set names it), else
    the target's backend's kernel."""
    own = kernel_of(fit)
    if framework != "sglang" or fit["op"] not in ATTENTION_CLASSES:
        return own, "no engine rule names another kernel"
    there, rule = _sglang_backend(fit, target)
    here, _ = _sglang_backend(fit, source)
    if there == here:
        return own, f"{rule}: {there} on {source.name} and {target.name}"
    return SGLANG_KERNELS.get(there, there), f"{rule}: {here} on {source.name}, {there} on {target.name}"


def travels(term: str, source_kernel: str, kernel: str, arch: str | None) -> bool:
    """Whether a kernel-specific term applies on the target: the target runs the measured
    kernel, and where that is the kernel the term describes (FA3's terms on FA3, any DeepGEMM
    for dgtile), on the architecture it describes. On another kernel that selected it (TRT-LLM's
    decode takes fa3split's split count) the term is that kernel's, and travels with it."""
    if term not in KERNEL_TERMS:
        return True
    if kernel != source_kernel:
        return False
    describes, on = KERNEL_TERMS[term]
    if describes is not None and source_kernel != describes:
        return True
    return on is None or arch == on


# op classes whose `serial` step (t_iter: one key block of a walking CTA) is an MMA on the SM,
# whose time follows the SM's FLOP rate (peak / SMs) rather than a latency: DeepGEMM's
# fp8_mqa_logits, 128 rows by 128 keys of 128 dims a step, 4.19 MFLOP. Fitted on aiconfigurator's
# SGLang 0.5.14 tables, t_iter is 0.304, 0.258, 0.164 and 0.126 us on an H100, H200, B200 and
# GB200, where that MMA at each one's per-SM fp8 peak takes 0.28, 0.28, 0.14 and 0.12 us.
# Carried in seconds, the H100's and H200's fits were 46-58% off at the p90 on the Blackwells;
# scaled, 28-32% (benchmarks/bench_transfer.py's pairs)
COMPUTE_STEPS = ("indexer",)


def step_scale(op: str, source: HardwareProfile, target: HardwareProfile, dtype: str) -> float:
    """What a fit's t_iter is multiplied by on the target: the source's per-SM FLOP rate over the
    target's for COMPUTE_STEPS, else 1 (a step's latency is the kernel's)."""
    if op not in COMPUTE_STEPS or not source.sm_count or not target.sm_count:
        return 1.0
    return (source.peak_flops(dtype) / source.sm_count) / (target.peak_flops(dtype) / target.sm_count)


# op classes whose memory time is bound by their CTAs' loads, one CTA an SM, rather than by the
# HBM: SGLang's fused top-k reads each row's fp32 logits twice in a 1,024-thread loop, one CTA an
# SM (sgl-kernel/csrc/elementwise/topk.cu, sgl-project/sglang @ 06c48ca8). In aiconfigurator's
# SGLang 0.5.14 tables the H100 (132 SMs, 3.35 TB/s) takes 1.01, 1.02, 1.06 and 1.09 times the
# H200's time (132 SMs, 4.8 TB/s), the median over the shapes whose logits are up to 50 MB,
# 50-200 MB, 200 MB-1 GB and 1-10 GB, where the bandwidths' ratio is 1.43 (past 10 GB, chunked
# launches, 1.38). So toward a GPU with less bandwidth a SM a fit keeps its memory rate a SM;
# toward one with more, its fraction of the bandwidth as fitted: a fit whose memory side never
# bound (the H100's top-k holds eta_m at its limit) would otherwise bind there. Chosen on the
# leave-one-GPU-out pairs (benchmarks/bench_transfer.py): the top-k carried to the H100 from the
# other three GPUs, 18.1% -> 9.5% median and 48.4% -> 34.6% p90; kept a SM both ways, the H100's
# fit carried to the others went from 7.5-11.7% to 11.9-21.4% median
SM_LOADS = ("topk",)


def memory_scale(op: str, source: HardwareProfile, target: HardwareProfile) -> float:
    """What a fit's eta_m is multiplied by on the target: for SM_LOADS toward less bandwidth a SM,
    the source's bandwidth a SM over the target's (its memory rate a SM kept), else 1 (a fraction
    of the target's bandwidth)."""
    if op not in SM_LOADS or not source.sm_count or not target.sm_count:
        return 1.0
    return max(1.0, (source.bandwidth / source.sm_count) / (target.bandwidth / target.sm_count))


def _retarget(model: dict, target: HardwareProfile, step: float = 1.0, memory: float = 1.0, dtype=None) -> dict:
    """A fit's or member's {"terms", "params"} with the target's L2 size (`l2`), its indexer's
    logits budget, a share of its memory (`chunk`), its sparse attention kernel's head and key
    blocks and whether it reads a request's shared rows once (`hblock`, `reuse`: SPARSE_BLOCKS and
    SPARSE_REUSE of its architecture; no blocks where none are known), its t_iter times `step`
    (`step_scale`) and its eta_m times `memory` (`memory_scale`; held at the dtype's limit)."""
    out = copy.deepcopy(model)
    if step != 1.0 and "t_iter_s" in out["params"]:
        out["params"]["t_iter_s"] = out["params"]["t_iter_s"] * step
    if memory != 1.0 and "eta_m" in out["params"]:
        out["params"]["eta_m"] = min(out["params"]["eta_m"] * memory, eta_limit(dtype))
    arch = family(target)
    out["params"].update(gpu_sizes(out["terms"], target.l2_bytes, target.memory_bytes, arch))
    if "hblock" in out["terms"] and arch in SPARSE_REUSE:  # the kernel's reads on the target's architecture
        terms = [t for t in out["terms"] if t != "reuse"]
        out["terms"] = terms + ["reuse"] if SPARSE_REUSE[arch] else terms
    return out


def family(hw: HardwareProfile) -> str | None:
    """The architecture the transfer error model keys by (sm90, sm100, ...), or None."""
    return arch_of(hw)


def error_key(op: str, source: HardwareProfile, target: HardwareProfile) -> tuple[str, str]:
    """(op class, crossing): `sm90>sm100` from one architecture to another (`sm90>sm90` within
    one); `?` for an architecture the engines' rules do not name."""
    return op, f"{family(source) or '?'}>{family(target) or '?'}"


def error_keys(
    op: str, crossing: str, dtype: str | None = None, other: bool | None = None, kernel: str | None = None
) -> list[str]:
    """The transfer error model's keys for a fit, most specific first: its op class, dtype,
    kernel on the target and whether that is another kernel than the measured one (`:other`,
    else `:same`) at this crossing; the same without the kernel; its op class at this crossing;
    every class at it; then its class and every class within one architecture (`same`) or
    across two (`cross`)."""
    a, b = crossing.split(">")
    kind = "same" if a == b and a != "?" else "cross"
    keys = [f"{op}/{crossing}", f"*/{crossing}", f"{op}/{kind}", f"*/{kind}"]
    if dtype is not None and other is not None:
        change = "other" if other else "same"
        keys.insert(0, f"{op}:{dtype}:{change}/{crossing}")
        if kernel is not None:
            keys.insert(0, f"{op}:{dtype}:{kernel}:{change}/{crossing}")
    return keys


def transfer_error(
    op: str,
    crossing: str,
    errors: dict | None = None,
    dtype: str | None = None,
    other: bool | None = None,
    kernel: str | None = None,
) -> tuple[str, dict] | None:
    """(key, entry {"n", "pairs", "quantiles", "shift"}) of the most specific key the model has
    from at least MIN_PAIRS pairs (`error_keys`), or None."""
    table = error_model()["errors"] if errors is None else errors
    keys = error_keys(op, crossing, dtype, other, kernel)
    return next(((k, table[k]) for k in keys if k in table and len(table[k].get("pairs", ())) >= MIN_PAIRS), None)


# the kernel's parameters a time scales (terms.PARAMS): seconds, and fractions of the ceilings
SECONDS = tuple(k for k in PARAMS if k.startswith("t_"))
ETAS = tuple(k for k in PARAMS if k.startswith("eta_"))


def scaled(model: dict, factor: float) -> dict:
    """A fit's or member's {"terms", "params"} whose every time is `factor` times as long: each
    time in seconds times it, each efficiency over it (model.predict is linear in those)."""
    params = dict(model["params"])
    for k in SECONDS:
        if k in params:
            params[k] = params[k] * factor
    for k in ETAS:
        if k in params:
            params[k] = params[k] / factor
    return dict(model, params=params)


def bias_factor(models: list[dict], shift: float, dtype) -> float:
    """exp(shift), the transfer model's median log(measured / predicted), held where it would
    take an efficiency of any of `models` past its physical limit (store.eta_limit)."""
    factor = math.exp(shift)
    top = eta_limit(dtype)
    for m in models:
        for k in ETAS:
            if k in m["params"] and m["params"][k] / factor > top:
                factor = m["params"][k] / top
    return factor


def widen(interval: dict | None, error: dict | None) -> dict | None:
    """A fit's interval evidence widened by the transfer error: at each level, the farther from
    zero of the fit's own (scaled) residual and the transfer's; the scale is then 1."""
    if interval is None or error is None:
        return interval
    q_t = error["quantiles"]
    scale = float(interval.get("scale", 1.0))

    def one(q):
        if q is None:
            return None
        own = [scale * v for v in q]
        return [round(min(a, b) if lv < 0.5 else max(a, b), 6) for lv, a, b in zip(u.LEVELS, own, q_t)]

    out = dict(interval, random=one(interval["random"]), blocked=one(interval.get("blocked")), scale=1.0)
    out["transfer"] = {"quantiles": list(q_t), "n": error.get("n"), "source_scale": scale}
    return out


def adaptations(fit: dict, moved: dict, step: float, memory: float = 1.0) -> list[str]:
    """What of the kernel a transfer took from the target, in words: the sparse kernel's blocks
    and reads (`hblock`, `reuse`), a step scaled by the SM's FLOP rate (`step_scale`) and a
    memory efficiency that keeps the rate per SM (`memory_scale`)."""
    out = []
    params = moved["params"]
    if "hblock" in moved["terms"] and params.get("head_block"):
        out.append(f"{params['head_block']:g} heads x {params['key_block']:g} keys a step")
    had, has = "reuse" in fit["terms"], "reuse" in moved["terms"]
    if had != has:
        out.append("shared rows read once" if has else "each selection read")
    if step != 1.0:
        out.append(f"step x{step:.2f}")
    if memory != 1.0:
        out.append(f"eta_m x{memory:.2f} (the memory rate a SM)")
    return out


IMPLIED = "its source's blocks (fitted without hblock)"


def implied_blocks(fit: dict, source: HardwareProfile) -> dict:
    """A sparse attention fit made without `hblock` (before the term, or with `--terms`), on a GPU
    whose kernel blocks are mlactl's own tile (64 heads by 64 keys: Hopper's), with `hblock` and
    those blocks: at heads a multiple of 64 its times on the source are the same, and a transfer
    then gives it the target's. Any other fit as it is."""
    blocks = sparse_blocks(family(source))
    if fit["op"] != "sparse_attention" or "hblock" in fit["terms"] or "tile128" in fit["terms"]:
        return fit
    if blocks != (TILE_ROWS, TILE_ROWS):
        return fit
    out = copy.deepcopy(fit)
    for model in [out, *out.get("members", [])]:
        model["terms"] = [*model["terms"], "hblock"]
        model["params"]["head_block"], model["params"]["key_block"] = blocks
    return out


def transfer_fit(
    fit: dict,
    framework: str | None,
    source: HardwareProfile,
    target: HardwareProfile,
    errors: dict | None = None,
    near: bool = NEAR_TRAVELS,
    correct: bool = CORRECT,
    peak_dtype: str = "bf16",
) -> dict:
    """One fit carried to `target` (see the module docstring), with its `transfer` record.
    `near`: whether a projection's nearest-shape correction travels (NEAR_TRAVELS); `correct`:
    whether the transfer model's median error is taken out (CORRECT); `peak_dtype`: the peak the
    calibration divides by (its ceilings' dtype), for `step_scale`."""
    implied = "hblock" not in fit["terms"]
    fit = implied_blocks(fit, source)
    implied = implied and "hblock" in fit["terms"]
    src_kernel = kernel_of(fit)
    kernel, decided = target_kernel(framework, fit, source, target)
    arch = family(target)
    drop = [t for t in fit["terms"] if not travels(t, src_kernel, kernel, arch) or (t == "near" and not near)]
    step = step_scale(fit["op"], source, target, peak_dtype)
    memory = memory_scale(fit["op"], source, target)
    out = _retarget(fit, target, step, memory, fit.get("dtype"))
    rests_on = SAME if kernel == src_kernel else f"{OTHER} ({src_kernel} measured, {kernel} on {target.name})"
    members = [_retarget(m, target, step, memory, fit.get("dtype")) for m in fit.get("members", [])]
    fallback = None
    if drop:
        clean = [m for m in members if not set(drop) & set(m["terms"])]
        if clean:  # the best member that needs none of the dropped terms
            out["terms"], out["params"] = list(clean[0]["terms"]), dict(clean[0]["params"])
            members = clean[1:]
            rests_on += f"; {MEMBER}"
            fallback = "member"
        else:
            out["terms"] = [t for t in fit["terms"] if t not in drop]  # the others' parameters as fitted
            rests_on += f"; {DROPPED}"
            fallback = "terms dropped"
        members = [dict(m, terms=[t for t in m["terms"] if t not in drop]) for m in members]
    out["members"] = members
    adapted = adaptations(fit, out, step, memory) + ([IMPLIED] if implied else [])
    crossing = error_key(fit["op"], source, target)[1]
    found = transfer_error(fit["op"], crossing, errors, fit.get("dtype"), kernel != src_kernel, kernel)
    key, error = found if found is not None else (None, None)
    factor = 1.0
    if error is not None and error.get("shift") and correct:
        # the transfer's median error taken out: every time times exp(shift), its residuals re-centred
        factor = bias_factor([out, *members], error["shift"], fit.get("dtype"))
        scaled_fit = scaled(out, factor)
        out["params"] = scaled_fit["params"]
        out["members"] = [scaled(m, factor) for m in members]
        error = dict(error, quantiles=[round(q - math.log(factor), 6) for q in error["quantiles"]])
    if "interval" in out:
        out["interval"] = widen(out["interval"], error)
    out["transfer"] = {
        "from": source.name,
        "to": target.name,
        "kernel": {"measured": src_kernel, "target": kernel, "decided": decided},
        "dropped": drop,
        "rests_on": rests_on,
        "fallback": fallback,
        "crossing": crossing,
        "error": None if error is None else {"n": error.get("n"), "key": key},
        "factor": round(factor, 6),
        "step": round(step, 6),
        "memory": round(memory, 6),
        "adapted": adapted,
    }
    return out


def _carry(fit: dict, fits: list, framework, source, target, errors, near: bool, correct: bool, dtype: str) -> dict:
    """`transfer_fit`, and for an fp8-cache attention fit on a kernel the target does not run, the
    same op and phase's bf16 fit in its place (STAND_IN), its step over the fp8 blocks
    (STAND_IN_STEP), where the calibration has one."""
    moved = transfer_fit(fit, framework, source, target, errors, near, correct, dtype)
    kernel = moved["transfer"]["kernel"]
    if kernel["measured"] == kernel["target"] or fit["op"] not in ATTENTION_CLASSES:
        return moved
    if "fp8" not in str(fit.get("dtype", "")):
        return moved
    twin = [f for f in fits if f["op"] == fit["op"] and f.get("dtype") == "bf16" and phase_of(f) == phase_of(fit)]
    if not twin:
        return moved
    stand_in = dict(copy.deepcopy(twin[0]), dtype=fit["dtype"], source=fit["source"])
    for model in [stand_in, *stand_in.get("members", [])]:  # the fp8 cache's blocks, a step each
        if "t_iter_s" in model["params"]:
            model["params"]["t_iter_s"] = model["params"]["t_iter_s"] * STAND_IN_STEP
    moved = transfer_fit(stand_in, framework, source, target, errors, near, correct, dtype)
    moved["transfer"]["rests_on"] += f"; {STAND_IN}"
    moved["transfer"]["fallback"] = "bf16 fit"
    moved["transfer"]["adapted"].append(f"fp8 cache blocks, step x{STAND_IN_STEP:.2f}")
    return moved


def transfer(
    cal: Calibration,
    source: HardwareProfile,
    target: HardwareProfile,
    name: str | None = None,
    errors=None,
    near: bool = NEAR_TRAVELS,
    correct: bool = CORRECT,
) -> dict:
    """The calibration file's dict of `cal` carried to `target` (validated). `source` is the
    profile `cal` was fitted against (its hardware)."""
    if cal.data.get("transfer"):
        first = cal.data["transfer"]["from"]["hardware"]
        raise MlactlError(
            f"calibration {cal.name!r} is itself transferred (from {first}): transfer the one fitted on {first}"
        )
    if target.name == cal.hardware:
        raise MlactlError(f"calibration {cal.name!r} was fitted on {target.name} already: nothing to transfer")
    ceilings = cal.data.get("ceilings") or {}
    dtype = ceilings.get("dtype") or "bf16"
    if dtype not in target.peak_tflops:
        raise MlactlError(f"{target.name} has no {dtype} peak, the dtype calibration {cal.name!r} divides by")
    framework = (cal.data.get("source") or {}).get("framework")
    entries = cal.data["fits"]  # the file's entries, carried one by one
    fits = [_carry(f, entries, framework, source, target, errors, near, correct, dtype) for f in entries]
    data = copy.deepcopy({k: v for k, v in cal.data.items() if k != "fits"})
    data.update(
        name=safe_name(name or f"{target.name}-from-{cal.name}"),
        hardware=target.name,
        ceilings=run.ceilings(target, dtype),
        created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        mlactl_version=__version__,
        fits=fits,
    )
    data["transfer"] = {
        "from": {"hardware": cal.hardware, "calibration": cal.name, "ceilings": ceilings},
        "to": target.name,
        "error_model": error_model()["model"],
    }
    validate(data, "the transferred calibration")
    return data
