"""The results store: what `mlactl tune` measured, as one versioned JSON file per run.

`mlactl plot`, `analyze --policy measured` and `mla_attention(path="auto")` read these files;
nothing here imports torch. Schema version 1 (docs/design.md, "Results files", says who writes
and reads what):

    {
      "schema": "mlactl.results", "schema_version": 1,
      "run_id": "20261130-064500-NVIDIA_H200-deepseek-v3", "created": "2026-11-30T06:45:00Z",
      "mlactl_version": "0.1.0",
      "device": {"name": "NVIDIA H200", "type": "cuda", "hardware": "h200", "sm_count": 132},
      "versions": {"python": "3.12.3", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"},
      "backend": "triton" | "torch" | "interpret",
      "timing": {"method": "cuda-graph" | "cuda-events" | "wall-clock", "l2": "cold" | "warm",
                 "warmup": 5, "repeats": 50, "meaningful": true},
      "model": {... MLAConfig fields ...}, "kv_dtype": "bf16", "dtype": "bf16", "chunk": 8192,
      "kernels": [                          # `mlactl tune kernels`
        {"kernel": "mla_decode", "bucket": "B=128,H=128,S_q=1,ctx=8192",
         "shape": {"B": 128, "H": 128, "S_q": 1, "ctx": 8192},
         "flops": 2.9e14, "bytes": 1.2e9,
         "configs": [{"config": {"BLOCK_N": 64, "num_warps": 8}, "status": "ok" | "failed" | "wrong",
                      "reason": "", "median_s": 1e-4, "p10_s": 9e-5, "p90_s": 1.1e-4}],
         "best": {"BLOCK_N": 64, "num_warps": 8}, "best_median_s": 1e-4,
         "default_median_s": 1.2e-4, "twin_median_s": 9e-3}
      ],
      "paths": [                            # `mlactl tune paths`: one row per measured point
        {"batch": 1, "new": 64, "prefix": 4096, "path": "absorb",
         "median_s": 1e-4, "p10_s": 9e-5, "p90_s": 1.1e-4, "flops": 1e10, "bytes": 1e8,
         "predicted_s": 8e-5}
      ],
      "crossovers": [                       # per (batch, prefix) measured by `tune paths`
        {"batch": 1, "prefix": 4096, "measured": 180, "predicted": 175, "predicted_by_flops": 168,
         "measured_status": "found" | "never" | "budget", "measured_low": 128, "measured_high": 256,
         "nonmonotone": false, "estimator": "local_root" | "first_stable", "first_stable": 192,
         "measured_root": 179.4, "measured_interval": [171, 188], "measured_window": [64, 384],
         "step_samples": [132, 133]}
      ],
      "ceilings": {"peak_tflops": {"bf16": 780.0}, "bandwidth_tbs": 4.3}   # `tune ceilings`
    }

Every section but the header is optional: a run that only measured ceilings has no "paths".
Optional in every timing: "cv" (stdev/mean of the repetitions), "remeasured", "unstable", and
in a path row "times_s" (each round's time, for the crossover's bootstrap); in a crossover row:
its status, noise bracket, monotonicity flag, estimator and interval (docs/noise-and-budget.md).
Times are seconds, FLOPs and bytes raw counts (from cost.py), as everywhere in mlactl.

The checked form of this layout is HEADER, KERNEL, PATH and CROSSOVER below; `validate` applies
them on every load. Fields not named there are allowed and kept (a newer mlactl's additions).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from mlactl.util import schema as S
from mlactl.util.errors import MlactlError
from mlactl.util.io import read_json
from mlactl.util.limits import MAX_SIZE

SCHEMA = "mlactl.results"
SCHEMA_VERSION = 1
SECTIONS = ("kernels", "paths", "crossovers", "ceilings")


def new_header(
    path, device: dict, versions: dict, backend: str, timing: dict, model: dict, kv_dtype: str, dtype: str, chunk: int
) -> dict:
    """The header of a new results file (`mlactl tune` writes it before the first timing): the
    schema written here and read back by `load`, the run's id (the file's stem) and creation
    time, the device and software versions, how it times, and the model and dtypes measured."""
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "run_id": Path(path).stem,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mlactl_version": versions["mlactl"],
        "device": device,
        "versions": versions,
        "backend": backend,
        "timing": timing,
        "model": model,
        "kv_dtype": kv_dtype,
        "dtype": dtype,
        "chunk": chunk,
    }


# -- the schema, written once: every reader validates with it (load, find_results, the store) ------

_COUNT = S.integer(1, MAX_SIZE)
_SIZE = S.integer(0, MAX_SIZE)
_SECONDS = S.nullable(S.number())
_FIGURE = S.nullable(S.number())
# A timing as mlactl.tune.timing writes it; other fields (spreads, the worker that measured it)
# may be added by a newer mlactl and are kept.
TIMING = {"median_s": _SECONDS, "p10_s": _SECONDS, "p90_s": _SECONDS, "repeats": S.integer(0), "method": S.string}


def _ok_has_median(entry: dict, where: str) -> None:
    """A measurement that succeeded has a time; a failed one has its reason instead."""
    if entry.get("status", "ok") == "ok" and entry.get("median_s") is None:
        raise S.Invalid(f"{where}.median_s".lstrip("."), "a time in seconds (status is ok)", entry.get("median_s"))


CONFIG = S.Obj(
    {"config": S.MapOf(S.anything)},
    {"status": S.string, "reason": S.string, **TIMING},
    rule=_ok_has_median,
)
KERNEL = S.Obj(
    {"kernel": S.string, "bucket": S.string},
    {
        "shape": S.MapOf(_COUNT),
        "flops": _FIGURE,
        "bytes": _FIGURE,
        "configs": S.ListOf(CONFIG),
        "best": S.nullable(S.MapOf(S.anything)),
        "best_median_s": _SECONDS,
        "default_median_s": _SECONDS,
        "twin_median_s": _SECONDS,
        "predicted_s": _SECONDS,
    },
)
PATH = S.Obj(
    {"batch": _COUNT, "new": _SIZE, "prefix": _SIZE, "path": S.string},
    {"status": S.string, "reason": S.string, "flops": _FIGURE, "bytes": _FIGURE, "predicted_s": _SECONDS, **TIMING},
    rule=_ok_has_median,
)
CROSSOVER = S.Obj(
    {"batch": _COUNT, "prefix": _SIZE},
    {
        "measured": S.nullable(_SIZE),
        "predicted": S.nullable(_SIZE),
        "predicted_by_flops": S.nullable(_SIZE),
        "measured_new": S.ListOf(_COUNT),
    },
)
ENTRY = {"kernels": KERNEL, "paths": PATH, "crossovers": CROSSOVER}
HEADER = S.Obj(
    {
        "device": S.Obj({"name": S.string}, {"type": S.string, "hardware": S.nullable(S.string)}),
        "backend": S.string,
        "timing": S.Obj({}, {"method": S.string, "l2": S.string, "meaningful": S.boolean}),
        "model": S.Obj(
            {},
            {k: _COUNT for k in ("H", "r", "dC", "dR", "dV", "hidden", "layers", "tp")}
            | {"name": S.string, "q_lora_rank": S.nullable(_COUNT)},
        ),
    },
    {
        "run_id": S.string,
        "created": S.string,
        "mlactl_version": S.string,
        "versions": S.MapOf(S.nullable(S.string)),
        "kv_dtype": S.string,
        "dtype": S.string,
        "chunk": _COUNT,
        "kernels": S.ListOf(S.anything),  # entries: ENTRY, checked one by one
        "paths": S.ListOf(S.anything),
        "crossovers": S.ListOf(S.anything),
        "ceilings": S.Obj(
            {}, {"peak_tflops": S.MapOf(S.number(positive=True)), "bandwidth_tbs": S.number(positive=True)}
        ),
    },
)


def validate(data, where: str, drop_bad: bool = False) -> dict:
    """Check a results file against the schema above and return it. A bad header is an error;
    a bad entry is an error too, or with `drop_bad` is left out and named in
    `data["_dropped"]` (so a resumed run measures it again). Raises MlactlError."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MlactlError(f'{where} is not an mlactl results file (no "schema": "{SCHEMA}")')
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise MlactlError(
            f"{where} has results schema version {version!r}; this mlactl reads version "
            f"{SCHEMA_VERSION} (re-run `mlactl tune`, or use the mlactl that wrote it)"
        )
    try:
        S.validate(HEADER, data)
    except S.Invalid as exc:
        raise MlactlError(f"{where}: {exc}") from None
    dropped = []
    for section, check in ENTRY.items():
        kept = []
        for i, entry in enumerate(data.get(section, [])):
            try:
                S.validate(check, entry, f"{section}[{i}]")
            except S.Invalid as exc:
                if not drop_bad:
                    raise MlactlError(f"{where}: {exc}") from None
                dropped.append(str(exc))
                continue
            kept.append(entry)
        if section in data:
            data[section] = kept
    if dropped:
        data["_dropped"] = dropped
    return data


