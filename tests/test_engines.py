"""The engines' path rules, pinned on hand-built batches, against a plain second implementation
written from the cited source; their losses, the threshold sweeps, the CLI and its errors.

Sources (see mlactl/engines.py): sgl-project/sglang@0a8dcfa9
python/sglang/srt/models/deepseek_common/attention_backend_handler.py and environ.py;
vllm-project/vllm@0014ca6b vllm/model_executor/layers/attention/mla_attention.py,
vllm/v1/attention/backends/mla/flashmla.py and flashattn_mla.py.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide import workload
from mlactl.decide.engines import Context, chunk_sizes, context_for, grid_paths, parse_engines, time_lost
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel
from mlactl.util.errors import MlactlError

runner = CliRunner()
H200 = Context(hardware="h200", arch="sm90", kv_dtype="bf16")


def test_grid_point_is_a_batch_of_alike_requests():
    """sglang@0.5.14 (no piecewise graph): 256 < 8192; 32*255 = 8160 < 8192; 64*256 = 16384;
    a decode; 33*4096 = 135168 > the 131072 capacity."""
    p = parse_engines("sglang@0.5.14", [], H200)[0]
    got = grid_paths(p, batch=[1, 32, 64, 64, 33], new=[512, 512, 512, 1, 4096], prefix=[256, 255, 256, 256, 0])
    assert list(got) == ["absorb", "absorb", "expand", "absorb", "expand_chunked"]


def test_vllm_context_chunk():
    """FLASHMLA (fp8 cache on an H200): the 64K workspace split over the prefills with context,
    rounded down to its 64-token block: 65536 // 3 = 21845 -> 21824; 65536 // 7 = 9362 -> 9344.
    FLASH_ATTN_MLA's 16-token blocks: 65536 // 3 = 21845 -> 21840."""
    fp8 = Context(hardware="h200", arch="sm90", kv_dtype="fp8")
    p = parse_engines("vllm", [], fp8)[0]
    assert (p.backend, p.block, p.workspace) == ("FLASHMLA", 64, 65536)
    assert chunk_sizes(p, [1, 3, 7]).tolist() == [65536, 21824, 9344]
    fa = parse_engines("vllm", [], H200)[0]
    assert (fa.backend, fa.block) == ("FLASH_ATTN_MLA", 16)
    assert chunk_sizes(fa, [3]).tolist() == [21840]
    assert chunk_sizes(parse_engines("sglang", [], H200)[0], [1]) is None


def test_vllm_workspace_formula():
    """min(max(8 * max_model_len, 4 * max_num_seqs * block), 64K), at least max_num_seqs * block:
    max_model_len 1000 -> max(8000, 4*256*16 = 16384) = 16384; max_num_seqs 8192 on 16-token
    blocks -> at least 131072."""
    (p,) = parse_engines("vllm", ["max_model_len=1000"], H200)
    assert p.workspace == 16384
    (p,) = parse_engines("vllm", ["max_num_seqs=8192"], H200)
    assert p.workspace == 131072


# -- losses -------------------------------------------------------------------------------------------


def test_time_lost_against_the_best_that_fits():
    times = {
        "expand": np.array([1.0, 5.0, np.inf]),
        "expand_chunked": np.array([1.1, 5.5, 9.0]),
        "absorb": np.array([3.0, 2.0, 20.0]),
    }
    chosen = np.array(["absorb", "expand_chunked", "expand"])
    assert list(time_lost(chosen, times)) == [2.0, 3.5, np.inf]
    assert list(time_lost(np.array(["expand", "absorb", "expand_chunked"]), times)) == [0.0, 0.0, 0.0]


# -- sweeps ---------------------------------------------------------------------------------------------


def v3_report(wl, engines="sglang,vllm", hw="h200"):
    cfg, profile = model.from_name("deepseek-v3"), hardware.from_name(hw)
    return workload.report(CostModel(cfg), profile, wl, parse_engines(engines, [], context_for(cfg, profile)))


def brute_force(wl, engine, thresholds, hw="h200"):
    """The workload's weighted time at each threshold, by running the rule again for each."""
    cost = CostModel(model.from_name("deepseek-v3"))
    times = workload.path_times_for(cost, hardware.from_name(hw), wl.batch, wl.new, wl.prefix)
    if engine == "vllm":  # vLLM expands context in chunks of its workspace (64K) over its prefills
        assert set(wl.batch.tolist()) == {1}
        own = CostModel(model.from_name("deepseek-v3"), chunk=65536)
        chunked = workload.path_times_for(own, hardware.from_name(hw), wl.batch, wl.new, wl.prefix)["expand_chunked"]
        times = dict(times, expand_chunked=chunked)
    out = {}
    for t in thresholds:
        ctx = context_for(model.from_name("deepseek-v3"), hardware.from_name(hw))
        p = parse_engines(engine, [f"threshold={t}"], ctx)[0]
        chosen = grid_paths(p, wl.batch, wl.new, wl.prefix)
        out[t] = float(sum(np.where(chosen == k, v, 0.0) for k, v in times.items()) @ wl.weight)
    return out


