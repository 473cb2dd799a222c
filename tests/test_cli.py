"""The command line: every command's help, analyze's JSON, CSV and output files, crossover, batch,
list (at 80 columns and piped), one-line errors, paths that do not fit memory, messages that
read as sentences, each shared option defined once, and --results FILE and --calibration NAME
bringing their settings to every command."""

import csv
import inspect
import io
import json
import subprocess
import sys

import pytest
import typer.main
from conftest import cpu_results, plain, save_calibration
from typer.testing import CliRunner

from mlactl.cli import app

runner = CliRunner()


def run(*args, ok=True):
    result = runner.invoke(app, list(args))
    if ok:
        assert result.exit_code == 0, result.output
    return result


def command_paths():
    """Every command and sub-command of the app (lazily built ones too), as argument lists."""

    def walk(cmd, prefix):
        yield prefix
        if hasattr(cmd, "list_commands"):
            ctx = cmd.context_class(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), prefix + [name])

    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "mlactl")
def test_help_for_every_command(path):
    result = run(*path, "--help")
    assert "Usage" in result.output
    if path:  # every command's help carries an example
        assert "Example" in result.output, path


def test_version():
    assert run("--version").output.startswith("mlactl ")


def strict_json(text):
    """JSON as the standard has it: NaN and Infinity are not numbers there."""

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def analyze_json(*args):
    return strict_json(run("analyze", "--format", "json", *args).stdout)


def test_json_schema():
    data = analyze_json("--new", "1,256", "--prefix", "0,4K")
    assert data["schema"] == "mlactl.analysis" and data["schema_version"] == 3
    for key in ("model", "hardware", "kv_dtype", "rows", "crossover"):
        assert key in data
    assert data["model"]["name"] == "deepseek-v3" and data["hardware"]["name"] == "h800"
    assert len(data["rows"]) == 4
    row = data["rows"][3]
    assert (row["batch"], row["new"], row["prefix"], row["context"]) == (1, 256, 4096, 4352)
    assert set(row["paths"]) == {"expand", "expand_chunked", "absorb", "mha"}
    for p in row["paths"].values():
        assert set(p) >= {"flops", "bytes", "intensity", "time_s", "bound", "ops"}
        assert p["bound"] in ("compute", "memory")
        assert p["flops"] == sum(op["flops"] for op in p["ops"])
        assert p["bytes"] == sum(op["bytes"] for op in p["ops"])
        assert p["time_s"] == pytest.approx(sum(op["time_s"] for op in p["ops"]))
        for op in p["ops"]:
            assert set(op) == {"name", "flops", "bytes", "time_s", "bound"}
    assert [op["name"] for op in row["paths"]["absorb"]["ops"]] == ["q_absorb", "attention", "out_absorb"]
    assert row["best"] in ("expand", "expand_chunked", "absorb")
    assert row["best_by_flops"] in ("expand", "expand_chunked", "absorb")
    assert row["kv_cache_bytes"] == 4352 * 576 * 2
    assert row["mha_cache_bytes"] == 4352 * 128 * 320 * 2
    assert data["crossover"]["asymptotic_new"] == pytest.approx(170.667, abs=1e-3)
    # the attention core's FLOPs per pair, from the JSON alone: 279K vs 82K
    pairs = 256 * 4352 - 256 * 255 // 2
    assert row["paths"]["absorb"]["ops"][1]["flops"] == 278_528 * pairs
    assert row["paths"]["expand"]["ops"][1]["flops"] == 81_920 * pairs


def test_fp8_halves_cache_bytes():
    bf16 = analyze_json("--new", "1", "--prefix", "1000")["rows"][0]
    fp8 = analyze_json("--new", "1", "--prefix", "1000", "--kv-dtype", "fp8")["rows"][0]
    assert fp8["kv_cache_bytes"] * 2 == bf16["kv_cache_bytes"]


def test_layers_all_multiplies():
    one = analyze_json("--new", "64", "--prefix", "1000")["rows"][0]
    every = analyze_json("--new", "64", "--prefix", "1000", "--layers", "all")["rows"][0]
    assert every["paths"]["absorb"]["flops"] == 61 * one["paths"]["absorb"]["flops"]
    assert every["kv_cache_bytes"] == 61 * one["kv_cache_bytes"]


