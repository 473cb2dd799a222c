"""benchmarks/gpu_check.py --smoke: its plumbing on tiny shapes in Triton's CPU interpreter.

Every FLOP and byte figure of the JSON is recomputed here by hand from docs/design.md's formulas (not
through mlactl.model.cost), and every roofline time from the "teaching" profile's round numbers
(100 TFLOP/s fp16, 3 TB/s). Nothing here looks at how fast anything ran.
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"
# the smoke dims, and the teaching profile the smoke run uses for its roofline
R, DR, DC, DV = 32, 16, 16, 16
PEAK, BANDWIDTH = 100e12, 3e12
BYTES = {"fp16": 2, "fp8": 1}


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check():
    return load_script()


@pytest.fixture(scope="module")
def smoke(gpu_check, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    rc = gpu_check.main(["--smoke", "--skip-tests", "--out", str(out)])
    files = list(out.glob("gpu-check-*.json"))
    assert len(files) == 1, files
    return rc, json.loads(files[0].read_text())


def pairs(new, prefix):
    k = new + prefix
    return new * k - new * (new - 1) // 2


def absorb_attention(B, new, prefix, H, a, kv):
    nq, nk = B * new, B * (new + prefix)
    flops = B * pairs(new, prefix) * (2 * H * (R + DR) + 2 * H * R)
    nbytes = nk * (R + DR) * kv + nq * H * (R + DR) * a + nq * H * R * a
    return [(flops, nbytes)]


def expand_attention(B, new, prefix, H, a, kv):
    nq, nk = B * new, B * (new + prefix)
    flops = B * pairs(new, prefix) * (2 * H * (DC + DR) + 2 * H * DV)
    nbytes = nq * H * (DC + DR) * a + nk * H * (DC + DV) * a + nk * DR * kv + nq * H * DV * a
    return [(flops, nbytes)]


def absorb_path(B, new, prefix, H, a, kv):
    nq = B * new
    q_absorb = (2 * H * DC * R * nq, nq * H * DC * a + H * DC * R * a + nq * H * R * a)
    out_absorb = (2 * H * R * DV * nq, nq * H * R * a + H * R * DV * a + nq * H * DV * a)
    return [q_absorb, *absorb_attention(B, new, prefix, H, a, kv), out_absorb]


def expand_path(B, new, prefix, H, a, kv):
    nk = B * (new + prefix)
    kv_expand = (2 * R * H * (DC + DV) * nk, nk * R * kv + H * (DC + DV) * R * a + nk * H * (DC + DV) * a)
    return [kv_expand, *expand_attention(B, new, prefix, H, a, kv)]


HAND = {
    ("absorb", "attention"): absorb_attention,
    ("expand", "attention"): expand_attention,
    ("absorb", "all ops"): absorb_path,
    ("expand", "all ops"): expand_path,
}


def test_smoke_run_succeeds(smoke):
    rc, doc = smoke
    assert rc == 0, [r.get("error") for r in doc["rows"]]
    assert doc["schema"] == "mlactl-gpu-check" and doc["schema_version"] == 3
    assert doc["smoke"] is True and doc["timings_meaningful"] is False
    assert doc["tests"] == {"status": "not run", "reason": "--skip-tests"}
    assert doc["hardware_profile"]["name"] == "teaching"
    assert "teaching" in doc["hardware_profile"]["note"]
    for key in ("torch", "triton", "cuda", "python"):
        assert key in doc["versions"]
    assert doc["device"]["name"] and doc["date"]
    assert doc["summary"]["rows_ok"] == doc["summary"]["rows"] == len(doc["rows"])


def test_smoke_rows_cover_every_kernel_and_path_checked(smoke):
    _, doc = smoke
    ids = [r["id"] for r in doc["rows"]]
    assert ids == [
        "decode-absorb-H4-fp16",
        "decode-absorb-H4-fp16-nosplit",
        "decode-absorb-H2-fp16",
        "prefill-expand-L160-H4",
        "prefill-expand-L96-H4",
        "decode-absorb-H4-fp8",
        "decode-absorb-H2-fp8",
        "path-absorb-decode-H2",
        "path-expand-decode-H2",
        "path-absorb-extend-H2",
        "path-expand-extend-H2",
    ]
    rows = {r["id"]: r for r in doc["rows"]}
    assert rows["decode-absorb-H4-fp16-nosplit"]["config"]["SPLIT_SCORE"] == 0
    assert rows["decode-absorb-H4-fp16"]["target"]["metric"] == "flops_per_s"
    assert rows["decode-absorb-H2-fp16"]["target"]["metric"] == "bytes_per_s"
    assert rows["prefill-expand-L160-H4"]["target"]["min"] == 350e12
    assert "twin" not in rows["prefill-expand-L160-H4"]  # compared in the twin-size row
    assert "L96" in rows["prefill-expand-L160-H4"]["note"]
    for r in doc["rows"]:
        if r["id"] != "prefill-expand-L160-H4":
            assert r["twin"]["status"] == "ok", r["twin"]
            assert r["twin"]["outputs_agree"] is True, r["twin"]["rel_err"]
            assert r["twin"]["speedup"] == pytest.approx(r["twin"]["timing"]["median_s"] / r["timing"]["median_s"])
        assert r["output_finite"] is True


@pytest.mark.parametrize(
    "row_id",
    [
        "decode-absorb-H4-fp16",
        "decode-absorb-H2-fp16",
        "decode-absorb-H4-fp8",
        "decode-absorb-H2-fp8",
        "decode-absorb-H4-fp16-nosplit",
        "prefill-expand-L160-H4",
        "prefill-expand-L96-H4",
        "path-absorb-decode-H2",
        "path-expand-decode-H2",
        "path-absorb-extend-H2",
        "path-expand-extend-H2",
    ],
)
def test_smoke_counts_by_hand(smoke, row_id):
    _, doc = smoke
    row = next(r for r in doc["rows"] if r["id"] == row_id)
    s = row["shape"]
    assert f"H{s['H']}" in row_id
    ops = HAND[row["cost_path"], row["cost_op"]](
        s["batch"], s["new"], s["prefix"], s["H"], BYTES[row["dtype"]], BYTES[row["kv_dtype"]]
    )
    assert row["flops"] == sum(f for f, _ in ops)
    assert row["bytes"] == sum(b for _, b in ops)
    # roofline: max per op, summed over the path's ops
    roof = sum(max(f / PEAK, b / BANDWIDTH) for f, b in ops)
    assert row["roofline_s"] == pytest.approx(roof, rel=1e-12)
    median = row["timing"]["median_s"]
    assert row["achieved_flops_per_s"] == pytest.approx(row["flops"] / median)
    assert row["achieved_bytes_per_s"] == pytest.approx(row["bytes"] / median)
    assert 0 < row["roofline_fraction"] < math.inf
    assert row["roofline_fraction"] == pytest.approx(roof / median)


def test_smoke_baselines_ceilings_and_error_thresholds(smoke):
    """Every decode row has the vectorised torch absorb as a baseline (its output within the
    threshold of ours) and lists the optional MLA kernels; the long prefill row tries each SDPA
    backend; every timed row has its fraction of the measured ceilings and its max error."""
    _, doc = smoke
    ceil = doc["ceilings"]
    assert ceil["matmul"]["flops_per_s"] == pytest.approx(2 * 128**3 / ceil["matmul"]["timing"]["median_s"])
    assert ceil["copy"]["bytes_per_s"] == pytest.approx(2 * 2**20 / ceil["copy"]["timing"]["median_s"])
    rows = {r["id"]: r for r in doc["rows"]}
    for row_id in ("decode-absorb-H4-fp16", "decode-absorb-H2-fp16", "decode-absorb-H4-fp8", "decode-absorb-H2-fp8"):
        names = [b["name"] for b in rows[row_id]["baselines"]]
        assert names == ["torch-vectorised", "flash_mla", "flashinfer-mla", "sgl_kernel", "flash_attn"]
        torch_vec = rows[row_id]["baselines"][0]
        assert torch_vec["status"] == "ok" and torch_vec["max_abs_diff_vs_kernel"] <= 4e-3
        assert torch_vec["ratio"] == pytest.approx(torch_vec["timing"]["median_s"] / rows[row_id]["timing"]["median_s"])
    assert [b["name"] for b in rows["prefill-expand-L160-H4"]["baselines"]] == [
        "sdpa-flash",
        "sdpa-cudnn",
        "sdpa-efficient",
    ]
    for r in doc["rows"]:
        of = r["fraction_of_measured"]
        assert of["flops"] == pytest.approx(r["achieved_flops_per_s"] / ceil["matmul"]["flops_per_s"])
        assert of["bytes"] == pytest.approx(r["achieved_bytes_per_s"] / ceil["copy"]["bytes_per_s"])
        if "twin" in r:
            assert r["twin"]["max_abs_err"] <= r["twin"]["max_abs_err_threshold"] == 4e-3


def test_vectorised_absorb_matches_the_twin(gpu_check):
    """The torch baseline computes what the twin computes (a second implementation, no loop)."""
    import torch

    from mlactl.kernels.decode_naive import mla_decode_naive

    gen = torch.Generator().manual_seed(3)
    B, H, r, dR, page, ctx = 3, 4, 32, 16, 16, 40
    kv = torch.randn(B * 3 + 1, page, r + dR, generator=gen)
    table = torch.randperm(B * 3 + 1, generator=gen)[: B * 3].reshape(B, 3).int()
    seqlens = torch.full((B,), ctx, dtype=torch.int32)
    q = torch.randn(B, 1, H, r + dR, generator=gen)
    got = gpu_check.absorb_vectorised(q, kv, table, seqlens, 0.2, r)
    want = mla_decode_naive(q, kv, table, seqlens, 0.2, r=r)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bench_budget_counts_from_the_benchmark_not_the_tests(gpu_check, tmp_path, monkeypatch):
    """Rows are skipped only when the benchmark itself ran past its budget, not the tests before it."""
    import time

    def slow_tests(timeout_s, log=None):
        time.sleep(1.5)
        return {"status": "passed", "passed": 1, "failed": 0, "errors": 0, "skipped": 0}

    real = gpu_check.row_specs
    monkeypatch.setattr(gpu_check, "run_gpu_tests", slow_tests)
    monkeypatch.setattr(gpu_check, "row_specs", lambda plan, model: real(plan, model)[-1:])
    monkeypatch.setattr(gpu_check, "measure_ceilings", lambda bench: None)
    gpu_check.main(["--smoke", "--bench-budget", "1", "--skip-smoke-launch", "--out", str(tmp_path)])
    doc = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    assert [r["status"] for r in doc["rows"]] == ["ok"]


def test_decode_kernel_row_counts_one_pair_per_cached_token(smoke):
    _, doc = smoke
    row = next(r for r in doc["rows"] if r["id"] == "decode-absorb-H4-fp16")
    B, ctx = row["shape"]["batch"], row["shape"]["context"]
    assert (row["shape"]["new"], row["cost_path"], row["cost_op"]) == (1, "absorb", "attention")
    assert row["flops"] == B * ctx * (2 * 4 * (R + DR) + 2 * 4 * R)


def test_a_broken_row_is_recorded_and_the_others_still_run(gpu_check, tmp_path, monkeypatch):
    real = gpu_check.row_specs

    def specs(plan, model):
        keep = [s for s in real(plan, model) if s[0] == "path-absorb-decode-H2"]

        def broken(bench):
            raise RuntimeError("boom")

        return [("broken-row", broken), *keep]

    monkeypatch.setattr(gpu_check, "row_specs", specs)
    rc = gpu_check.main(["--smoke", "--skip-tests", "--out", str(tmp_path)])
    doc = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    assert rc == 1
    assert [r["status"] for r in doc["rows"]] == ["error", "ok"]
    assert doc["rows"][0]["error"] == "RuntimeError: boom"
    assert doc["summary"]["rows_error"] == 1


@pytest.mark.parametrize(
    "text, want",
    [
        pytest.param(
            "..F.s\nFAILED tests/x.py::t - assert 0\n1 failed, 3 passed, 1 skipped, 40 deselected in 9.12s\n",
            dict(passed=3, failed=1, skipped=1, errors=0, deselected=40),
            id="failed",
        ),
        pytest.param(
            "ss\n2 skipped, 9 deselected in 0.5s\n",
            dict(passed=0, failed=0, skipped=2, errors=0, deselected=9),
            id="skipped",
        ),
        pytest.param("E\n1 error in 0.1s\n", dict(passed=0, failed=0, skipped=0, errors=1, deselected=0), id="error"),
        pytest.param("", dict(passed=0, failed=0, skipped=0, errors=0, deselected=0), id="empty"),
    ],
)
def test_parse_pytest(gpu_check, text, want):
    got = gpu_check.parse_pytest(text)
    assert {k: got[k] for k in want} == want


def test_smoke_rows_carry_the_new_reports(smoke):
    """Each decode row has its bitwise repeat check (equal under the interpreter); on a CPU the
    kernel-only time and the launched kernels say why they are absent instead of a number."""
    _, doc = smoke
    for r in doc["rows"]:
        assert r["kernel_timing"]["status"] == "not measured" and "CPU" in r["kernel_timing"]["reason"]
        assert r["launched"]["method"] == "none" and r["launched"]["kernels"] == []
        if r["id"].startswith("decode-"):
            assert r["repeat"] == {"runs": 2, "mismatches": 0, "max_abs_diff": 0.0, "bitwise_equal": True}
        else:
            assert "repeat" not in r
    s = doc["summary"]
    assert s["repeat_checked"] == 5 and s["repeat_mismatch"] == 0 and s["smoke_failed"] is False
    assert doc["smoke_launch"]["status"] == "not run"


def test_bitwise_repeat_catches_one_differing_bit(gpu_check):
    import torch

    first = torch.tensor([1.0, float("nan"), -0.0], dtype=torch.bfloat16)
    same = gpu_check.bitwise_repeat(lambda: first.clone(), first, 3)
    assert same == {"runs": 3, "mismatches": 0, "max_abs_diff": 0.0, "bitwise_equal": True}  # NaN bits equal too
    flips = iter([first.clone(), torch.tensor([1.0, float("nan"), 0.0], dtype=torch.bfloat16), first.clone()])
    got = gpu_check.bitwise_repeat(lambda: next(flips), first, 3)
    # -0.0 and +0.0 compare equal as numbers but not as bits: one launch of three differs
    assert got["mismatches"] == 1 and got["bitwise_equal"] is False and got["max_abs_diff"] == 0.0
    nudged = first.clone()
    nudged[0] = 1.0078125  # the next bf16 after 1.0 (8 bits of mantissa: 1 + 2**-7)
    assert gpu_check.bitwise_repeat(lambda: nudged, first, 1)["max_abs_diff"] == 2**-7


def test_smoke_launch_writes_each_launch_and_passes_tiny(gpu_check, tmp_path):
    """The smoke launch itself, in its child under the watchdog, on the tiny plan (interpreter)."""
    got = gpu_check.run_smoke_launch(tmp_path, watchdog_s=120, tiny=True)
    assert got["status"] == "ok" and got["returncode"] == 0, got
    launches = got["smoke"]["launches"]
    assert [x["id"] for x in launches] == ["decode-H4", "decode-H2"]
    for x in launches:
        assert x["status"] == "ok" and x["repeat"]["bitwise_equal"] and x["max_abs_err"] <= 4e-3
    assert got["smoke"]["status"] == "ok"


def test_smoke_launch_watchdog_kills_the_child(gpu_check, tmp_path):
    """A watchdog shorter than the child's start-up (importing torch alone takes longer than 0.3 s):
    the child is killed, and the verdict says it was on the host side, not in a kernel."""
    got = gpu_check.run_smoke_launch(tmp_path, watchdog_s=0.3, tiny=True)
    assert got["status"] == "timeout" and got["returncode"] is None
    assert got["slow_in"] == "startup (imports, CUDA init)" and "hung_in" not in got
    assert gpu_check.smoke_stops_the_run(got) is False


def test_smoke_verdict_tells_a_hang_from_a_slow_compile(gpu_check):
    def doc(*statuses):
        return {"launches": [{"id": f"decode-H{i}", "status": s} for i, s in enumerate(statuses)]}

    v = gpu_check.smoke_verdict
    assert v(doc("ok", "waiting for the GPU"), killed=True) == {"hung_in": "decode-H1", "phase": "waiting for the GPU"}
    assert v(doc("repeating on the GPU"), killed=True)["hung_in"] == "decode-H0"
    assert v(doc("ok", "compiling and launching"), killed=True) == {"slow_in": "decode-H1",
                                                                     "phase": "compiling and launching"}  # fmt: skip
    assert v(doc(), killed=True)["slow_in"] == "startup (imports, CUDA init)"
    assert v(doc("waiting for the GPU"), killed=False) == {}
    stops = gpu_check.smoke_stops_the_run
    assert stops({"status": "timeout", "hung_in": "decode-H0"}) and stops({"status": "wrong"})
    assert stops({"status": "failed", "returncode": 2}) and not stops({"status": "ok"})
    assert not stops({"status": "timeout", "slow_in": "decode-H0"}) and not stops({"status": "not run"})


def test_a_failed_smoke_launch_skips_the_benchmark_and_says_so(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "_cuda_present", lambda: True)
    monkeypatch.setattr(
        gpu_check, "run_smoke_launch", lambda out, watchdog_s: {"status": "timeout", "hung_in": "decode-H128"}
    )
    monkeypatch.setattr(gpu_check, "row_specs", lambda plan, model: pytest.fail("a row ran after the smoke failed"))
    rc = gpu_check.main(["--smoke", "--out", str(tmp_path)])
    doc = json.loads(next(tmp_path.glob("gpu-check-*.json")).read_text())
    assert rc == 1 and doc["rows"] == []
    assert doc["skipped_because"] == "the smoke launch timeout (hung in decode-H128, killed by its 20 s watchdog)"
    assert doc["tests"] == {"status": "not run", "reason": "the smoke launch failed"}
    assert "SMOKE LAUNCH TIMEOUT" in capsys.readouterr().out


class _FakeKernel:
    def __init__(self, name, function, regs, spills, shared=1024):
        self.name, self.function, self.n_regs, self.n_spills = name, function, regs, spills
        self.hash = f"h{function}"
        self.metadata = type("M", (), {"shared": shared, "num_warps": 8, "num_stages": 2})()
        self.src = type("S", (), {"constants": {(1,): 64, (0,): "x"}, "fn": type("F", (), {"arg_names": ["A", "B"]})})


def test_launched_kernels_are_those_the_launch_hook_saw(gpu_check, monkeypatch):
    """The hook notes each launch's CUfunction; only those kernels are reported, with the JIT's
    registers and spills, launch counts and named constants. Without a hook: those loaded."""
    a, b, c = _FakeKernel("stage1", 11, 232, 0), _FakeKernel("merge", 12, 40, 8), _FakeKernel("other", 13, 90, 0)
    jit = type("J", (), {"device_caches": {0: ({"k1": a, "k2": b}, "target"), 1: ({"k3": c},)}})()
    monkeypatch.setattr(gpu_check, "jit_functions", lambda: {"decode._kernel": jit})
    hooks = []

    def install(hook):
        hooks.append(hook)
        return lambda: hooks.remove(hook)

    monkeypatch.setattr(gpu_check, "_install_launch_hook", install)

    def call():  # what a launcher does: three launches, two kernels (a twice)
        for f in (11, 12, 11):
            hooks[0](type("LazyDict", (), {"data": {"function": f, "name": "n"}})())

    got = gpu_check.launched_kernels(call)
    assert got["method"] == "launch-hook" and got["launches"] == 3 and hooks == []
    by = {k["name"]: k for k in got["kernels"]}
    assert set(by) == {"stage1", "merge"}  # "other" was compiled but not launched by this call
    assert (by["stage1"]["n_regs"], by["stage1"]["n_spills"], by["stage1"]["launches"]) == (232, 0, 2)
    assert (by["merge"]["n_spills"], by["merge"]["launches"]) == (8, 1)
    assert by["stage1"]["constants"] == {"B": 64, "A": "x"} and by["stage1"]["shared_bytes"] == 1024
    summary = gpu_check.spill_summary([{"launched": got}, {"launched": got}])
    assert summary == {"kernels": 2, "spilling": 1, "max_regs": 232, "spilling_kernels": ["decode._kernel (8 spills)"]}

    monkeypatch.setattr(gpu_check, "_install_launch_hook", lambda hook: None)
    loaded = gpu_check.launched_kernels(lambda: None)
    assert loaded["method"] == "loaded" and {k["name"] for k in loaded["kernels"]} == {"stage1", "merge", "other"}


def test_install_launch_hook_on_this_triton(gpu_check):
    """On the Triton installed here the hook goes in and comes out again."""
    from triton import knobs

    before = knobs.runtime.launch_enter_hook
    calls_before = list(getattr(before, "calls", []))
    remove = gpu_check._install_launch_hook(print)
    assert remove is not None
    chain = knobs.runtime.launch_enter_hook
    assert print in getattr(chain, "calls", [chain])
    remove()
    assert list(getattr(knobs.runtime.launch_enter_hook, "calls", [])) == calls_before


CLOCKS_CSV = """timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], clocks.max.sm [MHz], temperature.gpu, \
power.draw [W], utilization.gpu [%], clocks_event_reasons.active
2026/11/30 10:00:00.000, 345, 3201, 1980, 30, 75.10, 0, 0x0000000000000001
2026/11/30 10:00:00.500, 1980, 3201, 1980, 41, 512.30, 100, 0x0000000000000000
2026/11/30 10:00:01.000, 1755, 3201, 1980, 52, 699.90, 100, 0x0000000000000004
2026/11/30 10:00:01.500, [N/A], 3201, 1980, 53, [N/A], 100, 0x0000000000000000
2026/11/30 10:00:02.0
"""


def test_clock_samples_and_their_window(gpu_check, tmp_path):
    path = tmp_path / "clocks.csv"
    path.write_text(CLOCKS_CSV)
    samples = gpu_check.read_clocks(path)
    assert len(samples) == 4  # the header and the torn last line are skipped
    t0 = samples[0]["t"]
    assert samples[1]["t"] - t0 == pytest.approx(0.5)
    assert samples[3]["sm_mhz"] is None and samples[3]["power_w"] is None
    win = gpu_check.clock_window(samples, t0 + 0.4, t0 + 1.6)  # the last three samples
    assert win["samples"] == 3
    assert win["sm_mhz"] == {"min": 1755.0, "median": 1980.0, "max": 1980.0}  # [N/A] left out
    assert win["max_power_w"] == 699.9 and win["max_temp_c"] == 53.0 and win["max_sm_mhz"] == 1980.0
    assert win["reasons"] == ["0x0000000000000000", "0x0000000000000004"]


# ---- the pytest plugin: failures as they happen, outcomes on disk ---------------------------------

PLUGIN_TESTS = """
import time

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "one is not two"

