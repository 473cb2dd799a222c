"""Calibration files: versioned JSON under $MLACTL_HOME/calibrations/, written atomically.

{
  "schema": "mlactl.calibration", "schema_version": 1,
  "name": "h200-aiconfigurator-sglang-0.5.14",     # file stem; what --calibration NAME finds
  "hardware": "h200",                              # the profile the fit divided by
  "ceilings": {"peak_flops": 9.89e14, "bandwidth_bytes_per_s": 4.8e12, "sm_count": 132,
               "dtype": "bf16"},                   # the peak fits divided by: the measured runs' dtype
  "source": {"kind": "aiconfigurator", "system": "h200_sxm", "framework": "sglang",
             "version": "0.5.14", "files": [...]},
  "transfer": {"from": {"hardware": "h200", "calibration": "...", "ceilings": {...}}, "to": "b300",
               "error_model": {...}},        # only in a calibration `mlactl calibrate transfer` wrote;
                                             # each of its fits has "transfer" too (transfer.py)
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
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from mlactl.decide.calibration.evidence import check_evidence
from mlactl.decide.calibration.terms import (  # noqa: F401  (the ranges and eta_limit: re-exported)
    ATTENTION_CLASSES,
    BLOCK_MAX,
    BUDGET_BYTES_MAX,
    ETA_LOWEST,
    ITER_SECONDS_MAX,
    L2_BYTES_MAX,
    L2_GAIN_MAX,
    OP_CLASSES,
    PARAMS,
    PATH_CLASSES,
    SECONDS_MAX,
    SIZES,
    TERMS,
    Terms,
    eta_limit,
    param_names,
)
from mlactl.util import dirs, safe
from mlactl.util import schema as S
from mlactl.util.errors import MlactlError, warn
from mlactl.util.io import atomic_write, contained, keep_aside, locked, read_json, store_files

SCHEMA = "mlactl.calibration"
# Each fit may carry its evidence (mlactl calibrate writes it since 0.1): "range", "shapes",
# "interval", "members", "blocked" (mlactl.decide.calibration.evidence). A fit without it (a file
# from an earlier mlactl, or written by hand) predicts as before, without an interval, and every
# op it times has basis `extrapolated` by an unknown distance: nothing says where it was measured.
SCHEMA_VERSION = 1
PHASES = ("decode", "prefill")  # a fit's phase: the end of its source (aiconfigurator's two tables)


def calibrations_dir() -> Path:
    return dirs.home() / "calibrations"


def safe_name(text: str) -> str:
    """A calibration's name as its file's stem (mlactl.util.safe.filename)."""
    return safe.filename(text) if str(text).strip() else "calibration"


def phase_of(source) -> str | None:
    """The phase a source names at its end (`sglang-0.5.14:flash_attention:decode`), or None."""
    return next((p for p in PHASES if str(source or "").endswith(":" + p)), None)


def kernel_of(source) -> str:
    """The kernel source a fit was measured on: an aiconfigurator source without its framework
    and phase (`sglang-0.5.14:flash_attention:decode` -> `flash_attention`), else the source."""
    parts = str(source or "").split(":")
    if len(parts) > 1 and parts[-1] in PHASES:
        parts.pop()
    return ":".join(parts[1:]) if len(parts) > 1 else parts[0]


@dataclass(frozen=True, eq=False)
class Model:
    """A term set and its fitted parameters: a fit, or one of its members."""

    terms: tuple[str, ...]
    params: dict

    @property
    def on(self) -> Terms:
        """The terms as typed flags (`fit.on.near`)."""
        return Terms.of(self.terms)

    def terms_for(self, cls: str) -> tuple[str, ...]:
        """The terms it predicts op class `cls` with: its own, and `split` for an absorb attention
        fit with waves but no split: a fit on prefill tables (prefix 0) never saw few CTAs over a
        long cache; there the kernel splits the KV (the split term has no parameter to fit)."""
        if cls == "absorb_attention" and self.on.waves and not self.on.split:
            return (*self.terms, "split")
        return self.terms

    @classmethod
    def of(cls, entry: dict) -> Model:
        return cls(tuple(entry["terms"]), entry["params"])


@dataclass(frozen=True, eq=False)
class Fit(Model):
    """One fit of a calibration file, typed; `entry` is the file's object as read (and written).
    Its evidence (evidence.py): the measured `range` and `shapes`, the `interval` and the
    `members` (term sets that fit about as well); `transfer`: a transferred fit's record."""

    op: str = ""
    source: str | None = None
    dtype: str | None = None
    entry: dict = field(default_factory=dict)
    members: tuple[Model, ...] = ()
    range: dict | None = None
    shapes: list | None = None
    interval: dict = field(default_factory=dict)
    transfer: dict | None = None

    @classmethod
    def of(cls, entry: dict) -> Fit:
        return cls(
            tuple(entry["terms"]), entry["params"], entry["op"], entry.get("source"), entry.get("dtype"), entry,
            tuple(Model.of(m) for m in entry.get("members") or ()), entry.get("range"), entry.get("shapes"),
            entry.get("interval") or {}, entry.get("transfer"),
        )  # fmt: skip

    @property
    def phase(self) -> str | None:
        """`decode`, `prefill` (the aiconfigurator table it was fitted on), or None: both."""
        return phase_of(self.source)

    @property
    def kernel(self) -> str:
        """The kernel it was measured on (`kernel_of` its source)."""
        return kernel_of(self.source)

    @property
    def target_kernel(self) -> str | None:
        """The kernel the GPU a transferred fit was carried to runs (None: not transferred)."""
        return ((self.transfer or {}).get("kernel") or {}).get("target")


