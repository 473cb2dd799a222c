"""`mlactl tune --ray` on a local Ray cluster of 2 CPUs, with the torch backend (the twins).

What is checked is content, never a timing: the Ray run finds the same keys as a serial run
with every correctness gate passed; a worker killed with SIGKILL while its unit is in flight
has that unit retried on the other worker; a unit that outlives its timeout is recorded failed
with the reason; no entry is duplicated or lost; a rerun resumes from the store.
"""

import json
import os
import signal
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.cli.tune import Run, _ray_address_optional
from mlactl.results import store as results

runner = CliRunner()
# --budget: on a loaded machine the quick budget (60 s) could cut a point, and a test must not
# depend on how fast the machine is
MODEL = ["--model", "teaching", "--tp", "8", "--backend", "torch", "--quick", "--budget", "3600"]
# 2 batches x 2 prefixes x 3 new counts = 12 points; at prefix 0 and 64 (< chunk 8192) each
# point has the two paths expand and absorb: 24 rows
PATHS = ["--batch", "1,2", "--prefix", "0,64", "--new", "1:64:*8"]
POINTS = {(b, n, p) for b in (1, 2) for n in (1, 8, 64) for p in (0, 64)}


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster of 2 CPUs for the whole file (it takes ~6 s to start here)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLACTL_TUNED_DIR", raising=False)
    return tmp_path / "home"


def tune(*args):
    result = runner.invoke(app, ["tune", *args])
    assert result.exit_code == 0, result.output
    return result


def keys(data: dict, section: str) -> Counter:
    if section == "kernels":
        return Counter((e["kernel"], e["bucket"]) for e in data[section])
    if section == "paths":
        return Counter((e["batch"], e["new"], e["prefix"], e["path"]) for e in data[section])
    return Counter((e["batch"], e["prefix"]) for e in data[section])


def test_ray_paths_match_a_serial_run(cluster, tmp_path, home):
    serial, on_ray = tmp_path / "serial.json", tmp_path / "ray.json"
    tune("paths", *MODEL, *PATHS, "--results-file", str(serial))
    shown = tune("paths", *MODEL, *PATHS, "--results-file", str(on_ray), "--ray", "--workers", "2")
    assert "Ray: 2 workers: cpu" in shown.output and "12 units done, 0 failed" in shown.output
    a, b = results.load(serial), results.load(on_ray)
    for section in ("paths", "crossovers"):
        assert keys(b, section) == keys(a, section), section
        assert max(keys(b, section).values()) == 1, f"{section}: an entry is duplicated"
    assert set(keys(b, "paths")) == {(bb, n, p, path) for bb, n, p in POINTS for path in ("expand", "absorb")}
    for row in b["paths"]:  # the gate: both paths computed the same function
        assert row["status"] == "ok" and row["median_s"] > 0 and row["agreement"] < 1e-3, row
    assert b["device"]["name"] == "cpu" and b["backend"] == "torch"


def _run(tmp_path, name: str) -> Run:
    return Run(
        model="teaching",
        tp="8",
        backend="torch",
        quick=True,
        results_file=tmp_path / name,
        ray="local",
        workers=2,
    )


