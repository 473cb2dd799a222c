"""mlactl tune on a CPU: the torch backend end to end, the interpreter backend with a failing
config, resume, corrupt files, concurrent writers, nearest-bucket lookup, and the errors; the
sweep (mlactl/tune/sweep.py): its time budget and point clock, the order it tries configs, no
tuned configs from interpreter runs; its tables on stdout, and the hint when torch is missing.

No assertion here depends on a timing: where a result is a measurement, the test checks its
structure; the logic that turns timings into a crossover is tested on given times."""

import json
import math
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
from conftest import SMALL  # small enough for a CPU; absorb much costlier per pair than expand
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.kernels import configs
from mlactl.model.config import from_hf_config
from mlactl.results import store as results
from mlactl.tune import store as store_mod
from mlactl.tune import sweep, timing
from mlactl.util.errors import MlactlError

runner = CliRunner()

# What the interpreter can run quickly: power-of-two dims, two heads.
TINY = dict(SMALL, model_type="tiny-mla", num_attention_heads=2, kv_lora_rank=32)


def model_file(tmp_path, fields) -> str:
    path = tmp_path / f"{fields['model_type']}.json"
    path.write_text(json.dumps(fields))
    return str(path)


def invoke(*args):
    result = runner.invoke(app, ["tune", *args])
    return result


def test_torch_backend_end_to_end(tmp_path, home):
    """tune paths with the twins on a CPU: a results file with measured and predicted crossovers
    that analyze --policy measured and every plot read."""
    model = model_file(tmp_path, SMALL)
    out = tmp_path / "run.json"
    result = invoke(
        "paths",
        "--backend",
        "torch",
        "--model",
        model,
        "--prefix",
        "0,64",
        "--new",
        "1:512:*8",
        "--results-file",
        str(out),
        "--quick",
        "--budget",
        "600",  # every point, however loaded the machine: a budget cut would leave some out
    )
    assert result.exit_code == 0, result.output
    data = results.load(out)
    assert data["backend"] == "torch" and data["device"]["name"] == "cpu"
    assert data["timing"]["method"] == "wall-clock"
    assert {(r["prefix"], r["new"], r["path"]) for r in data["paths"]} >= {
        (p, n, path) for p in (0, 64) for n in (1, 8, 64, 512) for path in ("expand", "absorb")
    }
    for row in data["paths"]:
        assert row["status"] == "ok" and row["median_s"] > 0 and row["p10_s"] <= row["median_s"] <= row["p90_s"]
        assert row["agreement"] < 1e-3  # both paths computed the same function
    cost_flops = {(r["prefix"], r["new"], r["path"]): r["flops"] for r in data["paths"]}
    # absorb at prefix 64, new 8: pairs 8*72 - 28 = 548; 548*2176 + 8*(2*4*16*128*2) FLOPs
    assert cost_flops[(64, 8, "absorb")] == 548 * 2176 + 8 * 32768
    frame = results.paths_frame(data)
    assert len(frame) == len(data["paths"]) and {"median_s", "flops", "path"} <= set(frame.columns)
    rows = {r["prefix"]: r for r in data["crossovers"]}
    assert set(rows) == {0, 64}
    for r in rows.values():
        # first_stable is a count measured; the estimate, a root fitted across the sign change,
        # lies within the counts it was fitted on
        assert r["first_stable"] is None or r["first_stable"] in r["measured_new"]
        if r.get("estimator") == "local_root":
            assert r["measured_window"][0] <= r["measured"] <= r["measured_window"][1]
        else:
            assert r["measured"] == r["first_stable"]
        # By hand for SMALL (H 4, r 128, dC = dR = dV = 16): absorb 2176 FLOPs per pair, expand 384,
        # so 1792 more; expanding a token costs 2*128*4*32 = 32768. At prefix 64 expand wins once
        # 1792 * pairs(n) > 32768 * 64, pairs(n) = 64n + n(n+1)/2: n = 16 gives 1160 pairs (too few,
        # 1170.3 needed), n = 17 gives 1241. At prefix 0 nothing is expanded twice: n = 1.
        assert r["predicted_by_flops"] == {0: 1, 64: 17}[r["prefix"]]

    # the measured policy reads it; a profile of round numbers stands in for this CPU's
    cpu = tmp_path / "cpu.toml"
    cpu.write_text('name = "cpu"\nmemory_gb = 16\nbandwidth_tbs = 0.02\n[peak_tflops]\nfp32 = 0.2\n')
    same = ["--model", model, "--hardware", str(cpu), "--kv-dtype", "fp32", "--dtype", "fp32"]
    analyzed = runner.invoke(
        app,
        [
            "analyze",
            *same,
            "--policy",
            "measured",
            "--results",
            str(out),
            "--new",
            "1,512",
            "--prefix",
            "0,64",
            "--format",
            "json",
        ],
    )
    assert analyzed.exit_code == 0, analyzed.output
    policy = [row["policy"] for row in json.loads(analyzed.output)["rows"]]
    assert all(p["name"] == "measured" and p["path"] in ("expand", "absorb") for p in policy)

    # every chart takes it
    for chart, extra in (
        ("crossover", ["--prefix", "0,64"]),
        ("roofline", []),
        ("pathmap", ["--prefix", "0,64,512", "--new", "1:512:*2"]),
    ):
        png = tmp_path / f"{chart}.png"
        shown = runner.invoke(app, ["plot", chart, *same, "--results", str(out), "-o", str(png), *extra])
        assert shown.exit_code == 0, (chart, shown.output)
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_measured_crossover_logic():
    t = {
        1: {"expand": 3, "absorb": 1},
        8: {"expand": 2, "absorb": 1},
        64: {"expand": 1, "absorb": 2},
        512: {"expand": 1, "absorb": 9},
    }
    assert sweep.measured_crossover(t) == 64
    t[1] = {"expand": 0.5, "absorb": 1}  # a noisy win below a loss does not move it
    assert sweep.measured_crossover(t) == 64
    t[8] = {"expand": 0.5, "absorb": 1}  # wins from 1 up: the crossover is 1
    assert sweep.measured_crossover(t) == 1
    assert sweep.measured_crossover({1: {"expand": 2, "absorb": 1}}) is None
    assert sweep.measured_crossover({1: {"expand": 1, "absorb": 2}, 4: {"expand": 1, "absorb": 2}}) == 1


