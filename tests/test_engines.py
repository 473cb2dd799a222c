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
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide import workload
from mlactl.decide.engines import (
    batch_paths,
    default_params,
    grid_paths,
    parse_engines,
    time_lost,
    vllm_context_chunk,
)
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel
from mlactl.util.errors import MlactlError

runner = CliRunner()

# -- the second implementation: the handlers' if/else, one scheduler batch at a time ----------------


def sglang_reference(engine, requests, threshold=8192, capacity=131072, backend="fa3"):
    """`requests`: (new, prefix) of every request the scheduler put in the step. SGLang runs the
    decodes (one token after a prefix) as a decode batch and the rest as one extend batch."""
    decodes = [r for r in requests if r[0] == 1 and r[1] > 0]
    extends = [r for r in requests if not (r[0] == 1 and r[1] > 0)]
    sum_extend_prefix_lens = 0
    sum_seq_lens = 0
    for new, prefix in extends:
        sum_extend_prefix_lens += prefix
        sum_seq_lens += prefix + new
    if engine == "sglang":  # _handle_attention_backend, chunked prefix cache on
        if sum_extend_prefix_lens >= threshold or sum_extend_prefix_lens == 0:
            if backend in ("fa3", "flashinfer", "flashmla") and sum_seq_lens <= capacity:
                extend_method = "MHA_ONE_SHOT"
            else:
                extend_method = "MHA_CHUNKED_KV"
        else:
            extend_method = "MLA"
    elif engine == "sglang-triton":  # handle_attention_triton
        extend_method = "MHA" if sum_extend_prefix_lens == 0 else "MLA"
    else:  # handle_attention_trtllm_mla, chunked prefix cache on
        extend_method = "MHA_CHUNKED_KV"
    name = {"MHA_ONE_SHOT": "expand", "MHA": "expand", "MHA_CHUNKED_KV": "expand_chunked", "MLA": "absorb"}
    return ["absorb" if r in decodes else name[extend_method] for r in requests]


def vllm_reference(requests, threshold=128):
    """split_decodes_and_prefills: query length <= reorder_batch_threshold is a decode; a prefill
    with context runs the chunked-context loop, without context plain MHA."""
    out = []
    for new, prefix in requests:
        if new <= threshold:
            out.append("absorb")
        elif prefix > 0:
            out.append("expand_chunked")
        else:
            out.append("expand")
    return out


# -- the table of cases, worked by hand --------------------------------------------------------------

D = 8192  # SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD
CAP = 128 * 1024  # SGLANG_MAX_KV_CHUNK_CAPACITY

SGLANG_CASES = [
    # (id, engine, options, requests, expected)
    ("sum-below-threshold", "sglang", {}, [(512, D - 1)], ["absorb"]),
    ("sum-at-threshold", "sglang", {}, [(512, D)], ["expand"]),
    ("two-summing-below", "sglang", {}, [(512, 4095), (64, 4096)], ["absorb", "absorb"]),
    ("two-summing-to-threshold", "sglang", {}, [(512, 4096), (64, 4096)], ["expand", "expand"]),
    ("64x256-sums-16384", "sglang", {}, [(512, 256)] * 64, ["expand"] * 64),
    ("no-prefix", "sglang", {}, [(4096, 0)], ["expand"]),
    ("one-token-no-prefix-is-extend", "sglang", {}, [(1, 0)], ["expand"]),
    ("capacity-exactly", "sglang", {}, [(4096, CAP - 4096)], ["expand"]),
    ("capacity-plus-one", "sglang", {}, [(4096, CAP - 4095)], ["expand_chunked"]),
    ("no-prefix-over-capacity", "sglang", {}, [(4096, 0)] * 33, ["expand_chunked"] * 33),
    ("decode", "sglang", {}, [(1, 32768)], ["absorb"]),
    ("decodes-never-sum", "sglang", {}, [(1, 32768)] * 64, ["absorb"] * 64),
    ("cutlass-never-one-shot", "sglang", {"backend": "cutlass_mla"}, [(512, D)], ["expand_chunked"]),
    ("threshold-4096", "sglang", {"threshold": 4096}, [(512, 4096)], ["expand"]),
    (
        "mixed-decodes-apart",
        "sglang",
        {},
        [(1, 30000), (512, 4000), (512, 4192), (1, 100)],
        ["absorb", "expand", "expand", "absorb"],
    ),
    ("mixed-below", "sglang", {}, [(1, 30000), (512, 4000), (512, 4191)], ["absorb", "absorb", "absorb"]),
    ("triton-no-prefix", "sglang-triton", {}, [(4096, 0)] * 33, ["expand"] * 33),
    ("triton-any-prefix", "sglang-triton", {}, [(4096, 0), (512, 1)], ["absorb", "absorb"]),
    ("triton-decode", "sglang-triton", {}, [(1, 5)], ["absorb"]),
    ("trtllm-extend", "sglang-trtllm", {}, [(16, 100), (4096, 0)], ["expand_chunked", "expand_chunked"]),
    ("trtllm-decode", "sglang-trtllm", {}, [(1, 100)], ["absorb"]),
]