def test_sglang_sweep_is_the_brute_force_minimum():
    wl = workload.grid_workload(
        *np.array([(b, n, p) for b in (1, 8) for n in (16, 512, 4096) for p in (0, 1024, 4096, 16384)]).T
    )
    sweep = next(e.sweep for e in v3_report(wl).engines if e.params.engine == "sglang")
    trials = [1, 512, 1024, 1025, 4096, 8192, 8193, 16384, 32768, 65536, 131072, 131073, 10**7]
    brute = brute_force(wl, "sglang", trials)
    assert sweep.best_time_s == pytest.approx(min(brute.values()))
    assert sweep.current_time_s == pytest.approx(brute[8192])
    assert brute[sweep.best] == pytest.approx(sweep.best_time_s)
    lo, hi = sweep.best_range
    assert brute_force(wl, "sglang", [lo])[lo] == pytest.approx(sweep.best_time_s)
    if hi is not None:
        assert brute_force(wl, "sglang", [hi])[hi] == pytest.approx(sweep.best_time_s)


def test_vllm_sweep_is_the_brute_force_minimum():
    wl = workload.grid_workload(*np.array([(1, n, p) for n in (1, 16, 64, 100, 256, 1024) for p in (0, 4096, 32768)]).T)
    sweep = next(e.sweep for e in v3_report(wl).engines if e.params.engine == "vllm")
    brute = brute_force(wl, "vllm", [1, 15, 16, 63, 64, 99, 100, 128, 255, 256, 512, 1023, 1024, 4096])
    assert sweep.best_time_s == pytest.approx(min(brute.values()))
    assert sweep.current_time_s == pytest.approx(brute[512])  # FLASH_ATTN_MLA on an H200, bf16 cache
    assert 0 <= sweep.saves <= 1


def test_weights_scale_the_loss(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("batch,new,prefix,weight\n1,4096,1024,10\n1,1,4096,1\n")
    wl = workload.read_workload(path)
    assert list(wl.weight) == [10.0, 1.0]
    report = v3_report(wl, "sglang")
    e = report.engines[0]
    assert list(e.paths) == ["absorb", "absorb"]  # 1024 < 8192; decode
    assert e.loss.lost_s == pytest.approx(10 * e.lost[0]) and e.lost[1] == 0
    assert report.worst(e) == [0]


# -- command line ----------------------------------------------------------------------------------------


def one_error_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0], lines[0]


