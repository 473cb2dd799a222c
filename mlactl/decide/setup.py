"""Which settings a run takes: the one resolution every command and the Python API share.

A setting the caller did not give (None) comes, in this order, from the first results file (its
model, tp, dtypes and hardware, as `mlactl analyze --results` always took them; with
`find_results` the newest that `mlactl tune paths` left for the model), from the calibration
(the hardware it was fitted on, or the target it was transferred to), else from the default. A
given setting that contradicts a file is an error naming both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlactl.decide.calibration import store as calibrations
from mlactl.decide.calibration.store import Calibration
from mlactl.model import config as models
from mlactl.model import hardware as profiles
from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.model.hardware import HardwareProfile
from mlactl.model.shapes import parse_sizes
from mlactl.results import measured
from mlactl.results import store as results
from mlactl.util import safe
from mlactl.util.defaults import (
    ACT_DTYPES,
    DEFAULT_CHUNK,
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    DEFAULT_TP,
    KV_DTYPES,
)
from mlactl.util.errors import MlactlError

# A note is a sentence: never more than this much of a name from a file goes into one.
MAX_NOTE = 2000


@dataclass
class Setup:
    """What a run's settings resolve to."""

    cfg: MLAConfig
    hw: HardwareProfile
    calibration: Calibration | None
    kv_dtype: str
    dtype: str
    chunk: int
    notes: list[str] = field(default_factory=list)  # where a setting came from, plain text (markup_notes)
    results: list[dict] = field(default_factory=list)  # results files read (each with "_path")

    def cost(self) -> CostModel:
        return CostModel(self.cfg, kv_dtype=self.kv_dtype, dtype=self.dtype, chunk=self.chunk)

    def markup_notes(self) -> list[str]:
        """The notes as lines for a rich console (names in them escaped)."""
        return [safe.markup(n, MAX_NOTE) for n in self.notes]


def one_int(value, option: str, minimum: int = 1) -> int:
    """A whole number given as a number or as text (`8K`, `1_000`); one only."""
    if isinstance(value, bool):
        raise MlactlError(f"{option} takes a whole number, got {value!r}")
    if isinstance(value, int):
        if value < minimum:
            raise MlactlError(f"{option} must be at least {minimum}, got {value}")
        return value
    values = parse_sizes(str(value), option, minimum)
    if len(values) != 1:
        raise MlactlError(f"{option} takes one value, got {value!r}")
    return values[0]


def choice(value: str, option: str, choices) -> str:
    if value not in choices:
        raise MlactlError(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    return value


def load_model(model: str, tp) -> MLAConfig:
    return models.resolve(model).with_tp(one_int(tp, "--tp"))


def setup(
    model: str | None = None,
    hardware: str | None = None,
    tp: int | str | None = None,
    kv_dtype: str | None = None,
    dtype: str | None = None,
    chunk: int | str | None = None,
    calibration: str | None = None,
    measured_ceilings: bool = False,
    results_files=(),
    find_results: bool = False,
    defaults: dict | None = None,
) -> Setup:
    """The model, hardware, calibration and dtypes of a run. None is "not given": it is taken
    from a results file or the calibration, else from `defaults` (a command's own, e.g. replay's
    serving node) or mlactl's (util/defaults.py)."""
    base: dict = {
        "model": DEFAULT_MODEL,
        "hardware": DEFAULT_HARDWARE,
        "tp": DEFAULT_TP,
        "kv_dtype": "bf16",
        "dtype": "bf16",
        "chunk": DEFAULT_CHUNK,
        **(defaults or {}),
    }
    given: dict = {"model": model, "tp": tp, "dtype": dtype, "kv_dtype": kv_dtype, "hardware": hardware}
    values: dict = {k: (v if v is not None else base[k]) for k, v in given.items()}
    notes: list[str] = []
    loaded = [dict(results.load(p), _path=str(p)) for p in results_files]
    if find_results and not loaded:
        loaded = [_newest_results(values["model"], values["tp"], given)]
        given.update(model=values["model"], tp=values["tp"])  # looked up for these: the file's own name may differ
    if loaded:
        as_text = {k: (None if v is None else str(v)) for k, v in given.items()}
        picked = measured.adopt(loaded[0], loaded[0]["_path"], as_text)
        values.update(model=picked.model, tp=picked.tp, dtype=picked.dtype, kv_dtype=picked.kv_dtype)
        values["hardware"] = picked.hardware or values["hardware"]
        given["hardware"] = given["hardware"] or picked.hardware
        notes += picked.notes
    cal = calibrations.resolve(calibration) if calibration is not None else None
    if cal is not None and given["hardware"] is None:
        values["hardware"] = cal.hardware
        moved = cal.transferred
        if moved is not None:
            source = moved.get("from", {}).get("hardware", "another GPU")
            notes.append(f"hardware {cal.hardware}: calibration {cal.name} was transferred to it from {source}")
        else:
            notes.append(f"hardware {cal.hardware}: the profile calibration {cal.name} was fitted on")
    hw = profiles.resolve(values["hardware"], measured=measured_ceilings)
    if cal is not None:
        calibrations.check_hardware(cal, hw.name)
        if hw.using_measured:
            raise MlactlError(
                f"calibration {cal.name!r} was fitted against {hw.name}'s nominal ceilings: drop --measured "
                "(its efficiencies already say how far from the datasheet the kernels run)"
            )
        calibrations.check_ceilings(cal, hw)
    return Setup(
        cfg=load_model(values["model"], values["tp"]),
        hw=hw,
        calibration=cal,
        kv_dtype=choice(values["kv_dtype"], "--kv-dtype", KV_DTYPES),
        dtype=choice(values["dtype"], "--dtype", ACT_DTYPES),
        chunk=one_int(chunk if chunk is not None else base["chunk"], "--chunk"),
        notes=notes,
        results=loaded,
    )


def _newest_results(model: str, tp, given: dict) -> dict:
    """The newest results file `mlactl tune paths` left for the model asked (mlactl.results.measured)."""
    cfg = load_model(model, tp)
    dims = {k: getattr(cfg, k) for k in measured.DIMS}
    hw_name = profiles.resolve(given["hardware"]).name if given["hardware"] else None
    data, path = measured.find(dims, given["kv_dtype"], hw_name)
    if data is None:
        where = f" on {hw_name}" if hw_name else ""
        kv = f", kv {given['kv_dtype']}" if given["kv_dtype"] else ""
        raise MlactlError(
            f"no measured crossovers for {cfg.name} (H={cfg.H}{kv}){where}: "
            "run `mlactl tune paths` there, or pass --results FILE"
        )
    return dict(data, _path=str(path))
