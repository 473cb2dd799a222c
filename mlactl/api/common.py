"""What every function of the front door shares: shape arguments, the result type, settings."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypedDict, TypeVar

from mlactl.decide import setup as settings
from mlactl.decide.setup import Setup
from mlactl.model.shapes import parse_sizes
from mlactl.util.errors import MlactlError
from mlactl.util.suggest import did_you_mean

Sizes = int | str | list | tuple


def sizes(value: Sizes, option: str, minimum: int = 1) -> list[int]:
    """A shape argument as the CLI reads it: an int, a list of ints, or text (`1:4096:*2`)."""
    if isinstance(value, bool):
        raise MlactlError(f"{option} takes whole numbers, got {value!r}")
    if isinstance(value, int):
        value = [value]
    if isinstance(value, (list, tuple)):
        return [settings.one_int(v, option, minimum) for v in value]
    return parse_sizes(str(value), option, minimum)


T = TypeVar("T")


@dataclass(frozen=True)
class Result(Generic[T]):
    """One job's answer: `value` (the library's own result object: an Analysis, a Crossover, a
    BatchAnalysis, a workload report or a Replay), the settings it ran under, and the document
    and table the CLI writes for it."""

    value: T
    setup: Setup
    _document: Callable[[], dict] = field(repr=False)
    _csv: Callable[[io.BufferedIOBase], None] | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        """The document `--format json` writes (the same keys and numbers, in SI units)."""
        return self._document()

    def write_csv(self, fh) -> None:
        """Write what `--format csv` writes to a binary file `fh`."""
        if self._csv is None:
            raise MlactlError("this result has no CSV form")
        self._csv(fh)

    def to_csv(self) -> str:
        """The text `--format csv` writes."""
        buf = io.BytesIO()
        self.write_csv(buf)
        return buf.getvalue().decode("utf-8")

    def to_pandas(self):
        """The CSV as a pandas DataFrame (pandas is imported here, not with mlactl)."""
        import pandas as pd

        return pd.read_csv(io.StringIO(self.to_csv()))


class Machine(TypedDict, total=False):
    """The settings that say what runs where, taken by every function of the front door as
    keywords, by the commands' option names; one left out (or None) resolves exactly as an
    option the user did not type (mlactl.decide.setup): `tp` (tensor parallelism: heads per GPU),
    `kv_dtype` (the cache: bf16, fp16, fp8), `dtype` (the math), `chunk` (expand_chunked's
    chunk), `calibration` (a name from `mlactl calibrate` or a file: calibrated times)."""

    tp: int | None
    kv_dtype: str | None
    dtype: str | None
    chunk: int | None
    calibration: str | Path | None


class Settings(Machine, total=False):
    """Machine's settings and the engines' rules: `engines` (names or `a,b@VERSION`, default the
    command's), `engine_options` (`[ENGINE.]KEY=VALUE` each, as --engine-option)."""

    engines: str | list[str] | tuple[str, ...] | None
    engine_options: list[str] | tuple[str, ...]


def _setup(
    job: str, model, hardware, given: Mapping, allowed: type = Settings, setup: Setup | None = None, **more
) -> Setup:
    """The Setup of `mlactl.<job>` from its keyword settings `given` (`setup`, where the caller
    resolved one already); a keyword it does not take is one MlactlError naming the ones it does
    (not Python's TypeError deep inside), with or without `setup`."""
    unknown = sorted(set(given) - set(allowed.__annotations__))
    if unknown:
        known = sorted(allowed.__annotations__)
        hint = did_you_mean(unknown[0], known)
        raise MlactlError(f"mlactl.{job}() takes no setting {unknown[0]!r}{hint}; its settings: {', '.join(known)}")
    if setup is not None:
        return setup
    calibration = given.get("calibration")
    return settings.setup(
        model=model,
        hardware=hardware,
        tp=given.get("tp"),
        kv_dtype=given.get("kv_dtype"),
        dtype=given.get("dtype"),
        chunk=given.get("chunk"),
        calibration=None if calibration is None else str(calibration),
        **more,
    )


def _engines(given: Mapping) -> tuple[str | None, list[str]]:
    """`engines` as the text --engines takes (None: the command's default) and the engine options."""
    engines = given.get("engines")
    names = engines if engines is None or isinstance(engines, str) else ",".join(engines)
    return names, list(given.get("engine_options") or ())
