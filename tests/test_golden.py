"""Every command's JSON and CSV on a fixed set of inputs, pinned as golden files.

The figures under tests/golden/ were written by the code before the core was redesigned (one
`Steps` value, one pricer, one `RuleLoss`); any redesign must give every figure again to 1e-9
relative. A change that fixes a bug regenerates the files it changes and names the fix in its
commit:

    python tests/test_golden.py --update [CASE ...]

Strings compare exactly, numbers to 1e-9 relative (1e-15 absolute near zero); what differs from
run to run (the mlactl home folder, a file's modification time) is normalised first.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from pathlib import Path

# first: it pins OpenBLAS's kernels before numpy loads (also when this file runs as a script)
from conftest import BLAS_PINNED

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
FIXTURE = HERE / "data" / "aiconfigurator"
FIXTURE_DSA = HERE / "data" / "aiconfigurator-dsa"
REL = 1e-9
ABS = 1e-15
# what a release changes without changing a figure
IGNORED_KEYS = {"mlactl_version"}

CAL = "h200-aiconfigurator-sglang-0.5.14"
# The calibrated cases read this file, the calibration the `calibrate` case stored when the golden
# files were written: what they pin is the arithmetic on a calibration, not the fit again.
CAL_FILE = GOLDEN / f"{CAL}.calibration.json"
# A fit is least squares through LAPACK, whose last bits differ from one BLAS kernel to another,
# and a near-tie between two term sets can then go either way: calibrate.json was written with
# OpenBLAS's SkylakeX kernels (conftest.py runs them where the CPU can) and is compared only there.


def fit_reproducible() -> bool:
    import numpy

    blas = str(numpy.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name", ""))
    return BLAS_PINNED and "openblas" in blas.lower()


# the batch CSV and the trace the cases read (written into the case's folder)
BATCH_CSV = "new,prefix,count\n1,8000,32\n1,300,16\n512,0,1\n64,4096,2\n3000,12000,1\n"


def trace_rows() -> list[dict]:
    """A small Mooncake-format trace: 40 requests over 20 s, some sharing prefixes, a few long prompts."""
    rows = []
    for i in range(40):
        tokens = 600 + 997 * (i % 7) + (9000 if i % 13 == 5 else 0)
        blocks = -(-tokens // 512)
        shared = min(i % 5, blocks - 1)  # the first blocks of a family of conversations
        ids = list(range(1, shared + 1)) + [1000 * (i + 1) + b for b in range(blocks - shared)]
        rows.append({"timestamp": 500 * i, "input_length": tokens, "output_length": 20 + 37 * (i % 4), "hash_ids": ids})
    return rows


MACHINE = ["--hardware", "h200", "--tp", "1"]
LAYERS = ["--layers", "1"]
ENGINES = "sglang@0.5.14,sglang-triton,vllm@0014ca6b"
GRID = ["--new", "1,64,256,4096", "--prefix", "0,8K,32K", "--batch", "1,16"]

# (case name, args, output format); a case's args may name {batch_csv}, {trace}
CASES: list[tuple[str, list[str], str]] = [
    ("analyze", ["analyze", *MACHINE, *LAYERS, *GRID], "json"),
    ("analyze", ["analyze", *MACHINE, *LAYERS, *GRID], "csv"),
    ("analyze-ops", ["analyze", *MACHINE, "--new", "1,512", "--prefix", "4K", "--ops", *LAYERS], "json"),
    ("analyze-fp8-tp8", ["analyze", "--hardware", "h200", "--tp", "8", "--kv-dtype", "fp8", *GRID], "json"),
    ("analyze-dsa", ["analyze", "--model", "deepseek-v3.2", *MACHINE, *LAYERS, *GRID], "json"),
    ("analyze-dsa", ["analyze", "--model", "deepseek-v3.2", *MACHINE, *LAYERS, *GRID], "csv"),
    ("analyze-engines", ["analyze", *MACHINE, *LAYERS, *GRID, "--engines", ENGINES], "json"),
    ("crossover", ["crossover", *MACHINE], "json"),
    ("crossover", ["crossover", *MACHINE], "csv"),
    ("crossover-dsa", ["crossover", "--model", "deepseek-v3.2", *MACHINE], "json"),
    ("batch", ["batch", "{batch_csv}", *MACHINE], "json"),
    ("batch", ["batch", "{batch_csv}", *MACHINE], "csv"),
    ("batch-dsa", ["batch", "{batch_csv}", "--model", "deepseek-v3.2", *MACHINE], "json"),
    ("engines", ["engines", *MACHINE], "json"),
    ("engines", ["engines", *MACHINE], "csv"),
    ("engines-dsa", ["engines", "--model", "deepseek-v3.2", *MACHINE], "json"),
    ("replay", ["replay", "{trace}", "--hardware", "h200"], "json"),
    ("replay", ["replay", "{trace}", "--hardware", "h200"], "csv"),
    ("replay-dsa", ["replay", "{trace}", "--model", "deepseek-v3.2", "--hardware", "h200"], "json"),
    (
        "calibrate",
        [
            "calibrate",
            "--from",
            "aiconfigurator",
            "--system",
            "h200_sxm",
            "--framework",
            "sglang",
            "--data-dir",
            str(FIXTURE),
        ],
        "json",
    ),  # fmt: skip
    ("analyze-cal", ["analyze", *MACHINE, *LAYERS, *GRID, "--calibration", CAL], "json"),
    ("crossover-cal", ["crossover", *MACHINE, "--calibration", CAL], "json"),
    ("engines-cal", ["engines", *MACHINE, "--calibration", CAL], "json"),
    ("replay-cal", ["replay", "{trace}", "--hardware", "h200", "--calibration", CAL], "json"),
]


def _files(folder: Path) -> dict[str, str]:
    batch = folder / "batch.csv"
    batch.write_text(BATCH_CSV)
    trace = folder / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in trace_rows()))
    return {"batch_csv": str(batch), "trace": str(trace)}


def run_cases(folder: Path, only: set[str] | None = None) -> dict[str, str]:
    """Each case's output, keyed `name.fmt`, run in order (the calibration is made before it is used)."""
    from typer.testing import CliRunner

    from mlactl.cli import app

    home = folder / "home"
    home.mkdir(exist_ok=True)
    os.environ["MLACTL_HOME"] = str(home)
    names = _files(folder)
    runner = CliRunner()
    out = {}
    for name, args, fmt in CASES:
        key = f"{name}.{fmt}"
        if only is not None and key not in only:
            continue
        argv = [a.format(**names) for a in args] + ["-f", fmt]
        if name == "calibrate":
            if not fit_reproducible():
                continue
        elif CAL in args:
            (home / "calibrations").mkdir(exist_ok=True)
            text = CAL_FILE.read_text().replace("<TESTS>", str(HERE))
            (home / "calibrations" / f"{CAL}.json").write_text(text)
        result = runner.invoke(app, argv)
        code, text, output = result.exit_code, result.stdout, result.output
        if code == 0 and name == "calibrate":  # what `--update calibrate.json` keeps as CAL_FILE
            fitted = (home / "calibrations" / f"{CAL}.json").read_text().replace(str(HERE), "<TESTS>")
            (folder / "fitted.calibration.json").write_text(fitted)
        if code != 0:
            raise AssertionError(f"{key}: mlactl {' '.join(argv)} exited {code}: {output[-2000:]}")
        for path, mark in ((str(home), "<HOME>"), (str(folder), "<DIR>"), (str(HERE), "<TESTS>")):
            text = text.replace(path, mark)
        out[key] = text
    return out


