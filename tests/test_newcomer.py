"""A newcomer's first hour (issue 11): tables at 80 columns, results tune wrote on a CPU found
again, --results taking its settings from the file, noise and budget in tune, clear messages and
help. No assertion depends on a timing: noise and budget logic run on given times and clocks."""

import io
import json
import re
import sys

import pytest
from conftest import SMALL  # small enough for a CPU, expand wins from a few dozen new tokens
from rich.console import Console
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.output import tune_tables
from mlactl.results import store as results
from mlactl.tune import noise, sweep, timing

runner = CliRunner()
TERMINAL_80 = {"COLUMNS": "80", "LINES": "50", "TTY_COMPATIBLE": "1", "NO_COLOR": "1", "TERM": "xterm"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLACTL_TUNED_DIR", raising=False)
    return tmp_path / "home"


def plain(text: str) -> str:
    return ANSI.sub("", text)


def render(table, width: int) -> str:
    con = Console(file=io.StringIO(), width=width, no_color=True, record=True)
    con.print(table)
    return con.export_text()


# -- 80 columns ----------------------------------------------------------------------------------


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


def test_tune_tables_at_80_columns():
    from mlactl.output import tune_tables as report

    bucket = "B=128,H=128,S_q=1,ctx=131072"
    entries = [
        {
            "kernel": "merge_attn_states",
            "bucket": bucket,
            "flops": 1e12,
            "bytes": 1e9,
            "best": {"BLOCK_H": 16, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
            "best_median_s": 1e-3,
            "default_median_s": 2e-3,
            "twin_median_s": 9e-2,
            "predicted_s": 5e-4,
            "configs": [{"status": "ok"}, {"status": "failed"}],
        }
    ]
    text = render(report.kernels_table(entries, True, 80), 80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "merge_attn_states" in text and bucket in text
    rows = [{"batch": 1, "prefix": 1024, "measured": 64, "measured_status": "found", "predicted_by_flops": 149}]
    text = render(report.paths_table(rows, True, 80), 80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    # piped (no width): every column, every value whole
    wide = render(report.kernels_table(entries, True, None), 200)
    assert "ok/failed/wrong" in wide and "1/1/0" in wide and "2.00x" in wide  # default 2 ms / best 1 ms


def test_torch_backend_kernels_table_shows_only_what_means_something():
    from mlactl.output import tune_tables as report

    entry = {
        "kernel": "mla_decode",
        "bucket": "B=2,H=4,S_q=1,ctx=100",
        "flops": 2e9,
        "bytes": 1e8,
        "best": None,
        "best_median_s": 1e-3,
        "twin_median_s": 1e-3,
        "predicted_s": 1.44e-3,  # the roofline says 1.44 ms: achieved 144% of it
        "configs": [],
    }
    text = render(report.kernels_table([entry], True, None, backend="torch"), 200)
    assert "best config" not in text and "vs twin" not in text and "ok/failed/wrong" not in text
    assert "1.00x" not in text and "0/0/0" not in text
    assert "2 " in text  # 2e9 FLOPs / 1 ms = 2 TFLOP/s
    assert "144%!" in text and "ceilings allow" in text  # above the ceiling: flagged, said why


def test_ceilings_table_names_the_previous_run():
    from mlactl.model.hardware import HardwareProfile
    from mlactl.output import tune_tables as report

    cpu = HardwareProfile("cpu", "CPU", {"fp32": 0.01}, 0.003, 16, measured={"peak_tflops": {"fp32": 0.02}})
    text = render(report.ceilings_table({"peak_tflops": {"fp32": 0.01}}, cpu.with_measured(), None), 120)
    assert "previous run" in text and "datasheet" not in text
    text = render(report.ceilings_table({"peak_tflops": {"fp32": 0.01}}, cpu, None), 120)
    assert "datasheet" in text


# -- the measured policy finds what tune wrote on a CPU ---------------------------------------------


@pytest.fixture
def cpu_run(tmp_path, home):
    """A real `mlactl tune paths --backend torch` on this CPU (a few seconds)."""
    config = tmp_path / "small-mla.json"
    config.write_text(json.dumps(SMALL))
    args = ["tune", "paths", "--backend", "torch", "--model", str(config), "--new", "1,64", "--prefix", "0"]
    out = runner.invoke(app, args + ["--budget", "600", "--repeats", "0"])
    assert out.exit_code == 0, out.output
    (path,) = (home / "results" / "cpu").glob("*.json")
    return str(config), path


def test_measured_policy_finds_cpu_results(cpu_run):
    config, path = cpu_run
    data = results.load(path)
    assert data["device"]["hardware"] is None and data["kv_dtype"] == "fp32"  # what the lookup used to miss
    assert data["crossovers"][0]["measured_status"] in ("found", "never")
    out = runner.invoke(app, ["analyze", "--model", config, "--policy", "measured", "--new", "1,64", "--prefix", "0"])
    assert out.exit_code == 0, out.output
    assert str(path) in out.output.replace("\n", "")
    assert "kv fp32" in out.output  # the file's cache dtype was taken, and it says so


def test_auto_policy_finds_cpu_results(cpu_run):
    from mlactl.kernels import attention

    config, path = cpu_run
    attention._auto_policy.cache_clear()
    # what mla_attention(path="auto") asks for fp32 tensors on a CPU
    policy = attention._auto_policy("cpu", 4, 128, 16, 16, 16, "fp32", "fp32")
    assert policy.kind == "measured" and str(path) in policy.source
    attention._auto_policy.cache_clear()


def test_cpu_results_match_the_cpu_profile(tmp_path, home):
    from mlactl.results import measured

    (home / "hardware").mkdir(parents=True)
    (home / "hardware" / "cpu.toml").write_text(
        'name = "cpu"\nmatch = ["cpu"]\nmemory_gb = 16\nbandwidth_tbs = 0.02\n[peak_tflops]\nfp32 = 0.2\n'
    )
    folder = tmp_path / "runs"
    folder.mkdir()
    data = _results_file(device={"name": "cpu", "type": "cpu", "hardware": None})
    (folder / "run.json").write_text(json.dumps(data))
    dims = {k: data["model"][k] for k in measured.DIMS}
    assert measured.find(dims, None, "cpu", folder)[1] == folder / "run.json"
    assert measured.find(dims, "fp32", "cpu", folder)[1] == folder / "run.json"
    assert measured.find(dims, "bf16", "cpu", folder)[0] is None
    assert measured.find(dims, None, "h800", folder)[0] is None


def _results_file(**extra) -> dict:
    from mlactl.model.config import from_name

    data = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "created": "2026-11-30T10:00:00Z",
        "device": {"name": "cpu", "type": "cpu", "hardware": None},
        "backend": "torch",
        "timing": {"method": "wall-clock"},
        "model": from_name("teaching").with_tp(8).to_dict(),
        "kv_dtype": "fp32",
        "dtype": "fp32",
        "crossovers": [{"batch": 1, "prefix": 0, "measured": 16, "measured_status": "found"}],
    }
    data.update(extra)
    return data


# -- --results FILE ------------------------------------------------------------------------------


def test_results_file_sets_model_tp_and_dtypes(tmp_path, home):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_results_file()))
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
    path.write_text(json.dumps(_results_file(device={"name": "NVIDIA H200", "type": "cuda", "hardware": "h200"})))
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


# -- noise ---------------------------------------------------------------------------------------


def test_coefficient_of_variation_by_hand():
    # 1, 2, 3: mean 2, sample stdev 1
    assert timing.coefficient_of_variation([1.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert timing.coefficient_of_variation([2.0, 2.0]) == 0.0
    t = timing.summarize([1.0, 2.0, 3.0, 4.0, 100.0], "wall-clock", "warm")
    assert t.p10_s == pytest.approx(1.4) and t.p90_s == pytest.approx(61.6)  # linear interpolation
    assert t.to_dict()["unstable"] is True and "cv" in t.to_dict()


def test_unstable_timing_is_measured_again(monkeypatch):
    made = iter([0.30, 0.25, 0.04, 0.01])

    def fake(fns, **kw):
        return {name: timing.Timing(1.0, 0.9, 1.1, 5, "wall-clock", "warm", cv=next(made)) for name in fns}

    monkeypatch.setattr(timing, "time_interleaved", fake)
    got = timing.time_stable(lambda: None, repeats=5)
    assert got.cv == 0.04 and got.remeasured == 2  # stops once stable
    made = iter([0.30, 0.25, 0.20])
    got = timing.time_stable(lambda: None, repeats=2)
    assert got.cv == 0.20 and got.remeasured == 2 and got.to_dict()["unstable"] is True


def test_interleaved_timing_takes_turns(monkeypatch):
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    timing.time_interleaved(fns, warmup=0, min_repeats=3, max_repeats=3)
    # one call of each to size the repetitions, then three rounds, each starting elsewhere
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]


def test_interleaved_timing_cancels_a_slowing_machine(monkeypatch):
    # a fake clock: every call costs 1 s times a slowdown that grows 10% per call, alike for both
    clock, calls = [0.0], [0]

    def work():
        calls[0] += 1
        clock[0] += 1.1 ** calls[0]

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    kw = dict(warmup=0, min_repeats=9, max_repeats=9)
    both = timing.time_interleaved({"a": work, "b": work}, **kw)
    paired = both["a"].median_s / both["b"].median_s
    one_after_other = timing.time_call(work, **kw).median_s / timing.time_call(work, **kw).median_s
    assert abs(paired - 1) < 0.1  # by hand: the medians are calls 11 and 12 (ratio 1/1.1)
    assert one_after_other < 0.5  # the first timed 10 calls before the second: 1.1**-10 = 0.39


def _row(median, p10, p90):
    return {"median_s": median, "p10_s": p10, "p90_s": p90}


def test_crossover_bracket_widened_by_noise():
    points = {
        8: {"expand": _row(3, 2.9, 3.1), "absorb": _row(1, 0.9, 1.1)},  # absorb decisively
        16: {"expand": _row(1.1, 0.8, 1.4), "absorb": _row(1.0, 0.9, 1.2)},  # overlap: undecided
        32: {"expand": _row(0.9, 0.7, 1.3), "absorb": _row(1.0, 0.9, 1.1)},  # expand by median only
        64: {"expand": _row(0.5, 0.45, 0.55), "absorb": _row(1.0, 0.9, 1.1)},  # expand decisively
    }
    assert sweep.measured_crossover({n: {p: r["median_s"] for p, r in v.items()} for n, v in points.items()}) == 32
    assert noise.bracket(points, 32) == (8, 64)
    assert noise.bracket(points, None) == (None, None)
    row = {"measured": 32, "measured_low": 8, "measured_high": 64, "measured_status": "found"}
    assert tune_tables.crossover_text(row) == "32 (8–64)"


def test_nonmonotone_over_prefix_is_flagged():
    # the second run: 79 / 79 / 17 at prefixes 0 / 256 / 1K
    rows = [
        {"batch": 1, "prefix": p, "measured": m, "measured_status": "found"}
        for p, m in ((0, 79), (256, 79), (1024, 17))
    ]
    noise.flag_nonmonotone(rows)
    assert [r["nonmonotone"] for r in rows] == [False, False, True]
    assert tune_tables.crossover_text(rows[2]).endswith("↓")
    # never (expand won at none of 256 counts) at a short prefix, then 64 at a longer one
    rows = [
        {"batch": 1, "prefix": 0, "measured": None, "measured_status": "never", "measured_new": [1, 256]},
        {"batch": 1, "prefix": 512, "measured": 64, "measured_status": "found"},
    ]
    noise.flag_nonmonotone(rows)
    assert rows[1]["nonmonotone"] is True


def test_never_and_budget_cut_are_told_apart():
    never = {"measured": None, "measured_status": "never", "measured_new": [1, 4, 16, 256]}
    cut = {"measured": None, "measured_status": "budget", "measured_new": [1, 4]}
    assert tune_tables.crossover_text(never) == "never ≤256"
    assert tune_tables.crossover_text(cut) == "cut (budget)"
    data = {
        "crossovers": [
            {"batch": 1, "prefix": 0, **never},
            {"batch": 1, "prefix": 4096, **cut},
            {"batch": 1, "prefix": 512, "measured": 40, "measured_status": "found"},
        ]
    }
    # the policy keeps "never" (absorb there) and leaves the cut prefix out
    assert results.measured_crossovers(data) == {0: None, 512: 40}


# -- budget --------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_budget_does_not_start_a_point_that_would_overrun(monkeypatch, tmp_path):
    """Each point takes 10 s on a fake clock; the budget is 25 s. Without a prediction the third
    point would start at 20 s and end at 30 s (20% over); with it, the sweep stops at 20 s."""
    import torch

    from mlactl.model.config import from_name
    from mlactl.tune import store as store_mod

    clock = FakeClock()
    monkeypatch.setattr(sweep.time, "monotonic", clock)
    measured = []

    def fake_point(ctx, cost, b, n, p, chunk):
        measured.append(n)
        clock.now += 10.0
        return {"expand": 2.0, "absorb": 1.0}  # absorb wins everywhere

    monkeypatch.setattr(sweep, "_measure_point", fake_point)
    cfg = from_name("teaching").with_tp(8)
    header = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "device": {"name": "cpu"},
        "backend": "torch",
        "timing": {},
        "model": cfg.to_dict(),
        "kv_dtype": "fp32",
        "dtype": "fp32",
        "versions": {},
    }
    store = store_mod.ResultsStore(tmp_path / "run.json", header)
    ctx = sweep.Context(cfg, torch.device("cpu"), "torch", "fp32", "fp32", store, None, deadline=25.0)
    rows = sweep.tune_paths(ctx, [1], [1, 2, 4, 8], [0], 8192, refine=False)
    assert measured == [1, 2] and clock.now == 20.0
    assert rows[0]["measured"] is None and rows[0]["measured_status"] == "budget"
    assert any("time budget" in s for s in ctx.skipped)
    # given all the time it needs, the same sweep ends in "never"
    clock.now, measured[:] = 0.0, []
    ctx.deadline = 1e9
    store2 = store_mod.ResultsStore(tmp_path / "run2.json", header)
    ctx.store = store2
    rows = sweep.tune_paths(ctx, [1], [1, 2, 4, 8], [0], 8192, refine=False)
    assert measured == [1, 2, 4, 8] and rows[0]["measured_status"] == "never"


def test_point_clock_predictions_by_hand():
    class Cost:  # FLOPs of a point = n (both paths together), to keep the arithmetic plain
        def ops(self, path, b, n, p):
            return [type("Op", (), {"flops": n / 2})()]

    clock = sweep._PointClock(Cost())
    assert clock.predict(1, 4, 0) == 0.0
    clock.seen = [(4.0, 1.0)]
    assert clock.predict(1, 16, 0) == pytest.approx(2.0)  # 1 s * sqrt(16 / 4)
    clock.seen = [(4.0, 1.0), (16.0, 4.0)]
    assert clock.predict(1, 64, 0) == pytest.approx(16.0)  # the line: 4 + (3 / 12) * 48
    assert clock.predict(1, 1, 0) == pytest.approx(1.0)  # never below the quickest seen


def test_interpreter_runs_write_no_tuned_configs(monkeypatch):
    import torch

    from mlactl.model.config import from_name
    from mlactl.tune import store as store_mod

    written = []
    monkeypatch.setattr(store_mod, "write_tuned_config", lambda *a, **k: written.append(a))

    def fake_bucket(ctx, spec, shape, bucket, cost, smem, override):
        return {"kernel": spec.name, "bucket": bucket, "best": {"BLOCK_N": 16}, "best_median_s": 1.0}

    monkeypatch.setattr(sweep, "_tune_bucket", fake_bucket)

    class Store:
        data = {"device": {"name": "cpu"}, "versions": {"triton": "3"}}

    cfg = from_name("teaching").with_tp(8)
    for backend, expect in (("interpret", 0), ("triton", 1)):
        written.clear()
        ctx = sweep.Context(cfg, torch.device("cpu"), backend, "fp32", "fp32", Store(), None, quick=True)
        sweep.tune_kernels(ctx, ["merge_attn_states"])
        assert (len(written) > 0) == bool(expect), backend


# -- messages and help ---------------------------------------------------------------------------


def test_list_help_and_list_csv_agree():
    shown = runner.invoke(app, ["list", "--help"], env={"COLUMNS": "200"})
    assert "table or json" in shown.output and "csv" not in shown.output
    refused = runner.invoke(app, ["list", "-f", "csv"])
    assert refused.exit_code == 2 and refused.output.startswith("Error: mlactl list writes table or json")


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


def test_missing_torch_hint_gives_the_readme_command(monkeypatch, home):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    out = runner.invoke(app, ["tune", "paths", "--backend", "torch"])
    assert out.exit_code == 2
    assert "pip install -e '.[kernels]'" in out.output
    readme = open(__file__.replace("tests/test_newcomer.py", "README.md")).read()
    assert "pip install -e '.[kernels" in readme


COMMANDS = [
    [],
    ["analyze"],
    ["crossover"],
    ["batch"],
    ["list"],
    ["engines"],
    ["calibrate"],
    ["tune"],
    ["tune", "ceilings"],
    ["tune", "kernels"],
    ["tune", "paths"],
    ["tune", "compile"],
    ["plot"],
    ["plot", "roofline"],
    ["plot", "crossover"],
    ["plot", "pathmap"],
    ["plot", "tune"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c) or "root")
def test_help_reads_alike(command):
    out = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = out.output
    assert "<str>" not in text and "<int>" not in text
    if command:  # completion is offered once, on the root (`mlactl --install-completion`)
        assert "install-completion" not in text and "show-completion" not in text
    for line in text.splitlines():
        assert not ("(default" in line and "[default:" in line), line
    assert "{requests}" not in text


def test_help_kinds_and_defaults():
    text = runner.invoke(app, ["analyze", "--help"], env={"COLUMNS": "250"}).output
    assert re.search(r"--tp\s+INT", text) and re.search(r"--new\s+-n\s+RANGE", text)
    assert re.search(r"--output\s+-o\s+PATH", text)
    assert "(default: 0,8K,32K)" in text
    usage = runner.invoke(app, ["batch", "--help"], env={"COLUMNS": "250"}).output
    assert "batch [OPTIONS] REQUESTS.CSV" in usage


# -- charts --------------------------------------------------------------------------------------


def test_plot_data_csv_holds_what_was_drawn(tmp_path):
    import csv

    png, table = tmp_path / "c.png", tmp_path / "c.csv"
    out = runner.invoke(
        app, ["plot", "crossover", "--new", "1:64", "--prefix", "0", "-o", str(png), "--data", str(table)]
    )
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(table.open()))
    timed = [r for r in rows if r["kind"] == "predicted time"]
    assert len(timed) == 3 * 64  # expand, expand_chunked, absorb at new = 1..64
    assert {r["path"] for r in timed} == {"expand", "expand_chunked", "absorb"}
    (asym,) = [r for r in rows if r["kind"] == "asymptotic crossover by FLOPs"]
    assert float(asym["new"]) == pytest.approx(170.67, abs=0.01)  # DeepSeek-V3 (docs/design.md)
    bad = runner.invoke(app, ["plot", "crossover", "-o", str(png), "--data", str(tmp_path / "c.xml")])
    assert bad.exit_code == 2 and "--data" in bad.output