def test_faults_resume_and_kernels_on_one_set_of_workers(cluster, tmp_path, home):
    """One pair of workers (each start imports torch: seconds on this machine) for: kernels
    against a serial run, a worker killed mid-unit, a rerun that resumes, a unit that hangs,
    Ctrl-C."""
    from mlactl.tune import ray_runner
    from mlactl.tune import space as spaces

    serial = tmp_path / "serial.json"
    tune("kernels", *MODEL, "--results-file", str(serial))
    run = _run(tmp_path, "run.json")
    killed = []

    def kill_first(slot, unit):  # SIGKILL the first worker as soon as it holds a unit
        if not killed:
            killed.append(slot.index)
            os.kill(slot.pid, signal.SIGKILL)

    try:
        _, kernel_stats = ray_runner.tune_kernels(run.cluster, spaces.default_kernels(run.ctx.cfg))
        found, stats = ray_runner.tune_paths(
            run.cluster, [1, 2], [1, 8, 64], [0, 64], refine=False, on_dispatch=kill_first
        )
        done = {s.index: (s.done, s.failed) for s in run.cluster.slots}
        _, again = ray_runner.tune_paths(run.cluster, [1, 2], [1, 8, 64], [0, 64], refine=False)
        # 1 ms: no unit can finish in time, so each attempt is killed as hung
        _, hung = ray_runner.tune_paths(run.cluster, [1], [2], [0], refine=False, retries=1, unit_timeout_s=0.001)

        def interrupt(slot, unit):  # Ctrl-C while a unit is in flight
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            ray_runner.tune_paths(run.cluster, [4], [1], [0], refine=False, on_dispatch=interrupt)
        assert run.cluster.slots == []  # the workers were stopped
    finally:
        run.finish()
    data = results.load(tmp_path / "run.json")  # valid after all of it, Ctrl-C included
    assert not [r for r in data["paths"] if r["batch"] == 4]  # the interrupted unit left nothing

    # kernels: the same buckets as the serial run, each timed once (the twins have no configs)
    assert keys(data, "kernels") == keys(results.load(serial), "kernels")
    assert {k for k, _ in keys(data, "kernels")} == {"mla_decode", "mla_prefill", "merge_attn_states"}
    assert all(e["twin_median_s"] > 0 and e["best_median_s"] == e["twin_median_s"] for e in data["kernels"])
    assert kernel_stats.units == 3 and kernel_stats.failed == 0

    # the killed worker lost its one unit; the other worker ran it; nothing lost or doubled
    (index,) = killed
    assert stats.retried == 1 and stats.failed == 0 and stats.units == 12
    assert done[index][1] == 1 and done[0][0] + done[1][0] - kernel_stats.units == 12
    paths = [r for r in data["paths"] if r["new"] != 2]
    assert Counter((r["batch"], r["new"], r["prefix"], r["path"]) for r in paths) == Counter(
        {(b, n, p, path): 1 for b, n, p in POINTS for path in ("expand", "absorb")}
    )
    assert all(r["status"] == "ok" for r in paths)
    assert set(keys(data, "crossovers")) == {(b, p) for b in (1, 2) for p in (0, 64)}
    assert len(found["cpu"]) == 4

    # the rerun asked no worker: every unit was in the store
    assert again.resumed == 12 and again.units == 12

    # hung twice (2 attempts), then recorded failed with the reason
    assert hung.failed == 1 and hung.retried == 1
    rows = [r for r in data["paths"] if r["new"] == 2]
    assert {(r["path"], r["status"]) for r in rows} == {("expand", "failed"), ("absorb", "failed")}
    assert all(r["reason"] == "worker lost: timed out after 0.001 s (2 attempts)" for r in rows)


