"""Calibration files: versioned JSON under $MLACTL_HOME/calibrations/, written atomically.

{
  "schema": "mlactl.calibration", "schema_version": 1,
  "name": "h200-aiconfigurator-sglang-0.5.14",     # file stem; what --calibration NAME finds
  "hardware": "h200",                              # the profile the fit divided by
  "ceilings": {"peak_flops": 9.89e14, "bandwidth_bytes_per_s": 4.8e12, "sm_count": 132,
               "dtype": "bf16"},                   # the peak fits divided by: the measured runs' dtype
  "source": {"kind": "aiconfigurator", "system": "h200_sxm", "framework": "sglang",
             "version": "0.5.14", "files": [...]},
  "created": "2026-11-30T12:00:00Z", "mlactl_version": "0.1.0",
  "fits": [{"op": "absorb_attention", "source": "flash_attention", "dtype": "bf16",
            "terms": ["fixed", "kvpad", "serial"], "n": 1448,
            "params": {"t_fixed_s": 1.3e-5, "eta_c": 0.55, "eta_m": 0.8, "t_iter_s": 3e-7},
            "in_sample": {"median": 0.1, "p90": 0.2}, "held_out": {"median": 0.11, "p90": 0.25}}]
}
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from mlactl.decide.calibration.evidence import check_evidence
from mlactl.decide.calibration.model import OP_CLASSES, PATH_CLASSES, TERMS, param_names
from mlactl.util import dirs
from mlactl.util.errors import MlactlError, warn
from mlactl.util.io import atomic_write, read_json

SCHEMA = "mlactl.calibration"
# Each fit may carry its evidence (mlactl calibrate writes it since issue 22): "range", "shapes",
# "interval", "members", "blocked" (mlactl.decide.calibration.evidence). A fit without it (a file
# from an earlier mlactl, or written by hand) predicts as before, without an interval, and every
# op it times has basis `extrapolated` by an unknown distance: nothing says where it was measured.
SCHEMA_VERSION = 1


def calibrations_dir() -> Path:
    return dirs.home() / "calibrations"


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "calibration"


@dataclass(frozen=True)
class Calibration:
    name: str
    hardware: str
    data: dict
    path: str | None = None

    @property
    def fits(self) -> list[dict]:
        return self.data["fits"]

    def peak(self, hw) -> float:
        """The peak the fits divided by (the dtype the measured runs computed in; bf16 for files
        that do not say): predictions must divide by the same one, whatever dtype is analysed."""
        return hw.peak_flops((self.data.get("ceilings") or {}).get("dtype", "bf16"))

    def fit_for(self, op: str, dtype: str | None = None, phase: str | None = None) -> dict | None:
        """The fit of an op class: of the wanted dtype if there is one, then of the phase
        (`prefill` or `decode`, the end of its source) if there is one, else the first listed."""
        found = [f for f in self.fits if f["op"] == op]
        if not found:
            return None
        found = [f for f in found if f.get("dtype") == dtype] or found
        if phase is not None:
            found = [f for f in found if str(f.get("source", "")).endswith(":" + phase)] or found
        return found[0]

    def describe(self) -> dict:
        """What JSON outputs record about the calibration used."""
        return {"name": self.name, "hardware": self.hardware, "path": self.path, "source": self.data.get("source")}


def validate(data, where: str) -> Calibration:
    """Check every field a prediction reads; one MlactlError line on anything wrong."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MlactlError(f'{where} is not an mlactl calibration file (no "schema": "{SCHEMA}")')
    if data.get("schema_version") != SCHEMA_VERSION:
        raise MlactlError(
            f"{where} has calibration schema version {data.get('schema_version')!r}; this mlactl reads "
            f"version {SCHEMA_VERSION} (run `mlactl calibrate` again)"
        )
    for key in ("name", "hardware"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise MlactlError(f"{where}: {key!r} must be a non-empty string")
    fits = data.get("fits")
    if not isinstance(fits, list) or not fits:
        raise MlactlError(f"{where}: 'fits' must be a non-empty list")
    for i, f in enumerate(fits):
        at = f"{where}: fits[{i}]"
        if not isinstance(f, dict):
            raise MlactlError(f"{at} must be an object")
        if f.get("op") not in OP_CLASSES + PATH_CLASSES:
            raise MlactlError(f"{at}: unknown op {f.get('op')!r}; ops: {', '.join(OP_CLASSES + PATH_CLASSES)}")
        _check_model(f, at)
        check_evidence(f, at, _check_model)
    return Calibration(data["name"], data["hardware"], data, where)


def _check_model(f: dict, at: str) -> None:
    """A fit's (or a member's) terms and the parameters they need."""
    terms = f.get("terms")
    if not isinstance(terms, list) or any(t not in TERMS for t in terms):
        raise MlactlError(f"{at}: 'terms' must list some of {', '.join(TERMS)}")
    params = f.get("params")
    if not isinstance(params, dict):
        raise MlactlError(f"{at}: 'params' must be an object")
    need = set(param_names(terms)) - ({"t_fixed_s"} if "fixed" not in terms else set())
    for k in sorted(need):
        v = params.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v != v or v == float("inf"):
            raise MlactlError(f"{at}: params.{k} must be a finite number >= 0, got {v!r}")
    if any(params[k] <= 0 for k in ("eta_c", "eta_m", "eta_q", "eta_x", "eta_p", "eta_s") if k in need):
        raise MlactlError(f"{at}: efficiencies (eta_*) must be positive")
    if "near" in terms:
        _check_near(params.get("near"), at)


def _check_near(table, at: str) -> None:
    """The `near` term's residual table: features [log2 rows, log2 heads, unaligned] per measured
    point and its log residual, as many of each, all finite."""

    bad = f"{at}: params.near must be {{'features': [[x, y, z], ...], 'log_residual': [r, ...]}} of equal length"
    if not isinstance(table, dict):
        raise MlactlError(bad)
    feats, res = table.get("features"), table.get("log_residual")
    if not isinstance(feats, list) or not isinstance(res, list) or not feats or len(feats) != len(res):
        raise MlactlError(bad)

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not all(isinstance(f, list) and len(f) == 3 and all(number(v) for v in f) for f in feats):
        raise MlactlError(bad)
    if not all(number(v) for v in res):
        raise MlactlError(bad)


def load(path: str | Path) -> Calibration:

    return validate(read_json(path, "calibration file"), str(path))


def names() -> list[str]:
    folder = calibrations_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def resolve(spec: str) -> Calibration:
    """--calibration NAME (a file in $MLACTL_HOME/calibrations/) or FILE."""
    if spec.endswith(".json") or "/" in spec:
        if not Path(spec).is_file():
            raise MlactlError(f"--calibration {spec}: no such file")
        return load(spec)
    path = calibrations_dir() / f"{spec}.json"
    if not path.is_file():
        have = names()
        raise MlactlError(
            f"no calibration named {spec!r} in {calibrations_dir()}; "
            + (f"known: {', '.join(have)}" if have else "run `mlactl calibrate` first")
        )
    return load(path)


def find_own(hw_name: str, dims: dict, kv_dtype: str) -> Calibration | None:
    """The newest calibration of mlactl's own paths (`mlactl calibrate --from results` on
    `mlactl tune paths` runs) made for this hardware profile, these model dims and this cache
    dtype, with a whole-path fit of expand and of absorb; None if there is none. Never one of
    another engine's kernels (aiconfigurator, CSV). A bad file is skipped with a warning."""

    found = []
    folder = calibrations_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            cal = load(path)
        except MlactlError as exc:
            warn(f"skipped {exc}")
            continue
        source = cal.data.get("source") or {}
        ops = {f["op"] for f in cal.fits}
        if (
            source.get("kind") == "results"
            and cal.hardware == hw_name
            and source.get("model") == dims
            and source.get("kv_dtype") == kv_dtype
            and {"path:expand", "path:absorb"} <= ops
        ):
            found.append((str(cal.data.get("created", "")), str(path), cal))
    return max(found)[2] if found else None


def check_hardware(cal: Calibration, hw_name: str) -> None:
    if cal.hardware != hw_name:
        raise MlactlError(
            f"calibration {cal.name!r} was made for hardware {cal.hardware!r}, not {hw_name!r}: "
            f"pass --hardware {cal.hardware}, or calibrate for {hw_name}"
        )


def write(data: dict, folder: Path | None = None) -> Path:
    """Validate, then write atomically as <folder>/<name>.json; returns the path."""

    validate(data, "the new calibration")
    path = (folder or calibrations_dir()) / f"{safe_name(data['name'])}.json"
    atomic_write(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path
