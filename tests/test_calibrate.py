"""`mlactl calibrate`: its help offers what it has (and its old --version points to the new
name), a missing option is named alone, and its table of fits (mlactl/output/calibrate_tables.py)
fits 100 columns without folding a name, piped with every column; `calibrate list` says what
each stored calibration is, and why one cannot be used; `calibrate show` prints one as it was
fitted."""

import csv
import json

import pytest
from conftest import error_line, plain, render, run, runner

from mlactl.cli import app


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


def test_a_csv_of_sglangs_fp8_gemm_selects_as_the_aiconfigurator_path_and_extrapolates(tmp_path, home):
    # SGLang's per-tensor fp8 GEMM (sglang_sgl_kernel_fp8_scaled_mm, aiconfigurator-core's H200
    # table) written as a CSV: `calibrate --from csv` selects its terms by the blocked split too
    # (fit m <= 1024, predict above), and keeps what the aiconfigurator path keeps on the same rows
    pytest.importorskip("aiconfigurator_core")
    pytest.importorskip("pyarrow")
    from mlactl.decide.calibration import aiconfigurator as ac
    from mlactl.decide.calibration.run import SYSTEM_PROFILES, machine_for
    from mlactl.decide.calibration.selection import select
    from mlactl.model import hardware

    table = next(t for t in ac.find_tables(ac.default_data_dir(), "h200_sxm", "sglang") if t.name.startswith("gemm"))
    key, pts = next((k, v) for k, v in ac.table_points(table).items() if k[1] == "sglang_sgl_kernel_fp8_scaled_mm")
    path = tmp_path / "fp8-gemm.csv"
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["op", "batch", "new", "prefix", "time_s", "heads", "source", "dtype"])
        for m, heads, t in zip(pts.context, pts.heads, pts.time_s, strict=True):
            out.writerow(["kv_expand", 1, int(m), 0, repr(float(t)), int(heads), key[1], "fp8"])
    result = runner.invoke(app, ["calibrate", "--from", "csv", str(path), "--hardware", "h200", "-f", "json"])
    assert result.exit_code == 0, result.output
    (got,) = json.loads(result.stdout)["fits"]
    assert got["blocked"]["axis"] == "rows" and got["blocked"]["at"] == 1024
    assert got["blocked"]["median"] <= 0.15 and got["blocked"]["p90"] <= 0.35
    assert got["held_out"]["median"] <= 0.10 and got["held_out"]["p90"] <= 0.25
    best, _ = select(*key, pts, machine_for(hardware.from_name(SYSTEM_PROFILES["h200_sxm"])))
    assert got["terms"] == list(best.terms)


def _stored(home, name, hardware_name, source=None):
    """A calibration `name` for `hardware_name` saved in `home`, fitted (it says) on `source`."""
    from mlactl.decide.calibration import store as cal_store

    fit = {"op": "q_absorb", "source": "t", "dtype": "bf16", "terms": ["fixed"]}
    data = {"schema": "mlactl.calibration", "schema_version": 1, "name": name, "hardware": hardware_name}
    data |= {
        "created": "2026-12-01T10:00:00Z",
        "fits": [fit | {"params": {"t_fixed_s": 5e-6, "eta_c": 0.6, "eta_m": 0.8}}],
    }
    return cal_store.save(data | ({"source": source} if source else {}), home / "calibrations")


def test_calibrate_list_says_what_each_calibration_is_and_why_one_cannot_be_used(home):
    tables = {"kind": "aiconfigurator", "system": "h200_sxm", "framework": "sglang", "version": "0.5.14"}
    _stored(home, "h200-sgl", "h200", tables | {"files": ["/x/mla_perf.parquet"]})
    _stored(home, "mine", "h100-sxm", {"kind": "csv", "files": ["/data/my-h100.csv"], "model": "deepseek-v3"})
    _, kept = _stored(home, "mine", "h100-sxm", {"kind": "results", "files": ["a.json", "b.json", "c.json"]})
    run("calibrate", "transfer", "h200-sgl", "--hardware", "b300")
    (home / "calibrations" / "broken.json").write_text("{}")

    out = plain(run("calibrate", "list").stdout)
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]] for line in out.splitlines()
            if line.startswith("│")}  # fmt: skip
    assert rows["h200-sgl"][:3] == ["h200", "aiconfigurator h200_sxm sglang 0.5.14", "1"]
    assert rows["b300-from-h200-sgl"][0] == "b300"  # its made-from cell folds (below, from the JSON)
    assert rows["mine"][:2] == ["h100-sxm", "tune results a.json and 2 more"]  # the newest "mine"
    assert rows[kept.stem][:2] == ["h100-sxm", "csv my-h100.csv"]  # the one it kept aside, by its own name
    assert rows["mine"][3] == "2026-12-01 10:00"
    assert "broken" not in rows
    said = " ".join(out.split())  # the line below the table, however it folds
    assert "cannot use broken: " in said and 'broken.json is not an mlactl calibration file (no "schema"' in said

    doc = json.loads(run("calibrate", "list", "--format", "json").stdout)
    assert doc["schema"] == "mlactl.calibrations" and doc["folder"] == str(home / "calibrations")
    by_name = {e["name"]: e for e in doc["calibrations"]}
    assert sorted(by_name) == sorted(["b300-from-h200-sgl", "broken", "h200-sgl", kept.stem, "mine"])
    assert by_name["broken"]["calibration"] is None and "not an mlactl calibration" in by_name["broken"]["problem"]
    moved = by_name["b300-from-h200-sgl"]
    assert moved["made_from"] == "aiconfigurator h200_sxm sglang 0.5.14; transferred from h200 (h200-sgl)"
    assert moved["calibration"]["transferred"] == {"from": "h200", "calibration": "h200-sgl", "to": "b300"}
    assert moved["problem"] is None and moved["fits"] == 1 and moved["op_classes"] == ["q_absorb"]
    # every name it lists is one --calibration takes
    assert run("analyze", "--calibration", kept.stem, "--hardware", "h100-sxm").exit_code == 0