def fit_dtype(cost, cls: str) -> str:
    """The dtype a fit of op class `cls` is looked up by: the cache's for attention and whole
    paths, the compute dtype's for the rest."""
    return cost.kv_dtype if cls in ATTENTION_CLASSES or cls.startswith("path:") else cost.dtype


@dataclass(frozen=True)
class Calibration:
    name: str
    hardware: str
    data: dict
    path: str | None = None

    @cached_property
    def fits(self) -> list[Fit]:
        return [Fit.of(f) for f in self.data["fits"]]

    @cached_property
    def classes(self) -> frozenset[str]:
        """The op classes (and whole paths) it has a fit for."""
        return frozenset(f.op for f in self.fits)

    def peak(self, hw) -> float:
        """The peak the fits divided by (the dtype the measured runs computed in; bf16 for files
        that do not say): predictions must divide by the same one, whatever dtype is analysed."""
        return hw.peak_flops((self.data.get("ceilings") or {}).get("dtype", "bf16"))

    def fit_for(
        self, op: str, dtype: str | None = None, phase: str | None = None, kernel: str | None = None,
        exact_dtype: bool = False,
    ) -> Fit | None:  # fmt: skip
        """THE choice of a fit: of op class `op`, of the wanted dtype if there is one (with
        `exact_dtype`, none of another), then of `kernel` (measured, or run there by transfer) if
        there is one, then of the phase (`prefill` or `decode`, the end of its source) if there is
        one, else the first listed."""
        found = [f for f in self.fits if f.op == op]
        found = [f for f in found if f.dtype == dtype] or ([] if exact_dtype else found)
        if kernel is not None:
            found = [f for f in found if kernel in (f.kernel, f.target_kernel)] or found
        if phase is not None:
            found = [f for f in found if f.phase == phase] or found
        return found[0] if found else None

    def class_fits(self, cost, cls: str) -> tuple[Fit, Fit] | None:
        """(decode fit, prefill fit) of op class `cls` as `cost`'s dtypes pick it (`fit_for`), the
        same fit twice where it has one for both, or None without a fit
        (mlactl.decide.calibration.model.decode_like says which applies where)."""
        dtype = fit_dtype(cost, cls)
        decode, prefill = self.fit_for(cls, dtype, "decode"), self.fit_for(cls, dtype, "prefill")
        return None if decode is None or prefill is None else (decode, prefill)

    def whole_path(self, cost, path: str) -> Fit | None:
        """A whole-path fit for `path`; expand_chunked without its own takes expand's, applied to
        expand_chunked's own FLOPs and bytes (the same ops, chunk by chunk, plus the lse merges)."""
        fit = self.fit_for(f"path:{path}", fit_dtype(cost, f"path:{path}"))
        if fit is None and path == "expand_chunked":
            fit = self.fit_for("path:expand", fit_dtype(cost, "path:expand"))
        return fit

    @property
    def transferred(self) -> dict | None:
        """{"from": {"hardware", "calibration", "ceilings"}, "to", "error_model"} of a calibration
        carried from another GPU by `mlactl calibrate transfer`; None for one fitted here."""
        t = self.data.get("transfer")
        return t if isinstance(t, dict) else None

    def transfer_note(self) -> str | None:
        """The line that says a calibration's times are transferred (None for a fitted one)."""
        t = self.transferred
        if t is None:
            return None
        rests = [(f.transfer or {}).get("rests_on") for f in self.fits]
        other = sum(1 for r in rests if r is not None and not r.startswith("same kernel"))
        src = safe.text(t["from"]["hardware"], 40)
        return (
            f"times of calibration {self.name} are transferred: fitted on {src} "
            f"({safe.text(t['from']['calibration'], 80)}), carried to {self.hardware}'s ceilings; "
            "their intervals include the transfer error"
            + (f"; {other} of {len(rests)} fits rest on a kernel the target does not run" if other else "")
        )

    def made_from(self) -> str:
        """What it was fitted on, in a few words: aiconfigurator's tables (system, framework,
        version), a CSV, tune results files; a transferred one says from which GPU."""
        src = self.data.get("source") or {}
        files = [safe.text(Path(str(f)).name, 60) for f in src.get("files") or ()]
        kind = src.get("kind")
        if kind == "aiconfigurator":
            what = " ".join(safe.text(src.get(k) or "?", 40) for k in ("system", "framework", "version"))
            out = f"aiconfigurator {what}"
        elif kind == "csv":
            out = f"csv {files[0] if files else '?'}"
        elif kind == "results":
            more = f" and {len(files) - 1} more" if len(files) > 1 else ""
            out = f"tune results {files[0]}{more}" if files else "tune results"
        else:
            out = safe.text(kind or "not recorded", 40)
        t = self.transferred
        if t is None:
            return out
        return f"{out}; transferred from {safe.text(t['from']['hardware'], 40)} ({transfer_source(self)})"

    def describe(self) -> dict:
        """What JSON outputs record about the calibration used (a transferred one: from where)."""
        out = {"name": self.name, "hardware": self.hardware, "path": self.path, "source": self.data.get("source")}
        t = self.transferred
        if t is not None:
            out["transferred"] = {
                "from": safe.text(t["from"]["hardware"], 80),
                "calibration": safe.text(t["from"]["calibration"], 80),
                "to": safe.text(t["to"], 80),
            }
        return out


