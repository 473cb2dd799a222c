"""Path-selection policies: which path each request runs.

roofline  the fastest MLA path by roofline time on a hardware profile (the model's choice),
          among those whose expanded K/V fits in the GPU's memory
flops     the path with the fewest FLOPs (machine-independent)
measured  per prefix, the crossover `mlactl tune paths` measured: absorb below it, expand from it
sglang, sglang-triton, sglang-trtllm, vllm
          what that engine runs, by its own rule (mlactl.decide.engines, each cited to its source)
"""

from __future__ import annotations

import numpy as np

from mlactl.decide.calibration.store import find_own
from mlactl.decide.calibration.time import path_times as timed
from mlactl.decide.engines import EngineParams, context_for, default_params, grid_paths, is_engine
from mlactl.model import hardware
from mlactl.model.cost import MLA_PATHS, CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.roofline import path_times
from mlactl.results import measured
from mlactl.results.measured import DIMS
from mlactl.util.defaults import POLICIES  # noqa: F401  (re-exported)
from mlactl.util.errors import MlactlError


def argmin_path(values: dict[str, np.ndarray], paths=MLA_PATHS) -> np.ndarray:
    """Name of the smallest value per point; ties go to the earlier path in `paths`."""
    stacked = np.stack([np.broadcast_to(values[p], np.shape(values[paths[0]])) for p in paths])
    return np.asarray(paths)[stacked.argmin(axis=0)]


def fitting_times(cost: CostModel, hw: HardwareProfile, times: dict, batch, new, prefix) -> dict:
    """Times with +inf where a path's latent cache and expanded K/V would not fit in the GPU's
    memory, so no choice lands on it (absorb expands nothing, but its cache can be too big too),
    and where the path cannot run at all (a DSA model's dense_expand past topk tokens)."""
    memory = hw.memory_bytes
    return {
        p: np.where(
            (cost.resident_bytes(p, batch, new, prefix) <= memory) & cost.applicable(p, batch, new, prefix), t, np.inf
        )
        for p, t in times.items()
    }


def runnable_flops(cost: CostModel, batch, new, prefix) -> dict:
    """Each choosable path's summed FLOPs, +inf where the path cannot run (the flops policy)."""
    out = {}
    for p in cost.choices:
        flops = sum(op.flops for op in cost.ops(p, batch, new, prefix))
        out[p] = np.where(cost.applicable(p, batch, new, prefix), flops, np.inf)
    return out


def measured_covers(crossovers: dict[int, int | None], prefix) -> np.ndarray:
    """Where a prefix lies within what was measured: from the smallest measured prefix to the
    largest, an octave of log2(1 + prefix) either side. A quick tune that measured prefix 0 only
    covers prefixes 0 and 1, not 512 (its crossover there lost 58% at 64 new tokens)."""
    known = np.log2(1 + np.array(sorted(crossovers), dtype=np.float64))
    p = np.log2(1 + np.asarray(prefix, dtype=np.float64))
    return (p >= known.min() - 1) & (p <= known.max() + 1)


def measured_paths(crossovers: dict[int, int | None], prefix, new, fallback=None) -> np.ndarray:
    """Path names from measured crossovers {prefix: first new count where expand won}.

    A prefix between measured ones takes the nearest measured prefix (in log2(1 + prefix)); where
    expand never won within what was measured, absorb is kept. Outside the measured prefixes
    (measured_covers) the paths are `fallback`'s (the roofline's, from select_paths), when given.
    """
    if not crossovers:
        raise MlactlError("no measured crossovers: run `mlactl tune paths` first")
    known = np.array(sorted(crossovers), dtype=np.float64)
    limits = np.array([np.inf if crossovers[int(p)] is None else crossovers[int(p)] for p in known])
    p = np.asarray(prefix, dtype=np.float64)
    nearest = np.abs(np.log2(1 + p[..., None]) - np.log2(1 + known)).argmin(axis=-1)
    paths = np.where(np.asarray(new) >= limits[nearest], "expand", "absorb")
    if fallback is None:
        return paths
    return np.where(measured_covers(crossovers, prefix), paths, fallback)


