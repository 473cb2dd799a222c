"""Property-based fuzzing of the CLI's defences: every command's options and every file reader
(results, hardware profiles, model configs, requests CSVs) under Hypothesis.

Whatever the input, each run must:
- exit 0 or 2;
- print no traceback;
- on exit 2, print exactly one line on stderr, `Error: ...` (`Warning:` lines about skipped
  files in $MLACTL_HOME may come before it);
- touch no file outside `-o` and $MLACTL_HOME (inputs byte-identical, no new files anywhere else);
- on failure, leave the earlier `-o` file and every file in $MLACTL_HOME byte-identical.

The budget is a Hypothesis profile: "ci" (the default; the whole file in about a minute on two
cores) or "long" (`benchmarks/fuzz.py`), chosen by $MLACTL_FUZZ_PROFILE. $MLACTL_FUZZ_EXAMPLES
overrides the examples per test. With $MLACTL_FUZZ_COUNTS set, the outcome counts are written
there as JSON when the module finishes.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import socket
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.util import numbers, safe
from mlactl.util.errors import MlactlError

EXAMPLES = int(os.environ.get("MLACTL_FUZZ_EXAMPLES", "0")) or None
# CI's run is derandomized: the same examples every time, so a red CI is a change's doing and
# reproduces; the long profile draws new ones each run to find what CI's set misses.
_common = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
settings.register_profile("ci", max_examples=EXAMPLES or 50, derandomize=True, **_common)
settings.register_profile("long", max_examples=EXAMPLES or 500, derandomize=False, **_common)
settings.load_profile(os.environ.get("MLACTL_FUZZ_PROFILE", "ci"))

runner = CliRunner()
COUNTS: collections.Counter = collections.Counter()
# Small enough that a fuzzed grid is refused in milliseconds instead of computed for seconds.
MEMORY = "24M"


@pytest.fixture(scope="module", autouse=True)
def save_counts():
    yield
    out = os.environ.get("MLACTL_FUZZ_COUNTS")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(COUNTS.items())), indent=1) + "\n")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run(
    kind: str,
    args: list[str],
    files: dict[str, bytes | str] | None = None,
    home: dict | None = None,
    error_lines: int = 1,
):
    """Run `mlactl ARGS` in a fresh folder holding `files` (and `home` under $MLACTL_HOME), with
    `-o out.*` pre-written, and check every property of the module docstring. A reader that
    reports each bad line of a file (`mlactl replay`'s traces) may print up to `error_lines`
    lines, each an `Error: ...`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        work, home_dir = root / "work", root / "home"
        work.mkdir()
        for name, body in {**(files or {}), **{f"home/{k}": v for k, v in (home or {}).items()}}.items():
            path = root / ("" if name.startswith("home/") else "work") / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body.encode() if isinstance(body, str) else body)
        outputs = [a for a in args if a.startswith("out.")]
        for name in outputs:
            (work / name).write_bytes(b"earlier output")
        before_work, before_home = snapshot(work), snapshot(home_dir) if home_dir.exists() else {}
        old = os.getcwd()
        os.chdir(work)
        try:
            result = runner.invoke(
                app, args, env={"MLACTL_HOME": str(home_dir), "MLACTL_MAX_MEMORY": MEMORY, "COLUMNS": "132"}
            )
        finally:
            os.chdir(old)
        after_work = snapshot(work)
        after_home = snapshot(home_dir) if home_dir.exists() else {}
        assert set(os.listdir(root)) <= {"work", "home"}, os.listdir(root)

    COUNTS[f"{kind}: exit {result.exit_code}"] += 1
    text = f"args={args}\nstdout={result.stdout[-2000:]}\nstderr={result.stderr[-2000:]}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{type(result.exception).__name__}: {result.exception}\n{text}") from result.exception
    assert result.exit_code in (0, 2), text
    assert "Traceback" not in result.stdout + result.stderr, text
    changed = {k for k in set(before_work) | set(after_work) if before_work.get(k) != after_work.get(k)}
    assert changed <= set(outputs), f"touched {changed - set(outputs)}\n{text}"
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("Warning: ")]
        assert 1 <= len(lines) <= error_lines and all(line.startswith("Error: ") for line in lines), text
        assert not changed, f"a failed run changed {changed}\n{text}"
        assert after_home == before_home, f"a failed run changed $MLACTL_HOME\n{text}"
    return result


# -- option values: valid forms, edges and junk ----------------------------------------------------------

SIZE_TOKENS = st.sampled_from(
    ["0", "1", "7", "64", "8K", "1M", "2147483647", "2147483648", "9223372036854775807", str(10**20), "-5", "+3"]
    + ["0:32K:4K", "1:4096:*2", "1:100", "10:1", "1:5:0", "0:8:*2", "1:2:*1", "1.5", "1e3", "²", "٣", "K", ":", ",", ""]
)
SIZE = st.one_of(
    st.lists(SIZE_TOKENS, min_size=1, max_size=3).map(",".join),
    st.integers(-(2**70), 2**70).map(str),
    st.text(max_size=12),
)
WORD = st.one_of(st.sampled_from(["bf16", "fp16", "fp8", "fp32", "int4", "auto", "", "BF16"]), st.text(max_size=8))
SIZE_OPTIONS = ["--batch", "--new", "--prefix", "--context", "--chunk", "--tp", "--layers"]


def options(names: list[str], values) -> st.SearchStrategy[list[str]]:
    return st.lists(st.tuples(st.sampled_from(names), values), max_size=4).map(
        lambda pairs: [x for pair in pairs for x in pair]
    )