def test_calibrate_list_of_an_empty_or_missing_folder(home, tmp_path):
    def said(*args):
        return " ".join(run("calibrate", "list", *args).stdout.split())  # as one line, however it folds

    assert said() == f"no calibrations in {home / 'calibrations'} yet: `mlactl calibrate` writes them there"
    assert said("--dir", tmp_path) == f"no calibrations in {tmp_path}"
    assert error_line(run("calibrate", "list", "--dir", tmp_path / "none", ok=False)).endswith(": no such folder")
    (tmp_path / "f.json").write_text("{}")
    assert error_line(run("calibrate", "list", "--dir", tmp_path / "f.json", ok=False)).endswith(": not a folder")
    assert "writes table or json" in error_line(run("calibrate", "list", "-f", "csv", ok=False))


def test_calibrate_show_prints_a_stored_fit_as_it_was_fitted(home):
    from mlactl.decide.calibration import store as cal_store

    fit = {"op": "q_absorb", "source": "sglang-0.5.14:bmm:decode", "dtype": "bf16", "terms": ["fixed", "sum"], "n": 400}
    fit |= {"params": {"t_fixed_s": 5e-6, "eta_c": 0.6, "eta_m": 0.8}, "in_sample": {"median": 0.1, "p90": 0.2}}
    fit |= {"held_out": {"median": 0.11, "p90": 0.25}, "members": [{"terms": ["fixed"], "params": fit["params"]}]}
    fit |= {"blocked": {"axis": "rows", "at": 1024, "n_train": 300, "n_test": 100, "median": 0.08, "p90": 0.16}}
    data = {"schema": "mlactl.calibration", "schema_version": 1, "name": "h200-sgl", "hardware": "h200"}
    source = {"kind": "aiconfigurator", "system": "h200_sxm", "framework": "sglang", "version": "0.5.14"}
    cal_store.save(data | {"source": source, "fits": [fit]})

    out = plain(run("calibrate", "show", "h200-sgl").stdout)
    row = next(line for line in out.splitlines() if line.startswith("│ q_absorb"))
    # op, kernel, phase, dtype, n, held-out median and p90, blocked median and p90, in 80%, in-sample
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == [
        "q_absorb",
        "bmm",
        "decode",
        "bf16",
        "400",
        "11.0%",
        "25.0%",
        "8.0%",
        "16.0%",
        "—",
        "10.0%",
        "20.0%",
    ]
    assert "terms kept: q_absorb (bmm, decode, bf16): fixed + sum" in out
    assert "made from aiconfigurator h200_sxm sglang 0.5.14" in " ".join(out.split())

    doc = json.loads(run("calibrate", "show", "h200-sgl", "-f", "json").stdout)
    assert doc["made_from"] == "aiconfigurator h200_sxm sglang 0.5.14"
    (got,) = doc["fits"]
    assert got["terms"] == ["fixed", "sum"] and got["members"] == [["fixed"]] and got["transfer"] is None
    assert got["held_out"] == {"median": 0.11, "p90": 0.25} and got["blocked"]["at"] == 1024

    run("calibrate", "transfer", "h200-sgl", "--hardware", "b300")
    moved = " ".join(plain(run("calibrate", "show", "b300-from-h200-sgl").stdout).split())
    assert "Calibration b300-from-h200-sgl: fitted on h200, transferred to b300's ceilings" in moved
    assert "times of calibration b300-from-h200-sgl are transferred: fitted on h200 (h200-sgl)" in moved
    assert json.loads(run("calibrate", "show", "b300-from-h200-sgl", "-f", "json").stdout)["fits"][0]["transfer"]

    line = error_line(run("calibrate", "show", "nope", ok=False))
    assert "no calibration named 'nope'" in line and "known: b300-from-h200-sgl, h200-sgl" in line
    assert "`mlactl calibrate list`" in line