def test_tp_note():
    data = analyze_json("--tp", "8", "--new", "1", "--prefix", "0")
    assert data["model"]["H"] == 16 and data["model"]["tp"] == 8
    assert any("replicated" in note for note in data["notes"])
    assert "replicated" in run("analyze", "--tp", "8").output


def test_context_alternative():
    data = analyze_json("--new", "10", "--context", "100")
    assert (data["rows"][0]["prefix"], data["rows"][0]["context"]) == (90, 100)


def test_engine_paths_and_loss():
    """Decode after 4K and 8K: both engines absorb, the best, and lose nothing (the old fixed
    rule expanded after 8K). 513 new tokens after 4K: SGLang's summed prefix 4096 < 8192 (and
    its 2048-token prefill graph) sends it to absorb; vLLM's 513 > 512 (FLASH_ATTN_MLA on an
    H800 with a bf16 cache) sends it to the chunked prefill path."""
    data = analyze_json("--new", "1,513", "--prefix", "4K,8K", "--hardware", "h800")
    assert data["schema_version"] == 3
    assert [e["name"] for e in data["engines"]] == ["sglang", "vllm"]
    rows = {(r["new"], r["prefix"]): r for r in data["rows"]}
    for p in (4096, 8192):
        assert rows[(1, p)]["engines"] == {
            "sglang": {"path": "absorb", "time_lost_s": 0},
            "vllm": {"path": "absorb", "time_lost_s": 0},
        }
    long = rows[(513, 4096)]
    assert long["engines"]["sglang"]["path"] == "absorb" and long["engines"]["vllm"]["path"] == "expand_chunked"
    t = {p: long["paths"][p]["time_s"] for p in ("expand", "expand_chunked", "absorb")}
    assert long["engines"]["sglang"]["time_lost_s"] == pytest.approx(t["absorb"] - min(t.values()))
    assert long["engines"]["vllm"]["time_lost_s"] == pytest.approx(t["expand_chunked"] - min(t.values()))


def test_csv_is_the_json_flattened():
    args = ["--new", "1,171,1024", "--prefix", "0,4K", "--batch", "1,8"]
    data = analyze_json(*args)
    text = run("analyze", "--format", "csv", "--ops", *args).output
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(data["rows"])
    for j, c in zip(data["rows"], rows):
        assert int(c["new"]) == j["new"] and int(c["prefix"]) == j["prefix"]
        assert c["best"] == j["best"]
        for name, p in j["paths"].items():
            assert float(c[f"{name}.flops"]) == p["flops"]
            assert float(c[f"{name}.time_s"]) == pytest.approx(p["time_s"], rel=1e-9)
            assert c[f"{name}.bound"] == p["bound"]
            for op in p["ops"]:
                assert float(c[f"{name}.{op['name']}.bytes"]) == op["bytes"]


def test_output_file_and_format_from_extension(tmp_path):
    out = tmp_path / "a.json"
    run("analyze", "--new", "1", "--output", str(out))
    assert json.loads(out.read_text())["rows"]
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary file left behind
    table = tmp_path / "a.txt"
    run("analyze", "--new", "1", "--output", str(table))
    assert "Roofline time per path" in table.read_text()


def test_crossover_command():
    data = json.loads(run("crossover", "--prefix", "0,4K,32K", "--format", "json").output)
    rows = {r["prefix"]: r for r in data["crossover"]["by_prefix"]}
    assert rows[0]["by_flops"] == 1
    assert rows[4096]["by_flops"] == 168 and rows[32768]["by_flops"] == 171
    assert "170.7" in run("crossover").output
    text = run("crossover", "--prefix", "0,4K", "--format", "csv").output
    assert text.splitlines()[0] == "batch,prefix,by_flops,by_time,by_time_chunked"