COMMON = st.one_of(
    options(SIZE_OPTIONS, SIZE),
    options(["--kv-dtype", "--dtype", "--model", "--hardware", "--policy", "--format"], WORD),
    options(["--model"], st.sampled_from(["deepseek-v3", "kimi-k2", "teaching", "llama", "/nonexistent", "x.json"])),
    options(["--hardware"], st.sampled_from(["h200", "h800", "b200", "tpu", "x.toml", "/"])),
    options(["--format"], st.sampled_from(["json", "csv", "table", "xml"])),
    options(["--bogus", "-Z", "--new="], st.text(max_size=4)),
)
ENGINE_OPTIONS = st.one_of(
    options(["--engines"], st.one_of(st.sampled_from(["sglang", "vllm,sglang", "sglang-triton", "sgl", ","]), WORD)),
    options(
        ["--engine-option"],
        st.one_of(
            st.sampled_from(["threshold=0", "threshold=-1", "sglang.threshold=8K", "vllm.threshold=1.5"]),
            st.sampled_from(["vllm.backend=flashmla", "vllm.backend=x", "sglang.capacity=2147483648", "x=y", "="]),
            st.text(max_size=10),
        ),
    ),
    options(["--calibration"], st.sampled_from(["nope", "/", "x.json", "../x", ""])),
)
FLAGS = st.lists(st.sampled_from(["--ops", "--crossover", "--measured", "-h"]), max_size=2, unique=True)
OUTPUT = st.sampled_from([[], ["-o", "out.json"], ["-o", "out.csv"], ["-o", "out.txt"], ["-o", "out.xml"], ["-o", "."]])


@given(command=st.sampled_from(["analyze", "crossover"]), opts=COMMON, flags=FLAGS, output=OUTPUT)
def test_fuzz_analyze_and_crossover_options(command, opts, flags, output):
    if command == "crossover":
        flags = [f for f in flags if f != "--ops" and f != "--crossover"]
    run(command, [command, *opts, *flags, *output])