def test_one_new_value_is_a_clear_error(tmp_path):
    out = runner.invoke(app, ["plot", "crossover", "--new", "1", "-o", str(tmp_path / "c.png")])
    assert out.exit_code == 2 and "at least two values" in out.output
    out = runner.invoke(app, ["plot", "pathmap", "--new", "1", "--prefix", "0", "-o", str(tmp_path / "p.png")])
    assert out.exit_code == 2 and "plot crossover" in out.output


def _teaching_analysis():
    from mlactl.decide import analysis
    from mlactl.model import config as model
    from mlactl.model import hardware

    return analysis.analyze(model.from_name("teaching"), hardware.from_name("teaching"), [1], [64], [0])


def test_points_above_the_roofline_are_flagged():
    from mlactl.output import plot

    result = _teaching_analysis()
    predicted = float(result.paths["absorb"].time_s[0])
    data = _results_file(
        model=result.cfg.to_dict(),
        kv_dtype="bf16",
        dtype="bf16",
        paths=[
            {"batch": 1, "new": 64, "prefix": 0, "path": "absorb", "median_s": predicted / 2},  # 200%
            {"batch": 1, "new": 64, "prefix": 0, "path": "expand", "median_s": 1.0},
        ],
    )
    fig, drawn = plot.roofline(result, [data])
    by_path = {m["path"]: m for m in drawn["measured"]}
    assert by_path["absorb"]["fraction"] == pytest.approx(2.0) and by_path["absorb"]["above_ceiling"] is True
    assert by_path["expand"]["above_ceiling"] is False
    assert "too low" in drawn["note"]
    # labelled points get a number beside them; what each is, in the legend below the axes (issue 24:
    # no text on the points or curves)
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text().isdigit()] == ["1", "2"]
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "1: b=1 n=64 p=0 absorb, 200% of the roofline (above the roofline!)" in legend
    assert "measured, joined to predicted" in legend