# -- the schema: every field a prediction or a message reads, with its physical range ------------
# (each fitted parameter's range is held in terms.py, with the parameter)

# `near`: features are log2 rows and heads and an unaligned flag; a residual is log(predicted /
# measured) of the parametric fit, and beyond e^9.2 = 10,000x it is not a correction but a
# different kernel.
NEAR_FEATURE_MAX = 64.0
NEAR_RESIDUAL_MAX = 9.2


def _non_empty(value):
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _terms(value):
    if not isinstance(value, list) or any(t not in TERMS for t in value) or len(set(value)) != len(value):
        return f"a list of distinct terms among {', '.join(TERMS)}"
    return None


def _near(value):
    """{'features': [[x, y, z], ...], 'log_residual': [r, ...]} of equal, non-zero length."""
    bad = "{'features': [[x, y, z], ...], 'log_residual': [r, ...]} of equal length"
    if not isinstance(value, dict):
        return bad
    feats, res = value.get("features"), value.get("log_residual")
    if not isinstance(feats, list) or not isinstance(res, list) or not feats or len(feats) != len(res):
        return bad

    def number(v, limit) -> bool:
        try:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= limit
        except OverflowError:
            return False

    if not all(isinstance(f, list) and len(f) == 3 and all(number(v, NEAR_FEATURE_MAX) for v in f) for f in feats):
        return bad + f", features finite and within +-{NEAR_FEATURE_MAX:g}"
    if not all(number(v, NEAR_RESIDUAL_MAX) for v in res):
        return bad + f", residuals finite and within +-{NEAR_RESIDUAL_MAX:g}"
    return None