def load(path: str | Path, drop_bad: bool = False) -> dict:
    """Read and validate one results file; one clear line on any problem."""

    data = read_json(path, "results", "; the file is corrupt or was cut short")
    return validate(data, str(path), drop_bad)


def check_matches(data: dict, where: str, model_name: str | None = None, hardware_name: str | None = None) -> None:
    """A results file measured for another model or device than asked is an error."""
    model = data.get("model", {}).get("name")
    if model_name is not None and model != model_name:
        raise MlactlError(
            f"{where} was measured for model {model!r}, not {model_name!r} "
            "(pass --model to match, or another results file)"
        )
    device = data["device"]
    if hardware_name is not None and device.get("hardware") not in (None, hardware_name):
        raise MlactlError(
            f"{where} was measured on {device['name']} ({device.get('hardware')}), "
            f"not {hardware_name} (pass --hardware to match, or another results file)"
        )


def measured_crossovers(data: dict, batch: int | None = None) -> dict[int, int | None]:
    """{prefix: measured crossover} for the measured batch size nearest `batch` (in log2; the
    smallest measured one if None). Across several results files, as rows: plot.measured_crossover_rows."""

    rows = data.get("crossovers", [])
    if not rows:
        return {}
    batches = sorted({r["batch"] for r in rows})
    pick = batches[0] if batch is None else min(batches, key=lambda b: abs(math.log2(b) - math.log2(max(batch, 1))))
    # a row the time budget cut short says nothing about its prefix: left out, not read as "absorb"
    return {
        int(r["prefix"]): r.get("measured")
        for r in rows
        if r["batch"] == pick and (r.get("measured") is not None or r.get("measured_status") != "budget")
    }


def paths_frame(data: dict):
    """A results file's path measurements as a pandas DataFrame, one row per (point, path),
    with the measured-to-predicted ratio where a prediction was made."""
    import pandas as pd

    frame = pd.DataFrame(data.get("paths", []))
    if "predicted_s" in frame and "median_s" in frame:
        frame["measured_over_predicted"] = frame["median_s"] / frame["predicted_s"]
    return frame