def test_ceiling_labels_read_plainly_and_are_drawn_once():
    from mlactl.model.hardware import HardwareProfile
    from mlactl.output import plot

    cpu = HardwareProfile(
        "cpu",
        "CPU",
        {"fp32": 0.2},
        0.02,
        16,
        measured={"device": "cpu", "peak_tflops": {"fp32": 0.19}, "bandwidth_tbs": 0.018},
    )
    same_run = {"device": {"name": "cpu"}, "ceilings": {"peak_tflops": {"fp32": 0.19}, "bandwidth_tbs": 0.018}}
    lines = plot.ceilings(cpu, "fp32", [same_run])
    assert [c["label"] for c in lines] == ["nominal", "measured on cpu"]  # not "measured (cpu)", and once


def test_tune_chart_says_when_the_default_is_faster():
    from pathlib import Path

    from mlactl.output import plot

    docs = Path(__file__).parents[1] / "docs" / "results" / "interpret-teaching-tp8-mla_decode.json"
    fig, drawn = plot.tune(results.load(docs))
    # the docs' sweep: best tried 59.7 ms, the launcher's default 30.7 ms (spreads ~5%: not noise)
    assert drawn["best_median_s"] == pytest.approx(0.0597, abs=1e-4)
    assert drawn["default_median_s"] == pytest.approx(0.0307, abs=1e-4)
    assert drawn["default_faster"] is True
    assert any("best tried: default faster" in t.get_text() for t in fig.axes[0].texts)