def test_hangs():
    time.sleep(120)
"""


def test_the_plugin_prints_failures_as_they_happen_and_a_kill_keeps_them(gpu_check, tmp_path):
    """pytest with -p gpu_check, killed while a test hangs: the failure was printed on its own line
    before the kill, and the outcome log says what passed, what failed and what was running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "test_three.py").write_text(PLUGIN_TESTS)
    log = tmp_path / "tests.jsonl"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_check", "--rootdir",
           str(tmp_path), "test_three.py"]  # fmt: skip
    env = gpu_check.plugin_env(log=log)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(n.endswith("test_hangs") for n in gpu_check.read_tests_log(log)["running"]):
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate()[0].decode()
    assert "FAILED test_three.py::test_fails - AssertionError: one is not two" in out.splitlines()
    got = gpu_check.read_tests_log(log)
    assert {n: r["outcome"] for n, r in got["ended"].items()} == {
        "test_three.py::test_passes": "passed",
        "test_three.py::test_fails": "failed",
    }
    assert got["running"] == ["test_three.py::test_hangs"]


def test_tests_log_skips_a_torn_line(gpu_check, tmp_path):
    log = tmp_path / "t.jsonl"
    log.write_text(
        '{"event": "start", "nodeid": "a"}\n{"event": "end", "nodeid": "a", "outcome": "passed"}\n'
        '{"event": "start", "nodeid": "b"}\n{"event": "end", "nodeid": "b", "outc'
    )
    assert gpu_check.read_tests_log(log) == {"ended": {"a": {"event": "end", "nodeid": "a", "outcome": "passed"}},
                                            "running": ["b"]}  # fmt: skip