def test_batch_command(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("new,prefix,count\n1,8000,64\n1,30000,16\n4096,0,1\n200,20000,2\n")
    data = json.loads(run("batch", str(path), "--format", "json").output)
    paths = [r["path"] for r in data["requests"]]
    assert paths[0] == "absorb" and paths[1] == "absorb" and paths[2] == "expand"
    totals = {s: t["time_s"] for s, t in data["totals"].items()}
    assert data["best_strategy"] == min(totals, key=totals.get)
    assert totals["per_request"] <= totals["all_absorb"] and totals["per_request"] <= totals["all_expand"]
    assert "Batch total by strategy" in run("batch", str(path)).output


def test_list():
    out = run("list").output
    for name in ("deepseek-v3", "kimi-k2", "teaching", "h200", "mi300x", "b200"):
        assert name in out
    data = json.loads(run("list", "--format", "json").output)
    assert data["models"]["deepseek-r1"]["name"] == "deepseek-v3"


BAD = [
    (["analyze", "--new", "0"], "--new: 0 must be a positive integer"),
    (["analyze", "--new", "-3"], "--new: -3 must be a positive integer"),
    (["analyze", "--batch", "1.5"], "--batch: '1.5' is not a whole number"),
    (["analyze", "--prefix", "10:1"], "ends before it starts"),
    (["analyze", "--prefix", "0:8K:x"], "is not a whole number"),
    (["analyze", "--new", "128", "--context", "100"], "--context 100 is shorter than --new 128"),
    (["analyze", "--prefix", "0", "--context", "100"], "either --prefix or --context"),
    (["analyze", "--model", "llama"], "unknown model 'llama'; presets: deepseek-v2"),
    (["analyze", "--hardware", "tpu"], "unknown hardware 'tpu'; known: a100-sxm"),
    (["analyze", "--chunk", "0"], "--chunk: 0 must be a positive integer"),
    (["analyze", "--tp", "3"], "--tp 3 does not divide the 128 heads"),
    (["analyze", "--kv-dtype", "int4"], "--kv-dtype must be one of bf16, fp16, fp8"),
    (["analyze", "--format", "xml"], "--format must be one of table, json, csv"),
    (["analyze", "--layers", "zero"], "--layers: 'zero' is not a whole number"),
    (["analyze", "--measured"], "no measured ceilings"),
    (["analyze", "--hardware", "a100-sxm", "--dtype", "bf16", "--kv-dtype", "fp8"], None),  # fine: fp8 cache, bf16 math
    (["crossover", "--prefix", "-1"], "--prefix: -1 must be an integer >= 0"),
    (["batch", "/nonexistent.csv"], "cannot read requests"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line(args, message):
    result = runner.invoke(app, args)
    if message is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0]


@pytest.mark.parametrize(
    "content, message",
    [
        ("prefix\n1\n", "line 1: the header must name new"),
        ("new,prefix\n1,abc\n", "line 2: prefix 'abc' is not a whole number"),
        ("new,prefix\n1,2\n0,5\n", "line 3: new must be at least 1"),
        ("new,prefix\n1,2,3\n", "line 2: 3 fields, the header has 2"),
        ("new,context\n10,5\n", "line 2: context 5 is shorter than new 10"),
        ("new,prefix\n", "no requests after the header"),
    ],
)
def test_bad_batch_csv(tmp_path, content, message):
    path = tmp_path / "r.csv"
    path.write_text(content)
    result = runner.invoke(app, ["batch", str(path)])
    assert result.exit_code == 2
    assert "Error: " in result.output and message in result.output


def test_bad_hardware_file_via_cli(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text('name = "x"\nmemory_gb = 1\nbandwidth_tbs = 0\n[peak_tflops]\nbf16 = 1\n')
    result = runner.invoke(app, ["analyze", "--hardware", str(path)])
    assert result.exit_code == 2 and "bandwidth_tbs must be a positive number, got 0" in result.output


def test_analyze_and_import_do_not_load_torch_or_triton():
    code = (
        "import sys, mlactl, mlactl.cli, mlactl.decide.analysis, mlactl.output.report, mlactl.output.render\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(mlactl.cli.app, ['analyze', '--crossover', '--format', 'json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "loaded = [m for m in ('torch', 'triton', 'matplotlib', 'pandas') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_paths_that_do_not_fit_are_never_chosen():
    """DeepSeek-V3 on an H800 (80 GB), batch 64, 512 new tokens after 128K: expanding the whole
    context needs 64 * 131,584 tokens * 65,536 bytes = 551.9 GB; chunked needs one 8K chunk per
    request, 64 * 8,192 * 65,536 = 34.4 GB. At prefix 0 and 128K new tokens every expand path
    needs 550 GB, so only absorb runs, and vLLM's expand 'does not fit'."""
    rows = analyze_json("--batch", "64", "--new", "512,128K", "--prefix", "0,128K")["rows"]
    far = next(r for r in rows if r["new"] == 512 and r["prefix"] == 131072)
    assert far["paths"]["expand"]["peak_expanded_bytes"] == 64 * 131584 * 65536
    assert far["paths"]["expand"]["fits_memory"] is False
    assert far["paths"]["expand_chunked"]["peak_expanded_bytes"] == 64 * 8192 * 65536
    assert far["paths"]["expand_chunked"]["fits_memory"] is True
    assert far["best"] == "expand_chunked"
    assert far["paths"]["expand"]["time_s"] < far["paths"]["expand_chunked"]["time_s"]  # faster, but too big
    huge = next(r for r in rows if r["new"] == 131072 and r["prefix"] == 0)
    assert huge["best"] == "absorb" and huge["engines"]["vllm"] == {"path": "expand", "time_lost_s": None}


def test_analysis_as_a_dataframe():
    from mlactl.decide import analysis
    from mlactl.model import config as model
    from mlactl.model import hardware
    from mlactl.model.shapes import grid
    from mlactl.output.report import to_frame

    result = analysis.analyze(
        model.from_name("deepseek-v3"), hardware.from_name("h200"), *grid([1, 8], [1, 256], [0, 4096])
    )
    frame = to_frame(result, ops=True)
    assert len(frame) == 8 and list(frame["best"].cat.categories) == ["expand", "expand_chunked", "absorb", "mha"]
    assert frame["absorb.attention.flops"].iloc[2] == 278_528 * 4097  # batch 1, new 1, prefix 4096
    assert (frame["expand.time_s"] > 0).all()


# -- one definition of each shared option ----------------------------------------------------------


def test_shared_options_are_defined_once_and_read_alike():
    """Every command that takes a shared option gets the one definition: the same flags, help
    and default (SHARED), unless the command overrides it on purpose (calibrate's --hardware
    and --format, calibrate score's --calibration)."""
    import typer.main

    from mlactl.cli import LazyGroup
    from mlactl.cli.helptext import polish
    from mlactl.cli.options import SHARED

    # options of the same name that mean something else there, on purpose
    overridden = {
        ("calibrate", "hardware"),  # optional: from the system or the results file
        ("calibrate", "fmt"),  # table or json, no --output
        ("calibrate", "calibration"),  # score: the calibration it scores, not the one that times
        ("list", "fmt"),  # two tables make no CSV
        ("plot", "output"),  # an image, named after the chart
        ("tune", "kv_dtype"),  # auto: the compute dtype
        ("tune", "dtype"),  # auto: bf16 on a GPU, fp32 on a CPU
    }
    overridden_defaults = {("replay", "hardware"), ("replay", "tp")}  # the same option; a serving node's h200, tp 8
    overridden_sub = {
        ("plot", "transfer", "calibration"),  # the calibration carried to another GPU
        ("tune", "list", "fmt"),  # a listing: table or json
    }
    seen = set()
    root = typer.main.get_command(app)
    for name in LazyGroup.LAZY:
        command = root.get_command(None, name)
        polish(command)
        subs = getattr(command, "commands", None) or {name: command}
        for sub_name, sub in subs.items():
            for param in sub.params:
                if param.name not in SHARED or (name, param.name) in overridden:
                    continue
                if (name, sub_name, param.name) in overridden_sub:
                    continue
                info = SHARED[param.name].annotation.__metadata__[0]
                if (name, param.name) not in overridden_defaults:
                    assert param.default == SHARED[param.name].default, (name, sub_name, param.name)
                assert param.help == info.help, (name, sub_name, param.name)
                assert set(param.opts) == {info.default, *info.param_decls} - {...}, (name, sub_name, param.name)
                seen.add((name, param.name))
    # the model and machine options reach every command that analyses
    for command in ("analyze", "crossover", "batch", "engines", "plot"):
        assert {(command, "model"), (command, "hardware"), (command, "calibration")} <= seen, command


def test_shared_decorator_hands_one_opts_with_what_was_typed():
    from mlactl.cli.options import MACHINE, Opts, shared

    got = {}

    @shared(*MACHINE)
    def command(opts: Opts, extra: int = 1):
        got.update(opts=opts, extra=extra)

    command(model="kimi-k2", hardware="h200", measured=False, tp="8", kv_dtype="fp8", dtype="bf16")
    opts = got["opts"]
    assert (opts.model, opts.tp, opts.kv_dtype, got["extra"]) == ("kimi-k2", "8", "fp8", 1)
    assert opts.given == frozenset()  # outside a click context nothing counts as typed
    assert list(inspect.signature(command).parameters)[:3] == ["model", "hardware", "measured"]


def test_batch_counts_the_layers_it_is_told_as_analyze_does(tmp_path):
    """A batch of one request is that request's shape: `batch --layers all` times it as `analyze
    --layers all` does, which scales each op's FLOPs and bytes by the layers before the roofline
    (a second route to the same seconds); one layer by default, and the JSON says which."""
    import json

    requests = tmp_path / "one.csv"
    requests.write_text("new,prefix\n512,0\n")
    shape = ["--hardware", "h200", "--new", "512", "--prefix", "0", "--layers", "all", "-f", "json"]
    row = json.loads(run("analyze", *shape).stdout)["rows"][0]
    want = row["paths"][row["best"]]["time_s"]
    every = json.loads(run("batch", str(requests), "--hardware", "h200", "--layers", "all", "-f", "json").stdout)
    one = json.loads(run("batch", str(requests), "--hardware", "h200", "-f", "json").stdout)
    assert every["layers"] == 61 and one["layers"] == 1
    assert every["totals"]["per_request"]["time_s"] == pytest.approx(want, rel=1e-12)
    assert every["totals"]["per_request"]["time_s"] == pytest.approx(
        61 * one["totals"]["per_request"]["time_s"], rel=1e-12
    )


# -- list: at 80 columns no name cut, piped every value whole; its help and -f csv agree -----------


TERMINAL_80 = {"COLUMNS": "80", "LINES": "50", "TTY_COMPATIBLE": "1", "NO_COLOR": "1", "TERM": "xterm"}


def test_list_at_80_columns_cuts_no_name():
    from mlactl.model import config as model
    from mlactl.model import hardware

    out = runner.invoke(app, ["list"], env=TERMINAL_80)
    assert out.exit_code == 0, out.output
    text = plain(out.output)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    cells = {c.strip() for line in text.splitlines() for c in line.split("│")}
    for name in model.preset_names() + hardware.names():
        assert name in cells, name  # whole, in a cell of its own
    assert "deepseek-v2-lite" in cells and "h100-sxm" in cells
    assert "not shown at 80 columns" in text  # says what it left out


def test_list_piped_prints_full_values():
    out = runner.invoke(app, ["list"])  # CliRunner is not a terminal
    assert out.exit_code == 0
    assert "…" not in out.output and "not shown" not in out.output
    for value in ("deepseek-v2-lite", "NVIDIA H800 SXM5 80GB", "q_lora_rank", "layers", "SMs"):
        assert value in out.output


def test_list_shows_the_architecture_the_engines_rules_resolve_for():
    lines = runner.invoke(app, ["list"]).output.splitlines()
    rows = {line.split("│")[1].strip(): line for line in lines if "│" in line}
    assert "│ sm89 " in rows["l40s"] and "│ sm120 " in rows["rtx-pro-6000"] and "│ — " in rows["teaching"]
    data = json.loads(runner.invoke(app, ["list", "-f", "json"]).output)["hardware"]
    assert (data["b300"]["arch"], data["mi300x"]["arch"], data["teaching"]["arch"]) == ("sm100", "rocm", None)


def test_list_help_and_list_csv_agree():
    shown = runner.invoke(app, ["list", "--help"], env={"COLUMNS": "200"})
    assert "table or json" in shown.output and "csv" not in shown.output
    refused = runner.invoke(app, ["list", "-f", "csv"])
    assert refused.exit_code == 2 and refused.output.startswith("Error: mlactl list writes table or json")


# -- messages: a suggestion for a hardware name, memory, no crossover ------------------------------


def test_hardware_suggestion():
    out = runner.invoke(app, ["analyze", "--hardware", "h100"])
    assert out.exit_code == 2 and "did you mean h100-sxm?" in out.output


def test_latent_cache_counts_toward_memory():
    """DeepSeek-V3, bf16 cache: (512 + 64) * 2 = 1152 bytes per token and layer. On an H800's
    80 GB, 100M tokens need 115.2 GB (absorb does not fit), 50M need 57.6 GB (it fits)."""
    out = runner.invoke(app, ["analyze", "--new", "50000000,100000000", "--prefix", "0", "-f", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["new"]: r for r in json.loads(out.stdout)["rows"]}
    assert rows[50_000_000]["paths"]["absorb"]["fits_memory"] is True
    assert rows[100_000_000]["paths"]["absorb"]["fits_memory"] is False
    assert all(e["time_lost_s"] is None for e in rows[100_000_000]["engines"].values())  # nothing fits
    table = runner.invoke(app, ["analyze", "--new", "100000000", "--prefix", "0"])
    assert "latent cache alone" in table.output and "no path fits" in table.output


def test_no_crossover_reads_as_a_sentence(tmp_path):
    config = {
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "kv_lora_rank": 32,  # a latent this small: absorb is cheaper per pair, expand never wins
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_hidden_layers": 1,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = runner.invoke(app, ["analyze", "--model", str(path), "--new", "1", "--prefix", "0"])
    assert out.exit_code == 0, out.output
    assert "none new tokens" not in out.stdout
    assert "Crossover (asymptotic, by FLOPs): none (expand never takes fewer FLOPs)" in out.stdout


# -- --results FILE and --calibration NAME bring their settings ------------------------------------


def test_results_file_sets_model_tp_and_dtypes(tmp_path, home):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cpu_results()))
    out = runner.invoke(
        app, ["analyze", "--policy", "measured", "--results", str(path), "--new", "1,64", "--prefix", "0", "-f", "json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["model"]["name"] == "teaching" and data["model"]["H"] == 4 and data["model"]["tp"] == 8
    assert data["kv_dtype"] == "fp32"
    paths = {row["new"]: row["policy"]["path"] for row in data["rows"]}
    assert paths == {1: "absorb", 64: "expand"}  # measured crossover 16 at prefix 0
    shown = runner.invoke(
        app, ["analyze", "--policy", "measured", "--results", str(path), "--new", "1", "--prefix", "0"]
    )
    assert "model teaching, tp 8, dtype fp32, kv fp32" in " ".join(shown.output.split())


def test_results_file_conflicts_come_in_one_error(tmp_path, home):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cpu_results(device={"name": "NVIDIA H200", "type": "cuda", "hardware": "h200"})))
    args = ["analyze", "--policy", "measured", "--results", str(path), "--model", "kimi-k2", "--tp", "2"]
    out = runner.invoke(app, args + ["--kv-dtype", "bf16", "--hardware", "h800", "--dtype", "fp32"])
    assert out.exit_code == 2
    (line,) = out.output.strip().splitlines()
    assert line.startswith("Error: ")
    for part in (
        "--model kimi-k2 (the file has teaching)",
        "--tp 2 (the file has 8)",
        "--kv-dtype bf16",
        "--hardware h800",
    ):
        assert part in line, part
    assert "--dtype" not in line  # fp32 agrees with the file
    agree = runner.invoke(app, ["analyze", "--policy", "measured", "--results", str(path), "--tp", "8", "-g", "h200"])
    assert agree.exit_code == 0, agree.output


def test_calibration_name_brings_its_hardware_everywhere(tmp_path, home):
    name = save_calibration(home)
    for args in (
        ["analyze", "-f", "json"],
        ["crossover", "-f", "json"],
        ["engines", "--new", "1,64", "--prefix", "0,4K", "-f", "json"],
    ):
        out = runner.invoke(app, [*args, "--calibration", name])
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["hardware"]["name"] == "h200", args
    chart = runner.invoke(app, ["plot", "pathmap", "--calibration", name, "-o", str(tmp_path / "p.png")])
    assert chart.exit_code == 0, chart.output