def test_spread_order_covers_the_space_early():
    assert sweep.spread_order(list(range(10))) == [0, 8, 4, 2, 6, 1, 3, 5, 7, 9]
    assert sweep.spread_order([]) == [] and sweep.spread_order(["a"]) == ["a"]


# == issue 24: a newcomer's hour ===========================================================================


def _calibration(home, name="fit-h200", hardware_name="h200"):
    from mlactl.decide.calibration import store as cal_store

    fits = [
        {"op": op, "source": "t", "dtype": "bf16", "terms": ["fixed"]}
        | {"params": {"t_fixed_s": 5e-6, "eta_c": 0.6, "eta_m": 0.8}}
        for op in ("kv_expand", "expand_attention", "lse_merge", "q_absorb", "absorb_attention", "out_absorb")
    ]
    cal_store.save(
        {"schema": "mlactl.calibration", "schema_version": 1, "name": name, "hardware": hardware_name} | {"fits": fits}
    )
    return name


# -- progress: a bar on a terminal's stderr for long work, nothing in a pipe -------------------------


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_long_work_shows_a_bar_on_a_terminal_only(home, terminal):
    env = {"MLACTL_PROGRESS_AFTER": "0", "COLUMNS": "100"}
    env["TTY_COMPATIBLE"] = "1" if terminal else "0"
    # a calibrated search over 256 prefixes: seconds of work
    name = _calibration(home)
    out = runner.invoke(app, ["crossover", "--calibration", name, "--prefix", "0:255K:1K", "-f", "json"], env=env)
    assert out.exit_code == 0, out.stderr
    json.loads(out.stdout)  # stdout is the answer alone
    if terminal:
        assert "crossover search (expand against absorb)" in plain(out.stderr)
    else:
        assert out.stderr == ""


