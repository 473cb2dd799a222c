"""Property-based fuzzing (issue 10's defences): every command's options and every file reader
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
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mlactl.cli import app

EXAMPLES = int(os.environ.get("MLACTL_FUZZ_EXAMPLES", "0")) or None
_common = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=False, database=None)
settings.register_profile("ci", max_examples=EXAMPLES or 50, **_common)
settings.register_profile("long", max_examples=EXAMPLES or 500, **_common)
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
