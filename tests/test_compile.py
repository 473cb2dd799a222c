"""The compile stage (mlactl/tune/compile.py): parsing of ptxas logs and PTX, the verdict that
tune uses to drop configs, the `mlactl tune compile` command, and the pinned defaults: every
listed model's decode default compiles for sm_90 with 0 spill bytes and no C7515 (no GPU needed)."""

from __future__ import annotations

import json
import types

import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.output import tune_tables
from mlactl.tune import compile as stage

# A ptxas -v log as ptxas-blackwell (CUDA 13) prints it, figures changed by hand
LOG = """ptxas-blackwell info    : 11 bytes gmem
ptxas-blackwell info    : Compiling entry function '_k' for 'sm_90a'
ptxas-blackwell info    : Function properties for _k
    200 bytes stack frame, 208 bytes spill stores, 204 bytes spill loads
ptxas-blackwell info    : Used 255 registers, used 1 barriers, 200 bytes cumulative stack size
ptxas-blackwell warning : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized
"""

PTX = """
.entry _k(
{
\tmov.u32 %r1, 0;
$L__BB0_1:
\twgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {...};
$L__BB0_2:
\twgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {...};
\twgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {...};
\t@%p1 bra $L__BB0_2;
\tmma.sync.aligned.m16n8k16 {...};
\t@%p2 bra $L__BB0_1;
\twgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {...};
\tret;
}
"""


def test_parse_ptxas_log():
    got = stage.parse_ptxas_log(LOG)
    assert got["registers"] == 255 and got["stack_bytes"] == 200
    assert (got["spill_stores"], got["spill_loads"], got["spill_bytes"]) == (208, 204, 412)
    assert len(got["warnings"]) == 1 and got["warnings"][0].startswith("(C7515)")


def test_parse_ptxas_log_clean():
    got = stage.parse_ptxas_log("info : Used 128 registers, used 1 barriers\n")
    assert got == {
        "registers": 128,
        "stack_bytes": 0,
        "spill_stores": 0,
        "spill_loads": 0,
        "spill_bytes": 0,
        "warnings": [],
    }


def test_loop_counts_take_the_busiest_loop():
    # outer loop (BB0_1 .. its branch) holds 3 wgmma and 1 mma; the inner one 2; the one after both loops counts in none
    assert stage.loop_counts(PTX, {"wgmma": "wgmma.mma_async", "mma": "mma.sync"}) == {"wgmma": 3, "mma": 1}
    assert stage.loop_counts("no loops\n", {"wgmma": "wgmma"}) == {"wgmma": 0}


def test_sass_counts():
    sass = (
        "        /*0100*/ HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ ;\n  STL [R1+0x4], R2 ;\n  LDL R2, [R1+0x4] ;\n"
    )
    assert stage.sass_counts(sass) == {"HGMMA": 1, "QGMMA": 0, "HMMA": 0, "LDL": 1, "STL": 1}


def _result(**kw):
    base = dict(arch="sm_90", smem_bytes=100_000, spill_bytes=0, stack_bytes=0, error=None)
    return {**base, **kw}


def test_verdict():
    assert stage.verdict(_result()) is None
    assert "shared memory" in stage.verdict(_result(smem_bytes=227 * 1024 + 1))
    assert stage.verdict(_result(smem_bytes=227 * 1024)) is None  # exactly the opt-in limit fits
    assert "163" not in (stage.verdict(_result(arch="sm_80", smem_bytes=170_000)) or "")
    assert "166912 B" in stage.verdict(_result(arch="sm_80", smem_bytes=170_000))  # 163 KiB on A100
    assert stage.verdict(_result(spill_bytes=8, stack_bytes=8)) == "spills 8 B (stack 8 B)"
    assert stage.verdict(_result(error="PTXASError: boom")).startswith("does not compile")


def test_drop_by_compile_records_why(monkeypatch):
    """tune's pruning: configs the stage rejects are dropped before timing, each with its reason."""
    from mlactl.model import config as model
    from mlactl.tune import space

    def fake(cases):
        return [_result(spill_bytes=16 * (c.config["BLOCK_N"] == 64), stack_bytes=0) for c in cases]

    monkeypatch.setattr(stage, "compile_cases", fake)
    monkeypatch.setattr(stage, "available", lambda: None)
    ctx = types.SimpleNamespace(
        cfg=model.from_name("deepseek-v3"), dtype="bf16", kv_dtype="bf16", skipped=[], backend="triton", device=None
    )
    entry = {}
    candidates = [{"BLOCK_H": 64, "BLOCK_N": n, "num_warps": 8, "num_stages": 3} for n in (16, 64)]
    shape = {"B": 128, "H": 128, "S_q": 1, "ctx": 8192}
    kept = stage.drop_by_compile(ctx, space.KERNELS["mla_decode"], shape, candidates, entry, arch="sm_90")
    assert kept == candidates[:1]
    assert entry["compile_dropped"] == [{"config": candidates[1], "reason": "spills 16 B (stack 0 B)"}]
    assert len(ctx.skipped) == 1 and "spills 16 B" in ctx.skipped[0]
    # no arch (a CPU run): nothing compiled, nothing dropped
    ctx.backend = "interpret"
    assert stage.drop_by_compile(ctx, space.KERNELS["mla_decode"], shape, candidates, {}) == candidates


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--arch", "sm_99"], "--arch must be one of sm_80, sm_90, sm_100", id="arch"),
        pytest.param(["--kernel", "nope"], "--kernel 'nope' is unknown", id="kernel"),
        pytest.param(["-f", "csv"], "csv is not offered", id="csv"),
        pytest.param(["--dtype", "fp8"], "--dtype must be one of", id="dtype"),
    ],
)
def test_cli_bad_input(args, message):
    res = CliRunner().invoke(app, ["tune", "compile", *args])
    assert res.exit_code == 2
    assert res.output.count("Error:") == 1 and message in res.output