def test_progress_tasks_cost_nothing_without_a_display():
    from mlactl.util import progress

    with progress.task("anything", total=3) as bar:
        bar.advance(2)
    assert bar is progress.SILENT


# -- commands that agree ------------------------------------------------------------------------------


def test_plot_results_takes_the_files_settings_and_measured_prefixes(tmp_path, home):
    from mlactl.model.config import from_name

    cfg = from_name("teaching").with_tp(8)
    rows = [
        {"batch": 1, "new": n, "prefix": p, "path": path, "median_s": 1e-4 * n + 1e-5}
        for p in (256, 1024)
        for n in (1, 8, 64)
        for path in ("expand", "absorb")
    ]
    crossovers = [{"batch": 1, "prefix": p, "measured": 64, "measured_status": "found"} for p in (256, 1024)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_results_file(model=cfg.to_dict(), paths=rows, crossovers=crossovers)))
    data = tmp_path / "drawn.json"
    out = runner.invoke(
        app, ["plot", "crossover", "--results", str(path), "-o", str(tmp_path / "c.png"), "--data", str(data)]
    )
    assert out.exit_code == 0, out.output
    assert "settings from" in out.stdout and "model teaching, tp 8, dtype fp32, kv fp32" in out.stdout
    drawn = json.loads(data.read_text())
    # the panels are the prefixes measured (not the default 0,4K,32K), for the file's model and dtypes
    assert [panel["prefix"] for panel in drawn["panels"]] == [256, 1024]
    assert "teaching, tp 8" in drawn["title"] and "fp32 compute" in drawn["title"]
    assert "cpu has no hardware profile" in drawn["title"]  # and against whose roofline


