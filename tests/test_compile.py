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


PTX_MMA = """
$L__BB0_1:
\twgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {...};
\twgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {...};
\twgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {...};
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};
\t@%p1 bra $L__BB0_1;
\twgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {...};
"""


def test_loop_mma_macs_and_ratio():
    # in the loop: 2 x 64*16*16 + 64*256*16 = 32768 + 262144 = 294912 wgmma MACs, 16*8*16 = 2048 mma
    assert stage.loop_mma_macs(PTX_MMA) == {"wgmma": 294912, "mma": 2048}
    # 8 warps: 2 warpgroups issue the wgmma, 8 warps the mma.sync: 589824 + 16384 = 606208
    assert stage.issued_over_needed({"wgmma": 294912, "mma": 2048}, 8, 606208) == 1.0
    assert stage.issued_over_needed({"wgmma": 0, "mma": 0}, 8, 100) is None  # FMA dots: no ratio
    # a hand count for the 128-head default without the split score: per 32-key tile each of
    # 2 warpgroups issues 72 m64n16k16 (score, K 576) and 2 m64n256k16 (value, K 32); the tile
    # needs 64 x 32 x (576 + 512) = 2228224: (2 x (72 x 16384 + 2 x 262144)) / 2228224 = 1.529
    got = stage.issued_over_needed({"wgmma": 72 * 16384 + 2 * 262144, "mma": 0}, 8, 64 * 32 * 1088)
    assert round(got, 3) == 1.529


def test_loop_shared_bytes_and_ops():
    ptx = """
$L__BB0_1:
\tcp.async.cg.shared.global [ %r1 + 0 ], [ %rd2 + 0 ], 0x10, %r3;
\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r4, %r5, %r6, %r7}, [%r8];
\tldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%r4, %r5}, [%r8];
\tld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r9];
\tld.shared.b8 %rs1, [%r9+1];
\tst.shared.v2.b32 [%r9], {%r1, %r2};
\tbar.sync \t0;
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};
\t@%p1 bra $L__BB0_1;
\tld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r9];
"""
    # per thread: cp.async 16; ldmatrix 4 x 4 + 2 x 4 = 24; ld.shared 16 + 1 (the one after the loop
    # is not counted); st.shared 8
    assert stage.loop_shared_bytes(ptx) == {"ld_shared": 17, "st_shared": 8, "ldmatrix": 24, "cp_async": 16}
    ops = stage.loop_counts(ptx, stage.LOOP_OPS)
    assert (ops["bar_sync"], ops["cp_async"], ops["ldmatrix"], ops["ld_shared"]) == (1, 1, 2, 2)
    assert stage.loop_mma_shapes(ptx) == {"mma m16n8k16": 1}


def test_sass_counts():
    sass = (
        "        /*0100*/ HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ ;\n  STL [R1+0x4], R2 ;\n  LDL R2, [R1+0x4] ;\n"
    )
    assert stage.sass_counts(sass) == {"HGMMA": 1, "QGMMA": 0, "HMMA": 0, "LDL": 1, "STL": 1}


# TTGIR after Triton's pipeliner, cut to the lines kv_pipeline reads (names and types as Triton 3.9
# prints them for the 64-row decode loop); {ALLOC} = the KV buffer's slots, {PRO} = prologue copies
TTGIR = """
    %b_q = ttg.local_alloc %q : (tensor<64x512xbf16, #blocked>) -> !ttg.memdesc<64x512xbf16, #shared, #smem>
    %b_kv = ttg.local_alloc : () -> !ttg.memdesc<{ALLOC}x32x512xbf16, #shared, #smem, mutable>
    %b_kpe = ttg.local_alloc : () -> !ttg.memdesc<{ALLOC}x32x64xbf16, #shared, #smem, mutable>
    %bar = ttg.local_alloc : () -> !ttg.memdesc<{ALLOC}x1xi64, #shared1, #smem, mutable>
{PRO}
    %l:4 = scf.for %n0 = %start to %end step %c32_i32 iter_args(%acc = %z, %m = %m0) -> (tensor<64x512xf32, #mma1>) {
      ttng.wait_barrier %bar_i, %phase : !ttg.memdesc<1xi64, #shared1, #smem, mutable>
      %s = ttng.warp_group_dot %b_q, %kt, %cst {isAsync = true} : !ttg.memdesc<64x512xbf16> -> tensor<64x32xf32, #mma>
      %s_w:3 = ttng.warp_group_dot_wait %s, %b_q, %kt {pendings = 0 : i32} : tensor<64x32xf32, #mma>
{EARLY}
      %acc_n = ttng.warp_group_dot %p, %b_kv_i, %acc {isAsync = true} : !ttg.memdesc -> tensor<64x512xf32, #mma1>
      %acc_w:3 = ttng.warp_group_dot_wait %acc_n, %p, %b_kv_i {pendings = 0 : i32} : tensor<64x512xf32, #mma1>
{LATE}
      scf.yield %acc_w#0 : tensor<64x512xf32, #mma1>
    }
"""
COPY = """      %kv_d{I} = ttg.memdesc_index %b_kv[%c{I}] : !ttg.memdesc<3x32x512xbf16> -> !ttg.memdesc<32x512xbf16>
      ttng.async_tma_copy_global_to_local %kv_desc[%row{I}, %c0_i32] %kv_d{I}, %bar{I}, %true
      %kpe_d{I} = ttg.memdesc_index %b_kpe[%c{I}] : !ttg.memdesc<3x32x64xbf16> -> !ttg.memdesc<32x64xbf16>
      ttng.async_tma_copy_global_to_local %kpe_desc[%row{I}, %c512_i32] %kpe_d{I}, %bar{I}, %true"""