KNOWN = "choose from sglang, vllm, sglang-triton, sglang-trtllm, sglang@0.5.14"
BAD = [
    (["analyze", "--engines", "tensorrt"], f"unknown engine 'tensorrt'; {KNOWN}"),
    (["analyze", "--policy", "fixed"], "--policy must be one of roofline, flops, measured, sglang"),
    (
        ["analyze", "--engine-option", "sglang.bogus=1"],
        "sglang@0.5.23 has no option 'bogus'; valid keys for sglang@0.5.23",
    ),
    (["analyze", "--engine-option", "foo.threshold=1"], f"unknown engine 'foo'; {KNOWN}"),
    (["analyze", "--engine-option", "sglang.threshold=abc"], "chunked_prefix_cache_threshold takes a whole number"),
    (["analyze", "--engine-option", "vllm.threshold=0"], "reorder_batch_threshold must be from 1 to 2,147,483,647"),
    (["analyze", "--engine-option", "vllm.threshold=-5"], "reorder_batch_threshold takes a whole number"),
    (["analyze", "--engine-option", "vllm.threshold=1.5"], "reorder_batch_threshold takes a whole number"),
    (["analyze", "--engine-option", "vllm.threshold=99999999999999999999"], "must be from 1 to 2,147,483,647"),
    (["analyze", "--engine-option", "threshold=4096"], "threshold belongs to sglang and vllm"),
    (["analyze", "--engine-option", "threshold"], "takes [ENGINE.]KEY=VALUE"),
    (["analyze", "--engine-option", "vllm.backend=triton"], "backend must be one of flash_attn_mla, flashmla"),
    (
        ["analyze", "--engines", "sglang@0.5.14", "--engine-option", "disable_piecewise_cuda_graph=true"],
        "sglang@0.5.14 has no option",
    ),
    (["analyze", "--engines", "vllm@9.9"], "no rule set for vllm@9.9; vllm versions: 0014ca6b, 0.33.0"),
    (
        ["analyze", "--hardware", "b200", "--engine-option", "vllm.backend=flashmla", "--kv-dtype", "fp32"],
        "FLASHMLA takes no fp32 cache",
    ),
    (["analyze", "--threshold", "8192"], "No such option"),
    (["engines", "--engines", "sglang,x"], f"unknown engine 'x'; {KNOWN}"),
    (["engines", "--engine-option", "sglang.threshold=-1"], "takes a whole number"),
    (["engines", "--list", "-f", "csv"], "--list writes table or json"),
    (["plot", "pathmap", "--policy", "nope", "-o", "/tmp/x.png"], f"unknown engine 'nope'; {KNOWN}"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_engine_input(args, message):
    if message == "No such option":  # click's own usage error: exit 2, names the option
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "--threshold" in result.output
        return
    one_error_line(args, message)


def test_batch_command_bad_engine(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("new,prefix\n1,100\n")
    one_error_line(
        ["batch", str(path), "--engines", "vllm,sglang-tensorrt"], f"unknown engine 'sglang-tensorrt'; {KNOWN}"
    )


def test_older_option_names_still_work():
    (p,) = parse_engines("sglang", ["threshold=4096"], H200)
    assert p.threshold == 4096 and p.label == "sglang(chunked_prefix_cache_threshold=4096)"
    (v,) = parse_engines("vllm", ["backend=flash_attn_mla"], H200)
    assert v.threshold == 512  # the backend brings its own threshold
    (v,) = parse_engines("vllm", ["threshold=64", "backend=flash_attn_mla"], H200)
    assert v.threshold == 64  # ... unless one was given
    with pytest.raises(MlactlError, match="sglang@0.5.23 has no option 'num_speculative_tokens'"):
        parse_engines("sglang-triton", ["num_speculative_tokens=1"], H200)


def test_batch_command_applies_each_engine_its_way(tmp_path):
    """16 decodes after 30K, and extends of 100 and 512 tokens after 4000 and 4192 (sum 8192),
    on an H200 with an fp8 cache. sglang@0.5.14 (no piecewise graph) expands both extends: their
    summed prefix reaches 8192. sglang@0.5.23 absorbs them: 612 new tokens fit its 2048-token
    prefill graph. vLLM runs FlashMLA (FLASH_ATTN_MLA takes no fp8), threshold 128, UNIFORM: the
    decodes come first, and the 100-token extend's query differs from theirs (1), so it is a
    prefill although 100 <= 128."""
    path = tmp_path / "r.csv"
    path.write_text("new,prefix,count\n1,30000,16\n100,4000,1\n512,4192,1\n")
    args = ["batch", str(path), "--hardware", "h200", "--kv-dtype", "fp8", "--format", "json"]
    data = json.loads(runner.invoke(app, [*args, "--engines", "sglang@0.5.14,sglang@0.5.23,vllm"]).output)
    paths = [r["engine_paths"] for r in data["requests"]]
    assert [p["sglang@0.5.14"] for p in paths] == ["absorb", "expand", "expand"]
    assert [p["sglang@0.5.23"] for p in paths] == ["absorb", "absorb", "absorb"]
    assert [p["vllm"] for p in paths] == ["absorb", "expand_chunked", "expand_chunked"]
    engines = {e["name"]: e for e in data["engines"]}
    best = data["totals"][data["best_strategy"]]["time_s"]
    for e in engines.values():
        assert e["lost_s"] == pytest.approx(max(0.0, e["time_s"] - best)) and e["lost_s"] >= 0
    assert "sgl-project/sglang@0a8dcfa9" in engines["sglang@0.5.14"]["source"]
    assert engines["vllm"]["version"] == "0.33.0" and engines["vllm"]["backend"] == "FLASHMLA"
    assert engines["vllm"]["why"][0].startswith("vllm@0.33.0 on h200 (sm90), fp8 cache → FLASHMLA (threshold 128)")
    assert engines["sglang@0.5.23"]["options"]["piecewise_cuda_graph_max_tokens"] == 2048


def test_batch_row_split_by_vllm(tmp_path):
    """Two decodes, one 600-token extend, then a row of three no-context 10-token requests: the
    reorder puts the three last, behind the extend that ends the decodes (FLASH_ATTN_MLA, 512)."""
    path = tmp_path / "r.csv"
    path.write_text("new,prefix,count\n10,0,3\n5,100,2\n600,100,1\n")
    data = json.loads(
        runner.invoke(app, ["batch", str(path), "--hardware", "h200", "--engines", "vllm", "-f", "json"]).output
    )
    assert [r["engine_paths"]["vllm"] for r in data["requests"]] == ["expand", "absorb", "expand_chunked"]


def test_engines_command_sentence_and_json(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("batch,new,prefix,weight\n1,4096,1024,10\n1,1,4096,100\n8,16,32768,5\n")
    out = runner.invoke(app, ["engines", str(path), "--hardware", "h200"], env={"COLUMNS": "80"}).output
    assert re.search(r"sglang's chunked_prefix_cache_threshold 8192 on h200 for this workload: ", out), out
    assert "sglang@0.5.23 on h200 (sm90), bf16 cache → fa3" in out.replace("\n", " ")
    args = ["engines", str(path), "--hardware", "h200", "-f", "json", "--engines", "sglang@0.5.14,vllm"]
    data = json.loads(runner.invoke(app, args).output)
    assert data["schema"] == "mlactl.engines" and data["workload"]["shapes"] == 3
    sg = next(e for e in data["engines"] if e["name"] == "sglang@0.5.14")
    # Below 1025 both extends expand, and 8 x 16 new tokens after 32K expanding costs more (x5)
    # than the 4K prefill after 1K absorbing (x10); from 8192 the 8 x 32K = 262,144 sum still
    # expands; only above it do both absorb, which loses least.
    assert sg["sweep"]["current"] == 8192 and sg["sweep"]["best_range"] == [262145, None]
    assert sg["sweep"]["option"] == "chunked_prefix_cache_threshold"
    # ... chunked, since 8 x (32768 + 16) = 262,272 tokens exceed the 131,072 capacity
    assert sg["worst"][0]["new"] == 16 and sg["worst"][0]["path"] == "expand_chunked"
    assert sg["why"][0].startswith("sglang@0.5.14 on h200 (sm90), bf16 cache → fa3")


def test_engines_list():
    result = runner.invoke(app, ["engines", "--list", "-f", "json"])
    data = json.loads(result.output)
    names = [r["name"] for r in data["rule_sets"]]
    assert names == ["sglang@0.5.14", "sglang@0.5.23", "vllm@0014ca6b", "vllm@0.33.0"]
    v = {d["arch"] + "-" + d["kv_dtype"]: d["backend"] for d in data["rule_sets"][3]["defaults"]}
    assert v == {
        "sm80-bf16": "TRITON_MLA",
        "sm80-fp8": "TRITON_MLA",
        "sm89-bf16": "TRITON_MLA",  # Ada (L40S): FLASH_ATTN_MLA needs SM90, FLASHMLA SM90/SM100
        "sm89-fp8": "TRITON_MLA",
        "sm90-bf16": "FLASH_ATTN_MLA",
        "sm90-fp8": "FLASHMLA",
        "sm100-bf16": "FLASHINFER_MLA",
        "sm100-fp8": "FLASHINFER_MLA",
        "sm120-bf16": "TRITON_MLA",  # RTX PRO 6000: not capability 10, so the other list, and only Triton runs
        "sm120-fp8": "TRITON_MLA",
    }
    sglang = {d["arch"] + "-" + d["kv_dtype"]: d["backend"] for d in data["rule_sets"][1]["defaults"]}
    # server_args.py: MLA on Hopper fa3, on sm100 trtllm_mla (DeepSeek-V3), else triton
    assert [sglang[f"{a}-bf16"] for a in ("sm80", "sm89", "sm90", "sm100", "sm120")] == [
        "triton", "triton", "fa3", "trtllm_mla", "triton"
    ]  # fmt: skip
    assert data["rule_sets"][0]["source"]["commit"].startswith("0a8dcfa9")
    assert data["rule_sets"][1]["options"]["disable_piecewise_cuda_graph"]["default"] is False
    table = runner.invoke(app, ["engines", "--list"], env={"COLUMNS": "200"}).output
    assert "sglang@0.5.23 (newest)" in table and "enable_mixed_chunk" in table
    # vLLM has no sparse backend off SM90 and SM100: those DSA cells keep their marker however narrow the column
    vllm_dsa = [line for line in table.splitlines() if line.startswith("│ vllm@0.33.0 ") and "SPAR" in line]
    assert vllm_dsa and vllm_dsa[0].count("│ *FLASHMLA_SPAR") == 6  # sm80, sm89 and sm120, each cache dtype


# -- the analyze table at 80 and 100 columns ------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TYPED = ("expand", "chunked", "absorb", "sglang", "vllm", "sglang-triton", "sglang-trtllm", "deepseek-v3")


def terminal(args, columns):
    """Run as if on a terminal `columns` wide (rich honours TTY_COMPATIBLE and COLUMNS)."""
    result = runner.invoke(app, args, env={"COLUMNS": str(columns), "TTY_COMPATIBLE": "1"})
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


@pytest.mark.parametrize(
    "args, columns",
    [
        pytest.param(["analyze"], 80, id="default-80"),
        pytest.param(["analyze", "--batch", "1,64", "--prefix", "0,131072"], 80, id="wide-values-80"),
        pytest.param(["analyze", "--engines", "sglang,sglang-triton,sglang-trtllm,vllm"], 80, id="four-engines-80"),
        pytest.param(["analyze", "--policy", "flops"], 100, id="flops-100"),
        pytest.param(["analyze", "--policy", "sglang-trtllm"], 80, id="policy-80"),
    ],
)
def test_analyze_table_fits_and_cuts_nothing(args, columns):
    out = terminal(args, columns)
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= columns
    for name in ("sglang", "vllm") if "--engines" not in args else TYPED[3:7]:
        assert re.search(rf"[┃│] {re.escape(name)} +[┃│]", out), name
    assert "131072" in out or "131072" not in " ".join(args)
    # every path cell is a whole name, optionally with a loss or ✗
    for cell in re.findall(r"[│] ([a-z]+)(?: \+| ✗| +[│])", out):
        assert cell in ("expand", "chunked", "absorb"), cell


def test_analyze_piped_prints_every_column_in_full():
    result = runner.invoke(app, ["analyze", "--prefix", "0,131072"], env={"COLUMNS": "80"})
    out = result.output
    assert "…" not in out and "not shown at this width" not in out
    for header in ("mha*", "by FLOPs", "sglang", "vllm", "131072"):
        assert header in out


@pytest.mark.parametrize(
    "content, message",
    [
        ("prefix,weight\n1,2\n", "line 1: the header must name new"),
        ("new,prefix,weight,count\n1,2,3,4\n", "give weight or count, not both"),
        ("new,prefix,weight\n1,2,0\n", "line 2: weight '0' must be above 0 and at most 1e+12"),
        ("new,prefix,weight\n1,2,1e308\n", "line 2: weight '1e308' must be above 0 and at most 1e+12"),
        ("new,new,prefix\n1,2,3\n", "line 1: column 'new' is named twice"),
        ("new,prefix\n-0,2\n", "line 2: new '-0' is not a whole number"),
        ("new,prefix\n1.5,2\n", "line 2: new '1.5' is not a whole number"),
        ("new,prefix\n\u0664,2\n", "is not a whole number"),
        ("new,prefix,weight\n1,2,nan\n", "line 2: weight 'nan' must be a positive number"),
        ("batch,new,prefix\n0,1,2\n", "line 2: batch must be at least 1"),
        ("new,context\n10,5\n", "line 2: context 5 is shorter than new 10"),
        ("new,prefix\n", "no shapes after the header"),
    ],
)
def test_bad_workload_csv(tmp_path, content, message):
    path = tmp_path / "w.csv"
    path.write_text(content)
    one_error_line(["engines", str(path)], message)


def test_engines_csv_has_each_engines_path_and_loss(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("new,context,count\n4096,5120,3\n")  # prefix 1024, weight 3
    text = runner.invoke(app, ["engines", str(path), "--engines", "vllm", "-f", "csv"]).output
    header, row = text.splitlines()
    assert header == "batch,new,prefix,weight,best,best_time_s,vllm.path,vllm.time_lost_s"
    assert row.startswith("1,4096,1024,3,expand,") and ",expand_chunked," in row


def test_vllm_expands_context_at_its_own_chunk_size():
    # One 1024-token request after 32K (a prefill: 1024 > FLASH_ATTN_MLA's 512): its context fits
    # one 64K vLLM chunk, so its time cannot depend on --chunk, and it loses less than
    # 8192-token chunks would (one merge instead of four).
    args = ["analyze", "--hardware", "h200", "--engines", "vllm", "--new", "1024", "--prefix", "32K", "-f", "json"]
    lost = {}
    for chunk in ("8192", "65536"):
        row = json.loads(runner.invoke(app, [*args, "--chunk", chunk]).output)["rows"][0]
        assert row["engines"]["vllm"]["path"] == "expand_chunked"
        lost[chunk] = row["engines"]["vllm"]["time_lost_s"]
    assert lost["8192"] == pytest.approx(lost["65536"], rel=1e-12)
    old = CostModel(model.from_name("deepseek-v3"))  # what the engine lost when timed at --chunk 8192
    t = workload.path_times_for(old, hardware.from_name("h200"), 1, 1024, 32768)
    assert 0 < lost["8192"] < float(t["expand_chunked"] - min(t.values()))


def test_batch_times_vllm_chunks_at_its_workspace_over_its_prefills(tmp_path):
    # Three prefills of 1024 new tokens after 32K on FLASH_ATTN_MLA: vLLM chunks the context at
    # 65536 // 3 = 21845 -> 21840 tokens (rounded down to its 16-token block), whatever --chunk
    # says; mlactl's all_expand_chunked strategy at --chunk 21840 runs the same requests the same way.
    path = tmp_path / "r.csv"
    path.write_text("new,prefix,count\n1024,32768,3\n")
    args = ["batch", str(path), "--hardware", "h200", "--engines", "vllm", "--format", "json"]
    default = json.loads(runner.invoke(app, args).output)
    same = json.loads(runner.invoke(app, [*args, "--chunk", "21840"]).output)
    vllm = next(e for e in default["engines"] if e["name"] == "vllm")
    assert default["requests"][0]["engine_paths"]["vllm"] == "expand_chunked"
    assert vllm["time_s"] == pytest.approx(same["totals"]["all_expand_chunked"]["time_s"], rel=1e-12)
    assert vllm["time_s"] != pytest.approx(default["totals"]["all_expand_chunked"]["time_s"], rel=1e-6)
    assert vllm["lost_s"] >= 0


# -- the one reader: both commands read the same forms ---------------------------------------------------

FORMS = [
    ("new,prefix\n4K,1K\n", None),  # K = 1024 in both
    ("new,prefix\n-0,2\n", "new '-0' is not a whole number"),
    ("new,prefix\n+1,2\n", "new '+1' is not a whole number"),
    ("new,prefix\n1.5,2\n", "new '1.5' is not a whole number"),
    ("new,prefix\n\u0664,2\n", "is not a whole number"),  # ARABIC-INDIC DIGIT FOUR
    ("new,prefix\n1,\uff11\n", "is not a whole number"),  # FULLWIDTH DIGIT ONE
    ("new,new,prefix\n1,2,3\n", "column 'new' is named twice"),
    ("new,prefix\n3000000000,0\n", "new: '3000000000' is above the limit of 2,147,483,647"),
]


@pytest.mark.parametrize("content, message", FORMS, ids=[f"form-{i}" for i in range(len(FORMS))])
@pytest.mark.parametrize("command", ["batch", "engines"])
def test_both_commands_read_the_same_forms(tmp_path, command, content, message):
    path = tmp_path / "r.csv"
    path.write_text(content, encoding="utf-8")
    if message is None:  # 4K new after 1K: both read 4096 and 1024
        result = runner.invoke(app, [command, str(path), "-f", "csv"])
        assert result.exit_code == 0, result.output
        row = result.output.splitlines()[1]
        assert row.startswith("4096,1024," if command == "batch" else "1,4096,1024,"), row
        return
    one_error_line([command, str(path)], message)


def test_batch_takes_a_batch_column_and_refuses_weight(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("batch,new,prefix\n64,512,256\n")
    data = json.loads(runner.invoke(app, ["batch", str(path), "-f", "json", "--engines", "sglang@0.5.14"]).output)
    # 64 alike requests of 256 cached tokens: the summed prefix 16,384 >= 8192, so SGLang expands
    assert data["requests"][0]["count"] == 64 and data["requests"][0]["engine_paths"]["sglang@0.5.14"] == "expand"
    path.write_text("new,prefix,weight\n1,100,3\n")
    one_error_line(["batch", str(path)], "a weight column belongs to a workload (`mlactl engines`)")
    path.write_text("new,prefix,batch,count\n1,100,3,2\n")
    one_error_line(["batch", str(path)], "give count or batch")


def test_why_lines_in_every_command(tmp_path):
    data = json.loads(runner.invoke(app, ["analyze", "--hardware", "b200", "--kv-dtype", "fp8", "-f", "json"]).output)
    why = {e["name"]: e["why"][0] for e in data["engines"]}
    assert why["vllm"].startswith("vllm@0.33.0 on b200 (sm100), fp8 cache → FLASHINFER_MLA (threshold 1)")
    assert why["sglang"].startswith("sglang@0.5.23 on b200 (sm100), fp8 cache → trtllm_mla")
    sg = next(e for e in data["engines"] if e["name"] == "sglang")
    assert sg["version"] == "0.5.23" and sg["options"]["enable_mixed_chunk"] is False and sg["options_set"] == []
    table = runner.invoke(app, ["analyze", "--hardware", "h200"], env={"COLUMNS": "300"}).output
    assert "vllm@0.33.0 on h200 (sm90), bf16 cache → FLASH_ATTN_MLA (threshold 512)" in table
    path = tmp_path / "r.csv"
    path.write_text("new,prefix\n1,100\n")
    out = runner.invoke(app, ["batch", str(path), "--hardware", "h200"], env={"COLUMNS": "300"}).output
    assert "sglang@0.5.23 on h200 (sm90), bf16 cache → fa3" in out


# -- DeepSeek-V3.2 (DSA): the engines' DSA rules on a workload -------------------------------------------

V32 = model.from_name("deepseek-v3.2")


def dsa_brute(wl, params, hw):
    """The workload's weighted time under rule `params`, path by path, each path timed the way the
    engine runs it: roofline sums of cost.py's ops, with vLLM's whole indexer in its dense MHA and
    its own context chunk in masked MHA (computed here, not through workload.engine_times)."""
    cfg = V32.with_tp(params.ctx.tp)
    profile = hardware.from_name(hw)
    peak, bw = profile.peak_flops("bf16"), profile.bandwidth
    cost = CostModel(cfg, dense_indexer="full" if params.family == "vllm" else "key")
    if params.family == "vllm":
        cost = CostModel(cfg, dense_indexer="full", chunk=65536)
    chosen = grid_paths(params, wl.batch, wl.new, wl.prefix)
    total = 0.0
    for i, path in enumerate(chosen):
        ops = cost.ops(str(path), int(wl.batch[i]), int(wl.new[i]), int(wl.prefix[i]))
        total += wl.weight[i] * sum(max(float(o.flops) / peak, float(o.bytes) / bw) for o in ops)
    return total


def dsa_report(wl, engines, hw, tp=1, options=()):
    cfg, profile = V32.with_tp(tp), hardware.from_name(hw)
    return workload.report(
        CostModel(cfg), profile, wl, parse_engines(engines, list(options), context_for(cfg, profile))
    )


DSA_GRID = np.array([(b, n, p) for b in (1, 3) for n in (1, 200, 700, 1500, 3000) for p in (0, 300, 1000, 5000)]).T


def test_sglang_dsa_sweep_is_the_brute_force_minimum():
    """sglang@0.5.14 (no prefill graph for DSA): the dense threshold swept over the grid's longest
    sequences equals the minimum of the rule re-run at each threshold."""
    wl = workload.grid_workload(*DSA_GRID)
    (e,) = dsa_report(wl, "sglang@0.5.14", "h200").engines
    s = e.sweep
    assert s.option == "nsa_prefill_dense_attn_kv_len_threshold" and s.current == 2048
    ctx = context_for(V32, hardware.from_name("h200"))
    brute = {
        t: dsa_brute(
            wl, parse_engines("sglang@0.5.14", [f"nsa_prefill_dense_attn_kv_len_threshold={t}"], ctx)[0], "h200"
        )
        for t in (0, 1, 199, 200, 201, 700, 1000, 1300, 1700, 2000, 2047, 2048)
    }
    assert s.best_time_s == pytest.approx(min(brute.values()), rel=1e-9)
    assert s.current_time_s == pytest.approx(brute[2048], rel=1e-9)
    lo, hi = s.best_range
    for t in (s.best, lo, hi):
        p = parse_engines("sglang@0.5.14", [f"nsa_prefill_dense_attn_kv_len_threshold={t}"], ctx)[0]
        assert dsa_brute(wl, p, "h200") == pytest.approx(s.best_time_s, rel=1e-9)
    assert e.loss.time_s == pytest.approx(brute[2048], rel=1e-9)  # the rule's own time, path by path


def test_vllm_masked_table_sweep_is_the_brute_force_minimum():
    """vllm@0.33.0 on a B200 at TP 8: each bucket's least query length swept equals the minimum of
    the rule re-run with that entry of the table replaced (None: never)."""
    from dataclasses import replace

    wl = workload.grid_workload(*np.array([(1, n, p) for n in (200, 700, 1500, 3000, 9000) for p in (0, 2500, 7000)]).T)
    (e,) = dsa_report(wl, "vllm@0.33.0", "b200", tp=8).engines
    p = e.params
    assert p.masked_row == (512, 512, 1024, 2048, 16384)
    masked = [s for s in e.sweeps if s.option.startswith("masked")]
    assert masked, e.sweeps
    assert e.loss.time_s == pytest.approx(dsa_brute(wl, p, "b200"), rel=1e-9)
    for s in masked:
        bucket = [i for i, b in enumerate(p.ruleset.dsa.buckets) if f"-{b:,})" in s.option][0]

        def with_entry(m, bucket=bucket):
            row = list(p.masked_row)
            row[bucket] = m
            return dsa_brute(wl, replace(p, masked_row=tuple(row)), "b200")

        tries = {m: with_entry(m) for m in (None, 1, 199, 200, 201, 699, 700, 1500, 3000, 9000)}
        assert s.best_time_s == pytest.approx(min(tries.values()), rel=1e-9)
        assert s.current_time_s == pytest.approx(with_entry(p.masked_row[bucket]), rel=1e-9)
        assert with_entry(s.best) == pytest.approx(s.best_time_s, rel=1e-9)


def test_dsa_engines_command(tmp_path):
    """`mlactl engines` on DeepSeek-V3.2 judges both engines' DSA rules (the shorthands fix dense
    backends, so the default is sglang and vllm), with their sweeps and why lines."""
    data = json.loads(
        runner.invoke(app, ["engines", "-m", "deepseek-v3.2", "-g", "b200", "--tp", "8", "-f", "json"]).output
    )
    assert [e["name"] for e in data["engines"]] == ["sglang", "vllm"]
    sg, vl = data["engines"]
    assert sg["backend"] == "dsa" and sg["dsa"] == {"dense_threshold": 2048, "dense_possible": True}
    assert vl["backend"] == "FLASHMLA_SPARSE" and vl["dsa"]["masked_min_query_len"] == [512, 512, 1024, 2048, 16384]
    assert vl["sweep"]["option"] == "reorder_batch_threshold"
    assert any(s["option"].startswith("masked MHA least query length") for s in vl["sweeps"])
    assert {w["path"] for e in data["engines"] for w in e["worst"]} <= {
        "sparse_absorb",
        "dense_expand",
        "masked_expand",
    }
    out = runner.invoke(app, ["engines", "-m", "deepseek-v3.2", "-g", "b200", "--tp", "8"], env={"COLUMNS": "200"})
    assert "masked MHA least query length" in out.output and "sglang: sglang@0.5.23 on b200 (sm100)" in out.output
    bad = runner.invoke(app, ["engines", "-m", "deepseek-v3.2", "--engines", "sglang-triton"])
    assert bad.exit_code == 2 and bad.output.startswith("Error: sglang@0.5.23: deepseek-v3.2 is a DSA model")


def test_dsa_dense_mha_costs_vllm_its_whole_indexer():
    """vLLM's dense MHA runs the indexer in full, SGLang's writes only the key: at 512 new tokens,
    no prefix (dense for both, no graph for 0.5.14), vLLM's time exceeds SGLang's by exactly the
    indexer's projections, logits and top-k less its key (roofline sums, computed here)."""
    profile = hardware.from_name("h200")
    peak, bw = profile.peak_flops("bf16"), profile.bandwidth
    wl = workload.grid_workload([1], [512], [0])
    report = dsa_report(wl, "sglang@0.5.14,vllm", "h200")
    sg, vl = report.engines
    assert sg.paths[0] == vl.paths[0] == "dense_expand"
    ops = {o.name: o for o in CostModel(V32).ops("sparse_absorb", 1, 512, 0)}
    key = {o.name: o for o in CostModel(V32).ops("dense_expand", 1, 512, 0)}["indexer_key"]

    def roof(o):
        return max(float(o.flops) / peak, float(o.bytes) / bw)

    extra = roof(ops["indexer_proj"]) + roof(ops["indexer"]) + roof(ops["topk"]) - roof(key)
    assert vl.loss.time_s - sg.loss.time_s == pytest.approx(extra, rel=1e-9)
    assert sg.loss.lost_s == 0 and vl.loss.lost_s == pytest.approx(extra, rel=1e-9)


def test_sweep_sentences():
    """The sentence for each kind of sweep result, `off` included (vLLM's masked MHA never)."""
    from types import SimpleNamespace

    from mlactl.output.engines import sentence

    result = SimpleNamespace(hw=SimpleNamespace(name="b200"))
    e = SimpleNamespace(params=SimpleNamespace(engine="vllm"))

    def say(current, best, rng, now, then):
        return sentence(result, e, workload.Sweep("vllm", "m", current, now, best, rng, then, []))

    assert say(1024, 256, (1, 256), 1.0, 0.9).endswith("m 1024 on b200 for this workload: best threshold 256 "
                                                        "(any threshold from 1 to 256), saves 10.0%")  # fmt: skip
    assert say(None, 700, (600, 700), 1.0, 0.5).endswith("m off on b200 for this workload: best threshold 700 "
                                                         "(any threshold from 600 to 700), saves 50.0%")  # fmt: skip
    assert say(512, None, (9001, None), 2.0, 1.0).endswith("best threshold off (off, or any threshold from 9001 up), "
                                                           "saves 50.0%")  # fmt: skip
    assert say(2048, 2048, (2048, 2048), 1.0, 1.0).endswith("already the best (no other threshold does as well)")
    assert say(64, 1, (1, None), 1.0, 1.0).endswith("already the best (any threshold from 1 up does as well)")