VLLM_CASES = [
    ("decode", {}, [(1, 32768)], ["absorb"]),
    ("threshold-minus-one", {}, [(127, 1000)], ["absorb"]),
    ("at-threshold", {}, [(128, 1000)], ["absorb"]),
    ("threshold-plus-one", {}, [(129, 1000)], ["expand_chunked"]),
    ("plus-one-no-context", {}, [(129, 0)], ["expand"]),
    ("short-no-context", {}, [(64, 0)], ["absorb"]),
    ("fa-mla-512", {"backend": "flash_attn_mla"}, [(512, 10), (513, 10)], ["absorb", "expand_chunked"]),
    ("threshold-option", {"threshold": 16}, [(16, 10), (17, 10)], ["absorb", "expand_chunked"]),
    (
        "mixed-per-request",
        {},
        [(1, 30000), (4096, 0), (200, 20000), (100, 50)],
        ["absorb", "expand", "expand_chunked", "absorb"],
    ),
]


def params(engine, options):
    return parse_engines(engine, [f"{k}={v}" for k, v in options.items()])[0]


@pytest.mark.parametrize(
    "engine, options, requests, expected", [c[1:] for c in SGLANG_CASES], ids=[c[0] for c in SGLANG_CASES]
)
def test_sglang_rules(engine, options, requests, expected):
    assert sglang_reference(engine, requests, **options) == expected
    new, prefix = np.array(requests).T
    assert list(batch_paths(params(engine, options), new, prefix, np.ones_like(new))) == expected


@pytest.mark.parametrize("options, requests, expected", [c[1:] for c in VLLM_CASES], ids=[c[0] for c in VLLM_CASES])
def test_vllm_rules(options, requests, expected):
    threshold = options.get("threshold", 512 if options.get("backend") == "flash_attn_mla" else 128)
    assert vllm_reference(requests, threshold) == expected
    new, prefix = np.array(requests).T
    assert list(batch_paths(params("vllm", options), new, prefix, np.ones_like(new))) == expected


def test_count_rows_are_that_many_requests():
    """A CSV row with count 64 is 64 requests: 64 x 256 sums to 16,384 >= 8192."""
    p = default_params("sglang")
    assert list(batch_paths(p, [512], [256], [64])) == ["expand"]
    assert list(batch_paths(p, [512], [256], [31])) == ["absorb"]  # 7936


def test_grid_point_is_a_batch_of_alike_requests():
    p = default_params("sglang")
    got = grid_paths(p, batch=[1, 32, 64, 64, 33], new=[512, 512, 512, 1, 4096], prefix=[256, 255, 256, 256, 0])
    # 256 < 8192; 32*255 = 8160 < 8192; 64*256 = 16384; decode; 33*4096 = 135168 > capacity
    assert list(got) == ["absorb", "absorb", "expand", "absorb", "expand_chunked"]


requests_st = st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 20000)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(requests=requests_st, engine=st.sampled_from(["sglang", "sglang-triton", "sglang-trtllm"]))
def test_sglang_matches_reference_on_random_batches(requests, engine):
    new, prefix = np.array(requests).T
    got = batch_paths(default_params(engine), new, prefix, np.ones_like(new))
    assert list(got) == sglang_reference(engine, requests)


@settings(max_examples=200, deadline=None)
@given(requests=requests_st)
def test_vllm_matches_reference_on_random_batches(requests):
    new, prefix = np.array(requests).T
    assert list(batch_paths(default_params("vllm"), new, prefix, np.ones_like(new))) == vllm_reference(requests)