def test_bisection_finds_the_exact_crossover(monkeypatch):
    """With times from a function whose crossover is 37, the refinement between 8 and 64 lands on it."""
    calls = []

    def fake_point(ctx, cost, b, n, p, chunk):
        calls.append(n)
        return {"expand": 1.0, "absorb": 2.0} if n >= 37 else {"expand": 2.0, "absorb": 1.0}

    monkeypatch.setattr(sweep, "_measure_point", fake_point)
    monkeypatch.setattr(sweep, "REFINE_STEPS", 10)
    times = {n: fake_point(None, None, 1, n, 0, 0) for n in (1, 8, 64)}
    sweep._refine(_Ctx(), None, 1, 0, 8192, times)
    assert sweep.measured_crossover(times) == 37
    assert len(calls) <= 3 + 6  # log2(56) bisection steps


class _Ctx:
    def out_of_time(self):
        return False


def test_interpreter_backend_records_a_failing_config(tmp_path, home):
    model = model_file(tmp_path, TINY)
    space = tmp_path / "space.json"
    # BLOCK_H 24 is not a power of two: the launcher refuses it; the sweep must record and go on
    space.write_text(
        json.dumps(
            [
                {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
                {"BLOCK_H": 24, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
                {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
            ]
        )
    )
    out = tmp_path / "interp.json"
    result = invoke(
        "kernels",
        "--interpret",
        "--model",
        model,
        "--kernel",
        "mla_decode",
        "--space",
        str(space),
        "--dtype",
        "fp16",
        "--results-file",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "times mean nothing" in result.output
    data = results.load(out)
    assert data["backend"] == "interpret" and data["timing"]["meaningful"] is False
    (entry,) = data["kernels"]
    status = {json.dumps(c["config"], sort_keys=True): c for c in entry["configs"]}
    bad = status[json.dumps({"BLOCK_H": 24, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}, sort_keys=True)]
    assert bad["status"] == "failed" and "BLOCK_H" in bad["reason"]
    good = [c for c in entry["configs"] if c["status"] == "ok"]
    assert len(good) == 2 and all(c["rel_error"] < 1e-2 for c in good)
    assert entry["best"] in [c["config"] for c in good]
    assert entry["default_median_s"] > 0 and entry["twin_median_s"] > 0
    # flops of the bucket from the cost model: B=2 decode at context 100, H=2, r=32, dR=16:
    # 2 requests * 100 pairs * (2*2*48 + 2*2*32)
    assert entry["flops"] == 2 * 100 * 320


class Killed(BaseException):
    """Like a KeyboardInterrupt or SIGTERM: not an Exception, so nothing on the way catches it."""


def test_resume_after_interruption(tmp_path, home, monkeypatch):
    model = from_hf_config(model_file(tmp_path, SMALL))
    out = tmp_path / "resume.json"
    header = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "device": {"name": "cpu"},
        "backend": "torch",
        "timing": {},
        "model": model.to_dict(),
        "kv_dtype": "fp32",
        "dtype": "fp32",
        "versions": {"torch": "x"},
    }
    measured, kill_at = [], [5]

    def fake_time_all(self, fns):  # the paths of one point, timed in turns
        out = {}
        for name in fns:
            measured.append(1)
            if len(measured) == kill_at[0]:
                raise Killed  # killed in the middle of the sweep (the third point)
            out[name] = timing.time_call(lambda: None, budget_s=0.001, warmup=0, min_repeats=1, max_repeats=1)
        return out

    monkeypatch.setattr(sweep.Context, "time_all", fake_time_all)
    import torch

    ctx = sweep.Context(model, torch.device("cpu"), "torch", "fp32", "fp32", store_mod.ResultsStore(out, header), None)
    with pytest.raises(Killed):
        sweep.tune_paths(ctx, [1], [1, 2, 4], [0, 16], 8192, refine=False)
    kept = results.load(out)
    assert len(kept["paths"]) == 4  # two full points (expand + absorb each) were saved before the kill

    measured.clear()
    kill_at[0] = None
    ctx = sweep.Context(model, torch.device("cpu"), "torch", "fp32", "fp32", store_mod.ResultsStore(out, header), None)
    sweep.tune_paths(ctx, [1], [1, 2, 4], [0, 16], 8192, refine=False)
    assert len(measured) == 12 - 4  # only what was missing
    assert len(results.load(out)["paths"]) == 12


def test_corrupt_results_file(tmp_path, home):
    out = tmp_path / "bad.json"
    out.write_text('{"schema": "mlactl.results", "schema_version": 1,\n "paths": [')
    model = model_file(tmp_path, SMALL)
    args = ("paths", "--backend", "torch", "--model", model, "--prefix", "0", "--new", "1", "--results-file", str(out))
    result = invoke(*args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "line 2: not valid JSON" in lines[0] and "--force" in lines[0]
    result = invoke(*args, "--force")
    assert result.exit_code == 0, result.output
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("bad.") and p.name != "bad.json"]
    assert len(kept) == 1 and kept[0].read_text().endswith('"paths": [')  # the old file is kept as it was
    assert results.load(out)["paths"]


def test_foreign_version_results_file(tmp_path):
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"schema": "mlactl.results", "schema_version": 0}))
    with pytest.raises(MlactlError, match="schema version 0; this mlactl reads version 1"):
        results.load(out)


