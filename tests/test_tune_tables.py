"""The tables `mlactl tune` prints (mlactl/output/tune_tables.py): at 80 columns nothing is cut,
piped every column is whole; the torch backend's kernels table shows only what means something
there; the ceilings table says where its figures came from; a crossover cell tells "never" from
"cut by the budget", and the paths legend explains the values its table holds; the compile
report's prefill row says what was launched; a kernel none of whose configs was tried is told from
one none of whose configs passed."""

import pytest
from conftest import render

from mlactl.output import tune_tables
from mlactl.results import store as results
from mlactl.tune import noise


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
