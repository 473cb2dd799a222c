"""Keeping what `mlactl tune` measures: the results file of a run, and tuned kernel configs.

A run's results file is rewritten after every measurement (atomically, under a lock, merged
with whatever another process wrote meanwhile), so a killed run keeps everything it finished and
a rerun skips it. A run is identified by its file: by default one per device, model, tensor
parallelism, dtypes and backend under $MLACTL_HOME/results/. Nothing a user measured is thrown
away: `--force` moves the old file aside before starting over, under the file's lock (so it waits
for a process that is writing it), to a name no other file has (created exclusively, never over
an existing backup). Entries of a resumed file that fail the schema are dropped with a warning and
measured again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mlactl.kernels import configs
from mlactl.results import store as results
from mlactl.util import dirs
from mlactl.util.errors import MlactlError, warn
from mlactl.util.io import atomic_write, keep_aside, locked


def _key(section: str, entry: dict) -> tuple:
    if section == "kernels":
        return (entry["kernel"], entry["bucket"])
    if section == "paths":
        return (entry["batch"], entry["new"], entry["prefix"], entry["path"])
    if section == "crossovers":
        return (entry["batch"], entry["prefix"])
    raise ValueError(section)


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def _merge_kernel(ours: dict, theirs: dict) -> dict:
    """One kernel bucket: the union of the configs tried, ours winning on the same config."""
    configs = {config_key(c["config"]): c for c in theirs.get("configs", [])}
    configs.update({config_key(c["config"]): c for c in ours.get("configs", [])})
    merged = dict(theirs, **ours)
    merged["configs"] = list(configs.values())
    return merged


def merge(ours: dict, theirs: dict) -> dict:
    """Entries of both, keyed per section; on the same key ours win (kernels merge config lists)."""
    out = dict(theirs, **{k: v for k, v in ours.items() if k not in results.SECTIONS})
    for section in ("kernels", "paths", "crossovers"):
        entries = {_key(section, e): e for e in theirs.get(section, [])}
        for e in ours.get(section, []):
            k = _key(section, e)
            entries[k] = _merge_kernel(e, entries[k]) if section == "kernels" and k in entries else e
        out[section] = list(entries.values())
    ceilings = dict(theirs.get("ceilings") or {})
    ceilings.update(ours.get("ceilings") or {})
    if ceilings:
        out["ceilings"] = ceilings
    return out


IDENTITY = ("device", "backend", "model", "kv_dtype", "dtype")


def default_path(device_slug: str, model: str, tp: int, dtype: str, kv_dtype: str, backend: str) -> Path:
    """$MLACTL_HOME/results/DEVICE/MODEL-....json; every name made safe as one path component (a
    config.json's _name_or_path of '../../x' or '/tmp/x' must not lead outside $MLACTL_HOME)."""
    name = dirs.path_component(f"{model}-tp{tp}-{dtype}-kv{kv_dtype}-{backend}")
    return dirs.results_dir() / dirs.path_component(device_slug) / f"{name}.json"


def _finite(value):
    """JSON without NaN or Infinity (not JSON): a non-finite float is stored as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class ResultsStore:
    """The results file of one run, kept up to date on disk after every `add`."""

    def __init__(self, path: str | Path, header: dict, force: bool = False):
        self.path = Path(path)
        self.moved_aside: Path | None = None
        existing = None
        if self.path.is_dir():
            raise MlactlError(f"--results-file {self.path} is a directory; give a file name, e.g. {self.path}/run.json")
        if force:
            with locked(self.path):  # waits while another process writes it; then nobody can
                if self.path.exists():
                    self.moved_aside = self._move_aside()
        elif self.path.exists():
            try:
                existing = results.load(self.path, drop_bad=True)
                self._check_same_run(existing, header)
            except MlactlError as exc:
                raise MlactlError(
                    f"{exc}; pass --force to start over (the old file is kept "
                    "beside it) or choose another --results-file"
                ) from None
            for problem in existing.pop("_dropped", []):
                warn(f"{self.path}: {problem}; that entry will be measured again")
        self.data = existing if existing is not None else dict(header, kernels=[], paths=[], crossovers=[])
        self.resumed = existing is not None
        self._save()

    def _check_same_run(self, old: dict, header: dict) -> None:
        for key in IDENTITY + ("versions",):
            if old.get(key) != header.get(key):
                raise MlactlError(
                    f"{self.path} holds another run ({key} was {old.get(key)!r}, now {header.get(key)!r})"
                )

    def _move_aside(self) -> Path:
        """Rename the file to NAME.STAMP[.N].json (mlactl.util.io.keep_aside): a name reserved
        first with an exclusive create, so no backup another run just made is overwritten."""
        return keep_aside(self.path)

    def _save(self) -> None:
        with locked(self.path):
            on_disk = None
            if self.path.exists():
                try:
                    on_disk = results.load(self.path, drop_bad=True)
                    on_disk.pop("_dropped", None)
                except MlactlError:
                    on_disk = None  # never merge a corrupt file; ours replaces it
            if on_disk is not None and all(on_disk.get(k) == self.data.get(k) for k in IDENTITY):
                self.data = merge(self.data, on_disk)
            # this run's own file, read above to merge: an update, not an input overwritten
            atomic_write(self.path, json.dumps(_finite(self.data), indent=1, allow_nan=False) + "\n", update=True)

    # -- reading ---------------------------------------------------------------------------------

    def find(self, section: str, **key) -> dict | None:
        want = _key(section, key)
        for entry in self.data.get(section, []):
            if _key(section, entry) == want:
                return entry
        return None

    # -- writing ---------------------------------------------------------------------------------

    def add(self, section: str, entry: dict) -> None:
        """Add or replace one entry (kernels: merged by config) and save."""
        entries = self.data.setdefault(section, [])
        k = _key(section, entry)
        for i, e in enumerate(entries):
            if _key(section, e) == k:
                entries[i] = _merge_kernel(entry, e) if section == "kernels" else entry
                break
        else:
            entries.append(entry)
        self._save()

    def set_ceilings(self, ceilings: dict) -> None:
        self.data["ceilings"] = dict(self.data.get("ceilings") or {}, **ceilings)
        self._save()


def write_tuned_config(
    kernel: str,
    device_name: str,
    dtype: str,
    bucket: str,
    config: dict,
    triton_version: str,
    folder: Path | None = None,
) -> Path:
    """Record the best config of one bucket in the user's tuned-config file (merged, locked)."""

    folder = folder or configs.user_dir()
    path = folder / configs.file_name(kernel, device_name, dtype)
    with locked(path):
        data: dict = {
            "version": configs.FORMAT_VERSION,
            "kernel": kernel,
            "device_name": device_name,
            "dtype": dtype,
            "configs": {},
        }
        if path.exists():
            try:
                old = configs.load(path)
                data["configs"].update(old["configs"])
            except (OSError, ValueError) as exc:
                raise MlactlError(f"{path}: {exc}; move it away to let tune write a new one") from None
        data["triton_version"] = triton_version
        data["configs"][bucket] = config
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n", update=True)
    return path