@settings(max_examples=max(5, (EXAMPLES or settings().max_examples) // 2))
@given(command=st.sampled_from(["analyze", "engines"]), opts=COMMON, engine_opts=ENGINE_OPTIONS, output=OUTPUT)
def test_fuzz_engine_options(command, opts, engine_opts, output):
    run(command, [command, *opts, *engine_opts, *output])


@given(opts=options(["--format", "-f"], st.one_of(st.sampled_from(["json", "table"]), WORD)), output=OUTPUT)
def test_fuzz_list_options(opts, output):
    run("list", ["list", *opts, *output])


@settings(max_examples=max(5, (EXAMPLES or settings().max_examples) // 4))
@given(
    chart=st.sampled_from(["roofline", "crossover", "pathmap"]),
    opts=st.one_of(options(["--batch", "--new", "--prefix", "--dpi"], SIZE), options(["--dpi"], SIZE_TOKENS)),
    output=st.sampled_from(["out.png", "out.svg", "out.gif", "out"]),
)
def test_fuzz_plot_options(chart, opts, output):
    run("plot", ["plot", chart, *opts, "-o", output])


# -- file readers ----------------------------------------------------------------------------------------

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
JSON_VALUE = st.recursive(
    JSON_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
)


def mutate(doc, draw_path, value):
    """Replace (or add) the value at a path of keys/indices in a deep copy of `doc`."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in draw_path[:-1]:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            break
    last = draw_path[-1]
    if isinstance(node, dict):
        node[last if isinstance(last, str) else str(last)] = value
    elif isinstance(node, list) and node:
        node[last % len(node) if isinstance(last, int) else 0] = value
    return doc


GOOD_RESULTS = {
    "schema": "mlactl.results",
    "schema_version": 1,
    "device": {"name": "NVIDIA H200", "type": "cuda", "hardware": "h200"},
    "versions": {"torch": "2.13.0"},
    "backend": "triton",
    "timing": {"method": "cuda-graph", "l2": "cold", "meaningful": True},
    "model": {"name": "deepseek-v3", "hidden": 7168, "H": 128, "q_lora_rank": 1536, "r": 512, "dC": 128, "dR": 64}
    | {"dV": 128, "layers": 61, "tp": 1},
    "kv_dtype": "bf16",
    "dtype": "bf16",
    "chunk": 8192,
    "created": "2026-11-30T06:45:00Z",
    "kernels": [
        {
            "kernel": "mla_decode",
            "bucket": "B=1,H=128,S_q=1,ctx=4096",
            "shape": {"B": 1, "H": 128, "S_q": 1, "ctx": 4096},
            "configs": [{"config": {"BLOCK_N": 64}, "status": "ok", "reason": "", "median_s": 1e-4}],
            "best": {"BLOCK_N": 64},
            "best_median_s": 1e-4,
        }
    ],
    "paths": [
        {"batch": 1, "new": n, "prefix": 4096, "path": p, "median_s": 1e-4 * n, "flops": 1e9, "bytes": 1e8}
        for n in (1, 64, 512)
        for p in ("expand", "absorb")
    ],
    "crossovers": [{"batch": 1, "prefix": 4096, "measured": 180, "predicted": 175, "predicted_by_flops": 168}],
    "ceilings": {"peak_tflops": {"bf16": 780.0}, "bandwidth_tbs": 4.3},
}
KEYS = st.sampled_from(
    ["schema", "schema_version", "device", "name", "backend", "timing", "model", "H", "r", "paths", "crossovers"]
    + ["kernels", "configs", "bucket", "median_s", "batch", "new", "prefix", "measured", "ceilings", "peak_tflops"]
    + ["bf16", "bandwidth_tbs", "kv_dtype", "created", "config", "status", "hardware"]
)
PATHS = st.lists(st.one_of(KEYS, st.integers(0, 5)), min_size=1, max_size=4)


GOOD_CALIBRATION = {
    "schema": "mlactl.calibration",
    "schema_version": 1,
    "name": "fuzz-h200",
    "hardware": "h200",
    "fits": [
        {"op": op, "source": "fuzz", "dtype": "bf16", "terms": ["fixed"]}
        | {"params": {"t_fixed_s": 5e-6, "eta_c": 0.6, "eta_m": 0.8}}
        for op in ("kv_expand", "expand_attention", "lse_merge", "q_absorb", "absorb_attention", "out_absorb")
    ],
}
CAL_KEYS = st.sampled_from(
    ["schema", "schema_version", "name", "hardware", "fits", "op", "source", "dtype", "terms", "params"]
    + ["t_fixed_s", "eta_c", "eta_m", "pad", "waves"]
)


@given(
    path=st.lists(st.one_of(CAL_KEYS, st.integers(0, 6)), min_size=1, max_size=4),
    value=JSON_VALUE,
    raw=st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40)),
    command=st.sampled_from([["analyze"], ["crossover"], ["engines", "--new", "1,512"]]),
)
def test_fuzz_calibration_files(path, value, raw, command):
    body = mutate(GOOD_CALIBRATION, path, value) if raw is None else raw
    text = json.dumps(body) if raw is None else raw
    args = [*command, "--hardware", "h200", "--prefix", "4096", "-f", "json"]
    run("calibration file", [*args, "--calibration", "c.json"], files={"c.json": text})
    # by name, from $MLACTL_HOME/calibrations/
    run("calibration in home", [*args, "--calibration", "fuzz-h200"], home={"calibrations/fuzz-h200.json": text})


@given(path=PATHS, value=JSON_VALUE, raw=st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40)))
def test_fuzz_results_files(path, value, raw):
    body = mutate(GOOD_RESULTS, path, value) if raw is None else raw
    text = json.dumps(body) if raw is None else raw
    run(
        "results --results",
        ["analyze", "--hardware", "h200", "--policy", "measured", "--results", "r.json"],
        files={"r.json": text},
    )
    # the same file found in $MLACTL_HOME: skipped with a warning when bad, never fatal by itself
    run(
        "results in home",
        ["analyze", "--hardware", "h200", "--policy", "measured", "-f", "json"],
        home={"results/NVIDIA_H200/r.json": text},
    )


TOML_LEAF = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["inf", "-inf", "nan", "1e308", "1e-320", "0", "0.5", "989", "true", '"x"', '""', "[]", '["a"]']),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=6).map(json.dumps),
)
PROFILE_KEYS = ["name", "display", "memory_gb", "bandwidth_tbs", "sm_count", "smem_per_sm_kib", "l2_mib"]
PROFILE_KEYS += ["match", "sources"]


@st.composite
def profiles(draw) -> str:
    base = {"name": '"fz"', "memory_gb": "80", "bandwidth_tbs": "3.35", "match": '["FZ"]'}
    valid = draw(st.booleans())  # half the examples keep every value valid but one at most
    for key in draw(st.lists(st.sampled_from(PROFILE_KEYS), max_size=1 if valid else 3)):
        base[key] = draw(st.sampled_from(['"other"', "1e6", "1e-6", "141", "[]"]) if valid else TOML_LEAF)
    for key in draw(st.lists(st.sampled_from(list(base)), max_size=0 if valid else 1)):
        base.pop(key)
    peaks = {"bf16": draw(st.just("989") if valid else TOML_LEAF)}
    lines = [f"{k} = {v}" for k, v in base.items()] + ["[peak_tflops]"] + [f"{k} = {v}" for k, v in peaks.items()]
    if draw(st.booleans()):
        lines += ["[measured]", f"bandwidth_tbs = {draw(TOML_LEAF)}", "[measured.peak_tflops]", "bf16 = 700"]
    text = "\n".join(lines) + "\n"
    return text if draw(st.integers(0, 9)) else draw(st.text(max_size=30))


@given(profile=profiles(), measured=st.booleans())
def test_fuzz_profiles(profile, measured):
    run(
        "profile --hardware",
        ["analyze", "--hardware", "p.toml", "-f", "json", *(["--measured"] * measured)],
        files={"p.toml": profile},
    )
    result = run("profile in home: list", ["list"], home={"hardware/fz.toml": profile})
    assert result.exit_code == 0, result.stderr  # a bad user profile must not break list


CONFIG = {
    "_name_or_path": "org/model",
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "kv_lora_rank": 256,
    "q_lora_rank": None,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "num_hidden_layers": 4,
}
CONFIG_KEYS = st.sampled_from([*CONFIG, "text_config", "model_type"])


@given(key=CONFIG_KEYS, value=JSON_VALUE, drop=st.booleans(), raw=st.one_of(st.none(), st.text(max_size=30)))
def test_fuzz_model_configs(key, value, drop, raw):
    config = dict(CONFIG)
    if drop:
        config.pop(key, None)
    else:
        config[key] = value
    run(
        "config",
        ["analyze", "--model", "config.json", "--new", "1,64", "--prefix", "0,4K", "-f", "csv"],
        files={"config.json": json.dumps(config) if raw is None else raw},
    )


VALID_CELL = st.one_of(st.integers(1, 10**5).map(str), st.sampled_from(["4K", " 7 ", "1M", "2147483647"]))
JUNK_CELL = st.one_of(
    SIZE_TOKENS,
    st.integers(-5, 10**6).map(str),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=5),
    st.sampled_from(['"1\n2"', '"3"', "", "1,2"]),
)
HEADER = st.sampled_from(
    ["new,prefix", "new,prefix,count", "new,context", "\ufeffnew,prefix", "prefix", "new,prefix,x"]
)


@st.composite
def requests_rows(draw, header: str) -> list[str]:
    """Half the time every row is valid for the header (context >= new), else any cells."""
    width = header.count(",") + 1
    if draw(st.booleans()):
        rows = []
        for _ in range(draw(st.integers(1, 6))):
            cells = [draw(VALID_CELL) for _ in range(width)]
            if header.endswith("context"):
                cells = ["1", cells[1]]
            rows.append(",".join(cells))
        return rows
    return draw(st.lists(st.lists(JUNK_CELL, min_size=1, max_size=4).map(",".join), max_size=6))


@given(
    header=HEADER,
    data=st.data(),
    newline=st.sampled_from(["\n", "\r\n"]),
    fmt=st.sampled_from(["table", "json", "csv"]),
)
def test_fuzz_requests_csv(header, data, newline, fmt):
    rows = data.draw(requests_rows(header))
    text = newline.join([header, *rows]) + newline
    run("requests", ["batch", "req.csv", "-f", fmt], files={"req.csv": text.encode("utf-8", "surrogatepass")})


# -- the results store (what `mlactl tune` resumes from): nothing measured is lost -------------------------


STORE_HEADER = {k: GOOD_RESULTS[k] for k in ("schema", "schema_version", "device", "versions", "backend")} | {
    k: GOOD_RESULTS[k] for k in ("timing", "model", "kv_dtype", "dtype", "chunk")
}


@given(path=PATHS, value=JSON_VALUE, force=st.booleans())
def test_fuzz_results_store(path, value, force):
    """Resume or --force on a mutated file: either one MlactlError (file untouched) or a store
    that kept every entry that passes the schema; with --force the old bytes survive as a backup."""
    from mlactl.results import store as results
    from mlactl.tune.store import ResultsStore
    from mlactl.util.errors import MlactlError

    body = json.dumps(mutate(GOOD_RESULTS, path, value))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        out.write_text(body)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                store = ResultsStore(out, STORE_HEADER, force=force)
            except MlactlError:
                COUNTS["store: refused"] += 1
                assert not force and out.read_text() == body and os.listdir(tmp) == ["r.json"]
                return
        COUNTS[f"store: {'forced' if force else 'resumed'}"] += 1
        if force:
            assert store.moved_aside is not None and store.moved_aside.read_text() == body
            return
        try:
            wanted = results.validate(json.loads(body), "x", drop_bad=True)
        except MlactlError:
            raise AssertionError("a resumed store accepted a file the schema refuses") from None
        kept = results.load(out)
        for section in ("kernels", "paths", "crossovers"):
            assert kept.get(section, []) == wanted.get(section, []), section
        assert sorted(os.listdir(tmp)) == ["r.json"]  # no lock or temporary file left


# == the guards, one boundary at a time ====================================================================
#
# Each boundary has one guard in mlactl/util (or mlactl/output for sinks), and every command passes
# through it. The guard itself is tested on arbitrary input first; then the commands that cross the
# boundary, so a new command that uses the guard is covered by the same properties.


ANY_TEXT = st.text(alphabet=st.characters(), max_size=60)  # surrogates, controls, bidi, everything
HOSTILE = st.one_of(
    ANY_TEXT,
    st.sampled_from(
        ["[/]", "[bold]x", "[link=https://e.x]y[/link]", "$x^2$", "a$b", "\x1b[31mred", "\u202eevil", "a\\", ":fire:"]
        + ["-rf", "..", "../../x", "/etc/passwd", "a\nb", "\ud800", "%s%n", "{0}", "x" * 300]
    ),
)
HIDDEN = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


# -- 1. names into sinks -----------------------------------------------------------------------------------


@given(name=HOSTILE)
def test_guard_text_leaves_nothing_a_terminal_obeys(name):
    import unicodedata

    out = safe.text(name)
    assert not any(unicodedata.category(c) in HIDDEN for c in out)
    assert len(out) <= safe.MAX_NAME
    out.encode("utf-8")  # a lone surrogate cannot even be printed; an escape can
    if name.isprintable() and len(name) <= safe.MAX_NAME:
        assert out == name  # plain names pass unchanged


@given(name=HOSTILE)
def test_guard_markup_prints_the_name_as_written(name):
    from rich.text import Text

    # the name between our own markup: rich neither raises nor takes any of it as a tag (emoji
    # codes such as :fire: are off in every console mlactl prints on: mlactl.cli.common.console)
    rendered = Text.from_markup(f"[bold]{safe.markup(name)}[/] end", emoji=False)
    assert rendered.plain == safe.text(name) + " end"
    assert all(span.style == "bold" for span in rendered.spans)


@given(name=HOSTILE)
def test_guard_mathtext_never_switches_to_math(name):
    from matplotlib.text import Text

    text, math_mode = Text(0, 0)._preprocess_math(safe.mathtext(name))
    assert math_mode is False, text


@given(name=HOSTILE)
def test_guard_filename_is_one_harmless_name(name):
    out = safe.filename(name)
    assert out and out not in (".", "..") and "/" not in out and "\0" not in out
    assert not out.startswith((".", "-"))
    assert len(out.encode()) <= 120
    assert re.fullmatch(r"[A-Za-z0-9=_][A-Za-z0-9.=_-]*", out)


@given(name=st.text(min_size=1, max_size=300), tail=st.sampled_from([".tmp", ".lock", ".20261130-120000.3.json"]))
def test_guard_fit_name_fits_any_file_system(name, tail):
    out = safe.fit_name(name, head=".", tail=tail)
    assert len(out.encode()) <= safe.NAME_MAX and out.startswith(".") and out.endswith(tail)


def toml_string(text: str) -> str:
    """`text` as a TOML basic string: control characters escaped, everything else literal."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


@settings(max_examples=max(5, (EXAMPLES or settings().max_examples) // 2))
@given(
    name=HOSTILE,
    where=st.sampled_from(["config", "profile", "calibration", "results"]),
    command=st.sampled_from(
        [
            ["analyze", "--new", "1,64", "--prefix", "0,4K"],
            ["analyze", "--new", "1", "--prefix", "4K", "-o", "out.txt"],
            ["crossover", "--prefix", "0,4K"],
            ["batch", "req.csv"],
            ["engines", "--new", "1,64", "--prefix", "0,4K"],
            ["plot", "crossover", "--new", "1:64:*4", "--prefix", "0,4K", "-o", "out.png"],
        ]
    ),
)
def test_fuzz_names_from_files_reach_every_sink_safely(name, where, command):
    """A hostile name in a config, a profile, a calibration or a results file: every command that
    shows it exits 0, prints no escape byte, and shows the name as text (markup not obeyed)."""
    assume(name.strip())
    config = dict(CONFIG, _name_or_path=name)
    files: dict = {"req.csv": "new,prefix\n1,4096\n512,0\n"}
    home: dict = {}
    args = list(command)
    if where == "config":
        files["config.json"] = json.dumps(config)
        args += ["--model", "config.json"]
    elif where == "profile":
        assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in name))  # a TOML file is UTF-8: no lone surrogates
        files["p.toml"] = f'name = "p"\ndisplay = {toml_string(name)}\nmemory_gb = 80\nbandwidth_tbs = 3.35\n'
        files["p.toml"] += "[peak_tflops]\nbf16 = 989\n"
        args += ["--hardware", "p.toml"]
    elif where == "calibration":
        cal = dict(GOOD_CALIBRATION, name=name[:100], hardware="h200")
        files["c.json"] = json.dumps(cal)
        args += ["--calibration", "c.json"]
    else:
        if command[0] != "plot":
            return  # results files reach analyze --policy measured and plot --results
        files["r.json"] = json.dumps(mutate(GOOD_RESULTS, ["device", "name"], name))
        args += ["--results", "r.json"]
    result = run(f"names into {where}", args, files=files, home=home)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout + result.stderr


# -- 2. inputs that are not regular files --------------------------------------------------------------------

KINDS = ["directory", "fifo", "socket", "dangling link", "link to fifo", "missing"]
INPUTS = {
    "--model": ["analyze", "--model", "{}"],
    "--hardware": ["analyze", "--hardware", "{}"],
    "--calibration": ["analyze", "--calibration", "{}"],
    "--results": ["analyze", "--policy", "measured", "--results", "{}"],
    "requests": ["batch", "{}"],
    "workload": ["engines", "{}"],
    "plot --results": ["plot", "roofline", "--results", "{}", "-o", "out.png"],
    "calibrate csv": ["calibrate", "--from", "csv", "{}", "--hardware", "h200"],
    "calibrate results": ["calibrate", "--from", "results", "{}", "--hardware", "h200"],
    "replay trace": ["replay", "{}"],
    "plot replay": ["plot", "replay", "{}", "-o", "out.png"],
}


def make_special(path: Path, kind: str, keep: list) -> None:
    """A file system object of `kind` at `path` (sockets are kept open in `keep`)."""
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        keep.append(sock)
    elif kind == "dangling link":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "link to fifo":
        os.mkfifo(path.parent / "real-fifo")
        path.symlink_to(path.parent / "real-fifo")


def run_bounded(args, seconds: float = 20.0, env=None):
    """runner.invoke under an alarm: a read that blocks fails the test instead of hanging it."""
    import signal

    def timeout(*_):
        raise TimeoutError(f"mlactl {' '.join(map(str, args))} blocked for {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return runner.invoke(app, [str(a) for a in args], env=env)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@settings(max_examples=max(10, (EXAMPLES or settings().max_examples) // 2))
@given(kind=st.sampled_from(KINDS), where=st.sampled_from(sorted(INPUTS)), name=st.sampled_from(["in", "in.json"]))
def test_fuzz_inputs_that_are_not_regular_files(kind, where, name):
    """Every input option, given a FIFO, a socket, a directory or a dangling link: one error line
    at once (never a read that blocks), naming what it is."""
    keep: list = []
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / name
        make_special(target, kind, keep)
        args = [a.replace("{}", str(target)) for a in INPUTS[where]]
        old = os.getcwd()
        os.chdir(tmp)
        try:
            result = run_bounded(args, env={"MLACTL_HOME": str(Path(tmp) / "home")})
        finally:
            os.chdir(old)
            for sock in keep:
                sock.close()
    COUNTS[f"special input: exit {result.exit_code}"] += 1
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("Warning: ")]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    if kind in ("fifo", "socket", "link to fifo"):
        assert "not a regular file" in lines[0] or "is a directory" in lines[0], lines[0]


STORES = {
    "hardware/x.toml": ["list"],
    "results/NVIDIA_H200/x.json": ["analyze", "--hardware", "h200", "--policy", "measured"],
    "calibrations/x.json": ["analyze", "--calibration", "nope"],
}


@settings(max_examples=max(6, (EXAMPLES or settings().max_examples) // 4))
@given(kind=st.sampled_from(["directory", "fifo", "socket", "dangling link"]), where=st.sampled_from(sorted(STORES)))
def test_fuzz_store_folders_skip_what_is_not_a_file(kind, where):
    """A FIFO (or a directory, a socket, a dangling link) named like a store file in $MLACTL_HOME:
    the command that lists the folder neither blocks nor fails on it; it warns, naming it."""
    keep: list = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        target = home / where
        target.parent.mkdir(parents=True)
        make_special(target, kind, keep)
        try:
            result = run_bounded(STORES[where], env={"MLACTL_HOME": str(home)})
        finally:
            for sock in keep:
                sock.close()
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output
    if not (kind == "directory" and where.startswith("results/")):  # results/ is searched into its folders
        assert f"Warning: skipped {target}" in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert result.exit_code == 0 or len(errors) == 1


# -- 3. an output that is also an input ---------------------------------------------------------------------

ALIASES = ["same", "dot-slash", "absolute", "symlink", "hard link", "parent hop"]
SAME_FILE = {
    # command, the input it reads, the option that would overwrite it
    "analyze --results": (["analyze", "--policy", "measured", "--results", "r.json", "-f", "json"], "r.json", "-o"),
    "analyze --model": (["analyze", "--model", "config.json", "-f", "json"], "config.json", "-o"),
    "analyze --calibration": (
        ["analyze", "--hardware", "h200", "--calibration", "c.json", "-f", "json"],
        "c.json",
        "-o",
    ),
    "batch": (["batch", "r.csv", "-f", "csv"], "r.csv", "-o"),
    "engines": (["engines", "r.csv", "-f", "csv"], "r.csv", "-o"),
    "plot --data": (["plot", "roofline", "--results", "r.json", "-o", "out.png"], "r.json", "--data"),
    "replay": (["replay", "t.jsonl", "-f", "json"], "t.jsonl", "-o"),
}


def alias_of(name: str, how: str, work: Path) -> str:
    if how == "same":
        return name
    if how == "dot-slash":
        return f"./{name}"
    if how == "absolute":
        return str(work / name)
    if how == "parent hop":
        return f"../{work.name}/{name}"
    other = work / f"alias-{name}"
    if how == "symlink":
        other.symlink_to(work / name)
    else:
        os.link(work / name, other)
    return other.name


@settings(max_examples=max(10, (EXAMPLES or settings().max_examples) // 2))
@given(case=st.sampled_from(sorted(SAME_FILE)), how=st.sampled_from(ALIASES))
def test_fuzz_an_output_never_replaces_an_input(case, how):
    """Every spelling of an input as the output (the name, ./name, its absolute path, a symlink, a
    hard link, ../dir/name): one error line, and the input byte-identical."""
    args, source, option = SAME_FILE[case]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bodies = {
            "r.json": json.dumps(GOOD_RESULTS),
            "config.json": json.dumps(CONFIG),
            "c.json": json.dumps(GOOD_CALIBRATION),
            "r.csv": "new,prefix\n1,4096\n512,0\n",
            "t.jsonl": '{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1, 2]}\n',
        }
        for name, body in bodies.items():
            (work / name).write_text(body)
        before = (work / source).read_bytes()
        old = os.getcwd()
        os.chdir(work)
        try:
            out = alias_of(source, how, work)
            result = run_bounded([*args, option, out], env={"MLACTL_HOME": str(work / "home")})
        finally:
            os.chdir(old)
        after = (work / source).read_bytes()
    COUNTS[f"output = input: exit {result.exit_code}"] += 1
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Error: cannot write") and "it is an input of this command" in lines[-1], lines
    assert after == before


@given(name=st.text(alphabet=st.characters(min_codepoint=0x61, max_codepoint=0x24F), min_size=1, max_size=120))
def test_fuzz_the_longest_legal_output_name_is_written(name):
    """A file name of 255 bytes (ASCII or not) is legal; its temporary sibling must fit too."""
    raw = name.encode()
    pad = 255 - len(".txt") - len(raw)
    assume(pad >= 0)
    long_name = name + "x" * pad + ".txt"
    assert len(long_name.encode()) == 255
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / long_name
        result = run_bounded(["analyze", "--new", "1", "--prefix", "0", "-o", out], env={})
        assert result.exit_code == 0, result.output
        assert out.read_text().startswith("deepseek-v3")
        assert os.listdir(tmp) == [long_name]  # no temporary file left


# -- 4. numbers ---------------------------------------------------------------------------------------------

NUMBER_TEXT = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**80), 2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["inf", "-inf", "nan", "1e308", "1e-320", "٣", "²", "1_000", "0x10", " 7 ", "4K", "1.5", "-0"]),
)


@given(text=NUMBER_TEXT, minimum=st.integers(0, 3), maximum=st.sampled_from([1, 100, numbers.MAX_SIZE]))
def test_guard_integer_is_bounded_and_ascii(text, minimum, maximum):
    try:
        value = numbers.integer(text, "--x", minimum, maximum)
    except MlactlError as exc:
        assert str(exc).startswith("--x") and "\n" not in str(exc)
        return
    assert isinstance(value, int) and minimum <= value <= maximum
    assert text.isascii()


def user_forms(n: int) -> list[str]:
    """The ways a user writes the size `n`: 4096, 4_096, 4.096e3, 4K (each where it is exact)."""
    forms = [str(n), f"{n:_}", f" {n} ", f"{n}e0"]
    if n and n % 10 == 0:
        digits = str(n).rstrip("0")
        forms.append(f"{digits}e{len(str(n)) - len(digits)}")
    if n % 1024 == 0:
        forms += [f"{n // 1024}K", f"{n // 1024}k"]
    if n % 1024 == 512:
        forms.append(f"{n // 1024}.5K")
    return forms


@given(n=st.integers(0, numbers.MAX_SIZE))
def test_guard_integer_reads_every_form_users_write(n):
    for text in user_forms(n):
        assert numbers.integer(text, "--x") == n, text


FOREIGN_DIGIT = st.characters(categories=["Nd", "No", "Nl"]).filter(lambda c: not c.isascii())


@given(before=st.text(alphabet="0123456789", max_size=3), digit=FOREIGN_DIGIT, after=st.text("0123456789", max_size=3))
def test_guard_numbers_refuse_other_scripts_and_hex_clearly(before, digit, after):
    """A digit of another script anywhere, or a 0x/0o/0b prefix, is refused by both parsers with
    the reason, never read as some other number."""
    for text in (before + digit + after, f"0x{before or '1'}{after}", f"0o{after or '7'}", "0b1"):
        for parse in (lambda t: numbers.integer(t, "--x"), lambda t: numbers.real(t, "--y", 0, 1e9)):
            with pytest.raises(MlactlError, match="another script|hexadecimal") as err:
                parse(text)
            assert "\n" not in str(err.value)


@given(text=NUMBER_TEXT, low=st.sampled_from([0.0, 1e-4]), high=st.sampled_from([1.2, 3600.0]))
def test_guard_real_is_finite_bounded_and_ascii(text, low, high):
    try:
        value = numbers.real(text, "time_s", low, high, above=True)
    except MlactlError as exc:
        assert str(exc).startswith("time_s") and "\n" not in str(exc)
        return
    assert math.isfinite(value) and low < value <= high and text.isascii()


@given(value=st.one_of(JSON_VALUE, st.floats(), st.integers(-(2**2000), 2**2000)))
def test_guard_check_real_takes_only_numbers_in_range(value):
    try:
        got = numbers.check_real(value, "eta", 1e-4, 1.2)
    except MlactlError:
        return
    assert 1e-4 <= got <= 1.2 and not isinstance(value, bool)


CSV_CELL = st.one_of(
    NUMBER_TEXT, st.sampled_from(["64", "1", "8191", "4.1e-05", "128", "inf", "1e308", "nan", "-1", "0", ""])
)


@settings(max_examples=max(10, (EXAMPLES or settings().max_examples) // 2))
@given(cells=st.lists(CSV_CELL, min_size=5, max_size=5))
def test_fuzz_calibration_csv_numbers(cells):
    """A calibration CSV row with any cells: a fit, or one error line; never an OverflowError
    from heads=inf nor a 2e303-second time."""
    batch, new, prefix, time_s, heads = cells
    rows = [f"absorb_attention,{batch},{new},{prefix},{time_s},{heads}"] * 8
    text = "op,batch,new,prefix,time_s,heads\n" + "\n".join(rows) + "\n"
    result = run(
        "calibration csv",
        ["calibrate", "--from", "csv", "c.csv", "--hardware", "h200", "-f", "json"],
        files={"c.csv": text},
        home={},
    )
    if result.exit_code == 0:
        fits = json.loads(result.stdout)["fits"]
        assert all(1e-4 <= f["params"][k] <= 2.4 for f in fits for k in f["params"] if k.startswith("eta_"))


PARAM_VALUES = st.one_of(
    st.sampled_from([1e-300, 1e308, -1, 0, 0.5, 1.2, 1.21, 2.5, "0.5", None, [], {}, True, float("inf")]),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(
    op=st.integers(0, 5),
    key=st.sampled_from(["t_fixed_s", "eta_c", "eta_m", "t_iter_s"]),
    value=PARAM_VALUES,
    dtype=st.sampled_from(["bf16", "fp8"]),
)
@example(op=1, key="t_iter_s", value=0.5, dtype="bf16")  # CI found it: 0.5 s x waves x iterations
def test_fuzz_calibration_parameters_have_physical_ranges(op, key, value, dtype):
    """Any value for a fitted parameter: the file is refused in one line, or every time it gives
    is finite and below an hour (an efficiency of 1e-300 gave 4e298 s before)."""
    cal = json.loads(json.dumps(GOOD_CALIBRATION))
    fit = cal["fits"][op]
    fit["terms"] = ["fixed", "serial"]
    fit["params"]["t_iter_s"] = 1e-7
    fit["params"][key] = value
    fit["dtype"] = dtype
    result = run(
        "calibration params",
        [
            "analyze",
            "--hardware",
            "h200",
            "--new",
            "1,4096",
            "--prefix",
            "0,32K",
            "-f",
            "json",
            "--calibration",
            "c.json",
        ],
        files={"c.json": json.dumps(cal)},
    )
    if result.exit_code == 0:
        rows = json.loads(result.stdout)["rows"]
        times = [p["time_s"] for r in rows for p in r["paths"].values()]
        assert all(t is None or 0 < t < 3600 for t in times)


# -- request traces (`mlactl replay`): each bad line one `Error:` line ---------------------------------

TRACE_VALUE = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, 511, 512, 513, 4096, 2**31, 1e309, -0.0, 1.5, "12", None, True, [], {}]),
    st.floats(allow_nan=False, allow_infinity=False),
)


@st.composite
def mooncake_lines(draw) -> list[str]:
    lines = []
    t = 0
    for _ in range(draw(st.integers(0, 6))):
        t += draw(st.integers(-500, 3000))
        inp = draw(st.integers(1, 5000))
        row = {"timestamp": t, "input_length": inp, "output_length": draw(st.integers(1, 30))}
        row["hash_ids"] = draw(st.lists(st.integers(0, 20), max_size=-(-inp // 512) + 1))
        if draw(st.booleans()):
            row[draw(st.sampled_from(list(row)))] = draw(TRACE_VALUE)
        if draw(st.integers(0, 9)) == 0:
            del row[draw(st.sampled_from(list(row)))]
        lines.append(json.dumps(row) if draw(st.integers(0, 9)) else draw(st.text(max_size=20)))
    return lines


@st.composite
def trace_csv_lines(draw) -> list[str]:
    header = draw(
        st.sampled_from(
            ["arrival_s,input_tokens,output_tokens", "arrival_s,input_tokens,output_tokens,cached_tokens,session",
             "input_tokens,output_tokens", "session,arrival_s,output_tokens,input_tokens"]
        )
    )  # fmt: skip
    width = header.count(",") + 1
    cell = st.one_of(st.integers(0, 3000).map(str), st.sampled_from(["", "a", "-1", "1e3", "nan", "4K", " 7 "]))
    rows = draw(st.lists(st.lists(cell, min_size=width - 1, max_size=width + 1).map(",".join), max_size=6))
    return [header, *rows]


@settings(max_examples=max(5, (EXAMPLES or settings().max_examples) // 2))
@given(lines=st.one_of(mooncake_lines(), trace_csv_lines()), engines=st.sampled_from(["vllm", "sglang"]))
def test_fuzz_replay_traces(lines, engines):
    text = "\n".join(lines) + "\n"
    args = ["replay", "t.jsonl", "--engines", engines, "-f", "json", "-o", "out.json"]
    run("trace", args, files={"t.jsonl": text.encode("utf-8", "surrogatepass")}, error_lines=21)


REPLAY_OPTIONS = options(
    ["--max-batch-tokens", "--max-running", "--mem-fraction", "--cache-tokens", "--step-overhead-ms", "--tp"],
    st.one_of(SIZE_TOKENS, st.sampled_from(["0.5", "1", "1.01", "-0.1", "inf", "nan", "0.0001"])),
)


# versioned rules and the options replay's scheduler and clock read (mixed chunk; fa4 decodes are refused)
REPLAY_ENGINE_OPTIONS = st.one_of(
    ENGINE_OPTIONS,
    options(
        ["--engines"],
        st.sampled_from(["sglang@0.5.14,vllm@0014ca6b", "vllm@0.33.0", "sglang@9", "sglang-trtllm,vllm@0014ca6b"]),
    ),
    options(
        ["--engine-option"],
        st.sampled_from(
            [
                "sglang.enable_mixed_chunk=true",
                "enable_mixed_chunk=1",
                "sglang.decode_attention_backend=fa4",
                "vllm.backend=flashmla",
                "vllm.prefill_context_parallel_size=2",
                "sglang.disable_piecewise_cuda_graph=true",
                "sglang.piecewise_cuda_graph_max_tokens=0",
            ]
        ),
    ),
)


@settings(max_examples=max(5, (EXAMPLES or settings().max_examples) // 4))
@given(opts=REPLAY_OPTIONS, engine_opts=REPLAY_ENGINE_OPTIONS, output=OUTPUT)
def test_fuzz_replay_options(opts, engine_opts, output):
    trace = '{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1, 2]}\n'
    run("replay", ["replay", "t.jsonl", *opts, *engine_opts, *output], files={"t.jsonl": trace})


# -- the trace reader's guard: exact, bounded, ordered timestamps; compressed files ----------------------

TIMESTAMP = st.one_of(
    st.integers(0, 10**18),
    st.sampled_from([1733000000000000, 1733000000000001, 10**18, 10**18 + 1, -1, 1e308, 0.5, 2**53 + 1]),
    st.floats(0, 1e18, allow_nan=False),
)


@given(stamps=st.lists(TIMESTAMP, min_size=1, max_size=6), crlf=st.booleans(), bom=st.booleans())
def test_guard_trace_clock_is_exact_bounded_and_ordered(tmp_path_factory, stamps, crlf, bom):
    """Any timestamps: the trace is read with arrivals from 0, each exactly (its timestamp minus the
    first, in ms, / 1000) however far from zero the clock is, in order; or each bad line is one
    `Error:` line (negative, past 1e18, out of order, a span past 31 years). A BOM and CRLF
    line ends change nothing."""
    from decimal import Decimal

    from mlactl.decide.replay.traces import read_trace

    end = "\r\n" if crlf else "\n"
    lines = [json.dumps({"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": [i]}) for i, t in
             enumerate(stamps)]  # fmt: skip
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    path.write_bytes(("\ufeff" if bom else "").encode() + end.join(lines).encode() + end.encode())
    try:
        trace = read_trace(path)
    except MlactlError as exc:
        errors = str(exc).split("\nError: ")
        assert all(e.startswith(f"{path}: line ") for e in errors) and len(errors) <= 21
        return
    exact = [Decimal(json.dumps(t)) for t in stamps]
    assert all(0 <= exact[i] <= 10**18 for i in range(len(exact)))
    assert exact == sorted(exact) and (exact[-1] - exact[0]) / 1000 <= 1e9
    assert trace.arrival.tolist() == [float((t - exact[0]) / 1000) for t in exact]
    assert trace.origin_s == float(exact[0] / 1000)


@pytest.mark.parametrize("magic, kind", [(b"\x1f\x8b\x08\x00", "gzip"), (b"BZh91AY", "bzip2"),
                                         (b"\xfd7zXZ\x00\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd")])  # fmt: skip
def test_a_compressed_trace_is_named_as_such(magic, kind):
    out = run("trace", ["replay", "t.jsonl"], files={"t.jsonl": magic + bytes(range(256))}, error_lines=1)
    assert out.exit_code == 2
    assert f"is a {kind}-compressed file" in out.stderr and "decompress it first" in out.stderr


# -- tables on a terminal and measurements on disk --------------------------------------------------------

NUMBER_CELL = st.one_of(
    st.integers(0, 10**12).map(lambda n: f"{n:,}"),
    st.floats(1e-9, 1e6, allow_nan=False).map(lambda x: f"{x:.4g}s"),
    st.sampled_from(["sglang-triton", "sglang-trtllm", "expand 93%, absorb 7%", "—", "n/a"]),
)


@given(
    headers=st.lists(st.sampled_from(["engine", "steps", "attention", "best", "lost", "lost %", "vs best step"]),
                     min_size=2, max_size=9),
    rows=st.integers(1, 5), width=st.integers(60, 140), data=st.data(),
)  # fmt: skip
def test_guard_fit_any_never_cuts_a_cell(headers, rows, width, data):
    """Any table printed through fit_any at any terminal width from 60: every cell appears whole,
    no '…', no line wider than the terminal (each cell here fits beside the key column)."""
    from rich.console import Console
    from rich.table import Table

    from mlactl.output.tables import fit_any

    table = Table(title="t")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    cells = [[data.draw(NUMBER_CELL) for _ in headers] for _ in range(rows)]
    for row in cells:
        table.add_row(*row)
    console = Console(width=width, record=True, file=__import__("io").StringIO(), emoji=False)
    console.print(fit_any(table, width))
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for row in cells:
        for cell in row:
            assert all(part in text for part in cell.split()), cell


MEASUREMENT_HEAD = st.sampled_from(
    ['{"schema": "mlactl.results", ', '{\n "schema":"mlactl.calibration",', '{"triton_version": "3", ', "[measured]\n"]
)


@given(head=MEASUREMENT_HEAD, before=st.binary(max_size=200), after=st.binary(max_size=200),
       other=st.one_of(st.binary(max_size=300), JSON_VALUE.map(json.dumps).map(str.encode)))  # fmt: skip
def test_guard_a_measurement_is_never_replaced(tmp_path_factory, head, before, after, other):
    """A file holding a measurement header anywhere in its first MiB is refused by the writer,
    byte for byte kept; a file without one (any bytes, any JSON that is not ours) is written."""
    from mlactl.util import io as files

    folder = tmp_path_factory.mktemp("m")
    kept = folder / "run.json"
    body = before.replace(b"[measured]", b"") + b"\n" + head.encode() + after
    kept.write_bytes(body)
    with pytest.raises(MlactlError, match="a measurement mlactl reads back"):
        files.atomic_write(kept, "new")
    assert kept.read_bytes() == body
    plain = folder / "plain.json"
    plain.write_bytes(other)
    if files.measurement(plain) is None:
        files.atomic_write(plain, "new")
        assert plain.read_text() == "new"


@given(words=st.lists(st.one_of(st.text(min_size=1, max_size=12).filter(lambda w: not any(c.isspace() for c in w)),
                                st.integers(301, 5000).map(lambda n: "x" * n)), max_size=8))  # fmt: skip
def test_guard_excerpts_keep_the_sentence_and_cut_the_value(words):
    """Every word up to 300 characters is kept as it is (a message's reason, a path), every longer
    one is its first 120 and its length; so an error line stays short and still says why."""
    out = safe.excerpts(" ".join(words))
    assert out == " ".join(w if len(w) <= 300 else w[:120] + f"…({len(w):,} characters)" for w in words)