def _writer(path, tag, count):
    header = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "device": {"name": "cpu"},
        "backend": "torch",
        "timing": {},
        "model": {"name": "m"},
        "kv_dtype": "fp32",
        "dtype": "fp32",
        "versions": {},
    }
    store = store_mod.ResultsStore(path, header)
    for i in range(count):
        store.add("paths", {"batch": tag, "new": i, "prefix": 0, "path": "absorb", "median_s": 1.0})


def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, tag, 40)) for tag in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = results.load(path)
    assert {(r["batch"], r["new"]) for r in data["paths"]} == {(t, i) for t in (1, 2) for i in range(40)}


def test_nearest_bucket_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_TUNED_DIR", str(tmp_path))
    buckets = {
        "B=1,H=128,S_q=1,ctx=1024": {"BLOCK_N": 16},
        "B=128,H=128,S_q=1,ctx=8192": {"BLOCK_N": 64},
        "B=32,H=16,S_q=1,ctx=8192": {"BLOCK_N": 32},
    }
    assert configs.nearest(buckets, B=100, H=128, S_q=1, ctx=16384) == {"BLOCK_N": 64}
    assert configs.nearest(buckets, B=2, H=128, S_q=1, ctx=512) == {"BLOCK_N": 16}
    assert configs.nearest(buckets, B=2, H=16, S_q=1, ctx=512) == {"BLOCK_N": 32}
    assert configs.nearest(buckets, B=2, H=16) is None  # other names: no match
    store_mod.write_tuned_config(
        "mla_decode", "NVIDIA H200", "bf16", "B=128,H=128,S_q=1,ctx=8192", {"BLOCK_N": 64}, "3.6.0", folder=tmp_path
    )
    store_mod.write_tuned_config(
        "mla_decode", "NVIDIA H200", "bf16", "B=1,H=128,S_q=1,ctx=1024", {"BLOCK_N": 16}, "3.6.0", folder=tmp_path
    )
    assert (tmp_path / "kernel=mla_decode,device_name=NVIDIA_H200,dtype=bf16.json").is_file()
    assert configs.lookup("mla_decode", "NVIDIA H200", "bf16", B=64, H=128, S_q=1, ctx=8000) == {"BLOCK_N": 64}
    assert configs.lookup("mla_decode", "NVIDIA H200", "bf16", B=1, H=128, S_q=1, ctx=900) == {"BLOCK_N": 16}
    assert configs.lookup("mla_decode", "NVIDIA H100", "bf16", B=1, H=128, S_q=1, ctx=900) is None
    monkeypatch.setenv("MLACTL_NO_TUNED", "1")
    assert configs.lookup("mla_decode", "NVIDIA H200", "bf16", B=1, H=128, S_q=1, ctx=900) is None