def _ttgir(buffers, prologue, where):
    body = {"EARLY": "", "LATE": ""}
    body[where] = COPY.replace("{I}", "9")
    text = TTGIR.replace("{ALLOC}", str(buffers))
    text = text.replace("{PRO}", "\n".join(COPY.replace("{I}", str(i)) for i in range(prologue)))
    return text.replace("{EARLY}", body["EARLY"]).replace("{LATE}", body["LATE"])


@pytest.mark.parametrize(
    "buffers, prologue, where, want",
    [
        # an earlier 64-row default: 2 buffers, the copy of tile i + 1 after tile i's value dot
        pytest.param(2, 1, "LATE", (2, 1, 1, False), id="2buf-copy-after-value-dot"),
        # 3 stages: 3 buffers, tiles i + 1 and i + 2 fetched ahead, tile i + 2 copied after the dot
        pytest.param(3, 2, "LATE", (3, 2, 2, False), id="3buf-two-in-flight"),
        # 2 buffers, tile i + 1 copied before tile i's value dot waits: two in flight across it
        pytest.param(2, 1, "EARLY", (2, 1, 2, True), id="2buf-copy-before-value-dot"),
    ],
)
def test_kv_pipeline_reads_buffers_and_tiles_in_flight(buffers, prologue, where, want):
    got = stage.kv_pipeline(_ttgir(buffers, prologue, where))
    assert (got["kv_buffers"], got["prefetched"], got["tiles_in_flight"], got["copy_before_value_wait"]) == want


def test_kv_pipeline_without_copies_or_dots():
    # a loop of dots whose tiles come through registers (no async copy): nothing in flight ahead
    plain = _ttgir(2, 0, "LATE").replace("ttng.async_tma_copy_global_to_local", "tt.store")
    assert stage.kv_pipeline(plain) == {
        "kv_buffers": 0,
        "prefetched": 0,
        "tiles_in_flight": 1,
        "copy_before_value_wait": None,
    }
    # the KV tile loaded into registers in the loop (an fp8 tile widened for both dots, as the
    # fp8 default was): only a small side operand is copied ahead, so nothing of the tile is in flight
    unstaged = _ttgir(3, 2, "LATE").replace(
        "      ttng.wait_barrier",
        "      %raw = tt.load %p_kv, %m : tensor<32x512x!tt.ptr<i8>, #blocked>\n      ttng.wait_barrier",
    )
    unstaged = unstaged.replace("x32x512xbf16", "x16x64xbf16")  # the copies fill 2 KiB slots only
    assert stage.kv_pipeline(unstaged)["tiles_in_flight"] == 1
    assert stage.kv_pipeline(unstaged)["kv_buffers"] == 0
    # a merge: no dot in any loop
    assert set(stage.kv_pipeline("scf.for %k = %a to %b step %c {\n  tt.load %p\n}\n").values()) == {None}


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


# the launch defaults of the shipped models: DeepSeek-V3 at 128/64/32/16 heads per GPU, Kimi K2 (64),
# V2-Lite (16)
LISTED = [("deepseek-v3", 1), ("deepseek-v3", 2), ("deepseek-v3", 4), ("deepseek-v3", 8), ("kimi-k2", 1)]
LISTED += [("deepseek-v2-lite", 1)]