def test_calibration_name_brings_its_hardware_everywhere(tmp_path, home):
    name = _calibration(home)
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


def test_calibrated_charts_name_the_calibration(home):
    from mlactl.decide import analysis
    from mlactl.decide.calibration import store as cal_store
    from mlactl.model import config as model
    from mlactl.model import hardware
    from mlactl.output import plot

    cal = cal_store.resolve(_calibration(home))
    args = (model.from_name("deepseek-v3"), hardware.from_name("h200"), [1] * 4, [1, 64, 512, 4096], [4096] * 4)
    roof, calibrated = analysis.analyze(*args), analysis.analyze(*args, calibration=cal)
    for _, drawn in (plot.crossover(roof, calibrated=calibrated), plot.roofline(roof, calibrated=calibrated)):
        assert "calibrated times" in drawn["title"] and "fit-h200" in drawn["title"]
        assert "analytic only" not in drawn["title"]
    grid = analysis.analyze(*args[:2], [1] * 4, [1, 64, 1, 64], [0, 0, 64, 64], calibration=cal)
    assert "calibrated times: fit-h200" in plot.pathmap(grid)[1]["title"]


def test_legends_sit_outside_the_axes_and_no_label_sits_on_a_curve(home):
    from mlactl.decide import analysis
    from mlactl.model import config as model
    from mlactl.model import hardware
    from mlactl.output import plot

    cfg, hw = model.from_name("deepseek-v3"), hardware.from_name("h800")
    grid = analysis.analyze(cfg, hw, [1] * 6, [1, 64, 512] * 2, [0] * 3 + [4096] * 3)
    fig, drawn = plot.crossover(grid)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    # the crossover values are in each panel's title, not written over the curves
    assert all(not ax.texts for ax in fig.axes)
    assert "crossover (new tokens): predicted" in fig.axes[1].get_title()
    fig, _ = plot.roofline(analysis.analyze(cfg, hw, [1], [1], [4096]))
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1


def test_the_path_map_has_no_blank_band_above_prefix_zero(home):
    from matplotlib.collections import QuadMesh

    from mlactl.decide import analysis
    from mlactl.model import config as model
    from mlactl.model import hardware
    from mlactl.output import plot

    news, prefixes = [1, 16, 256], [0, 64, 256, 1024]
    grid = analysis.analyze(
        model.from_name("deepseek-v3"),
        hardware.from_name("h800"),
        [1] * 12,
        [n for _ in prefixes for n in news],
        [p for p in prefixes for _ in news],
    )
    fig, _ = plot.pathmap(grid)
    meshes = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]
    (zero, rows) = sorted(meshes, key=lambda m: m.get_coordinates()[0, 0, 1])
    zero_top = zero.get_coordinates()[-1, 0, 1]
    rows_bottom = rows.get_coordinates()[0, 0, 1]
    assert zero_top == pytest.approx(rows_bottom)  # prefix 0's row touches 64's: no band between


# -- tune's tables on stdout --------------------------------------------------------------------------