def test_vllm_context_chunk():
    """The 64K workspace split over the prefills with context, rounded down to a 64-token page."""
    p = default_params("vllm")
    assert vllm_context_chunk(1, p) == 65536
    assert vllm_context_chunk(3, p) == 21824  # 21845 -> 21824
    assert vllm_context_chunk(7, p) == 9344  # 9362 -> 9344
    assert vllm_context_chunk(0, p) == 0


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
    cost = CostModel(model.from_name("deepseek-v3"))
    return workload.report(cost, hardware.from_name(hw), wl, parse_engines(engines))


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
        p = parse_engines(engine, [f"threshold={t}"])[0]
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
    brute = brute_force(wl, "vllm", [1, 15, 16, 63, 64, 99, 100, 128, 255, 256, 1023, 1024, 4096])
    assert sweep.best_time_s == pytest.approx(min(brute.values()))
    assert sweep.current_time_s == pytest.approx(brute[128])
    assert 0 <= sweep.saves <= 1


def test_weights_scale_the_loss(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("batch,new,prefix,weight\n1,4096,1024,10\n1,1,4096,1\n")
    wl = workload.read_workload(path)
    assert list(wl.weight) == [10.0, 1.0]
    report = v3_report(wl, "sglang")
    e = report.engines[0]
    assert list(e.paths) == ["absorb", "absorb"]  # 1024 < 8192; decode
    assert e.lost_s == pytest.approx(10 * e.lost[0]) and e.lost[1] == 0
    assert report.worst(e) == [0]


# -- command line ----------------------------------------------------------------------------------------


def one_error_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0], lines[0]


