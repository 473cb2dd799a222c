"""Which results file `analyze --policy measured` reads, and what it takes from it.

A results file says for which model (with its tensor parallelism), dtypes and device it was
measured. With `--results FILE` those become the run's settings: a flag the user gave that says
otherwise is an error, and all such conflicts are reported in one message. Without a file, the
newest one `mlactl tune paths` left for these model dims is looked up; the flags the user did not
give (cache dtype, hardware) do not filter it, since a CPU run is fp32 and has no GPU profile.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlactl.model import config as models
from mlactl.model import hardware
from mlactl.results import store
from mlactl.util import dirs
from mlactl.util.errors import MlactlError, warn
from mlactl.util.io import store_files

DIMS = ("H", "r", "dC", "dR", "dV")


def file_hardware(data: dict) -> str | None:
    """The hardware profile a results file was measured on: the one tune recorded, else the one
    whose `match` fits the device name (a CPU's `cpu` profile, once `tune ceilings` wrote it)."""
    device = data.get("device") or {}
    if device.get("hardware"):
        return str(device["hardware"])
    found = hardware.detect(str(device.get("name", "")))
    return found.name if found is not None else None


@dataclass
class Adopted:
    """What a results file set, and the lines that tell the user so."""

    model: str
    tp: int
    dtype: str
    kv_dtype: str
    hardware: str | None
    notes: list[str] = field(default_factory=list)


def _file_model(data: dict) -> tuple[str | None, int]:
    """The model name and tensor parallelism a results file was measured with."""
    model = data.get("model") or {}
    return model.get("name"), int(model.get("tp", 1) or 1)


def _same(key: str, want: str, have) -> bool:
    """Whether a flag's value names what the file has (a path or an alias resolved first)."""
    if key == "model":
        return models.resolve(want).name == have
    if key == "hardware":
        return hardware.resolve(want).name == have
    return want.strip().lower() == str(have).lower()


FLAGS = {"model": "--model", "tp": "--tp", "dtype": "--dtype", "kv_dtype": "--kv-dtype", "hardware": "--hardware"}


def adopt(data: dict, where: str, given: dict[str, str | None]) -> Adopted:
    """The settings of the results file at `where`; `given` maps model, tp, dtype, kv_dtype and
    hardware to what the user passed explicitly (None: not given). Conflicts: one MlactlError
    that lists them all."""

    model_name, file_tp = _file_model(data)
    values = {
        "model": model_name,
        "tp": str(file_tp),
        "dtype": data.get("dtype"),
        "kv_dtype": data.get("kv_dtype"),
        "hardware": file_hardware(data),
    }
    conflicts = [
        f"{flag} {given[key]} (the file has {values[key]})"
        for key, flag in FLAGS.items()
        if given.get(key) is not None and values[key] is not None and not _same(key, str(given[key]), values[key])
    ]
    if conflicts:
        raise MlactlError(
            f"{where} was measured with other settings: {'; '.join(conflicts)}; "
            "drop these flags to use the file's, or pass another results file"
        )
    if given.get("model") is None and model_name not in models.preset_names():
        raise MlactlError(f"{where} was measured for model {model_name!r}, not a preset: pass --model CONFIG.json")
    device = (data.get("device") or {}).get("name", "?")
    picked = Adopted(
        model=given.get("model") or str(model_name),
        tp=int(given.get("tp") or file_tp),
        dtype=str(values["dtype"] or given.get("dtype") or "bf16"),
        kv_dtype=str(values["kv_dtype"] or given.get("kv_dtype") or "bf16"),
        hardware=given.get("hardware") or values["hardware"],
    )
    taken = [f"model {model_name}", f"tp {file_tp}", f"dtype {picked.dtype}", f"kv {picked.kv_dtype}"]
    if values["hardware"] is not None:
        taken.append(f"hardware {values['hardware']}")
    picked.notes.append(f"settings from {where} (measured on {device}): {', '.join(taken)}")
    if values["hardware"] is None and given.get("hardware") is None:
        picked.notes.append(
            f"{device} has no hardware profile (`mlactl tune ceilings` writes one), so the roofline "
            "columns are for the default --hardware"
        )
    return picked


def find(
    dims: dict,
    kv_dtype: str | None,
    hardware_name: str | None,
    folder: Path | None = None,
) -> tuple[dict | None, Path | None]:
    """The newest results file with a measured crossover for these model dims; `kv_dtype` and
    `hardware_name` filter only when not None. A file whose device has no recorded hardware
    (every CPU run) matches a hardware name through the profile detected for its device."""
    return find_results(dims, kv_dtype, hardware_name=hardware_name, folder=folder)


def usable_crossovers(data: dict) -> bool:
    """A crossover row tells the policy something unless the budget cut its sweep short: a
    measured count, or "expand never won" over the counts measured (absorb everywhere)."""
    return any(r.get("measured") is not None or r.get("measured_status") == "never" for r in data.get("crossovers", []))


def find_results(
    dims: dict,
    kv_dtype: str | None,
    *,
    device_name: str | None = None,
    hardware_name: str | None = None,
    folder: Path | None = None,
):
    """The newest results file with a usable measured crossover for a model with these dims {H, r,
    dC, dR, dV}: (data, path), or (None, None). Each filter applies only when not None: the cache
    dtype, the device (by CUDA name: its folder), the hardware profile (a file with no recorded
    hardware, as every CPU run, matches through the profile detected for its device). A file that
    fails the schema is skipped with a warning naming it. The one lookup behind `mla_attention(
    path="auto")` and `analyze --policy measured`."""
    root = folder or dirs.results_dir()
    if folder is None and device_name is not None:
        root = root / dirs.device_slug(device_name)
    best, best_created, best_path = None, "", None
    for path in store_files(root, "*.json", recursive=True):  # a FIFO there: skipped, with a warning
        try:
            data = store.load(path)
        except MlactlError as exc:  # one bad file must not hide the others, nor stop the command
            warn(f"skipped {exc}")
            continue
        model, device = data.get("model", {}), data["device"]
        if any(model.get(k) != v for k, v in dims.items()):
            continue
        if kv_dtype is not None and data.get("kv_dtype") != kv_dtype:
            continue
        if device_name is not None and device.get("name") != device_name:
            continue
        if hardware_name is not None and file_hardware(data) != hardware_name:
            continue
        if not usable_crossovers(data):
            continue
        if data.get("created", "") >= best_created:
            best, best_created, best_path = data, data.get("created", ""), path
    return best, best_path


def find_crossovers(device_name: str, dims: dict, kv_dtype: str, folder: Path | None = None, batch: int | None = None):
    """The measured crossovers of the newest matching results file for this device:
    ({prefix: crossover}, path), or (None, None). How `mla_attention(path="auto")` finds the
    measured policy `mlactl tune paths` left."""
    data, path = find_results(dims, kv_dtype, device_name=device_name, folder=folder)
    if data is None:
        return None, None
    return store.measured_crossovers(data, batch), path


@dataclass(frozen=True)
class ResultsFile:
    """One results file of the store (`mlactl tune list`): its path, and the run read from it,
    or why it cannot be read (`problem`: the schema's line)."""

    path: Path
    data: dict | None = None
    problem: str | None = None

    def summary(self) -> dict:
        """What was measured where: the run, its device and profile, backend, model and dtypes,
        and how much of each section (kernel buckets, path points, crossovers with a measured
        count, ceilings or not)."""
        d = self.data
        if d is None:
            return {"path": str(self.path), "problem": self.problem}
        model, device = d.get("model") or {}, d.get("device") or {}
        crossovers = d.get("crossovers") or []
        return {
            "path": str(self.path),
            "run_id": d.get("run_id"),
            "created": d.get("created"),
            "device": device.get("name"),
            "hardware": file_hardware(d),
            "backend": d.get("backend"),
            "model": model.get("name"),
            "tp": int(model.get("tp", 1) or 1),
            "kv_dtype": d.get("kv_dtype"),
            "dtype": d.get("dtype"),
            "kernels": len(d.get("kernels") or []),
            "paths": len(d.get("paths") or []),
            "crossovers": len(crossovers),
            "crossovers_measured": sum(1 for r in crossovers if r.get("measured") is not None),
            "ceilings": bool(d.get("ceilings")),
            "problem": None,
        }


def runs(folder: Path | None = None) -> list[ResultsFile]:
    """Every results file under `folder` (default $MLACTL_HOME/results/, every device's folder),
    newest first; one that fails the schema is listed with its problem, not passed over."""
    found = []
    for path in store_files(folder or dirs.results_dir(), "*.json", recursive=True):
        try:
            found.append(ResultsFile(path, store.load(path)))
        except MlactlError as exc:
            found.append(ResultsFile(path, problem=str(exc)))
    return sorted(found, key=lambda r: str((r.data or {}).get("created", "")), reverse=True)


def runs_json(folder: Path, found: list[ResultsFile]) -> dict:
    """`mlactl tune list --format json`: the folder and each results file's summary."""
    return {
        "schema": "mlactl.results-list",
        "schema_version": 1,
        "folder": str(folder),
        "results": [r.summary() for r in found],
    }