def _params_rule(fit: dict, where: str) -> None:
    """Every parameter the fit's terms use, within its physical range (terms.PARAMS)."""
    terms, params = Terms.of(fit["terms"]), fit["params"]
    at = f"{where}.params".lstrip(".")
    names = set(param_names(terms)) - ({"t_fixed_s"} if not terms.fixed else set())
    top = eta_limit(fit.get("dtype"))
    for key in sorted(names):
        value = params.get(key)
        lo, hi = PARAMS[key].physical_range(top)
        if key not in params:
            raise S.Invalid(f"{at}.{key}", "present", "nothing")
        expected = S.number(lo, maximum=hi)(value)
        if expected is not None:
            raise S.Invalid(f"{at}.{key}", expected, value)
    for size in SIZES:  # the GPU's sizes the terms use, each a number or null (not known: the term does nothing)
        value = params.get(size.name)
        if size.term not in terms or value is None:
            continue
        expected = S.number(1.0, maximum=size.maximum)(value)
        if expected is None and size.whole and value != int(value):
            expected = "a whole number"
        if expected is not None:
            raise S.Invalid(f"{at}.{size.name}", expected, value)
    if terms.near:
        expected = _near(params.get("near"))
        if expected is not None:
            raise S.Invalid(f"{at}.near", expected, params.get("near"))


CEILINGS = S.Obj(
    {},
    {
        "peak_flops": S.number(1e6, positive=True, maximum=1e21),  # a MFLOP/s to a ZFLOP/s
        "bandwidth_bytes_per_s": S.number(1e6, positive=True, maximum=1e18),
        "sm_count": S.nullable(S.integer(1, 1 << 20)),
        "dtype": S.string,
    },
)
# a transferred calibration's record (transfer.py) and each of its fits'
TRANSFER = S.Obj(
    {"from": S.Obj({"hardware": _non_empty, "calibration": _non_empty}, {"ceilings": S.nullable(CEILINGS)}),
     "to": _non_empty},
    {"error_model": S.nullable(S.MapOf(S.anything))},
)  # fmt: skip
FIT_TRANSFER = S.Obj(
    {"from": _non_empty, "to": _non_empty, "rests_on": _non_empty},
    {
        "dropped": S.ListOf(S.string),
        "kernel": S.nullable(S.MapOf(S.anything)),
        "crossing": S.string,
        "fallback": S.nullable(S.string),
    },
)
_ERRORS = S.nullable(S.number(0.0, maximum=1e6))
FIT = S.Obj(
    {
        "op": S.one_of(*OP_CLASSES, *PATH_CLASSES),
        "terms": _terms,
        "params": S.MapOf(S.anything),
    },
    {
        "source": S.string,
        "dtype": S.string,
        "n": S.integer(0),
        "transfer": FIT_TRANSFER,
        "in_sample": S.Obj({}, {"median": _ERRORS, "p90": _ERRORS}),
        "held_out": S.Obj({}, {"median": _ERRORS, "p90": _ERRORS}),
        "drift": S.nullable(
            S.Obj(
                {},
                {
                    "paired_with": S.ListOf(S.string),
                    "shapes": S.integer(0),
                    "median_abs": S.number(0.0, maximum=1e6),
                    "max_abs": S.number(0.0, maximum=1e6),
                },
            )
        ),
    },
    rule=_params_rule,
)
CALIBRATION = S.Obj(
    {"name": _non_empty, "hardware": _non_empty, "fits": S.ListOf(FIT)},
    {
        "transfer": TRANSFER,
        "ceilings": S.nullable(CEILINGS),
        "source": S.nullable(S.MapOf(S.anything)),
        "created": S.string,
        "mlactl_version": S.string,
    },
)


MEMBER = S.Obj({"terms": _terms, "params": S.MapOf(S.anything)}, rule=_params_rule)


def _member_check(fit: dict):
    """check(member, where) for fit's members: their terms and every parameter within its
    physical range, an efficiency's by the fit's dtype."""

    def check(member, where: str) -> None:
        if not isinstance(member, dict):
            raise MlactlError(f"{where} must be an object")
        try:
            S.validate(MEMBER, dict(member, dtype=fit.get("dtype")))
        except S.Invalid as exc:
            raise MlactlError(f"{where}: {exc}") from None

    return check


