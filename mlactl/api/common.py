"""What every function of the front door shares: shape arguments, the result type, settings."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mlactl.decide import setup as settings
from mlactl.decide.setup import Setup
from mlactl.model.shapes import parse_sizes
from mlactl.util.errors import MlactlError

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


def _setup(model, hardware, tp, kv_dtype, dtype, chunk, calibration, **more) -> Setup:
    return settings.setup(
        model=model,
        hardware=hardware,
        tp=tp,
        kv_dtype=kv_dtype,
        dtype=dtype,
        chunk=chunk,
        calibration=None if calibration is None else str(calibration),
        **more,
    )


def _engine_names(engines) -> str | None:
    if engines is None or isinstance(engines, str):
        return engines
    return ",".join(engines)
