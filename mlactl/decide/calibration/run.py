"""`mlactl calibrate` as library calls: points from a source, fits, a calibration file's dict."""

from __future__ import annotations

import datetime as _dt

import numpy as np

from mlactl import __version__
from mlactl.decide.calibration import aiconfigurator as ac
from mlactl.decide.calibration.fit import Machine
from mlactl.decide.calibration.selection import fit_groups
from mlactl.decide.calibration.sources import _concat, csv_points, results_points
from mlactl.decide.calibration.store import SCHEMA, SCHEMA_VERSION, safe_name
from mlactl.decide.engines import arch_of
from mlactl.model import hardware
from mlactl.model.hardware import HardwareProfile
from mlactl.results import store as results
from mlactl.results.measured import DIMS  # the dims a whole-path fit was measured at
from mlactl.util.errors import MlactlError

# aiconfigurator system -> mlactl hardware profile
SYSTEM_PROFILES = {
    "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "a100_sxm": "a100-sxm", "gb200": "gb200",
    "b300_sxm": "b300", "gb300": "gb300", "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000",
}  # fmt: skip


def machine_for(hw: HardwareProfile, dtype: str = "bf16") -> Machine:
    return Machine(
        hw.peak_flops(dtype),
        hw.bandwidth,
        hw.sm_count,
        l2_bytes=hw.l2_bytes,
        memory_bytes=hw.memory_bytes,
        arch=arch_of(hw),
    )


def ceilings(hw: HardwareProfile, dtype: str = "bf16") -> dict:
    return {
        "peak_flops": hw.peak_flops(dtype),
        "bandwidth_bytes_per_s": hw.bandwidth,
        "sm_count": hw.sm_count,
        "dtype": dtype,
    }


def build(
    name: str, hw: HardwareProfile, source: dict, groups: dict, select: bool = True, terms=None
) -> tuple[dict, list]:
    """Fit every group and assemble the calibration file's dict; returns (data, fit results).
    `terms`: fit these terms (those that act on each op class) instead of selecting them."""

    if not groups:
        raise MlactlError("no measured points to calibrate from")
    dtype = source.get("dtype", "bf16")  # the runs' compute dtype: fits divide by its peak
    results = fit_groups(groups, machine_for(hw, dtype), select_terms=select, terms=terms)
    data = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "name": safe_name(name),
        "hardware": hw.name,
        "ceilings": ceilings(hw, dtype),
        "source": source,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mlactl_version": __version__,
        "fits": [r.to_json() for r in results],
    }
    return data, results


def from_aiconfigurator(system: str, framework: str, version: str | None, data_dir, hw: HardwareProfile | None):

    folder = ac.default_data_dir() if data_dir is None else data_dir
    tables = ac.find_tables(folder, system, framework, version)
    if hw is None:
        if system not in SYSTEM_PROFILES:
            raise MlactlError(f"no hardware profile for system {system!r}: pass --hardware NAME|FILE")
        hw = hardware.from_name(SYSTEM_PROFILES[system])
    groups, left = table_groups(tables, framework)
    versions = sorted({t.version for t in tables})
    source = {
        "kind": "aiconfigurator",
        "system": system,
        "framework": framework,
        "version": "+".join(versions),
        "files": [str(t.path) for t in tables],
        **({"left_out": left} if left else {}),
    }
    name = f"{hw.name}-aiconfigurator-{framework}-{'+'.join(versions)}"
    return name, hw, source, groups


def from_results(files, hw: HardwareProfile | None):

    groups = results_groups(files)
    hw_names, dtypes, runs = set(), {}, []
    for f in files:
        data = results.load(f)
        device = data.get("device") or {}
        hw_names.add(device.get("hardware"))
        dtypes[str(f)] = data.get("dtype", "bf16")
        runs.append((tuple((data.get("model") or {}).get(k) for k in DIMS), data.get("kv_dtype"), device.get("name")))
    if hw is None:
        known = {h for h in hw_names if h}
        if len(known) != 1 or None in hw_names:
            raise MlactlError(
                "the results files name no single hardware profile (a CPU run has none): pass --hardware NAME|FILE"
            )
        hw = hardware.from_name(known.pop())
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{f} ({d})" for f, d in dtypes.items())
        raise MlactlError(f"the results files computed in different dtypes: {listed}; calibrate each dtype alone")
    source = {"kind": "results", "files": [str(f) for f in files], "dtype": next(iter(dtypes.values()))}
    if len(set(runs)) == 1:  # what `mla_attention(path="auto")` matches a calibration of its own paths by
        dims, kv_dtype, device = runs[0]
        source.update(model=dict(zip(DIMS, dims)), kv_dtype=kv_dtype, device=device)
    stem = "+".join(sorted({str(f).rsplit("/", 1)[-1].removesuffix(".json") for f in files}))[:80]
    return f"{hw.name}-results-{stem}", hw, source, groups


def table_groups(tables, framework: str) -> tuple[dict, list[dict]]:
    """({(op, source, dtype): Points} of aiconfigurator tables, the groups left out); a source
    names the framework's version and kernel, and ends in the table's phase (:decode, :prefill).
    A group whose rows are not kernel times (ac.eager) is left out, with its rows, its shortest
    time and why."""
    groups, left = {}, []
    for t in tables:
        folder, stem = t.name.split("/")
        phase = ac.PHASES.get(stem, "")
        for (op, src, dtype), pts in ac.table_points(t).items():
            source = f"{framework}-{t.version}:{src}{phase}"
            why = ac.eager(framework, folder, dtype)
            if why is None:
                groups[(op, source, dtype)] = pts
            else:
                shortest = float(np.min(np.asarray(pts.time_s, dtype=np.float64)))
                left.append(
                    {"op": op, "source": source, "dtype": dtype, "rows": len(pts), "shortest_s": shortest, "why": why}
                )
    return groups, left


def aiconfigurator_groups(system: str, framework: str, version: str | None, data_dir) -> tuple[dict, list[dict]]:
    """The groups of `from_aiconfigurator` and those it leaves out, for scoring."""
    folder = ac.default_data_dir() if data_dir is None else data_dir
    return table_groups(ac.find_tables(folder, system, framework, version), framework)


def results_groups(files) -> dict:
    """{(op, source, dtype): Points} of `mlactl tune` results files, keyed as `from_results`."""
    groups: dict = {}
    for f in files:
        for key, pts in results_points(results.load(f), str(f)).items():
            groups[key] = _concat([groups[key], pts]) if key in groups else pts
    return groups


def from_csv(file, cfg, hw: HardwareProfile):

    groups = csv_points(file, cfg)
    source = {"kind": "csv", "files": [str(file)], "model": cfg.name}
    return f"{hw.name}-csv-{str(file).rsplit('/', 1)[-1].removesuffix('.csv')}", hw, source, groups