def _number(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def differences(want, got, where="$", out=None, limit=20) -> list[str]:
    """Where two parsed documents differ beyond the tolerance, as `path: want != got` lines."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    a, b = _number(want), _number(got)
    if a is not None and b is not None:
        same = (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= max(ABS, REL * max(abs(a), abs(b)))
        if not same:
            out.append(f"{where}: {want!r} != {got!r}")
    elif isinstance(want, dict) and isinstance(got, dict):
        for k in sorted((set(want) | set(got)) - IGNORED_KEYS):
            if k not in got:
                out.append(f"{where}.{k}: missing")
            elif k not in want:
                out.append(f"{where}.{k}: new key")
            else:
                differences(want[k], got[k], f"{where}.{k}", out, limit)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append(f"{where}: {len(want)} items != {len(got)}")
        for i, (x, y) in enumerate(zip(want, got)):
            differences(x, y, f"{where}[{i}]", out, limit)
    elif want != got:
        out.append(f"{where}: {want!r} != {got!r}")
    return out


def _cell(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def parse(key: str, text: str):
    if key.endswith(".json"):
        return json.loads(text)
    return [[_cell(c) for c in row] for row in csv.reader(io.StringIO(text))]


def _update(only: set[str] | None) -> None:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for key, text in run_cases(Path(tmp), only).items():
            if only is None or key in only:
                (GOLDEN / key).write_text(text)
                print("wrote", GOLDEN / key)
        if (Path(tmp) / "fitted.calibration.json").exists():
            CAL_FILE.write_text((Path(tmp) / "fitted.calibration.json").read_text())
            print("wrote", CAL_FILE)


if __name__ == "__main__":
    if "--update" not in sys.argv[1:]:
        sys.exit("usage: python tests/test_golden.py --update [CASE.FMT ...]")
    sys.path.insert(0, str(HERE.parent))
    picked = {a for a in sys.argv[1:] if not a.startswith("--")}
    _update(picked or None)
else:
    import pytest

    pytestmark = pytest.mark.slow  # about 40 s on a quiet 2-core machine, all cases together

    @pytest.fixture(scope="module")
    def outputs(tmp_path_factory):
        return run_cases(tmp_path_factory.mktemp("golden"))

    @pytest.mark.parametrize("key", [f"{n}.{f}" for n, _, f in CASES])
    def test_golden(outputs, key):
        if key not in outputs:
            pytest.skip("the fit is pinned with OpenBLAS's SkylakeX kernels, which this CPU or numpy lacks")
        want = parse(key, (GOLDEN / key).read_text())
        got = parse(key, outputs[key])
        found = differences(want, got)
        assert not found, f"{key} differs from tests/golden/{key}:\n" + "\n".join(found)