@pytest.mark.slow
@needs_ptxas
def test_listed_defaults_do_not_spill_on_sm90():
    """Every listed model's decode default, bf16 and fp8 cache, compiled for sm_90 as the launcher
    launches it (its schedule, split count and output dtype; for the uniform schedule both the
    one-split bf16 output and the fp32 partials) with the ptxas Triton selects: 0 spill bytes, no
    C7515, fits shared memory; prefill's defaults too. Run it under Triton 3.6 as well
    (docs/kernels.md, "Triton 3.6")."""
    from mlactl.model import config as model

    cases = []
    for name, tp in LISTED:
        cfg = model.from_name(name).with_tp(tp)
        for kv in ("bf16", "fp8"):
            cases += stage.default_cases(cfg, ("mla_decode",), "sm_90", "bf16", kv)
    for tp in (1, 8):  # the sparse decode at 128 and 16 heads
        for kv in ("bf16", "fp8"):
            cfg = model.from_name("deepseek-v3.2").with_tp(tp)
            cases += stage.default_cases(cfg, ("mla_sparse_decode",), "sm_90", "bf16", kv)
    cases += stage.default_cases(model.from_name("deepseek-v3"), ("mla_prefill",), "sm_90", "bf16", "bf16")
    results = stage.compile_cases(cases)
    bad = [
        (r["kernel"], r["shape"], r["kv_dtype"], r["config"], r["spill_bytes"], r["warnings"], r["error"])
        for r in results
        if r["error"] or r["spill_bytes"] or any("C7515" in w for w in r["warnings"]) or stage.verdict(r)
    ]
    assert not bad, bad
    assert {(r["ptxas"], r["ptxas_version"]) for r in results} == {PTXAS_SM90[triton_minor()]}
    decode = [r for r in results if r["kernel"] == "mla_decode" and r["stage"] == "stage1"]
    for r in decode:  # what each row says it launched is what the launcher picks (see below)
        assert r["out_dtype"] == ("fp32" if r["variant"] == "uniform" and r["num_splits"] > 1 else "bf16"), r
    # every shipped decode default, dense and sparse, keeps two KV tiles in flight across the value
    # dot, read from the compiled loop (kv_pipeline): the copy of a later tile runs while one is
    # multiplied. The 64-row TMA default has 3 buffers (at 2 stages: 2 buffers, 1 tile in flight)
    loops = [r for r in results if r["kernel"] in ("mla_decode", "mla_sparse_decode") and r["stage"] == "stage1"]
    covered = {(r["kernel"], r["shape"]["H"], r["kv_dtype"]) for r in loops}
    dense = {("mla_decode", h, kv) for h in (128, 64, 32, 16) for kv in ("bf16", "fp8")}
    assert covered == dense | {("mla_sparse_decode", h, kv) for h in (128, 16) for kv in ("bf16", "fp8")}
    assert all(r["kv_buffers"] >= 2 and r["tiles_in_flight"] >= 2 for r in loops), [
        (r["kernel"], r["shape"], r["kv_dtype"], r["config"], r["kv_buffers"], r["tiles_in_flight"]) for r in loops
    ]
    assert {r["kv_buffers"] for r in decode if r["config"]["BLOCK_H"] == 64} == {3}
    # the launch's other kernels are compiled too: the merges, and an fp8 cache's scale as a float
    stages = {(r["kernel"], r.get("stage")) for r in results}
    assert {("mla_decode", "merge"), ("mla_sparse_decode", "merge")} <= stages
    assert {r["kv_scale"] for r in decode if r["kv_dtype"] == "fp8"} == {"tensor", "float"}
    # DeepSeek-V3 TP1 bf16 (B 128: one split, bf16 out; B 16: fp32 partials), the 64-row default:
    # each tensor-core multiply-add issued once (the split score tile), 1.53 without it
    wide = [r for r in decode if r["shape"]["H"] == 128 and r["kv_dtype"] == "bf16"]
    assert sorted((r["shape"]["B"], r["num_splits"] > 1, r["out_dtype"]) for r in wide) == [
        (16, True, "fp32"),
        (128, False, "bf16"),
    ]
    assert all(r["issued_mma_over_needed"] <= 1.02 and r["config"]["SPLIT_SCORE"] == 1 for r in wide), wide


# The ptxas each Triton release selects for sm_90 (triton/backends/nvidia/compiler.py, get_ptxas):
# 3.9 `ptxas-blackwell` from sm_90 on (CUDA 13.4 in the wheel), 3.6 `ptxas` below sm_100 (CUDA 12.8)
PTXAS_SM90 = {(3, 9): ("ptxas-blackwell", "13.4"), (3, 6): ("ptxas", "12.8")}


def triton_minor() -> tuple[int, int]:
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


LAUNCHES = [  # (H, S_q, dtype, config, schedule): what mla_decode launches, recorded in the interpreter
    pytest.param(4, 1, "fp16", {"BLOCK_N": 16, "num_splits": 1, "SPLIT_SCORE": 1}, "auto", id="uniform-1split"),
    pytest.param(4, 1, "fp16", {"BLOCK_N": 16, "num_splits": 3}, "auto", id="uniform-3splits-fp32-out"),
    pytest.param(4, 2, "fp32", {"BLOCK_N": 32}, "balanced", id="balanced"),
]


