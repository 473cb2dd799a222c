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
    assert doc["schema"] == "mlactl-gpu-check" and doc["schema_version"] == 2
    assert doc["smoke"] is True and doc["timings_meaningful"] is False
    assert doc["tests"] == {"status": "not run", "reason": "--skip-tests"}
    assert doc["hardware_profile"]["name"] == "teaching"
    assert "teaching" in doc["hardware_profile"]["note"]
    for key in ("torch", "triton", "cuda", "python"):
        assert key in doc["versions"]
    assert doc["device"]["name"] and doc["date"]
    assert doc["summary"]["rows_ok"] == doc["summary"]["rows"] == len(doc["rows"])


def test_smoke_rows_cover_the_issue(smoke):
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

    def slow_tests(timeout_s):
        time.sleep(1.5)
        return {"status": "passed", "passed": 1, "failed": 0, "errors": 0, "skipped": 0}

    real = gpu_check.row_specs
    monkeypatch.setattr(gpu_check, "run_gpu_tests", slow_tests)
    monkeypatch.setattr(gpu_check, "row_specs", lambda plan, model: real(plan, model)[-1:])
    monkeypatch.setattr(gpu_check, "measure_ceilings", lambda bench: None)
    gpu_check.main(["--smoke", "--bench-budget", "1", "--out", str(tmp_path)])
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


# ---- benchmarks/device_check.sh: the one GPU run, planned to fit one call ------------------------

DEVICE_CHECK = SCRIPT.parent / "device_check.sh"


def _bash(args, env, cwd):
    import os
    import subprocess

    return subprocess.run(
        ["bash", str(DEVICE_CHECK), *args], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_device_check_dry_run_checks_plan_and_imports(tmp_path):
    """What CI runs of the GPU script on a CPU: the budgets printed up front add up to at most the
    540 s one call allows, every module and script it runs imports, and nothing is written to $OUT."""
    import sys

    run = _bash(["--dry-run"], {"OUT": str(tmp_path / "out"), "PYTHON": sys.executable}, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    budgets = {}
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "s" and parts[1].isdigit():
            budgets[parts[0]] = int(parts[1])
    total = budgets.pop("total")
    assert list(budgets) == ["setup", "gpu_check", "tests", "schedules", "tune", "compile"]
    assert total == sum(budgets.values()) <= 540
    assert "imports ok" in run.stdout and list((tmp_path / "out").iterdir()) == []


def test_device_check_dry_run_refuses_budgets_over_the_limit(tmp_path):
    import sys

    env = {"OUT": str(tmp_path), "PYTHON": sys.executable, "DEVICE_CHECK_STEPS": "setup:300 gpu_check:300"}
    run = _bash(["--dry-run"], env, tmp_path)
    assert run.returncode == 1 and "add up to 600 s, over the 540 s limit" in run.stderr


def test_device_check_run_falls_back_times_out_and_skips(tmp_path):
    """The real run's control flow with a stand-in python (no GPU): pip fails and the run goes on
    from the source tree, a step past its budget is killed and recorded, a step that would end past
    the limit is skipped, and every step is recorded in $OUT as it ends."""
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'case "$*" in\n'
        '  *"-m pip"*) echo "error: invalid command bdist_wheel" >&2; exit 1 ;;\n'
        "  *gpu_check.py*) trap '' TERM; sleep 7 ;;\n"
        '  *) echo "fake python $*" ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {
        "OUT": str(out),
        "PYTHON": str(fake),
        "DEVICE_CHECK_LIMIT_S": "9",
        "DEVICE_CHECK_STEPS": "setup:1 gpu_check:1 tests:1 schedules:1 tune:30 compile:1",
        "PATH": f"{tmp_path}:/usr/bin:/bin",
    }
    run = _bash([], env, SCRIPT.parent.parent)
    assert run.returncode == 1  # the plan's check, before anything runs: 35 s of budgets over 9 s
    env["DEVICE_CHECK_STEPS"] = "setup:1 gpu_check:1 tests:1 schedules:1 tune:4 compile:1"
    run = _bash([], env, SCRIPT.parent.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pip could not install; running from the source tree" in run.stdout
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()[1:]]
    status = {r[0]: r[1] for r in rows}
    assert status["setup"] == "ok" and status["gpu_check"] == "timeout" and status["tests"] == "ok"
    # gpu_check ignores the TERM at its 1 s budget and is killed 5 s later: tune's 4 s would then
    # end past the 9 s limit, so it is skipped; compile's 1 s still fits
    assert status["tune"] == "skipped" and status["compile"] == "ok"
    assert list(status) == ["setup", "gpu_check", "tests", "schedules", "tune", "compile"]
    assert len(list(out.iterdir())) <= 8 and (out / "device_check.log").exists()