def test_cli_help_has_example():
    res = CliRunner().invoke(app, ["tune", "compile", "--help"])
    assert res.exit_code == 0 and "Example: mlactl tune compile" in res.output


needs_ptxas = pytest.mark.skipif(stage.available() is not None, reason=str(stage.available()))


@pytest.mark.slow
@needs_ptxas
def test_cli_json_schema(tmp_path):
    """`-f json` is a list of the documented objects (merge: the quickest kernel to build)."""
    out = tmp_path / "report.json"
    args = ["tune", "compile", "--kernel", "merge_attn_states", "--model", "deepseek-v2-lite", "-f", "json", "-o", out]
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert len(rows) == 1
    row = rows[0]
    for key in ("kernel", "shape", "config", "arch", "smem_bytes", "registers", "spill_bytes", "stack_bytes"):
        assert key in row
    assert row["kernel"] == "merge_attn_states" and row["arch"] == "sm_90" and row["shape"] == {"H": 16, "T": 4096}
    assert isinstance(row["warnings"], list) and row["spill_bytes"] == 0 and row["registers"] > 0
    assert row["dropped"] is None


# the defaults the issue lists: DeepSeek-V3 at 128/64/32/16 heads per GPU, Kimi K2 (64), V2-Lite (16)
LISTED = [("deepseek-v3", 1), ("deepseek-v3", 2), ("deepseek-v3", 4), ("deepseek-v3", 8), ("kimi-k2", 1)]
LISTED += [("deepseek-v2-lite", 1)]


@pytest.mark.slow
@needs_ptxas
def test_listed_defaults_do_not_spill_on_sm90():
    """Every listed model's decode default, bf16 and fp8 cache, compiled for sm_90 with the ptxas
    Triton selects: 0 spill bytes, no C7515, fits shared memory; prefill's defaults too."""
    from mlactl.model import config as model

    cases = []
    for name, tp in LISTED:
        cfg = model.from_name(name).with_tp(tp)
        for kv in ("bf16", "fp8"):
            cases += stage.default_cases(cfg, ("mla_decode",), "sm_90", "bf16", kv)
    cases += stage.default_cases(model.from_name("deepseek-v3"), ("mla_prefill",), "sm_90", "bf16", "bf16")
    results = stage.compile_cases(cases)
    bad = [
        (r["kernel"], r["shape"], r["kv_dtype"], r["config"], r["spill_bytes"], r["warnings"], r["error"])
        for r in results
        if r["error"] or r["spill_bytes"] or any("C7515" in w for w in r["warnings"]) or stage.verdict(r)
    ]
    assert not bad, bad
    assert {(r["ptxas"], r["ptxas_version"]) for r in results} == {PTXAS_SM90[triton_minor()]}


# The ptxas each Triton release selects for sm_90 (triton/backends/nvidia/compiler.py, get_ptxas):
# 3.9 `ptxas-blackwell` from sm_90 on (CUDA 13.4 in the wheel), 3.6 `ptxas` below sm_100 (CUDA 12.8)
PTXAS_SM90 = {(3, 9): ("ptxas-blackwell", "13.4"), (3, 6): ("ptxas", "12.8")}


def triton_minor() -> tuple[int, int]:
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def test_report_table_never_cuts_the_bucket_or_kernel_at_80_columns():
    # A hand-made result row (no compile): the bucket and kernel are names a user types.
    from rich.console import Console

    row = {
        "kernel": "merge_attn_states",
        "shape": {"B": 128, "H": 128, "S_q": 1, "ctx": 131072},
        "config": {"BLOCK_H": 64, "BLOCK_N": 32, "num_splits": 1, "num_warps": 8, "num_stages": 3},
        "arch": "sm_90",
        "smem_bytes": 147456,
        "registers": 249,
        "spill_bytes": 0,
        "stack_bytes": 0,
        "wgmma_per_loop": 74,
        "mma_per_loop": 0,
        "warnings": [],
        "dropped": None,
    }
    for width in (80, None):
        con = Console(width=width or 200, record=True, file=None)
        with con.capture() as cap:
            con.print(tune_tables.compile_table([row], width))
        text = cap.get()
        assert "B=128,H=128,S_q=1,ctx=131072" in text and "merge_attn_states" in text
        assert "…" not in text
        if width:
            assert max(len(line) for line in text.splitlines()) <= 80
