"""Units of tuning work and the one function that measures a unit, whoever schedules it.

A unit is the smallest piece of `mlactl tune` worth handing to a worker: one kernel bucket (or a
slice of its launch space), one path point (batch, new, prefix), or the ceilings of a device.
`measure_unit` runs it with the same sweep code the serial run uses (`sweep._tune_bucket`,
`sweep._measure_point`, `sweep.tune_ceilings`) against a `UnitStore`: an in-memory stand-in for
the results store, seeded with what the real store already holds for the unit (so a resumed
unit skips what was measured), that collects what the unit adds. The scheduler then merges
those entries into the real store under its lock; the store stays the one source of truth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mlactl.kernels import configs as tuned_configs
from mlactl.model.cost import CostModel
from mlactl.tune import space as spaces
from mlactl.tune import store as store_mod
from mlactl.tune import sweep


@dataclass(frozen=True)
class Unit:
    """One unit of work: a kernel bucket's slice of candidates, a path point, or the ceilings.

    A bucket's part == -1 is its last stage (the configs no part tried, then mla_decode's
    split-KV factors), run once the parts are in.
    """

    section: str  # "kernels", "paths" or "ceilings"
    kernel: str = ""  # kernels: the kernel, its bucket and the bucket's shape (JSON: a unit hashes)
    bucket: str = ""
    shape_json: str = ""
    # this slice of the bucket's candidates (space.candidates, as the serial run takes them):
    # candidates[part::parts]
    part: int = 0
    parts: int = 1
    batch: int = 0  # paths: the point measured
    new: int = 0
    prefix: int = 0

    @property
    def shape(self) -> dict:
        return json.loads(self.shape_json) if self.shape_json else {}

    def label(self) -> str:
        if self.section == "kernels":
            stage = ""
            if self.part < 0:
                stage = " last"
            elif self.parts > 1:
                stage = f" {self.part + 1}/{self.parts}"
            return f"{self.kernel} {self.bucket}{stage}"
        if self.section == "paths":
            return f"paths b{self.batch} n{self.new} p{self.prefix}"
        return "ceilings"


def kernel_units(cfg, names, quick: bool, device_type: str, parts: int) -> list[Unit]:
    """Every bucket of every kernel, each cut into `parts` slices of its launch space."""
    units = []
    for name in names:
        for shape in spaces.KERNELS[name].buckets(cfg, quick, device_type):
            bucket = tuned_configs.bucket_key(**shape)
            shape_json = json.dumps(shape, sort_keys=True)
            units += [Unit("kernels", name, bucket, shape_json, part, parts) for part in range(parts)]
    return units


class UnitStore:
    """What a unit sees of the results store: `find`, `add`, `set_ceilings`, `data` (device and
    versions). Entries added are kept, merged the way ResultsStore merges them, for `added`."""

    def __init__(self, header: dict, seed: list[tuple[str, dict]] | None = None):
        self.data: dict = dict(header, kernels=[], paths=[], crossovers=[])
        self._added: dict[tuple, tuple[str, dict]] = {}
        for section, entry in seed or []:
            self.data[section].append(json.loads(json.dumps(entry)))  # a copy the unit may change

    def find(self, section: str, **key) -> dict | None:
        want = store_mod._key(section, key)
        return next((e for e in self.data.get(section, []) if store_mod._key(section, e) == want), None)

    def add(self, section: str, entry: dict) -> None:
        entries = self.data.setdefault(section, [])
        k = store_mod._key(section, entry)
        for i, e in enumerate(entries):
            if store_mod._key(section, e) == k:
                entries[i] = store_mod._merge_kernel(entry, e) if section == "kernels" else entry
                break
        else:
            entries.append(entry)
        self._added[(section, *k)] = (section, json.loads(json.dumps(entry)))

    def set_ceilings(self, ceilings: dict) -> None:
        self.data["ceilings"] = dict(self.data.get("ceilings") or {}, **ceilings)

    def added(self) -> list[tuple[str, dict]]:
        return list(self._added.values())


def seed_for(store, unit: Unit, chunk: int) -> list[tuple[str, dict]]:
    """What the store already holds for a unit: a resumed unit measures only what is missing."""
    if unit.section == "kernels":
        found = store.find("kernels", kernel=unit.kernel, bucket=unit.bucket)
        return [("kernels", found)] if found else []
    if unit.section == "paths":
        rows = [
            store.find("paths", batch=unit.batch, new=unit.new, prefix=unit.prefix, path=path)
            for path in sweep._paths_at(unit.prefix, chunk)
        ]
        return [("paths", r) for r in rows if r is not None]
    return []


def is_done(store, unit: Unit, backend: str, chunk: int) -> bool:
    """Whether a rerun can skip the unit without asking a worker (resume)."""
    found = seed_for(store, unit, chunk)
    if unit.section == "paths":
        return len(found) == len(sweep._paths_at(unit.prefix, chunk))
    if unit.section == "kernels":  # the twins: one timing per bucket; Triton: the worker knows the space
        return backend == "torch" and bool(found) and "twin_median_s" in found[0][1]
    return bool((store.data.get("ceilings") or {}).get("peak_tflops"))


def measure_unit(ctx, unit: Unit, chunk: int = 8192, override: list | None = None) -> dict:
    """Measure one unit with `ctx` (a sweep.Context whose store is a UnitStore); `override`, a
    list of configs to search instead of the kernel's space (`tune kernels --space`).

    Returns {"entries": [(section, entry)], "skipped": [line], "ceilings": dict | None}.
    """
    skipped_before = len(ctx.skipped)
    ceilings = None
    if unit.section == "kernels":
        spec = spaces.KERNELS[unit.kernel]
        cost = spaces.cost_model(ctx.cfg, unit.kernel, ctx.kv_dtype, ctx.dtype)
        smem = sweep._smem_limit(ctx.device, ctx.hw)
        configs = None  # the last stage: whatever no part tried, then the split-KV factors
        if unit.part >= 0 and ctx.backend != "torch":
            candidates = override
            if candidates is None:  # what the serial run tries, in its order: the shipped config first
                candidates = spaces.candidates(spec, ctx.cfg, unit.shape, ctx.kv_dtype, ctx.dtype, smem, ctx.quick)
            configs = candidates[unit.part :: unit.parts]
        sweep._tune_bucket(ctx, spec, unit.shape, unit.bucket, cost, smem, configs)
    elif unit.section == "paths":
        cost = CostModel(ctx.cfg, kv_dtype=ctx.kv_dtype, dtype=ctx.dtype, chunk=chunk)
        sweep._measure_point(ctx, cost, unit.batch, unit.new, unit.prefix, chunk)
    else:
        ceilings = sweep.tune_ceilings(ctx, write_profile=False)
    return {"entries": ctx.store.added(), "skipped": ctx.skipped[skipped_before:], "ceilings": ceilings}