def test_without_ray_one_line_says_how_to_install_it(tmp_path, home, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    result = runner.invoke(app, ["tune", "paths", *MODEL, "--ray", "--workers", "2"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "Error: --ray needs Ray, an optional extra: pip install -e '.[ray]' (or pip install 'mlactl[ray]')"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--workers", "2"], "--workers counts Ray workers: add --ray", id="workers-without-ray"),
        pytest.param(
            ["--backend", "triton", "--ray", "--workers", "2"], "--workers runs CPU actors", id="triton-on-cpus"
        ),
        pytest.param(["--workers", "0", "--ray"], "Invalid value for '--workers'", id="zero-workers"),
    ],
)
def test_ray_bad_input(home, args, message):
    pytest.importorskip("ray")
    result = runner.invoke(app, ["tune", "paths", "--model", "teaching", "--tp", "8", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, expected",
    [
        pytest.param(["--ray"], ["--ray", "local"], id="alone-last"),
        pytest.param(["--ray", "--workers", "2"], ["--ray", "local", "--workers", "2"], id="before-option"),
        pytest.param(["--ray", "paths"], ["--ray", "local", "paths"], id="before-subcommand"),
        pytest.param(["--ray", "list"], ["--ray", "local", "list"], id="before-list"),
        pytest.param(["--ray", "compile"], ["--ray", "local", "compile"], id="before-compile"),
        pytest.param(["--ray", "auto"], ["--ray", "auto"], id="auto"),
        pytest.param(["--ray", "10.0.0.1:6379"], ["--ray", "10.0.0.1:6379"], id="address"),
    ],
)
def test_ray_address_is_optional(args, expected):
    assert _ray_address_optional(args) == expected


def test_interpreter_configs_split_over_workers_merge_into_one_bucket(cluster, tmp_path, home):
    """Three configs of one mla_decode bucket cut into 2 units (one per worker): the store holds
    one bucket with all three, the failing one with its reason, the best over both units."""
    tiny = {
        "model_type": "tiny-mla",
        "hidden_size": 256,
        "num_attention_heads": 2,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
        "num_hidden_layers": 2,
    }
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(tiny))
    configs = [
        {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        {"BLOCK_H": 24, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},  # not a power of two: refused
        {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    ]
    space = tmp_path / "space.json"
    space.write_text(json.dumps(configs))
    out = tmp_path / "interp.json"
    args = ["kernels", "--interpret", "--model", str(model), "--kernel", "mla_decode", "--space", str(space)]
    shown = tune(*args, "--dtype", "fp16", "--results-file", str(out), "--ray", "--workers", "2")
    assert "2 units done, 0 failed" in shown.output
    (entry,) = results.load(out)["kernels"]
    by_config = {json.dumps(c["config"], sort_keys=True): c for c in entry["configs"]}
    assert set(by_config) == {json.dumps(c, sort_keys=True) for c in configs}
    assert by_config[json.dumps(configs[1], sort_keys=True)]["status"] == "failed"
    ok = [c for c in entry["configs"] if c["status"] == "ok"]
    assert len(ok) == 2 and entry["best"] == min(ok, key=lambda c: c["median_s"])["config"]


@pytest.mark.parametrize("command", ["kernels", "paths", "ceilings"])
def test_help_says_how_to_install_ray(command):
    """The extra's name survives the help's markup (rich would eat a bare [ray])."""
    result = runner.invoke(app, ["tune", command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "pip install -e '.[ray]'" in result.output and "--workers" in result.output


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_ray_parts_split_the_candidates_the_serial_run_tries(monkeypatch, quick):
    """A bucket cut into parts for Ray workers tries, over its parts, exactly the candidates the
    serial run tries (space.candidates: the shipped config first, then the space spread out;
    --quick keeps QUICK_CANDIDATES), each once. The Ray path used to take every 4th config of
    the space instead, which with --quick had none with SPLIT_SCORE 1 and left the shipped
    config of the 64-row decode untried."""
    import types

    from mlactl.model.config import from_name
    from mlactl.tune import space, sweep, units

    cfg = from_name("deepseek-v3")
    tried = {}

    def fake_bucket(ctx, spec, shape, bucket, cost, smem, configs):
        tried[ctx.part] = configs

    monkeypatch.setattr(sweep, "_tune_bucket", fake_bucket)
    monkeypatch.setattr(sweep, "_smem_limit", lambda device, hw: space.HOPPER_SMEM)
    parts = 3
    (first, *_), spec = units.kernel_units(cfg, ["mla_decode"], quick, "cuda", parts), space.KERNELS["mla_decode"]
    for part in range(parts):
        ctx = types.SimpleNamespace(cfg=cfg, kv_dtype="bf16", dtype="bf16", device=None, hw=None, backend="triton",
                                    quick=quick, skipped=[], store=units.UnitStore({}), part=part)  # fmt: skip
        units.measure_unit(ctx, units.Unit("kernels", first.kernel, first.bucket, first.shape_json, part, parts))
    serial = space.candidates(spec, cfg, first.shape, "bf16", "bf16", space.HOPPER_SMEM, quick)
    keys = [json.dumps(c, sort_keys=True) for p in range(parts) for c in tried[p]]
    assert sorted(keys) == sorted(json.dumps(c, sort_keys=True) for c in serial) and len(set(keys)) == len(keys)
    assert tried[0][0] == serial[0] == space.shipped_configs(spec, cfg, first.shape, "bf16", "bf16", set(serial[1]))[0]
    if quick:
        assert len(keys) == space.QUICK_CANDIDATES
        assert {c["SPLIT_SCORE"] for c in serial} == {0, 1}  # [::4] of the space kept only 0s
