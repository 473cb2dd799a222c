"""No traceback on any input, no lost measurement, no write outside where the user asked.

One test per case. Special output targets are made in tmp dirs (os.mknod, os.mkfifo): the real
/dev/null or /dev/stdout are never touched. Every expected figure is written out by hand.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.kernels.configs import device_slug
from mlactl.model import hardware
from mlactl.results import measured
from mlactl.results import store as results
from mlactl.tune import store as store_mod
from mlactl.util import dirs, io
from mlactl.util.errors import MlactlError, MlactlWarning

runner = CliRunner()
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="os.mknod of a character device needs root")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLACTL_MAX_MEMORY", raising=False)
    return tmp_path / "home"


def one_error(result, *needles):
    """Exit 2, exactly one non-empty output line, `Error: ...`, containing each needle."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def cli(*args, **env):
    return runner.invoke(app, [str(a) for a in args], env=env or None)


# -- -o: where and how output is written -----------------------------------------------------------


@needs_root
def test_output_to_a_character_device_stays_a_device(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    result = cli("analyze", "--format", "json", "-o", null)
    assert result.exit_code == 0, result.output
    assert stat.S_ISCHR(os.stat(null).st_mode) and os.stat(null).st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left beside it


def test_output_to_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    result = cli("analyze", "--new", "1", "--prefix", "0", "--format", "json", "-o", fifo)
    reader.join(30)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["rows"][0]["new"] == 1


def test_output_through_a_symlink_replaces_its_target(tmp_path):
    target = tmp_path / "data" / "out.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = cli("analyze", "--new", "1", "--prefix", "0", "-o", link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["rows"][0]["prefix"] == 0


def test_output_keeps_an_existing_files_mode(tmp_path):
    out = tmp_path / "private.csv"
    out.write_text("old")
    out.chmod(0o600)
    result = cli("analyze", "--new", "1", "--prefix", "0", "-o", out)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert out.read_text().startswith("batch,new,prefix")


def test_output_to_a_directory_says_so(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    line = one_error(cli("analyze", "-f", "json", "-o", folder), f"cannot write {folder}: it is a directory")
    assert ".tmp" not in line
    assert list(folder.iterdir()) == []


def test_output_with_an_unknown_extension_is_refused(tmp_path):
    out = tmp_path / "out.xml"
    one_error(cli("analyze", "-o", out), "cannot tell the format from '.xml'", "--format")
    assert not out.exists()
    assert cli("analyze", "-o", out, "--format", "csv").exit_code == 0  # named, it is fine


@needs_root
def test_disk_full_on_a_device_names_the_file(tmp_path):
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full: every write is ENOSPC
    one_error(cli("analyze", "-f", "json", "-o", full), f"cannot write {full}: No space left on device")


def test_disk_full_on_a_file_names_it_and_keeps_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "grid.json"
    out.write_text("earlier")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io.os, "fsync", full)
    one_error(cli("analyze", "-f", "json", "-o", out), f"cannot write {out}: No space left on device")
    assert out.read_text() == "earlier"
    assert [p.name for p in tmp_path.iterdir() if p.name != "home"] == ["grid.json"]  # no temp file left


def test_plot_output_through_a_symlink(tmp_path):
    target = tmp_path / "chart.svg"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "latest.svg"
    link.symlink_to(target)
    result = cli("plot", "roofline", "-o", link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and target.read_text().lstrip().startswith("<?xml")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640


# -- the results store: nothing measured is lost ----------------------------------------------------


def header(**extra) -> dict:
    return {
        "schema": "mlactl.results",
        "schema_version": 1,
        "device": {"name": "cpu"},
        "backend": "torch",
        "timing": {"method": "wall-clock"},
        "model": {"name": "m", "H": 4, "r": 32, "dC": 16, "dR": 16, "dV": 16},
        "kv_dtype": "fp32",
        "dtype": "fp32",
        "versions": {},
        **extra,
    }


def path_row(new: int, median: float = 1e-3, **extra) -> dict:
    return {"batch": 1, "new": new, "prefix": 0, "path": "absorb", "median_s": median, **extra}


def good_file(path: Path, rows: int = 48, **extra) -> Path:
    data = header(**extra)
    data["paths"] = [path_row(n) for n in range(1, rows + 1)]
    path.write_text(json.dumps(data))
    return path


def test_backups_never_overwrite_one_another(tmp_path, monkeypatch):
    out = good_file(tmp_path / "r.json", rows=3)
    monkeypatch.setattr(io.time, "strftime", lambda fmt, *a: "20261130-120000")  # one second
    taken = tmp_path / "r.20261130-120000.json"
    taken.write_text("a backup from before")
    first = store_mod.ResultsStore(out, header(), force=True)
    assert first.moved_aside == tmp_path / "r.20261130-120000.1.json"
    first.add("paths", path_row(7))
    second = store_mod.ResultsStore(out, header(), force=True)
    assert second.moved_aside == tmp_path / "r.20261130-120000.2.json"
    assert taken.read_text() == "a backup from before"
    assert len(json.loads(first.moved_aside.read_text())["paths"]) == 3
    assert [r["new"] for r in json.loads(second.moved_aside.read_text())["paths"]] == [7]


def _force(path: str) -> None:
    store = store_mod.ResultsStore(path, header(), force=True)
    store.add("paths", path_row(1000 + os.getpid() % 1000))


def test_concurrent_force_runs_lose_no_measurement(tmp_path):
    """Two `--force` runs at once on a file of 48 measurements."""
    out = good_file(tmp_path / "r.json", rows=48)
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        procs = [ctx.Process(target=_force, args=(str(out),)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    kept = set()
    for f in tmp_path.glob("r*.json"):
        kept |= {r["new"] for r in json.loads(f.read_text())["paths"]}
    assert set(range(1, 49)) <= kept
    assert not list(tmp_path.glob(".*lock"))


def test_force_waits_for_a_writer(tmp_path):
    out = good_file(tmp_path / "r.json", rows=2)
    holding, release = threading.Event(), threading.Event()

    def writer():
        with io.locked(out):
            holding.set()
            release.wait(30)

    t = threading.Thread(target=writer)
    t.start()
    holding.wait(30)
    done = []
    forced = threading.Thread(target=lambda: done.append(store_mod.ResultsStore(out, header(), force=True)))
    forced.start()
    time.sleep(0.3)
    assert not done and len(json.loads(out.read_text())["paths"]) == 2  # waiting, nothing moved
    release.set()
    forced.join(30)
    t.join(30)
    assert done and len(json.loads(done[0].moved_aside.read_text())["paths"]) == 2


def test_results_file_that_is_a_directory_is_refused(tmp_path):
    folder = tmp_path / "runs"
    (folder / "keep.json").parent.mkdir()
    (folder / "keep.json").write_text("{}")
    for force in (False, True):
        with pytest.raises(MlactlError, match="is a directory"):
            store_mod.ResultsStore(folder, header(), force=force)
    assert [p.name for p in tmp_path.iterdir() if p.name != "home"] == ["runs"]
    assert (folder / "keep.json").read_text() == "{}"


def test_no_lock_file_left_behind(tmp_path):
    store = store_mod.ResultsStore(tmp_path / "r.json", header())
    store.add("paths", path_row(1))
    with io.locked(tmp_path / "x.json"):
        assert (tmp_path / ".x.json.lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["r.json"]


def test_non_finite_times_are_stored_as_null(tmp_path):
    store = store_mod.ResultsStore(tmp_path / "r.json", header())
    store.add("kernels", {"kernel": "k", "bucket": "B=1", "default_median_s": float("inf"), "configs": []})
    text = (tmp_path / "r.json").read_text()
    assert "Infinity" not in text and json.loads(text)["kernels"][0]["default_median_s"] is None


# -- one schema, checked by every reader --------------------------------------------------------------


def breaks(**change):
    def apply(data):
        for key, value in change.items():
            data[key] = value
        return data

    return apply


BAD_FILES = {
    "paths-ints": (breaks(paths=[1, 2]), "paths[0] must be an object"),
    "model-string": (breaks(model="deepseek"), "model must be an object"),
    "crossover-strings": (breaks(crossovers=[{"batch": "1", "prefix": 0}]), "crossovers[0].batch must be an integer"),
    "crossover-batch-0": (
        breaks(crossovers=[{"batch": 0, "prefix": 0}]),
        "crossovers[0].batch must be an integer >= 1",
    ),
    "crossover-ints": (breaks(crossovers=[3]), "crossovers[0] must be an object"),
    "device-name-5": (breaks(device={"name": 5}), "device.name must be a string"),
    "timing-string": (breaks(timing="fast"), "timing must be an object"),
    "kernel-no-bucket": (breaks(kernels=[{"kernel": "mla_decode"}]), "kernels[0].bucket must be present"),
    "ceilings-list": (breaks(ceilings=[1]), "ceilings must be an object"),
    "median-null": (breaks(paths=[path_row(1, None)]), "paths[0].median_s must be a time"),
    "median-fast": (breaks(paths=[path_row(1, "fast")]), "paths[0].median_s must be a finite number"),
    "median-negative": (breaks(paths=[path_row(1, -1.0)]), "paths[0].median_s must be a finite number >= 0"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_results_file_is_one_line(tmp_path, name):
    fix, message = BAD_FILES[name]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(fix(header(crossovers=[{"batch": 1, "prefix": 0, "measured": 5}]))))
    with pytest.raises(MlactlError, match=None) as info:
        results.load(path)
    assert message in str(info.value) and str(path) in str(info.value)
    for args in (
        ["analyze", "--policy", "measured", "--results", path],
        ["plot", "tune", "--results", path, "-o", tmp_path / "t.png"],
    ):
        one_error(cli(*args), message)


def test_failed_measurement_needs_no_time(tmp_path):
    """status failed with a reason and no median is a valid entry (sweep.py writes those)."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(header(paths=[path_row(1, None, status="failed", reason="OOM")])))
    assert results.load(path)["paths"][0]["reason"] == "OOM"


def test_extra_timing_fields_are_kept(tmp_path):
    """Fields a newer mlactl adds (spreads, the worker's device) load and survive a resume."""
    path = tmp_path / "r.json"
    row = path_row(1, p10_s=9e-4, p90_s=1.1e-3, cv=0.05, worker={"device": "cuda:3"})
    path.write_text(json.dumps(header(paths=[row], workers=["a", "b"])))
    assert results.load(path)["paths"][0]["cv"] == 0.05
    store = store_mod.ResultsStore(path, header())
    store.add("paths", path_row(2))
    kept = results.load(path)
    assert kept["paths"][0]["worker"] == {"device": "cuda:3"} and kept["workers"] == ["a", "b"]


def measured_file(folder: Path, name: str, crossover: int, created: str) -> Path:
    data = header(
        model={"name": "deepseek-v3", "H": 128, "r": 512, "dC": 128, "dR": 64, "dV": 128},
        device={"name": "NVIDIA H200", "hardware": "h200"},
        kv_dtype="bf16",
        created=created,
        crossovers=[{"batch": 1, "prefix": 0, "measured": crossover}],
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))
    return folder / name


def test_bad_file_in_home_is_skipped_with_a_warning(home):
    folder = home / "results" / "NVIDIA_H200"
    measured_file(folder, "good.json", 150, "2026-01-01T00:00:00Z")
    bad = folder / "newer.json"
    bad.write_text(json.dumps(header(crossovers=[{"batch": "x", "prefix": 0}])))
    dims = {"H": 128, "r": 512, "dC": 128, "dR": 64, "dV": 128}
    with pytest.warns(MlactlWarning, match=f"skipped {bad}: crossovers"):
        crossovers, where = measured.find_crossovers("NVIDIA H200", dims, "bf16")
    assert crossovers == {0: 150} and where.name == "good.json"
    # mla_attention(path="auto") chooses with this policy object
    from mlactl.decide.policy import AutoPolicy
    from mlactl.model.config import from_name
    from mlactl.model.cost import CostModel

    with pytest.warns(MlactlWarning, match="newer.json"):
        policy = AutoPolicy(CostModel(from_name("deepseek-v3")), "NVIDIA H200")
    assert policy.kind == "measured"
    # and analyze --policy measured: a Warning line, then the answer
    result = cli("analyze", "--hardware", "h200", "--policy", "measured", "--new", "1", "--prefix", "0")
    assert result.exit_code == 0, result.output
    assert f"Warning: skipped {bad}" in result.output


def test_resume_measures_bad_entries_again(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(header(paths=[path_row(1), path_row(2, "fast")])))
    with pytest.warns(MlactlWarning, match=r"paths\[1\].median_s .* measured again"):
        store = store_mod.ResultsStore(path, header())
    assert store.resumed and store.find("paths", batch=1, new=1, prefix=0, path="absorb") is not None
    assert store.find("paths", batch=1, new=2, prefix=0, path="absorb") is None  # so the sweep measures it
    assert [r["new"] for r in results.load(path)["paths"]] == [1]


# -- names that become path components -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../../../tmp/x", "/tmp/x", "..", ".", "", "a/../../b", "~root"])
def test_names_stay_one_path_component(name, home):
    for path in (
        store_mod.default_path(device_slug(name), name, 1, "fp32", "fp32", "torch"),
        store_mod.default_path(name, "m", 1, "fp32", "fp32", "torch"),
    ):
        resolved = path.resolve()
        assert resolved.parent.parent == (home / "results").resolve(), path
        assert not resolved.name.startswith(".")
    assert "/" not in dirs.path_component(name) and dirs.path_component(name) not in ("", ".", "..")


def test_config_name_or_path_cannot_lead_tune_outside_home(tmp_path, home):
    from mlactl.model.config import from_hf_config

    config = {
        "_name_or_path": "../../../../tmp/escape",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
        "num_hidden_layers": 1,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = from_hf_config(tmp_path / "config.json")
    path = store_mod.default_path(device_slug("cpu"), cfg.name, 1, "fp32", "fp32", "torch")
    assert path == home / "results" / "cpu" / "tmp_escape-tp1-fp32-kvfp32-torch.json"


def test_measured_profile_name_stays_in_the_hardware_folder(tmp_path, monkeypatch):
    from mlactl.tune import ceilings

    evil = hardware.parse_profile(
        {"name": "../../evil", "peak_tflops": {"fp32": 1}, "bandwidth_tbs": 1, "memory_gb": 1, "match": ["Evil"]},
        "x",
    )
    monkeypatch.setattr(hardware, "detect", lambda name: evil)
    path = ceilings.write_measured_profile("Evil GPU", {"bandwidth_tbs": 0.5, "peak_tflops": {"fp32": 0.5}}, tmp_path)
    assert path == tmp_path / "evil.toml"


# -- sizes beyond int64, and memory ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needle",
    [
        (["analyze", "--new", str(10**20)], "--new: '100000000000000000000' is above the limit of 2,147,483,647"),
        (["analyze", "--prefix", "9223372036854775807"], "--prefix: '9223372036854775807' is above the limit"),
        (["analyze", "--prefix", "0:99999999999999999999:1K"], "is above the limit of 2,147,483,647"),
        (["analyze", "--batch", "2M:4M:*2", "--new", "2K"], None),  # 2^31 - 1 < 4M * ... : fine, each below
        (["crossover", "--max-new", "3G"], "--max-new: '3G' is not a whole number"),
        (["analyze", "--new", "-5"], "--new: -5 must be a positive integer"),
        (["analyze", "--new", "1" * 5000], "is above the limit"),
    ],
)
def test_sizes_beyond_the_limit(args, needle):
    result = cli(*args)
    if needle is None:
        assert result.exit_code == 0, result.output
        return
    one_error(result, needle)


def test_requests_count_beyond_the_limit(tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_text(f"new,prefix,count\n1,0,{10**20}\n")
    one_error(cli("batch", csv), "line 2: count: '100000000000000000000' is above the limit of 2,147,483,647")


def test_grid_memory_is_checked_before_it_is_built():
    # 100,000 points at 1,500 bytes is 143 MiB: over a 64 MiB budget
    one_error(
        cli("analyze", "--batch", "1:100000", "--new", "1", "--prefix", "0", MLACTL_MAX_MEMORY="64M"),
        "--batch: 100,000 values, more than the 44,739",
        "split",
    )
    # JSON costs 31,500 bytes a point: 10,000 points need 300 MiB, CSV would need 14 MiB
    args = ["analyze", "--batch", "1:10000", "--new", "1", "--prefix", "0"]
    one_error(cli(*args, "-f", "json", MLACTL_MAX_MEMORY="256M"), "10,000 points in json", "--format csv")
    assert cli(*args, "-f", "csv", MLACTL_MAX_MEMORY="256M").exit_code == 0


def test_requests_csv_rows_are_counted_as_they_stream(tmp_path, monkeypatch):
    from mlactl.decide import requests

    monkeypatch.setattr(requests, "CHECK_EVERY", 100)
    csv = tmp_path / "many.csv"
    csv.write_text("new,prefix\n" + "1,0\n" * 2000)
    # 2,000 requests at 800 bytes need 1.5 MiB, over a 1 MiB budget: refused at row 1,400
    one_error(cli("batch", csv, MLACTL_MAX_MEMORY="1M"), "1,400+ requests in table", "1.1 MiB", "split -l")


def test_plot_resolution_and_points_are_checked(tmp_path):
    out = tmp_path / "x.png"
    one_error(cli("plot", "roofline", "--dpi", "100000", "-o", out), "PNG is at most 65,535 a side")
    # 10 x 7.5 inches (the legend below the axes) at 2,000 dpi: 300 megapixels at 12 bytes, 3.4 GiB
    one_error(cli("plot", "roofline", "--dpi", "2000", "-o", out, MLACTL_MAX_MEMORY="1G"), "300-megapixel", "--dpi")
    # 200,000 points at 4,000 bytes: 763 MiB
    one_error(
        cli("plot", "crossover", "--new", "1:200000", "--prefix", "0", "-o", out, MLACTL_MAX_MEMORY="512M"),
        "a chart of 200,000 points",
    )
    assert not out.exists()


@needs_root
def test_model_from_an_endless_device(tmp_path):
    zero = tmp_path / "zero"
    os.mknod(zero, stat.S_IFCHR | 0o444, os.makedev(1, 5))  # /dev/zero's numbers
    # the one reader refuses anything but a regular file before reading a byte
    one_error(cli("analyze", "--model", zero), f"cannot read model config {zero}: it is a character device")
    one_error(cli("batch", zero), f"cannot read requests {zero}: it is a character device, not a regular file")


def test_deeply_nested_json(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    one_error(cli("analyze", "--model", deep), "nested too deeply")
    one_error(cli("analyze", "--policy", "measured", "--results", deep), "nested too deeply")


# -- TOML profiles ------------------------------------------------------------------------------------------

PROFILE = 'name = "x"\nmemory_gb = 80\nbandwidth_tbs = 2\n{extra}[peak_tflops]\nbf16 = {peak}\n'


@pytest.mark.parametrize(
    "extra, peak, needle",
    [
        ("sources = 5\n", "500", "sources must be a list of strings"),
        ('match = "H100"\n', "500", "match must be a list of strings"),
        ("", "inf", "peak_tflops.bf16 must be a positive number, got inf"),
        ("", "nan", "peak_tflops.bf16 must be a positive number, got nan"),
        ("", "1e308", "peak_tflops.bf16 must be a positive number, got 1e+308 (from 1e-06 to 1e+06)"),
        ("", "1e-320", "got 1e-320"),
        ("sm_count = 1.5\n", "500", "sm_count must be a whole number"),
        ("display = 3\n", "500", "display must be a non-empty string"),
    ],
)
def test_bad_profile_values(tmp_path, extra, peak, needle):
    path = tmp_path / "x.toml"
    path.write_text(PROFILE.format(extra=extra, peak=peak))
    one_error(cli("analyze", "--hardware", path), needle)


def test_json_output_is_strict_at_the_profile_limits(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nmemory_gb = 1e6\nbandwidth_tbs = 1e-6\n[peak_tflops]\nbf16 = 1e6\n')

    def no_constant(name):
        raise AssertionError(f"{name} in JSON output")

    for command in ("analyze", "crossover"):
        result = cli(command, "--hardware", path, "-f", "json")
        assert result.exit_code == 0, result.output
        json.loads(result.stdout, parse_constant=no_constant)


def test_bad_user_profile_does_not_break_other_commands(home):
    (home / "hardware").mkdir(parents=True)
    bad = home / "hardware" / "mine.toml"
    bad.write_text('name = "mine"\nsources = 5\n')
    result = cli("list")
    assert result.exit_code == 0, result.output
    assert f"Warning: skipped hardware profile: {bad}: missing required key" in result.output
    assert "h200" in result.output
    assert cli("analyze", "--hardware", "h200").exit_code == 0
    one_error(cli("analyze", "--hardware", "mine"), str(bad))  # asked for, it is an error


# -- requests CSV ------------------------------------------------------------------------------------------


def batch_json(path) -> dict:
    result = cli("batch", path, "-f", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_requests_csv_cells(tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text("new,prefix,count\n1,4096,2\n512,0,1\n")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))  # Excel's CSV UTF-8
    suffixed = tmp_path / "k.csv"
    suffixed.write_text("new,prefix,count\n1,4K,2\n512,0,1\n")
    want = batch_json(plain)
    assert batch_json(bom) == want and batch_json(suffixed) == want

    for body, needle in (
        ("new,prefix\n\u00b2,0\n", "line 2: new '²' is not a whole number"),
        ("new,prefix\n\u0663,0\n", "line 2: new '٣' is not a whole number"),
        ('new,prefix\n"1\n2",0\n', "line 2: a quoted cell spans lines"),
        ("new,prefix\n0,0\n", "line 2: new must be at least 1"),
    ):
        bad = tmp_path / "bad.csv"
        bad.write_text(body)
        one_error(cli("batch", bad), needle)


# -- the root command ---------------------------------------------------------------------------------------


def test_unknown_option_is_one_line():
    one_error(cli("analyze", "--bogus"), "No such option: --bogus", "analyze --help)")
    one_error(cli("nonsense"), "No such command 'nonsense'")
    one_error(cli("plot", "roofline", "--dpi"), "--dpi")


def test_broken_pipe_exits_quietly():
    mlactl = Path(sys.executable).with_name("mlactl")
    command = [str(mlactl)] if mlactl.exists() else [sys.executable, "-m", "mlactl.cli"]
    proc = subprocess.Popen(
        [*command, "analyze", "--new", "1:20000", "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.read(100)
    proc.stdout.close()  # like `| head -c 100`
    err = proc.stderr.read()
    proc.wait(60)
    assert err == b"" and proc.returncode != 2


def test_dpi_too_small_for_the_labels_is_one_error_line(tmp_path):
    # Found by the fuzz suite: --dpi 1 made FreeType fail on the 7-point labels (a RuntimeError).
    from typer.testing import CliRunner

    from mlactl.cli import app

    out = CliRunner().invoke(app, ["plot", "roofline", "--dpi", "1", "-o", str(tmp_path / "r.png")])
    assert out.exit_code == 2, out.output
    assert "--dpi 1 is too small: at least 20" in out.output
    assert not (tmp_path / "r.png").exists()


# == each boundary guarded once: calibrations, links, special files, outputs, names, numbers ==============


def _calibration(name="b-h200", hardware_name="h200", ceilings=None) -> dict:
    fits = [
        {"op": op, "source": "t", "dtype": "bf16", "terms": ["fixed"], "params": {"t_fixed_s": 1e-6, "eta_c": 0.5}}
        | {"n": 10}
        for op in ("kv_expand", "expand_attention", "lse_merge", "q_absorb", "absorb_attention", "out_absorb")
    ]
    for f in fits:
        f["params"]["eta_m"] = 0.8
    data = {"schema": "mlactl.calibration", "schema_version": 1, "name": name, "hardware": hardware_name, "fits": fits}
    if ceilings is not None:
        data["ceilings"] = ceilings
    return data


def test_a_link_in_the_calibrations_folder_is_not_followed(home, tmp_path):
    from mlactl.decide.calibration import store as cal_store

    folder = home / "calibrations"
    folder.mkdir(parents=True)
    outside = tmp_path / "outside.json"
    outside.write_text("precious")
    (folder / "b-h200.json").symlink_to(outside)
    with pytest.raises(MlactlError, match="symbolic link"):
        cal_store.save(_calibration())
    assert outside.read_text() == "precious"
    (folder / "b-h200.json").unlink()
    (folder / "sub").symlink_to(tmp_path)  # a folder link: the name leads nowhere else, only files
    path, kept = cal_store.save(_calibration())
    assert path == folder / "b-h200.json" and kept is None and not path.is_symlink()


def test_a_calibration_of_the_same_name_is_kept_aside(home, monkeypatch):
    from mlactl.decide.calibration import store as cal_store

    monkeypatch.setattr(io.time, "strftime", lambda fmt, *a: "20261201-120000")
    first, kept = cal_store.save(_calibration())
    assert kept is None
    second_data = _calibration()
    second_data["fits"][0]["params"]["t_fixed_s"] = 2e-6
    second, kept = cal_store.save(second_data)
    assert second == first and kept == first.with_name("b-h200.20261201-120000.json")
    assert json.loads(kept.read_text())["fits"][0]["params"]["t_fixed_s"] == 1e-6  # the first, kept
    assert json.loads(second.read_text())["fits"][0]["params"]["t_fixed_s"] == 2e-6
    third, kept = cal_store.save(_calibration())
    assert kept == first.with_name("b-h200.20261201-120000.1.json")  # never over the earlier backup
    assert sorted(p.name for p in first.parent.iterdir()) == [
        "b-h200.20261201-120000.1.json",
        "b-h200.20261201-120000.json",
        "b-h200.json",
    ]  # no lock or temporary file left


def _save_one(home: str, t_fixed: float, queue) -> None:
    os.environ["MLACTL_HOME"] = home
    from mlactl.decide.calibration import store as cal_store

    data = _calibration()
    data["fits"][0]["params"]["t_fixed_s"] = t_fixed
    path, kept = cal_store.save(data)
    queue.put(("replaced" if kept else "written", t_fixed))


def test_concurrent_calibrations_never_both_say_written(home):
    """Two runs of the same name at once must not both say "written" while one is lost."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_save_one, args=(str(home), t, queue)) for t in (1e-6, 2e-6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    said = sorted(queue.get(timeout=5) for _ in procs)
    assert [s for s, _ in said].count("written") == 1 and [s for s, _ in said].count("replaced") == 1
    files = sorted((home / "calibrations").glob("*.json"))
    kept = {json.loads(f.read_text())["fits"][0]["params"]["t_fixed_s"] for f in files}
    assert len(files) == 2 and kept == {1e-6, 2e-6}  # both fits on disk: nothing lost


def test_calibrate_says_replaced_and_where_the_earlier_one_is(home, tmp_path):
    csv = tmp_path / "c.csv"
    rows = [f"absorb_attention,{b},1,{p},{1e-5 + b * p * 1e-12},128" for b in (1, 8, 64) for p in (1024, 8192, 65536)]
    csv.write_text("op,batch,new,prefix,time_s,heads\n" + "\n".join(rows) + "\n")
    args = ["calibrate", "--from", "csv", csv, "--hardware", "h200", "--name", "same"]
    first = cli(*args)
    assert first.exit_code == 0, first.output
    said = [line.split(":")[0] for line in first.stdout.splitlines()]
    assert "written" in said and "replaced" not in said
    second = cli(*args, "-f", "json")
    assert second.exit_code == 0, second.output
    replaced = json.loads(second.stdout)["calibration"]["replaced"]
    assert replaced and Path(replaced).exists() and Path(replaced).parent == home / "calibrations"


def test_a_calibration_fitted_against_other_ceilings_is_refused(home):
    """A calibration records the ceilings its efficiencies divide: a profile edited since (2.4
    TB/s where the fit saw 4.8) would silently halve every memory-bound time."""
    from mlactl.decide.calibration import store as cal_store

    ceilings = {"peak_flops": 989e12, "bandwidth_bytes_per_s": 4.8e12, "sm_count": 132, "dtype": "bf16"}
    cal_store.save(_calibration(ceilings=ceilings))
    ok = cli("analyze", "--calibration", "b-h200", "-f", "json")
    assert ok.exit_code == 0, ok.output
    (home / "hardware").mkdir(parents=True)
    (home / "hardware" / "h200.toml").write_text(
        'name = "h200"\nmemory_gb = 141\nbandwidth_tbs = 2.4\n[peak_tflops]\nbf16 = 989\n'
    )
    one_error(cli("analyze", "--calibration", "b-h200"), "fitted against 4.8 TB/s (the profile now says 2.4)")


def test_the_calibration_brings_its_hardware(home):
    from mlactl.decide.calibration import store as cal_store

    cal_store.save(_calibration())  # fitted on h200; the default --hardware is h800
    out = cli("analyze", "--calibration", "b-h200", "-f", "json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["hardware"]["name"] == "h200"
    table = cli("analyze", "--calibration", "b-h200", "--new", "1", "--prefix", "0")
    assert "hardware h200: the profile calibration b-h200 was fitted on" in table.stdout
    one_error(cli("analyze", "--calibration", "b-h200", "--hardware", "h800"), "made for hardware 'h200', not 'h800'")


@pytest.mark.parametrize(
    "params, message",
    [
        pytest.param({"eta_c": 1e-300}, "params.eta_c must be a finite number >= 0.0001", id="eta-1e-300"),
        pytest.param({"eta_m": 1.3}, "params.eta_m must be a finite number >= 0.0001 and <= 1.2", id="eta-1.3"),
        pytest.param({"t_fixed_s": 1e308}, "params.t_fixed_s must be a finite number >= 0 and <= 1", id="1e308-s"),
        pytest.param({"eta_c": [0.5]}, "params.eta_c must be a finite number", id="list-for-number"),
    ],
)
def test_calibration_fields_have_physical_ranges(home, tmp_path, params, message):
    bad = _calibration()
    bad["fits"][1]["params"].update(params)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    one_error(cli("analyze", "--calibration", path), f"fits[1].{message}")


@pytest.mark.parametrize(
    "field, value, message",
    [
        pytest.param("ceilings", [1, 2], "ceilings must be an object", id="list-for-object"),
        pytest.param("source", "x", "source must be an object", id="string-for-object"),
        pytest.param("fits", {"op": "x"}, "'fits' must be a non-empty list", id="object-for-list"),
        pytest.param("name", "", "name must be a non-empty string", id="empty-name"),
    ],
)
def test_calibration_schema_checks_every_field(home, tmp_path, field, value, message):
    bad = dict(_calibration(), **{field: value})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    one_error(cli("analyze", "--calibration", path), message)


def test_an_fp8_fit_may_reach_twice_the_bf16_ceiling():
    from mlactl.decide.calibration import store as cal_store

    assert cal_store.eta_limit("bf16") == 1.2 and cal_store.eta_limit("fp8_block") == 2.4
    assert cal_store.eta_limit("nvfp4") == 4.8
    data = _calibration()
    data["fits"][0].update(dtype="fp8", params={"t_fixed_s": 1e-6, "eta_c": 2.0, "eta_m": 0.9})
    cal_store.validate(data, "fp8")  # fine for fp8; the same on bf16 is refused
    data["fits"][0]["dtype"] = "bf16"
    with pytest.raises(MlactlError, match="<= 1.2"):
        cal_store.validate(data, "bf16")


@needs_root
def test_a_device_or_directory_as_calibration_says_what_it_is(tmp_path):
    one_error(cli("analyze", "--calibration", f"{tmp_path}/"), "it is a directory, not a regular file")
    null = tmp_path / "null.json"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    one_error(cli("analyze", "--calibration", null), "it is a character device, not a regular file")


def test_a_fifo_as_any_input_is_refused_at_once(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    for args in (["analyze", "--model", fifo], ["analyze", "--hardware", fifo], ["batch", fifo], ["engines", fifo]):
        one_error(cli(*args), "it is a FIFO (named pipe), not a regular file")


def test_a_fifo_in_the_hardware_folder_is_skipped(home):
    (home / "hardware").mkdir(parents=True)
    os.mkfifo(home / "hardware" / "x.toml")
    out = cli("list")
    assert out.exit_code == 0
    assert (
        f"Warning: skipped {home / 'hardware' / 'x.toml'}: it is a FIFO (named pipe), not a regular file" in out.output
    )


@pytest.mark.parametrize(
    "args, source",
    [
        pytest.param(
            ["analyze", "--policy", "measured", "--results", "r.json", "-o", "./r.json"], "r.json", id="analyze"
        ),
        pytest.param(["batch", "r.csv", "-o", "r.csv"], "r.csv", id="batch"),
        pytest.param(["engines", "r.csv", "-f", "csv", "-o", "r.csv"], "r.csv", id="engines"),
        pytest.param(
            ["plot", "roofline", "--results", "r.json", "--data", "r.json", "-o", "x.png"], "r.json", id="plot"
        ),
    ],
)
def test_an_output_that_is_an_input_is_refused(tmp_path, monkeypatch, args, source):
    monkeypatch.chdir(tmp_path)
    v3 = {"name": "deepseek-v3", "hidden": 7168, "H": 128, "q_lora_rank": 1536, "r": 512, "dC": 128, "dR": 64}
    measured = header(model=v3 | {"dV": 128, "layers": 61, "tp": 1}, kv_dtype="bf16", dtype="bf16")
    measured["crossovers"] = [{"batch": 1, "prefix": 4096, "measured": 180}]
    (tmp_path / "r.json").write_text(json.dumps(measured))
    (tmp_path / "r.csv").write_text("new,prefix\n1,4096\n")
    before = (tmp_path / source).read_bytes()
    one_error(cli(*args), "it is an input of this command")
    assert (tmp_path / source).read_bytes() == before
    assert not (tmp_path / "x.png").exists()  # refused before drawing


def test_a_255_byte_output_name_is_written(tmp_path):
    name = "é" * 125 + "a.txt"  # 250 + 5 bytes of UTF-8: the longest name ext4 allows
    assert len(name.encode()) == 255
    out = cli("analyze", "--new", "1", "--prefix", "0", "-o", tmp_path / name)
    assert out.exit_code == 0, out.output
    assert os.listdir(tmp_path) == [name]
    with io.locked(tmp_path / name):  # its lock file's name fits too
        pass


def test_names_with_markup_and_escapes_print_as_text(tmp_path):
    config = {
        "_name_or_path": "[/] [link=http://x]y[/link] $a^2$ :fire: \x1b[31mred",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "kv_lora_rank": 256,
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "num_hidden_layers": 4,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = cli("analyze", "--model", path, "--new", "1", "--prefix", "0", "-o", tmp_path / "report.txt")
    assert out.exit_code == 0, out.output
    report = (tmp_path / "report.txt").read_text()
    assert "[/] [link=http://x]y[/link] $a^2$ :fire: \\x1b[31mred at TP 1, 1 layer" in report and "\x1b" not in report
    chart = cli("plot", "crossover", "--model", path, "--new", "1:64:*4", "-o", tmp_path / "x.svg")
    assert chart.exit_code == 0, chart.output
    assert "$a^2$" in (tmp_path / "x.svg").read_text()  # drawn as written, not as mathtext


def test_numbers_from_the_environment_are_ascii(monkeypatch):
    from mlactl.util import limits

    for bad in ("٣G", "infG", "nan", "1e999"):
        monkeypatch.setenv("MLACTL_MAX_MEMORY", bad)
        with pytest.raises(MlactlError, match="MLACTL_MAX_MEMORY"):
            limits.memory_budget()


# -- unbounded work: the crossover search is bounded in memory and evaluations --------------------------------


def _plain_search(times, prefixes, batch, path, max_new):
    """The definition, by brute force: the first n in 1..max_new where `path` is faster."""
    import numpy as np

    n = np.arange(1, max_new + 1, dtype=np.float64)
    out = []
    for p in prefixes:
        t = times(batch, n, np.full_like(n, p), (path, "absorb"))
        wins = np.flatnonzero(t[path].time_s < t["absorb"].time_s)
        out.append(int(wins[0]) + 1 if len(wins) else None)
    return out


@pytest.mark.parametrize("calibrated", [False, True], ids=["roofline", "calibrated"])
@pytest.mark.parametrize("path", ["expand", "expand_chunked"])
def test_the_bounded_crossover_search_finds_what_a_plain_scan_finds(calibrated, path):
    """Beyond 1024 new tokens the search rules out whole intervals by a bound; it must land on
    the same first win as evaluating every count (a second, plain implementation)."""
    from mlactl.decide.calibration import store as cal_store
    from mlactl.decide.calibration.time import path_times
    from mlactl.model import config, roofline
    from mlactl.model.cost import CostModel

    hw = hardware.from_name("h200")
    cal = None
    if calibrated:  # slow expansion, several terms: crossovers far out, past the exhaustive range
        data = _calibration()
        for f in data["fits"]:
            f["terms"] = ["fixed", "pad", "waves", "serial", "kvpad"]
            f["params"] = {"t_fixed_s": 4e-6, "eta_c": 0.05 if f["op"] == "kv_expand" else 0.6}
            f["params"] |= {"eta_m": 0.7, "t_iter_s": 2e-7}
        cal = cal_store.validate(data, "test")
    for name, tp in (("deepseek-v3", 1), ("kimi-k2", 8)):
        cost = CostModel(config.from_name(name).with_tp(tp))

        def times(b, n, p, paths, cost=cost):
            return path_times(cost, hw, cal, b, n, p, paths=paths)

        prefixes = [0, 300, 4096, 50_000, 250_000]
        for batch in (1, 16):
            got = roofline.crossover_by_time(cost, hw, prefixes, batch=batch, path=path, max_new=40_000, times=times)
            assert got == _plain_search(times, prefixes, batch, path, 40_000), (name, batch)


def test_the_crossover_search_is_bounded_whatever_max_new():
    """A model where expand never wins, searched to 16M (and to 2^31 - 1) new tokens, must not
    grow past 8 GB (it did). Counted, not timed: the points evaluated stay in the thousands,
    and no single evaluation is larger than a block."""
    from mlactl.model import roofline
    from mlactl.model.config import MLAConfig
    from mlactl.model.cost import CostModel

    never = MLAConfig("never", 7168, 128, 1536, 32, 128, 64, 128, 1)  # r = 32: absorb wins every pair
    cost = CostModel(never)
    hw = hardware.from_name("h800")
    sizes = []

    def times(batch, n, p, paths):
        import numpy as np

        sizes.append(int(np.broadcast(np.asarray(n), np.asarray(p)).size))
        return roofline.path_times(cost, hw, paths, batch, n, p)

    prefixes = [0, 1024, 4096, 8192, 16384, 32768, 65536, 131072]
    for max_new in (1 << 24, (1 << 31) - 1):
        sizes.clear()
        assert roofline.crossover_by_time(cost, hw, prefixes, max_new=max_new, times=times) == [None] * 8
        assert max(sizes) <= roofline.BLOCK and sum(sizes) < 20_000, (max_new, sum(sizes))


# -- no path fits, and no output replaces a measurement ----------------------------------------------


def test_best_when_no_path_fits_is_marked_so():
    """64 requests after a 10M-token prefix: the latent cache alone is 773 GB a layer
    (64 x 10,485,761 tokens x (512 + 64) x 2 bytes = 7.73e11), past an H800's 80 GB, so no path
    fits. `best` was `expand` (35.9 s: the first of the paths, all +inf); it is now the fastest that
    runs, absorb (0.23 s), marked as not fitting in the JSON and the table."""
    result = cli("analyze", "--new", "1", "--prefix", "0,10M", "--batch", "64", "--hardware", "h800", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    fits, huge = rows
    assert huge["prefix"] == 10 * 1024 * 1024
    assert not any(p["fits_memory"] for p in huge["paths"].values())
    assert huge["best"] == "absorb" and huge["best_fits_memory"] is False
    assert huge["paths"]["absorb"]["time_s"] < huge["paths"]["expand"]["time_s"] / 100
    assert "best_fits_memory" not in fits  # only where nothing fits
    table = cli("analyze", "--new", "1", "--prefix", "10M", "--batch", "64", "--hardware", "h800")
    assert "absorb ✗" in table.stdout.split("┃ best")[1]


def _calibration_csv(path: Path) -> Path:
    """Absorb attention timed as 2 µs + its latent bytes at 4.8 TB/s (a fit that converges)."""
    rows = ["op,batch,new,prefix,time_s"]
    for b in (1, 2, 4, 8, 16, 32):
        for p in (0, 1024, 4096, 16384, 65536):
            rows.append(f"absorb_attention,{b},1,{p},{2e-6 + b * (p + 1) * 1152 / 4.8e12:.6g}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_calibrate_never_replaces_a_tune_results_file(tmp_path):
    """`calibrate --dir res --name run` used to move `res/run.json`, the results `mlactl tune`
    wrote, aside and take its place; `-o` over it replaced it. Both are refused, byte for byte."""
    res = tmp_path / "res"
    res.mkdir()
    measured_file = res / "run.json"
    measured_file.write_text('{"schema": "mlactl.results", "schema_version": 1, "kernels": []}\n')
    before = measured_file.read_bytes()
    q = _calibration_csv(tmp_path / "q.csv")
    one_error(cli("calibrate", "--from", "csv", q, "--hardware", "h200", "--dir", res, "--name", "run"),
              "run.json", "results file", "a measurement mlactl reads back")  # fmt: skip
    one_error(cli("analyze", "--new", "1", "--prefix", "0", "-o", measured_file), "results file")
    assert measured_file.read_bytes() == before and sorted(os.listdir(res)) == ["run.json"]


@pytest.mark.parametrize(
    "content, kind",
    [
        ('{\n "schema": "mlactl.calibration", "name": "x"}', "calibration"),
        ('{"configs": {}, "triton_version": "3.1"}', "tuned-config"),
        ('name = "h200"\n\n[measured]\nbandwidth_tbs = 4.1\n', "measured ceilings"),
    ],
    ids=["calibration", "tuned-configs", "measured-profile"],
)
def test_no_output_replaces_a_measurement(tmp_path, content, kind):
    target = tmp_path / "m.json"
    target.write_text(content)
    one_error(cli("analyze", "--new", "1", "--prefix", "0", "-o", target, "-f", "json"), kind)
    assert target.read_text() == content
    assert io.measurement(tmp_path / "missing") is None


# -- the environment: an unusable home, the C locale, SIGTERM, inputs at their extremes --------------

C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}


def _mlactl(*args, env=None, **kw):
    full = dict(os.environ, **(env or {}))
    full = {k: v for k, v in full.items() if v != ""}
    return subprocess.run([sys.executable, "-m", "mlactl", *map(str, args)], capture_output=True, env=full, **kw)


def test_mlactl_home_that_is_a_file_is_one_line(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder")
    one_error(cli("calibrate", "--from", "csv", _calibration_csv(tmp_path / "q.csv"), "--hardware", "h200",
                  MLACTL_HOME=str(home)), "is not a folder")  # fmt: skip
    assert home.read_text() == "not a folder"


def test_home_that_cannot_be_resolved_is_one_line(monkeypatch):
    """No $MLACTL_HOME, no $XDG_DATA_HOME, and `~` that expands to itself (no $HOME and no
    passwd entry): the store would have been a folder named `~` in the working directory."""
    monkeypatch.delenv("MLACTL_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setattr(dirs.os.path, "expanduser", lambda p: p)
    with pytest.raises(MlactlError, match="cannot find your home directory.*set \\$MLACTL_HOME"):
        dirs.home()


def test_a_read_only_home_is_one_line(tmp_path, monkeypatch):
    """(As root a mode of 555 does not stop a write: the refusal is made by the system call.)"""

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(io.tempfile, "mkstemp", refused)
    one_error(cli("calibrate", "--from", "csv", _calibration_csv(tmp_path / "q.csv"), "--hardware", "h200"),
              "cannot write", "h200-csv-q.json: Permission denied")  # fmt: skip


def test_c_locale_terminal_and_files_work(tmp_path):
    """LC_ALL=C with Python's UTF-8 mode off: stdout is ASCII. The table is written with `us` for
    `µs` and `x` for `✗`; a file mlactl writes is UTF-8 whatever the locale."""
    out = _mlactl("analyze", "--new", "1", "--prefix", "0,10M", "--batch", "64", env=C_LOCALE, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode("ascii")
    assert "absorb x" in text and "us M" in text
    target = tmp_path / "o.txt"
    assert _mlactl("analyze", "--new", "1", "--prefix", "0", "-o", target, env=C_LOCALE, timeout=120).returncode == 0
    assert "µs" in target.read_text(encoding="utf-8")


SIGTERM_WRITER = """
import os, signal, sys
from mlactl.cli.errors import exit_on_sigterm
from mlactl.util import io
exit_on_sigterm()
with io.locked(sys.argv[1]), io.atomic_open(sys.argv[1], "w") as fh:
    fh.write("half of a new calibration")
    fh.flush()
    os.kill(os.getpid(), signal.SIGTERM)
    fh.write(" and the rest")
"""


def test_sigterm_while_a_file_is_written_leaves_the_old_one_and_nothing_else(tmp_path):
    target = tmp_path / "cal.json"
    target.write_text('{"schema": "old"}\n')
    out = subprocess.run([sys.executable, "-c", SIGTERM_WRITER, str(target)], capture_output=True, timeout=120)
    assert out.returncode == 143
    assert out.stderr.decode().strip() == "Error: terminated (SIGTERM); any file being written keeps its old content"
    assert target.read_text() == '{"schema": "old"}\n'
    assert sorted(os.listdir(tmp_path)) == ["cal.json"]  # no temporary file, no lock file


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        found |= {int(c) for c in task.read_text().split()}
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_sigterm_ends_replay_and_its_workers(tmp_path):
    trace = tmp_path / "t.jsonl"
    line = '{{"timestamp": {t}, "input_length": 3000, "output_length": 40, "hash_ids": [{t}]}}\n'
    trace.write_text("".join(line.format(t=100 * i) for i in range(60_000)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlactl", "replay", str(trace), "--jobs", "2", "-o", str(tmp_path / "r.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    workers: set[int] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(workers) < 2 and proc.poll() is None:
        workers = _children(proc.pid)
        time.sleep(0.05)
    if len(workers) < 2:
        proc.kill()
        pytest.skip("the replay ended before its workers were seen")
    proc.terminate()
    assert proc.wait(timeout=60) == 143
    time.sleep(0.5)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text()]
    assert alive == []
    assert not (tmp_path / "r.json").exists()


REPLAY_TRACE = (
    '{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1, 2]}\n'
    '{"timestamp": 5, "input_length": 3000, "output_length": 4, "hash_ids": [1, 2]}\n'
)


@pytest.mark.parametrize("option", ["--tp", "--max-batch-tokens", "--cache-tokens", "--max-running"])
@pytest.mark.parametrize("value", ["0", "1", str(2**63), "1e30", "٣"])
def test_replay_options_at_their_extremes(tmp_path, option, value):
    """0 and past int64 are one line naming the option; 1 runs (or, --tp 1 and --cache-tokens 1,
    says in one line why it cannot: the weights or a request do not fit)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(REPLAY_TRACE)
    result = cli("replay", trace, "--engines", "vllm", option, value, "-f", "json", "-o", tmp_path / "r.json")
    if value == "1" and option in ("--max-batch-tokens", "--max-running"):
        assert result.exit_code == 0, result.output
        return
    line = one_error(result)
    assert option in line or "fit" in line


def test_a_cache_no_gpu_holds_is_warned_about(tmp_path):
    """2^31 - 1 tokens x 70,272 bytes (DeepSeek-V3's 1,152 a layer x 61 layers) = 150,908 GB,
    past an H200's 141 GB."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(REPLAY_TRACE)
    result = cli("replay", trace, "--engines", "vllm", "--cache-tokens", str(2**31 - 1), "-f", "json")
    assert result.exit_code == 0
    assert "Warning: --cache-tokens 2,147,483,647: a KV cache of 150,908 GB" in result.stderr
    assert "Warning" not in cli("replay", trace, "--engines", "vllm", "--cache-tokens", "100000").stderr


def test_a_csv_where_json_is_read_is_named_as_such(tmp_path):
    """`calibrate score m.csv` (without --from csv) said 'line 1: not valid JSON ... the file is
    corrupt or was cut short'."""
    measurements = tmp_path / "m.csv"
    measurements.write_text("op,batch,new,prefix,time_s\nq_absorb,1,1,0,1e-5\n")
    one_error(cli("analyze", "--policy", "measured", "--results", measurements),
              "m.csv is a CSV (op,batch,new,prefix,time_s), but JSON (results", "--from csv")  # fmt: skip


@pytest.mark.parametrize(
    "option, why",
    [("--hardware", "known: a100-sxm"), ("--engines", "choose from sglang"), ("--kv-dtype", "must be one of bf16"),
     ("--new", "is not a whole number"), ("--engine-option", "takes [ENGINE.]KEY=VALUE")],
)  # fmt: skip
def test_an_error_quotes_a_short_escaped_excerpt_and_says_why(option, why):
    """A 100 KB value with escapes in it: the error line quoted all of it up to 2,000 characters,
    and the reason (after the value) was cut off."""
    value = ("\x1b[31m" + "a" * 1000) * 100
    line = one_error(cli("analyze", option, value), why)
    assert len(line) < 600 and "\x1b" not in line