KNOWN = "choose from sglang, sglang-triton, sglang-trtllm, vllm"
BAD = [
    (["analyze", "--engines", "tensorrt"], f"unknown engine 'tensorrt'; {KNOWN}"),
    (["analyze", "--policy", "fixed"], "--policy must be one of roofline, flops, measured, sglang"),
    (["analyze", "--engine-option", "sglang.bogus=1"], "unknown option 'bogus' for sglang"),
    (["analyze", "--engine-option", "foo.threshold=1"], f"unknown engine 'foo'; {KNOWN}"),
    (["analyze", "--engine-option", "sglang.threshold=abc"], "sglang.threshold must be a positive integer, got 'abc'"),
    (["analyze", "--engine-option", "sglang.threshold=0"], "must be a positive integer, got '0'"),
    (["analyze", "--engine-option", "vllm.threshold=-5"], "must be a positive integer, got '-5'"),
    (["analyze", "--engine-option", "vllm.threshold=1.5"], "must be a positive integer, got '1.5'"),
    (["analyze", "--engine-option", "threshold=4096"], "threshold belongs to sglang and vllm"),
    (["analyze", "--engine-option", "threshold"], "takes [ENGINE.]KEY=VALUE"),
    (["analyze", "--engine-option", "vllm.backend=triton"], "vllm backend must be one of flashmla, flash_attn_mla"),
    (["analyze", "--threshold", "8192"], "No such option"),
    (["engines", "--engines", "sglang,x"], f"unknown engine 'x'; {KNOWN}"),
    (["engines", "--engine-option", "sglang.threshold=0"], "must be a positive integer"),
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


def test_bare_option_goes_to_the_one_engine_that_has_it():
    (p,) = parse_engines("sglang", ["threshold=4096"])
    assert p.threshold == 4096 and p.label == "sglang(threshold=4096)"
    (v,) = parse_engines("vllm", ["backend=flash_attn_mla"])
    assert v.threshold == 512  # the backend brings its own threshold
    (v,) = parse_engines("vllm", ["threshold=64", "backend=flash_attn_mla"])
    assert v.threshold == 64  # ... unless one was given
    with pytest.raises(MlactlError, match="unknown option 'threshold' for sglang-triton"):
        parse_engines("sglang-triton", ["threshold=1"])


def test_batch_command_applies_each_engine_its_way(tmp_path):
    """16 decodes after 30K, and extends after 4000 and 4192 (sum 8192): SGLang expands both
    extends; vLLM keeps the 100-token one on the decode path and chunks the 512-token one."""
    path = tmp_path / "r.csv"
    path.write_text("new,prefix,count\n1,30000,16\n100,4000,1\n512,4192,1\n")
    data = json.loads(runner.invoke(app, ["batch", str(path), "--format", "json"]).output)
    paths = [r["engine_paths"] for r in data["requests"]]
    assert [p["sglang"] for p in paths] == ["absorb", "expand", "expand"]
    assert [p["vllm"] for p in paths] == ["absorb", "absorb", "expand_chunked"]
    engines = {e["name"]: e for e in data["engines"]}
    best = data["totals"][data["best_strategy"]]["time_s"]
    for e in engines.values():
        assert e["lost_s"] == pytest.approx(e["time_s"] - best) and e["lost_s"] >= 0
    assert "sgl-project/sglang@0a8dcfa9" in engines["sglang"]["source"]


def test_engines_command_sentence_and_json(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("batch,new,prefix,weight\n1,4096,1024,10\n1,1,4096,100\n8,16,32768,5\n")
    out = runner.invoke(app, ["engines", str(path), "--hardware", "h200"], env={"COLUMNS": "80"}).output
    assert re.search(r"sglang's threshold 8192 on h200 for this workload: best threshold \d+", out), out
    data = json.loads(runner.invoke(app, ["engines", str(path), "--hardware", "h200", "-f", "json"]).output)
    assert data["schema"] == "mlactl.engines" and data["workload"]["shapes"] == 3
    sg = next(e for e in data["engines"] if e["name"] == "sglang")
    # Below 1025 both extends expand, and 8 x 16 new tokens after 32K expanding costs more (x5)
    # than the 4K prefill after 1K absorbing (x10); from 8192 the 8 x 32K = 262,144 sum still
    # expands; only above it do both absorb, which loses least.
    assert sg["sweep"]["current"] == 8192 and sg["sweep"]["best_range"] == [262145, None]
    # ... chunked, since 8 x (32768 + 16) = 262,272 tokens exceed the 131,072 capacity
    assert sg["worst"][0]["new"] == 16 and sg["worst"][0]["path"] == "expand_chunked"


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
        ("new,prefix,weight\n1,2,0\n", "line 2: weight '0' must be a positive number"),
        ("new,prefix,weight\n1,2,nan\n", "line 2: weight 'nan' must be a positive number"),
        ("batch,new,prefix\n0,1,2\n", "line 2: new and batch must be at least 1"),
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
    # vLLM sizes a context chunk as its 64K workspace over the prefills with context, rounded down
    # to the 64-token page (hand: 65536 // 3 = 21845 -> 21824); mlactl's --chunk does not apply.
    from mlactl.decide.engines import chunk_sizes

    vllm = parse_engines("vllm")[0]
    assert chunk_sizes(vllm, [1, 3, 2048, 4096]).tolist() == [65536, 21824, 64, 64]
    assert chunk_sizes(parse_engines("sglang")[0], [1]) is None
    # one request with a 32K prefix: its context fits one vLLM chunk, so its time cannot depend
    # on --chunk, and it loses less than 8192-token chunks would (one merge instead of four)
    args = ["analyze", "--hardware", "h200", "--engines", "vllm", "--new", "256", "--prefix", "32K", "-f", "json"]
    lost = {}
    for chunk in ("8192", "65536"):
        row = json.loads(runner.invoke(app, [*args, "--chunk", chunk]).output)["rows"][0]
        assert row["engines"]["vllm"]["path"] == "expand_chunked"
        lost[chunk] = row["engines"]["vllm"]["time_lost_s"]
    assert lost["8192"] == pytest.approx(lost["65536"], rel=1e-12)
    old = CostModel(model.from_name("deepseek-v3"))  # what the engine lost when timed at --chunk 8192
    t = workload.path_times_for(old, hardware.from_name("h200"), 1, 256, 32768)
    assert 0 < lost["8192"] < float(t["expand_chunked"] - min(t.values()))


def test_batch_times_vllm_chunks_at_its_workspace_over_its_prefills(tmp_path):
    # Three prefills of 512 new tokens after 32K: vLLM chunks the context at 65536 // 3 -> 21824
    # tokens (rounded down to 64), whatever --chunk says; mlactl's all_expand_chunked strategy at
    # --chunk 21824 runs the same three requests the same way.
    path = tmp_path / "r.csv"
    path.write_text("new,prefix,count\n512,32768,3\n")
    args = ["batch", str(path), "--hardware", "h200", "--engines", "vllm", "--format", "json"]
    default = json.loads(runner.invoke(app, args).output)
    same = json.loads(runner.invoke(app, [*args, "--chunk", "21824"]).output)
    vllm = next(e for e in default["engines"] if e["name"] == "vllm")
    assert default["requests"][0]["engine_paths"]["vllm"] == "expand_chunked"
    assert vllm["time_s"] == pytest.approx(same["totals"]["all_expand_chunked"]["time_s"], rel=1e-12)
    assert vllm["time_s"] != pytest.approx(default["totals"]["all_expand_chunked"]["time_s"], rel=1e-6)
    assert vllm["lost_s"] >= 0