def validate(data, where: str) -> Calibration:
    """Check every field of a calibration file against CALIBRATION (types, and each number's
    physical range); one MlactlError line naming the first field that is wrong."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MlactlError(f'{safe.text(where)} is not an mlactl calibration file (no "schema": "{SCHEMA}")')
    if data.get("schema_version") != SCHEMA_VERSION:
        raise MlactlError(
            f"{safe.text(where)} has calibration schema version {safe.text(repr(data.get('schema_version')), 40)}; "
            f"this mlactl reads version {SCHEMA_VERSION} (run `mlactl calibrate` again)"
        )
    if not isinstance(data.get("fits"), list) or not data["fits"]:
        raise MlactlError(f"{safe.text(where)}: 'fits' must be a non-empty list")
    try:
        S.validate(CALIBRATION, data)
    except S.Invalid as exc:
        raise MlactlError(f"{safe.text(where)}: {exc}") from None
    for i, fit in enumerate(data["fits"]):  # each fit's evidence: its range, shapes, interval, members
        check_evidence(fit, f"{safe.text(where)}: fits[{i}]", _member_check(fit))
    # names from the file: printable from here on (markup and mathtext are escaped where drawn)
    return Calibration(safe.text(data["name"]), safe.text(data["hardware"]), data, where)


def load(path: str | Path) -> Calibration:
    """Read (through the one reader: regular files only) and validate a calibration file."""
    return validate(read_json(path, "calibration file"), str(path))


@dataclass(frozen=True)
class Stored:
    """One file of a calibrations folder: the name --calibration takes (its stem), and the
    calibration read from it, or why it cannot be used (`problem`: validate's line)."""

    name: str
    path: Path
    calibration: Calibration | None = None
    problem: str | None = None

    def to_json(self) -> dict:
        cal = self.calibration
        return {
            "name": self.name,
            "path": str(self.path),
            "calibration": None if cal is None else cal.describe(),
            "made_from": None if cal is None else cal.made_from(),
            "created": None if cal is None else cal.data.get("created"),
            "fits": None if cal is None else len(cal.fits),
            "op_classes": None if cal is None else sorted(cal.classes),
            "problem": self.problem,
        }


def stored(folder: str | Path | None = None) -> list[Stored]:
    """Every calibration file of `folder` (default $MLACTL_HOME/calibrations/), by name, the ones
    kept aside by a later one of the same name (NAME.YYYYMMDD-HHMMSS) included; a file that does
    not validate is listed with its problem, not passed over. A folder that is not there has
    none."""
    out = []
    for path in store_files(Path(folder) if folder is not None else calibrations_dir(), "*.json"):
        try:
            out.append(Stored(path.stem, path, load(path)))
        except MlactlError as exc:
            out.append(Stored(path.stem, path, problem=str(exc)))
    return out


def stored_json(folder: str | Path, entries: list[Stored]) -> dict:
    """`mlactl calibrate list --format json`: the folder and each of its calibration files."""
    return {
        "schema": "mlactl.calibrations",
        "schema_version": 1,
        "folder": str(folder),
        "calibrations": [e.to_json() for e in entries],
    }


def names() -> list[str]:
    """The calibrations in $MLACTL_HOME/calibrations/ (anything there that is not a regular
    file is skipped with a warning)."""
    return sorted(p.stem for p in store_files(calibrations_dir(), "*.json"))


def resolve(spec: str) -> Calibration:
    """--calibration NAME (a file in $MLACTL_HOME/calibrations/) or FILE."""
    if spec.endswith(".json") or "/" in spec:
        return load(spec)  # a directory, a FIFO or a device: one line saying which
    path = calibrations_dir() / f"{spec}.json"
    if not path.exists():
        have = names()
        raise MlactlError(
            f"no calibration named {spec!r} in {calibrations_dir()}; "
            + (
                f"known: {', '.join(have)} (`mlactl calibrate list` says what each is)"
                if have
                else "run `mlactl calibrate` first"
            )
        )
    return load(path)


def find_own(hw_name: str, dims: dict, kv_dtype: str) -> Calibration | None:
    """The newest calibration of mlactl's own paths (`mlactl calibrate --from results` on
    `mlactl tune paths` runs) made for this hardware profile, these model dims and this cache
    dtype, with a whole-path fit of expand and of absorb; None if there is none. Never one of
    another engine's kernels (aiconfigurator, CSV); one fitted on this GPU before one transferred
    to it. A bad file is skipped with a warning."""

    found = []
    for path in store_files(calibrations_dir(), "*.json"):
        try:
            cal = load(path)
        except MlactlError as exc:
            warn(f"skipped {exc}")
            continue
        source = cal.data.get("source") or {}
        if (
            source.get("kind") == "results"
            and cal.hardware == hw_name
            and source.get("model") == dims
            and source.get("kv_dtype") == kv_dtype
            and {"path:expand", "path:absorb"} <= cal.classes
        ):
            # one fitted on this GPU before one transferred to it
            found.append((cal.transferred is None, str(cal.data.get("created", "")), str(path), cal))
    return max(found, key=lambda f: f[:3])[3] if found else None


def check_hardware(cal: Calibration, hw_name: str) -> None:
    """Refuse a calibration made for other hardware (one line naming the transfer command); a
    transferred calibration is accepted for its target, and a note says its times are
    transferred (a `Warning:` line, once per command)."""
    if cal.hardware != hw_name:
        made = "carried by transfer to" if cal.transferred else "made for"
        there = f"carry it there with `mlactl calibrate transfer {transfer_source(cal)} --hardware {hw_name}`"
        if cal.transferred and cal.transferred["from"].get("hardware") == hw_name:
            there = f"use the one it was carried from, --calibration {transfer_source(cal)}"  # fitted there
        raise MlactlError(
            f"calibration {cal.name!r} was {made} hardware {cal.hardware!r}, not {hw_name!r}: "
            f"pass --hardware {cal.hardware}, or calibrate for {hw_name}, or {there}"
        )
    note = cal.transfer_note()
    if note is not None:
        warn(note)


def transfer_source(cal: Calibration) -> str:
    """The calibration a transfer starts from: a transferred one's own source, else itself."""
    t = cal.transferred
    return safe.text(t["from"]["calibration"], 80) if t else cal.name


# Relative difference between a calibration's recorded ceilings and the profile's beyond which
# its efficiencies no longer mean what they were fitted to mean (a rounding of TB/s is 0.1%).
CEILING_TOLERANCE = 0.005


def check_ceilings(cal: Calibration, hw) -> None:
    """Refuse a calibration whose recorded ceilings (what its fits divided by) differ from the
    profile's: each efficiency is a fraction of those ceilings, so a profile edited since (2.4
    TB/s where the fit saw 4.8) would change every calibrated time without a word. A file that
    records no ceilings (written by hand) is not checked."""
    ceilings = cal.data.get("ceilings")
    if not ceilings:
        return
    dtype = ceilings.get("dtype") or "bf16"
    have = {"bandwidth_bytes_per_s": hw.bandwidth}
    if dtype in hw.peak_tflops:
        have["peak_flops"] = hw.peak_flops(dtype)
    units = {"bandwidth_bytes_per_s": (1e12, "TB/s"), "peak_flops": (1e12, f"TFLOP/s {dtype}")}
    differ = []
    for key, now in have.items():
        then = ceilings.get(key)
        if then is not None and abs(now / then - 1) > CEILING_TOLERANCE:
            scale, unit = units[key]
            differ.append(f"{then / scale:.4g} {unit} (the profile now says {now / scale:.4g})")
    if dtype not in hw.peak_tflops:
        differ.append(f"a {dtype} peak (the profile has none)")
    if differ:
        raise MlactlError(
            f"calibration {cal.name!r} was fitted against {', '.join(differ)} of {hw.name}: its efficiencies are "
            "fractions of those ceilings; calibrate again with this profile, or pass --hardware FILE with the "
            "ceilings it was fitted against"
        )


def save(data: dict, folder: Path | None = None) -> tuple[Path, Path | None]:
    """Validate, then write `data` as <folder>/<name>.json (default $MLACTL_HOME/calibrations/):
    under the file's lock, so two runs take turns; a calibration already there is kept aside as
    NAME.YYYYMMDD-HHMMSS.json first, never overwritten; a symbolic link there, or a path that
    resolves outside the folder, is refused. Returns (path, where the earlier one was kept, or
    None when there was none)."""

    validate(data, "the new calibration")
    folder = Path(folder or calibrations_dir())
    path = contained(folder / f"{safe_name(data['name'])}.json", folder)
    with locked(path):
        contained(path, folder)  # again under the lock: a link planted meanwhile
        kept = keep_aside(path, kind=SCHEMA) if os.path.lexists(path) else None  # never a tune results file
        atomic_write(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path, kept


def write(data: dict, folder: Path | None = None) -> Path:
    """`save`, returning only the path."""
    return save(data, folder)[0]