@pytest.mark.parametrize("H, S_q, dtype, config, schedule", LAUNCHES)
def test_compile_spec_builds_what_the_launcher_launches(monkeypatch, H, S_q, dtype, config, schedule):
    """The compile stage builds the kernel, constexprs and output dtype that mla_decode launches:
    the launch is recorded (Triton's interpreter on a CPU) and set against compile_spec."""
    import torch
    from test_decode import paged_case

    from mlactl.kernels import decode

    seen = {}

    class Record:
        def __init__(self, name):
            self.name, self.real = name, getattr(decode, name)
            self.arg_names = self.real.arg_names

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                bound = dict(zip(self.arg_names, args))
                seen.update(kernel=self.name, o=bound["o"].dtype, consts=kwargs)
                return self.real[grid](*args, **kwargs)

            return launch

    for name in ("_mla_decode_split_kernel", "_mla_decode_planned_kernel"):
        monkeypatch.setattr(decode, name, Record(name))
    torch_dtype = {"fp16": torch.float16, "fp32": torch.float32}[dtype]
    q, kv, table, seqlens, _ = paged_case((40, 100), H, S_q, 32, 16, 16, torch_dtype)
    decode.mla_decode(q, kv, table, seqlens, 0.15, r=32, config=config, schedule=schedule)
    shape = {"B": 2, "H": H, "S_q": S_q, "ctx": 100}
    fn, sig, consts, _, options, launch = decode.compile_spec(
        shape, config, 32, 16, 16, dtype, dtype, variant=None if schedule == "auto" else schedule
    )
    assert fn is getattr(decode, seen["kernel"])  # the stage-1 kernel the launcher ran
    names = {torch.float16: "fp16", torch.float32: "fp32", torch.bfloat16: "bf16"}
    assert sig["o"] == f"*{names[seen['o']]}" and launch["out_dtype"] == names[seen["o"]]
    launched = {k: v for k, v in seen["consts"].items() if k not in ("num_warps", "num_stages", "INTERPRETED")}
    built = {k: v for k, v in consts.items() if k not in ("INTERPRETED", "TMA")}
    launched.pop("TMA")  # the interpreter takes TMA only at 64 rows, as a GPU does (tested in test_schedule)
    assert launched == built
    assert (options["num_warps"], options["num_stages"]) == (seen["consts"]["num_warps"], seen["consts"]["num_stages"])


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


SPARSE_LAUNCHES = [  # (H, dtype, fp8, config): what mla_sparse_decode launches, recorded in the interpreter
    pytest.param(4, "fp16", False, {"BLOCK_H": 16, "BLOCK_N": 16, "num_splits": 1}, id="bf16-row-1split-H4"),
    pytest.param(5, "fp32", False, {"BLOCK_N": 16, "num_splits": 3}, id="3splits-fp32-partials"),
    pytest.param(3, "fp16", True, {"BLOCK_H": 64, "BLOCK_N": 16, "num_splits": 2}, id="fp8-row-BLOCK_H-clamped"),
]


@pytest.mark.parametrize("H, dtype, fp8, config", SPARSE_LAUNCHES)
def test_sparse_compile_spec_builds_what_the_launcher_launches(monkeypatch, H, dtype, fp8, config):
    """mla_sparse_decode's compile stage builds the constexprs, output dtype and options the
    launcher launches (a BLOCK_H wider than the heads is clamped the same way in both)."""
    import torch
    from test_sparse_decode import sparse_case

    from mlactl.kernels import sparse_decode

    seen = {}
    real = sparse_decode._sparse_decode_kernel

    class Record:
        arg_names = real.arg_names

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.update(o=dict(zip(self.arg_names, args))["o"].dtype, consts=kwargs)
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(sparse_decode, "_sparse_decode_kernel", Record())
    torch_dtype = {"fp16": torch.float16, "fp32": torch.float32}[dtype]
    q, cache, slots = sparse_case(2, 1, H, 128, 32, 4, 16, 40, torch_dtype, fp8=fp8, device="cpu")
    sparse_decode.mla_sparse_decode(q, cache, slots, 0.1, r=128, config=config)
    shape = {"B": 2, "H": H, "S_q": 1, "topk": 40}
    _, sig, consts, _, options, launch = sparse_decode.compile_spec(
        shape, config, 128, 32, dtype, "fp8" if fp8 else dtype
    )
    names = {torch.float16: "fp16", torch.float32: "fp32"}
    assert sig["o"] == f"*{names[seen['o']]}" and launch["out_dtype"] == names[seen["o"]]
    assert launch["num_splits"] == config["num_splits"]
    launched = {k: v for k, v in seen["consts"].items() if k not in ("num_warps", "num_stages", "DOT_FP32")}
    assert launched == {k: v for k, v in consts.items() if k != "DOT_FP32"}
    assert (options["num_warps"], options["num_stages"]) == (seen["consts"]["num_warps"], seen["consts"]["num_stages"])
