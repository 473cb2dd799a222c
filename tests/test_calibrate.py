"""`mlactl calibrate`: its help offers what it has (and its old --version points to the new
name), a missing option is named alone, and its table of fits (mlactl/output/calibrate_tables.py)
fits 100 columns without folding a name, piped with every column."""

from conftest import plain, render, runner

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