def test_triton_backend_without_cuda_is_one_line(tmp_path, home):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for args in (("kernels",), ("paths",), ()):
        result = invoke(*args, "--backend", "triton")
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1
        assert "--backend triton needs a CUDA GPU" in lines[0] and "--backend torch" in lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (("kernels", "--interpret", "--kernel", "flash"), "--kernel 'flash' is unknown"),
        (("paths", "--backend", "jax"), "--backend must be one of triton, torch, interpret"),
        (("paths", "--backend", "torch", "--new", "0"), "--new: 0 must be a positive integer"),
        (("paths", "--backend", "torch", "--dtype", "int8"), "--dtype must be one of"),
        (("kernels", "--interpret", "--device", "cuda"), "--device cuda"),
    ],
)
def test_tune_bad_input(tmp_path, home, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_ceilings_on_cpu_write_a_measured_profile(tmp_path, home):
    result = invoke("ceilings", "--device", "cpu", "--quick")
    assert result.exit_code == 0, result.output
    profile = home / "hardware" / "cpu.toml"
    assert profile.is_file()
    from mlactl.model import hardware

    hw = hardware.resolve("cpu", measured=True)
    assert hw.using_measured and hw.bandwidth > 0 and hw.peak_flops("fp32") > 0
    analyzed = runner.invoke(
        app,
        [
            "analyze",
            "--hardware",
            "cpu",
            "--measured",
            "--dtype",
            "fp32",
            "--kv-dtype",
            "fp32",
            "--model",
            "teaching",
            "--new",
            "1",
        ],
    )
    assert analyzed.exit_code == 0, analyzed.output
    assert os.listdir(home / "results" / "cpu")  # the run's results file too


# ---- tune --quick: the shipped defaults first, a compile budget, the default's timing on disk ------


def test_quick_candidates_start_with_the_shipped_defaults():
    """The 64-row bf16 decode ships with the split score on (kernels/decode.py, NO_SPILL): the old
    thinning, every 4th config of the space, had none with SPLIT_SCORE=1 (the flag is the space's
    last factor, so every 4th config has it 0). Now the shipped config comes first, whatever it is,
    and the quick list is QUICK_CANDIDATES long."""
    from mlactl.kernels import decode
    from mlactl.model.config import from_name
    from mlactl.tune import space

    cfg = from_name("deepseek-v3")
    spec = space.KERNELS["mla_decode"]
    shape = {"B": 128, "H": 128, "S_q": 1, "ctx": 8192}
    whole = spec.space(cfg, shape, "bf16", "bf16", space.HOPPER_SMEM)
    assert {c["SPLIT_SCORE"] for c in whole[::4]} == {0}  # what --quick used to keep
    got = space.candidates(spec, cfg, shape, "bf16", "bf16", space.HOPPER_SMEM, quick=True)
    shipped = decode.default_config(shape, 512, 64, 64, "bf16", "bf16")
    assert got[0] == {k: shipped[k] for k in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages", "SPLIT_SCORE")}
    assert len(got) == space.QUICK_CANDIDATES and len({json.dumps(c, sort_keys=True) for c in got}) == len(got)
    assert all(c in whole for c in got[1:])
    full = space.candidates(spec, cfg, shape, "bf16", "bf16", space.HOPPER_SMEM, quick=False)
    assert full[0] == got[0] and len(full) == len(whole) + (got[0] not in whole)
    for name in ("mla_prefill", "merge_attn_states", "mla_sparse_decode"):
        spec = space.KERNELS[name]
        for shape in spec.buckets(cfg, True, "cuda"):
            first = space.candidates(spec, cfg, shape, "bf16", "bf16", space.HOPPER_SMEM, quick=True)[0]
            assert first == space.shipped_configs(spec, cfg, shape, "bf16", "bf16", set(first))[0], name


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


class _Store:
    def __init__(self):
        self.saved = []

    def add(self, section, entry):
        self.saved.append(json.loads(json.dumps(entry)))  # what reached the disk at that moment


def test_compile_stage_stops_when_its_budget_runs_out(monkeypatch):
    """Compiles of 4 s each (a fake clock) under a 10 s budget: the first at 0 s, the second at
    4 s, then 8 + 4 > 10, so the stage stops after two; the rest are not timed, and each compile
    was stored as it ended. The shipped config, first in the list, is compiled first."""
    import types

    from mlactl.model.config import from_name
    from mlactl.tune import compile as stage
    from mlactl.tune import space

    clock = _Clock()
    monkeypatch.setattr(sweep, "time", clock)
    compiled = []

    def fake_compile(case):
        compiled.append(case.config)
        clock.now += 4.0
        spills = 16 if case.config["BLOCK_N"] == 64 else 0
        return dict(arch="sm_90", smem_bytes=100_000, spill_bytes=spills, stack_bytes=0, error=None, registers=200)

    monkeypatch.setattr(stage, "compile_one", fake_compile)
    monkeypatch.setattr(stage, "available", lambda: None)
    monkeypatch.setattr(stage, "cuda_arch", lambda device: "sm_90")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    store = _Store()
    ctx = types.SimpleNamespace(
        cfg=from_name("deepseek-v3"), dtype="bf16", kv_dtype="bf16", skipped=[], backend="triton", device=None,
        compile_budget_s=10.0, quick=True, deadline=math.inf, store=store,
    )  # fmt: skip
    shape = {"B": 128, "H": 128, "S_q": 1, "ctx": 8192}
    candidates = space.candidates(space.KERNELS["mla_decode"], ctx.cfg, shape, "bf16", "bf16", space.HOPPER_SMEM, True)
    candidates[1]["BLOCK_N"] = 64  # the second one spills
    entry = {}
    kept = sweep.compile_stage(ctx, space.KERNELS["mla_decode"], shape, "B=128", candidates, entry)
    assert compiled == candidates[:2] and kept == candidates[:1]
    assert entry["compile_budget_cut"] == candidates[2:] and entry["compile_budget_s"] == 10.0
    assert entry["compile_dropped"] == [{"config": candidates[1], "reason": "spills 16 B (stack 0 B)"}]
    assert [len(s["compiled"]) for s in store.saved] == [1, 2]  # each compile on disk as it ended
    assert store.saved[0]["compiled"][0] == {"config": candidates[0], "seconds": 4.0, "dropped": None,
                                             "registers": 200, "spill_bytes": 0, "smem_bytes": 100_000}  # fmt: skip
    assert any(f"{len(candidates) - 2} configs not compiled, not timed (compile budget 10 s spent)" in s
               for s in ctx.skipped)  # fmt: skip


def test_compile_budget_is_a_share_of_the_time_left():
    import types

    ctx = types.SimpleNamespace(compile_budget_s=None, quick=True, deadline=sweep.time.monotonic() + 30)
    assert 9.9 < sweep.compile_budget(ctx) <= 10.0  # a third of the 30 s left, under the quick 20 s
    ctx.deadline = math.inf
    assert sweep.compile_budget(ctx) == sweep.QUICK_COMPILE_BUDGET_S == 20.0
    ctx.quick = False
    assert sweep.compile_budget(ctx) == math.inf


def test_the_defaults_timing_is_stored_before_any_candidate(tmp_path, home, monkeypatch):
    """A run killed in its first candidate still has the launcher default's timing on disk."""
    import torch

    from mlactl.tune import space

    model = from_hf_config(model_file(tmp_path, TINY))
    header = {"schema": "mlactl.results", "schema_version": 1, "device": {"name": "cpu"}, "backend": "triton",
              "timing": {}, "model": model.to_dict(), "kv_dtype": "fp32", "dtype": "fp32", "versions": {}}  # fmt: skip
    out = tmp_path / "killed.json"

    def run(kwargs, config):
        if config is not None:
            raise Killed
        return kwargs["x"] * 2

    spec = space.KernelSpec(
        "mla_decode", lambda cfg, q, d: [{"B": 1}], lambda *a: {"x": torch.ones(4)}, run, lambda kw: kw["x"] * 2,
        lambda *a: [{"BLOCK_N": 16}], lambda cost, s: types_op(), lambda k, d: d,
    )  # fmt: skip
    monkeypatch.setitem(space.KERNELS, "mla_decode", spec)
    ctx = sweep.Context(model, torch.device("cpu"), "triton", "fp32", "fp32", store_mod.ResultsStore(out, header), None)
    with pytest.raises(Killed):
        sweep.tune_kernels(ctx, ["mla_decode"], write_configs=False)
    (entry,) = results.load(out)["kernels"]
    assert entry["default_status"] == "ok" and entry["default_median_s"] > 0
    assert entry["default_timing"]["status"] == "ok" and entry["configs"] == []


def types_op():
    import types

    return types.SimpleNamespace(flops=1.0, bytes=1.0)


# ---- the budget bounds the whole command: launches, checks and timings, under the interpreter ------


class _LaunchClock:
    """A clock that only kernel launches move: each call of a kernel or its twin takes 1 s. The
    sweep, the timing harness and the command read it (their `time` module), so what the budget
    cuts depends on how many launches there were, never on how fast this machine is."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    perf_counter = monotonic

    def launches(self, fn):
        def call(*args):
            self.now += 1.0
            return fn(*args)

        return call


@pytest.mark.parametrize(
    "budget, default_rounds",
    [
        # inputs and twin: 1 + 5 launches; the default: its check, 3 warm-ups, 1 to size, 5
        # repetitions = 10 s, to 16 s; the first candidate would take as long: 26 > 20
        pytest.param(20, 5, id="default-whole"),
        # the default's check and warm-ups end at 10 s, the sizing call at 11 s: 1 repetition fits
        pytest.param(12, 1, id="default-cut"),
    ],
)
def test_a_tiny_budget_stops_the_command_and_keeps_what_it_measured(tmp_path, home, monkeypatch, budget,
                                                                    default_rounds):  # fmt: skip
    """`tune kernels --interpret --quick` under a budget too small for its launch space stops
    within it: no trial, repetition or re-measurement is started that the launches before it say
    would end past it; the command lists every candidate and bucket it skipped, and the results
    file (rewritten atomically after each measurement) holds what was measured."""
    from dataclasses import replace

    import mlactl.cli.tune as cli_tune
    from mlactl.tune import space

    clock = _LaunchClock()
    for module in (cli_tune, sweep, timing):
        monkeypatch.setattr(module, "time", clock)
    for name, spec in list(space.KERNELS.items()):
        monkeypatch.setitem(space.KERNELS, name, replace(spec, run=clock.launches(spec.run),
                                                         twin=clock.launches(spec.twin)))  # fmt: skip
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # set by the command; put back after the test
    out = tmp_path / "run" / "budget.json"
    model = model_file(tmp_path, TINY)
    result = invoke("kernels", "--interpret", "--quick", "--model", model, "--dtype", "fp16",
                    "--budget", str(budget), "--results-file", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert clock.now <= 1000 + budget  # it stopped within its budget (by the launches' clock)
    skipped = result.output[result.output.index("skipped (") :]
    quick = space.QUICK_CANDIDATES
    assert "skipped (3):" in skipped
    assert f"mla_decode B=2,H=2,S_q=1,ctx=100: {quick} configs (time budget)" in skipped
    assert "mla_prefill H=2,L=64: time budget spent" in skipped
    assert "merge_attn_states H=2,T=64: time budget spent" in skipped

    data = results.load(out)  # what it measured, in a file that loads
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.startswith(".")) == ["budget.json"]
    (entry,) = data["kernels"]
    assert entry["kernel"] == "mla_decode" and entry["configs"] == []
    assert entry["twin_median_s"] == 1.0
    default = entry["default_timing"]
    assert default["status"] == "ok" and default["median_s"] == entry["default_median_s"] == 1.0
    assert default["repeats"] == default_rounds
    assert default.get("budget_cut", False) is (default_rounds < 5)


# -- the sweep: its time budget, its point clock, the order it tries configs, what it writes -------


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


def test_spread_order_covers_the_space_early():
    assert sweep.spread_order(list(range(10))) == [0, 8, 4, 2, 6, 1, 3, 5, 7, 9]
    assert sweep.spread_order([]) == [] and sweep.spread_order(["a"]) == ["a"]


# -- tables on stdout, and the hint when torch is missing ------------------------------------------


@pytest.mark.slow
def test_tune_prints_its_tables_on_stdout(tmp_path, home):
    model = tmp_path / "small.json"
    model.write_text(json.dumps(SMALL))
    args = ["tune", "paths", "--backend", "torch", "--model", str(model), "--prefix", "0", "--new", "1,8"]
    out = runner.invoke(app, [*args, "--quick", "--results-file", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    assert "Paths: measured crossover" in out.stdout and "results: " in out.stdout
    assert "Paths: measured crossover" not in out.stderr


def test_missing_torch_hint_gives_the_readme_command(monkeypatch, home):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    out = runner.invoke(app, ["tune", "paths", "--backend", "torch"])
    assert out.exit_code == 2
    assert "pip install -e '.[kernels]'" in out.output
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "pip install -e '.[kernels" in readme


def test_tune_list_says_what_each_results_file_measured_and_why_one_cannot_be_read(tmp_path, monkeypatch):
    from conftest import cpu_results, error_line, plain, run

    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "results"
    (folder / "cpu").mkdir(parents=True)
    older = cpu_results(run_id="20261130-100000-cpu-teaching")  # one measured crossover, one path point
    older["paths"] = [{"batch": 1, "new": 1, "prefix": 0, "path": "absorb", "median_s": 1e-4}]
    older["crossovers"].append({"batch": 1, "prefix": 512, "measured": None, "measured_status": "budget"})
    newer = cpu_results(created="2026-12-01T10:00:00Z", ceilings={"peak_tflops": {"fp32": 1.0}, "bandwidth_tbs": 0.01})
    newer.pop("crossovers")
    (folder / "cpu" / "a.json").write_text(json.dumps(older))
    (folder / "cpu" / "b.json").write_text(json.dumps(newer))
    (folder / "bad.json").write_text('{"schema": "mlactl.results"}')

    out = plain(CliRunner().invoke(app, ["tune", "list"], env={"COLUMNS": "200"}).stdout)  # no cell folds
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│ cpu/")]
    # newest first: file, created, device, hardware, backend, model, dtypes, kernels, paths, crossovers, ceilings
    assert rows[0] == ["cpu/b.json", "2026-12-01 10:00", "cpu", "—", "torch", "teaching tp8", "fp32 / fp32"] + [
        "0", "0", "0", "yes"
    ]  # fmt: skip
    assert rows[1][0] == "cpu/a.json" and rows[1][7:] == ["0", "1", "1 of 2", ""]
    said = " ".join(out.split())
    assert f"cannot read {folder / 'bad.json'}: " in said and "schema version None" in said

    doc = json.loads(run("tune", "list", "-f", "json").stdout)
    assert doc["schema"] == "mlactl.results-list" and doc["folder"] == str(folder)
    assert [Path(r["path"]).name for r in doc["results"]] == ["b.json", "a.json", "bad.json"]
    first = doc["results"][1]
    assert first["run_id"] == "20261130-100000-cpu-teaching" and first["crossovers_measured"] == 1
    assert first["crossovers"] == 2 and first["ceilings"] is False and first["problem"] is None
    assert doc["results"][2]["problem"].endswith("(re-run `mlactl tune`, or use the mlactl that wrote it)")

    empty = tmp_path / "empty"
    empty.mkdir()
    assert " ".join(run("tune", "list", "--dir", empty).stdout.split()) == f"no results in {empty}"
    assert error_line(run("tune", "list", "--dir", tmp_path / "nope", ok=False)).endswith(": no such folder")