def select_paths(
    cost: CostModel,
    hw: HardwareProfile | None,
    new,
    prefix,
    *,
    batch=1,
    policy: str = "roofline",
    engine: EngineParams | None = None,
    crossovers: dict[int, int | None] | None = None,
) -> np.ndarray:
    """The path each (new, prefix) request runs under `policy`; an array of names.

    This is what `mla_attention(path="auto")` calls. `hw` may be None for the flops and engine
    policies; `crossovers` is needed by the measured one; `engine` gives an engine policy's
    parameters (default: the engine's own defaults). An engine judges each point as a batch of
    `batch` alike requests.
    """
    new = np.asarray(new)
    prefix = np.asarray(prefix)
    if not cost.cfg.measurable and policy == "measured":
        raise MlactlError(
            f"--policy measured: {cost.cfg.name} is a {cost.cfg.attention} model and `mlactl tune paths` "
            "measures MLA paths only; use roofline, flops or an engine (docs/engines.md: DeepSeek-V3.2)"
        )
    if is_engine(policy):
        ctx = context_for(cost.cfg, hw, cost.kv_dtype)
        params = engine if engine is not None and engine.engine == policy else default_params(policy, ctx)
        return grid_paths(params, np.broadcast_to(batch, np.broadcast(new, prefix).shape), new, prefix)
    if policy == "measured":
        fallback = None  # outside the prefixes measured: the roofline's choice (analysis says so)
        if hw is not None and crossovers and not measured_covers(crossovers, prefix).all():
            fallback = select_paths(cost, hw, new, prefix, batch=batch, policy="roofline")
        return measured_paths(crossovers or {}, prefix, new, fallback)
    if policy == "flops":
        return argmin_path(runnable_flops(cost, batch, new, prefix), cost.choices)
    if policy == "roofline":
        if hw is None:
            raise MlactlError("the roofline policy needs a hardware profile")
        times = path_times(cost, hw, cost.choices, batch, new, prefix)
        fitting = fitting_times(cost, hw, {p: t.time_s for p, t in times.items()}, batch, new, prefix)
        return argmin_path(fitting, cost.choices)
    raise MlactlError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


class AutoPolicy:
    """What `mla_attention(path="auto")` asks: the path of each request, by the best policy the
    machine has. In order: the calibrated times of mlactl's own paths on this device's hardware
    profile (`mlactl calibrate --from results` on `mlactl tune paths` runs at these model dims and
    cache dtype; never a calibration of another engine's kernels); the crossovers `mlactl tune
    paths` measured on this device; the roofline of its hardware profile; FLOPs. A calibration
    comes first because it fits all of a run's shapes at once: on the project's shared CPU two
    runs' calibrated crossovers agreed to 2% where their measured ones differed by up to 28%.

    `source` says which one it is, for logs and tests.
    """

    def __init__(self, cost: CostModel, device_name: str, *, results_folder=None, use_measured: bool = True):

        self.cost = cost
        self.device_name = device_name
        self.crossovers = None
        self.calibration = None
        self.hw = hardware.detect(device_name)
        dims = {k: getattr(cost.cfg, k) for k in DIMS}
        if use_measured and self.hw is not None:
            self.calibration = find_own(self.hw.name, dims, cost.kv_dtype)
            if self.calibration is not None:
                self.kind = "calibrated"
                self.source = f"calibrated times of this device's own paths from {self.calibration.path}"
                return
        if use_measured:
            self.crossovers, where = measured.find_crossovers(device_name, dims, cost.kv_dtype, results_folder)
            if self.crossovers:
                self.kind, self.source = "measured", f"measured crossovers from {where}"
                return
        if self.hw is not None:
            self.kind, self.source = "roofline", f"roofline on the {self.hw.name} profile"
        else:
            self.kind, self.source = "flops", f"FLOPs (no hardware profile matches {device_name!r})"

    def __call__(self, new, prefix) -> np.ndarray:
        if self.kind == "calibrated":
            hw = self.hw
            assert hw is not None  # a calibration is looked up only for a known hardware profile
            paths = timed(self.cost, hw, self.calibration, 1, new, prefix, paths=self.cost.choices)
            times = {p: t.time_s for p, t in paths.items()}
            fitting = fitting_times(self.cost, hw, times, 1, np.asarray(new), np.asarray(prefix))
            return argmin_path(fitting, self.cost.choices)
        return select_paths(self.cost, self.hw, new, prefix, batch=1, policy=self.kind, crossovers=self.crossovers)