@pytest.mark.slow
def test_tune_prints_its_tables_on_stdout(tmp_path, home):
    from conftest import SMALL

    model = tmp_path / "small.json"
    model.write_text(json.dumps(SMALL))
    args = ["tune", "paths", "--backend", "torch", "--model", str(model), "--prefix", "0", "--new", "1,8"]
    out = runner.invoke(app, [*args, "--quick", "--results-file", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    assert "Paths: measured crossover" in out.stdout and "results: " in out.stdout
    assert "Paths: measured crossover" not in out.stderr


# -- help that tells the truth, and messages ------------------------------------------------------------


def test_calibrate_help_offers_what_it_has():
    out = runner.invoke(app, ["calibrate", "--help"], env={"COLUMNS": "200"})
    text = plain(out.stdout)
    assert "--framework-version" in text and "table or json" in text
    assert "csv" not in text.split("--format")[1].split("\n")[0]  # its --format line offers no csv
    assert "--output" not in text
    assert "Example:" in text
    # --version is mlactl's (on the root command); calibrate's old --version VERSION points to the new name
    assert runner.invoke(app, ["--version"]).stdout.startswith("mlactl ")
    old = runner.invoke(app, ["calibrate", "--version", "0.5.14"])
    assert old.exit_code == 2 and "--framework-version" in old.stderr


def test_calibrate_names_the_one_missing_option():
    out = runner.invoke(app, ["calibrate", "--from", "aiconfigurator", "--system", "h200"])
    assert out.exit_code == 2
    assert "needs --framework (e.g. sglang)" in out.stderr and "--system" not in out.stderr.split("needs")[1]


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


def test_the_calibrate_table_fits_100_columns_without_folding_a_name():
    from mlactl.decide.calibration.fit import FitResult
    from mlactl.output.calibrate_tables import fits_table, terms_lines

    errors = {"median": 0.045, "p90": 0.145}
    fits = [
        FitResult(op, f"sglang-0.5.14:{kernel}:{phase}", dtype, terms, {}, 1448, errors, errors)
        for op, kernel, phase, dtype, terms in (
            ("absorb_attention", "flash_attention", "decode", "bf16", ("fixed", "split", "kvpad", "serial")),
            ("absorb_attention", "flash_attention", "prefill", "bf16", ("fixed", "pad", "waves", "fa3split")),
            ("kv_expand", "sglang_deepgemm_gemm_nt_f8f8bf16", "prefill", "fp8_block", ("fixed",)),  # the longest
        )
    ]
    text = render(fits_table("h200-aiconfigurator-sglang-0.5.14", "h200", fits, 100), 100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    body = [line for line in lines if "│" in line]
    assert len(body) == 3  # one line a fit: nothing folded onto a second
    for name in ("absorb_attention", "kv_expand", "flash_attention", "sglang_deepgemm_gemm_nt_f8f8bf16", "fp8_block"):
        assert name in text
    # piped (132 columns): the held-out, blocked and interval columns, the in-sample ones left
    # out first, still one line a fit
    piped = render(fits_table("h200-aiconfigurator-sglang-0.5.14", "h200", fits, 132), 132)
    assert "held-out" in piped and "blocked" in piped and "in 80%" in piped and "median and p90" in piped
    assert len([line for line in piped.splitlines() if "│" in line]) == 3
    assert terms_lines(fits)[0] == (
        "terms kept: absorb_attention (flash_attention, decode, bf16): fixed + split + kvpad + serial"
    )


# -- round three: what a newcomer hits first -----------------------------------------------------------


def test_python_dash_m_mlactl_runs_the_cli():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "mlactl", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mlactl ")


@pytest.mark.parametrize("typed, meant", [("analyse", "analyze"), ("cross", "crossover"), ("replya", "replay")])
def test_mistyped_command_gets_did_you_mean(typed, meant):
    out = runner.invoke(app, [typed])
    assert out.exit_code == 2
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"did you mean {meant}?" in lines[0], out.output


def test_shell_completion_is_offered_and_completes_commands():
    shown = runner.invoke(app, ["--show-completion", "bash"], prog_name="mlactl")
    assert shown.exit_code == 0 and "_mlactl_completion" in shown.output
    env = {"_MLACTL_COMPLETE": "complete_bash", "COMP_WORDS": "mlactl ana", "COMP_CWORD": "1"}
    assert runner.invoke(app, [], env=env, prog_name="mlactl").output.split() == ["analyze"]
    env = {"_MLACTL_COMPLETE": "complete_bash", "COMP_WORDS": "mlactl analyze --hard", "COMP_CWORD": "2"}
    assert runner.invoke(app, [], env=env, prog_name="mlactl").output.split() == ["--hardware"]
    # sub-commands do not repeat them
    assert "--install-completion" not in runner.invoke(app, ["analyze", "--help"]).output


# -- every command whole at 80 columns, in a pseudo-terminal -------------------------------------------


def in_terminal(args, cwd, columns: int = 80, timeout: float = 180.0) -> str:
    """`python -m mlactl ARGS` in a pseudo-terminal `columns` wide (as a user's shell runs it:
    rich sees a terminal and its size), its output without ANSI codes."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(cwd)
        env = dict(os.environ, COLUMNS=str(columns), LINES="50", TERM="xterm", NO_COLOR="1")
        env.pop("TTY_COMPATIBLE", None)
        os.execvpe(sys.executable, [sys.executable, "-m", "mlactl", *args], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    else:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(fd)
    return plain(out.decode("utf-8", "replace")).replace("\r\n", "\n")


def _trace_lines(n: int = 120) -> str:
    rows = []
    for i in range(n):  # tests/test_golden.py's trace, shorter
        tokens = 600 + 997 * (i % 7) + (9000 if i % 13 == 5 else 0)
        blocks, shared = -(-tokens // 512), min(i % 5, -(-tokens // 512) - 1)
        ids = list(range(1, shared + 1)) + [1000 * (i + 1) + b for b in range(blocks - shared)]
        rows.append({"timestamp": 100 * i, "input_length": tokens, "output_length": 20 + 37 * (i % 4), "hash_ids": ids})
    return "".join(json.dumps(r) + "\n" for r in rows)


TABLES_80 = [
    ["analyze"],
    ["analyze", "--hardware", "h200", "--new", "1,256,4096", "--prefix", "0,32K", "--ops"],
    ["crossover", "--max-new", "64"],
    ["batch", "req.csv"],  # new=512 was `5…`
    ["engines"],
    ["replay", "trace.jsonl"],  # `10,…`, `1.…`, `375…`, `sglang-t…`
    ["list"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", TABLES_80 + [[*c, "--help"] for c in COMMANDS] + [["replay", "--help"]],
                         ids=lambda a: "-".join(a))  # fmt: skip
def test_every_table_and_help_is_whole_at_80_columns(tmp_path, home, args):
    (tmp_path / "req.csv").write_text("new,prefix,count\n1,8000,32\n1,300,16\n512,0,1\n64,4096,2\n3000,12000,1\n")
    (tmp_path / "trace.jsonl").write_text(_trace_lines())
    text = in_terminal(args, tmp_path)
    assert "Traceback" not in text and "Error" not in text, text
    assert "…" not in text, text  # nothing cut: no number, name or example shortened
    assert max(len(line) for line in text.splitlines()) <= 80, text
    if args == ["batch", "req.csv"]:
        assert "512" in text and "3000" in text


def test_measured_policy_outside_what_was_measured_falls_back_and_says_so(tmp_path, home):
    """A quick CPU tune measured prefix 0 only (crossover 16: expand from 16 new tokens). At 64 new
    tokens after a 512-token prefix its crossover was applied anyway (expand, losing what absorb
    would not); it covers prefixes 0 and 1 only now, and elsewhere the roofline chooses, as the
    roofline policy does, with one note saying so."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_results_file()))
    args = ["analyze", "--policy", "measured", "--results", str(path), "--new", "64", "--prefix", "0,1,512,32K"]
    out = runner.invoke(app, [*args, "-f", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    measured = {row["prefix"]: row["policy"]["path"] for row in data["rows"]}
    roofline = runner.invoke(app, [*args[:1], "--policy", "roofline", *args[5:], "--model", "teaching", "--tp", "8",
                                   "--dtype", "fp32", "--kv-dtype", "fp32", "-f", "json"])  # fmt: skip
    assert roofline.exit_code == 0, roofline.output
    rl = {row["prefix"]: row["policy"]["path"] for row in json.loads(roofline.stdout)["rows"]}
    assert measured[0] == measured[1] == "expand"  # measured: 64 >= 16
    assert measured[512] == rl[512] == "absorb" and measured[32768] == rl[32768]  # was expand
    assert any(
        "2 point(s) lie outside the prefixes measured (0): the roofline chooses there" in n for n in data["notes"]
    )


def test_paths_legend_explains_the_values_in_its_table():
    """The legend said `158 (140–175): ...` under every table, though no row held it."""
    rows = [
        {
            "batch": 1,
            "prefix": 0,
            "measured": 64,
            "measured_low": 32,
            "measured_high": 128,
            "measured_new": [16, 32, 64],
        },
        {"batch": 1, "prefix": 512, "measured": None, "measured_status": noise.BUDGET, "measured_new": [16]},
    ]
    caption = tune_tables.paths_caption(rows)
    assert caption.startswith("64 (32–128): expand wins from 64 new tokens at every count measured")
    assert "cut (budget)" in caption and "158" not in caption and "never" not in caption
    assert tune_tables.paths_caption([]) is None


def test_compile_report_prefill_row_says_what_was_launched():
    """The prefill row said neither its output dtype nor its split count (decode's did)."""
    pytest.importorskip("triton")
    from mlactl.tune.compile import Case, _build

    config = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    launch = _build(Case("mla_prefill", {"B": 1, "H": 128, "S_q": 256, "ctx": 4352}, config))[-1]
    assert launch == {"out_dtype": "bf16", "num_splits": 1}
    row = {"kernel": "mla_prefill", "shape": {"B": 1}, "config": config, "arch": "sm_90", "error": "x", **launch}
    assert "bf16 x1" in render(tune_tables.compile_table([row], 132), 132)


def test_kernels_table_tells_none_tried_from_none_passed():
    """`mla_prefill ... none passed 0/0/0`: the budget ran out before its first config."""
    entries = [
        {"kernel": "mla_prefill", "bucket": "B=1", "configs": []},
        {"kernel": "mla_decode", "bucket": "B=1", "configs": [{"status": "failed"}]},
    ]
    text = render(tune_tables.kernels_table(entries, meaningful=False), 132)
    assert "none tried (budget)" in text and "0/0/0" in text
    assert "none passed" in text and "0/1/0" in text