def test_gpu_tests_command_names_the_gpu_test_files(gpu_check):
    cmd = gpu_check.gpu_tests_command("python3", workers=4)
    assert cmd[:4] == ["python3", "-m", "pytest", "-m"] and cmd[4] == "gpu"
    assert ["-p", "gpu_check"] == cmd[cmd.index("gpu_check") - 1 : cmd.index("gpu_check") + 1]
    assert "--tb=line" in cmd and "-rfE" in cmd and cmd[cmd.index("-n") + 1] == "4"
    files = [a for a in cmd if a.startswith("tests/")]
    assert "tests/test_decode.py" in files and "tests/test_gpu_check.py" in files  # its GPU test below
    assert "tests/test_tune.py" not in files  # no GPU test there
    assert "-n" not in gpu_check.gpu_tests_command("python3", workers=0)


# ---- benchmarks/device_check.py: the one GPU run, 330 s of budgets -------------------------------

DEVICE_CHECK_SH = SCRIPT.parent / "device_check.sh"


@pytest.fixture(scope="module")
def device_check(gpu_check):
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT.parent / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _bash(args, env, cwd):
    import os
    import subprocess

    return subprocess.run(
        ["bash", str(DEVICE_CHECK_SH), *args], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_the_plan_fits_two_runs_in_the_device_time(device_check):
    """330 s of budgets (15 device minutes: two runs and two machine starts of ~2 min), the smoke
    launch right after setup under its 20 s watchdog, and every inner budget inside its step's."""
    plan = dict(device_check.PLAN)
    assert list(plan) == ["setup", "smoke", "gpu_check", "tests", "tune", "schedules"]
    assert sum(plan.values()) <= 330 == device_check.LIMIT_S
    assert plan["smoke"] == 20
    steps = device_check.build_steps(list(device_check.PLAN), Path("/tmp/x"), "python3")
    assert device_check.check_plan(steps, 330) == []
    argv = {s.name: s.argv for s in steps}
    assert argv["gpu_check"][argv["gpu_check"].index("--bench-budget") + 1] == "95"  # 115 - 20 of start-up
    assert argv["tune"][argv["tune"].index("--budget") + 1] == "45"
    assert "--smoke-launch" in argv["smoke"] and "--skip-smoke-launch" in argv["gpu_check"]
    assert len(device_check.PLANNED_FILES) <= 8


def test_check_plan_refuses(device_check):
    def steps(text):
        return device_check.build_steps(device_check.parse_plan(text), Path("/tmp/x"), "python3")

    assert device_check.check_plan(steps("setup:200 smoke:20 gpu_check:200"), 330) == [
        "the step budgets add up to 420 s, over the 330 s limit"
    ]
    assert "the smoke launch must come first (after setup)" in device_check.check_plan(steps("tests:10 smoke:20"), 330)
    assert any("watchdog is 20 s" in p for p in device_check.check_plan(steps("smoke:30"), 330))
    assert any("reserve" in p for p in device_check.check_plan(steps("gpu_check:20"), 330))
    with pytest.raises(ValueError, match="no command for step 'flash'"):
        steps("flash:10")


def test_device_check_dry_run_checks_plan_and_imports(tmp_path):
    """What CI runs of the GPU script on a CPU: the plan printed, its budgets add up to 330 s,
    every module and script it runs imports, gpu_check's and tune's own plans check out, and
    nothing is written to $OUT."""
    import sys

    run = _bash(["--dry-run"], {"OUT": str(tmp_path / "out"), "PYTHON": sys.executable}, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    budgets = {}
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit() and parts[2].startswith("s"):
            budgets[parts[0]] = int(parts[1])
    assert list(budgets) == ["setup", "smoke", "gpu_check", "tests", "tune", "schedules"]
    assert sum(budgets.values()) <= 330 and budgets["smoke"] == 20
    assert "dry run: plan, budgets, tools and imports ok" in run.stdout
    assert "shipped first: True" in run.stdout and "PROBLEM" not in run.stdout + run.stderr
    assert not (tmp_path / "out").exists()


def test_device_check_dry_run_refuses_budgets_over_the_limit(tmp_path):
    import sys

    env = {"OUT": str(tmp_path), "PYTHON": sys.executable, "DEVICE_CHECK_STEPS": "setup:300 smoke:20 gpu_check:300"}
    run = _bash(["--dry-run"], env, tmp_path)
    assert run.returncode == 1 and "add up to 620 s, over the 330 s limit" in run.stderr


def _fake(code: str) -> list[str]:
    import sys

    return [sys.executable, "-c", code]


def test_run_plan_records_ok_failed_and_timeout_and_exits_1(device_check, tmp_path, capfd):
    """Fake steps: one succeeds, one fails, one writes its result and then hangs ignoring SIGTERM.
    The hang is killed at its budget, what it wrote before survives, every step is in steps.jsonl,
    and the summary line and the exit status say a step failed."""
    out = tmp_path / "out"
    S = device_check.Step
    steps = [
        S("fine", 10, _fake("print('fine')")),
        S("broken", 10, _fake("import sys; sys.exit(3)")),
        S("hang", 4.5, _fake(f"import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             f"pathlib.Path({str(out / 'partial.json')!r}).write_text('measured'); time.sleep(60)")),
        S("after", 10, _fake("print('after')")),
    ]  # fmt: skip
    rc = device_check.run_plan(steps, out, limit_s=60)
    printed = capfd.readouterr().out
    assert rc == 1
    records = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(r.get("step"), r.get("status"), r.get("rc")) for r in records[:4]] == [
        ("fine", "ok", 0),
        ("broken", "failed", 3),
        ("hang", "timeout", None),
        ("after", "ok", 0),
    ]
    assert records[2]["seconds"] <= 4.5 + 1  # killed within its budget (SIGKILL GRACE_S after the TERM)
    assert (out / "partial.json").read_text() == "measured"
    assert (
        records[4]["summary"] == "FAILED" and records[4]["failed"] == ["broken"] and records[4]["timeout"] == ["hang"]
    )
    assert "device_check: SUMMARY FAILED: 2 ok, 1 failed (broken), 1 timeout (hang), 0 skipped" in printed


def test_run_plan_all_ok_exits_0(device_check, tmp_path, capfd):
    S = device_check.Step
    rc = device_check.run_plan([S("a", 10, _fake("pass")), S("b", 10, _fake("pass"))], tmp_path, limit_s=20)
    assert rc == 0
    assert "device_check: SUMMARY ok: 2 ok, 0 failed, 0 timeout, 0 skipped" in capfd.readouterr().out


def test_a_hung_smoke_launch_skips_every_later_step(device_check, tmp_path, capfd):
    """The smoke step hangs in its first launch (its smoke.json says so): it is killed, every later
    step is skipped with the reason, and the run exits 1."""
    smoke = {"status": "running", "launches": [{"id": "decode-H128", "status": "waiting for the GPU"}]}
    write = f"import json, time; open({str(tmp_path / 'smoke.json')!r}, 'w').write(json.dumps({smoke!r})); "
    S = device_check.Step
    steps = [
        S("smoke", 4, _fake(write + "time.sleep(60)")),
        S("gpu_check", 10, _fake("pass")),
        S("tests", 10, _fake("pass")),
    ]
    rc = device_check.run_plan(steps, tmp_path, limit_s=30)
    printed = capfd.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert rc == 1
    assert records[0]["status"] == "timeout" and records[0]["hung_in"] == "decode-H128"
    why = "the smoke launch hung in decode-H128 (killed by its watchdog)"
    assert [(r["status"], r["note"]) for r in records[1:3]] == [("skipped", why), ("skipped", why)]
    assert f"device_check: {why}: skipping gpu_check, tests" in printed
    assert "SUMMARY FAILED: 0 ok, 0 failed, 1 timeout (smoke), 2 skipped (gpu_check, tests)" in printed


def test_a_step_that_would_end_past_the_limit_is_skipped(device_check, tmp_path, capfd):
    S = device_check.Step
    rc = device_check.run_plan([S("a", 8, _fake("pass")), S("b", 30, _fake("pass"))], tmp_path, limit_s=12)
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert rc == 1 and records[1]["status"] == "skipped" and "past the 12 s limit" in records[1]["note"]


@pytest.mark.gpu
def test_kernel_time_and_launched_kernels_on_the_gpu(gpu_check):
    """On the GPU machine (the tests step): mla_decode is captured in a CUDA graph for its
    kernel-only time, and the launch hook finds the kernels it launched with the registers and
    spills the JIT reports. No timing is judged: only that each figure exists and is sane."""
    import torch

    from mlactl.kernels.decode import mla_decode
    from mlactl.tune.inputs import paged_cache
    from mlactl.tune.timing import time_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    kv, table, _ = paged_cache(4, 1000, 576, "bf16", torch.bfloat16, torch.device("cuda"), gen, page=64)
    seqlens = torch.full((4,), 1000, dtype=torch.int32, device="cuda")
    q = torch.randn(4, 1, 16, 576, generator=gen, device="cuda").to(torch.bfloat16)

    def call():
        return mla_decode(q, kv, table, seqlens, 0.07, r=512, validate=False)[0]

    first = call()
    t = time_kernel(call, device="cuda", budget_s=0.01, min_repeats=3, max_repeats=10)
    assert t.method == "cuda-graph" and t.repeats >= 3 and t.median_s > 0
    got = gpu_check.launched_kernels(call, torch.cuda.synchronize)
    assert got["method"] == "launch-hook" and got["launches"] >= 1, got
    assert any("mla_decode" in k["name"] for k in got["kernels"]), got
    for k in got["kernels"]:
        assert isinstance(k["n_regs"], int) and 0 < k["n_regs"] <= 255 and k["n_spills"] >= 0, k
    assert gpu_check.bitwise_repeat(call, first, 5)["bitwise_equal"]


def test_a_smoke_launch_killed_while_compiling_lets_the_run_go_on(device_check, tmp_path, capfd):
    """Killed on the host side (its first launch still compiling): no kernel hung, so the later
    steps run; the smoke step still counts as timed out in the summary and the exit status."""
    smoke = {"status": "running", "launches": [{"id": "decode-H128", "status": "compiling and launching"}]}
    write = f"import json, time; open({str(tmp_path / 'smoke.json')!r}, 'w').write(json.dumps({smoke!r})); "
    S = device_check.Step
    rc = device_check.run_plan([S("smoke", 4, _fake(write + "time.sleep(60)")), S("gpu_check", 10, _fake("pass"))],
                               tmp_path, limit_s=30)  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert rc == 1 and records[0]["slow_in"] == "decode-H128" and records[1]["status"] == "ok"
    assert "no kernel hung, going on" in capfd.readouterr().out


def test_digest_puts_every_row_in_a_line(device_check, smoke, tmp_path):
    """The run's last lines (what the device tool returns) hold each row's figures; the whole-call
    TFLOP/s is FLOPs over the median when there is no kernel-only time (a CPU run)."""
    _, doc = smoke
    doc = json.loads(json.dumps(doc))
    doc["rows"][1] = {"id": "decode-absorb-H4-fp16-nosplit", "status": "skipped", "error": "time budget of 95 s"}
    (tmp_path / "gpu-check-x.json").write_text(json.dumps(doc))
    lines = device_check.digest(tmp_path)
    assert lines[0].startswith("digest of gpu-check-x.json") and len(lines) == 1 + len(doc["rows"])
    first = lines[1].split()
    row = doc["rows"][0]
    assert first[0] == row["id"] and float(first[1]) == pytest.approx(row["timing"]["median_s"] * 1e3, abs=1e-3)
    assert first[2] == "-" and first[6] == "same"
    assert lines[2].split()[:2] == ["decode-absorb-H4-fp16-nosplit", "skipped:"]
    assert device_check.digest(tmp_path / "none") == ["digest: no gpu-check-*.json"]
