"""A DSA model (DeepSeek-V3.2) through analyze, crossover, batch, engines and plot: its three paths,
where dense MHA may run, the windows where an expand path beats sparse absorb, and what is said
about the engines' rules (not modelled yet for DSA)."""

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide import analysis
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel

V32 = model.from_name("deepseek-v3.2")
H200 = hardware.from_name("h200")
runner = CliRunner()


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def test_analyze_json_has_the_dsa_paths():
    data = json.loads(
        run(
            "analyze", "-m", "deepseek-v3.2", "-g", "h200", "--new", "1,512,4096", "--prefix", "0,1K,32K", "-f", "json"
        ).output
    )
    assert data["model"]["topk"] == 2048 and data["model"]["index_heads"] == 64
    assert data["engines"] == []
    assert any("not modelled yet" in note for note in data["notes"])
    for row in data["rows"]:
        assert set(row["paths"]) == {"sparse_absorb", "masked_expand", "dense_expand"}
        assert row["engines"] == {}
        context = row["prefix"] + row["new"]
        assert row["paths"]["dense_expand"]["runs"] is (context <= 2048)
        assert row["paths"]["sparse_absorb"]["runs"] is True
        if context > 2048:
            assert row["best"] != "dense_expand" and row["best_by_flops"] != "dense_expand"
        names = [op["name"] for op in row["paths"]["sparse_absorb"]["ops"]]
        assert names == ["indexer_proj", "indexer", "topk", "q_absorb", "attention", "out_absorb"]
    decode = next(r for r in data["rows"] if (r["new"], r["prefix"]) == (1, 32768))
    att = decode["paths"]["sparse_absorb"]["ops"][4]
    assert att["flops"] == 570_425_344
    assert decode["paths"]["sparse_absorb"]["ops"][1]["flops"] == 536_887_296
    assert decode["best"] == "sparse_absorb"
    by_prefix = {r["prefix"]: r for r in data["crossover"]["by_prefix"]}
    assert by_prefix[0]["masked_expand"]["by_flops"] == {"first": 1, "last": 12_812, "count": 12_812}
    assert by_prefix[32768]["masked_expand"]["by_flops"] is None


def test_analyze_csv_columns():
    text = run("analyze", "-m", "deepseek-v3.2", "-g", "h200", "--new", "1,4096", "--prefix", "0", "-f", "csv").output
    rows = list(csv.DictReader(io.StringIO(text)))
    assert "sparse_absorb.time_s" in rows[0] and "mha.time_s" not in rows[0]
    assert [r["dense_expand.runs"] for r in rows] == ["true", "false"]


def test_analyze_table_marks_dense_not_applicable():
    out = run("analyze", "-m", "deepseek-v3.2", "-g", "h200", "--new", "4096", "--prefix", "0").output
    assert "n/a" in out and "sparse" in out and "masked" in out


@pytest.mark.parametrize("policy", ["sglang", "vllm", "measured"])
def test_engine_and_measured_policies_refused_for_dsa(policy):
    out = run("analyze", "-m", "deepseek-v3.2", "--policy", policy, code=2).output
    assert out.startswith("Error:") and "DSA" in out


def test_flops_policy_on_dsa():
    data = json.loads(
        run(
            "analyze", "-m", "deepseek-v3.2", "--new", "4096,16384", "--prefix", "0", "--policy", "flops", "-f", "json"
        ).output
    )
    # 4096 < 12,812 < 16,384: masked MHA takes fewer FLOPs first, sparse absorb then
    assert [r["policy"]["path"] for r in data["rows"]] == ["masked_expand", "sparse_absorb"]


# -- the windows ---------------------------------------------------------------------------------------


def plain_time(cost: CostModel, path: str, n: int, p: int) -> float:
    """Roofline seconds summed over ops, computed here from FLOPs and bytes: max(F/peak, B/bw)."""
    return sum(
        max(float(op.flops) / H200.peak_flops("bf16"), float(op.bytes) / H200.bandwidth)
        for op in cost.ops(path, 1, n, p)
    )


@pytest.mark.parametrize("prefix", [0, 1024, 4096])
def test_window_edges_by_roofline(prefix):
    """At the window's first and last new-token counts masked MHA is faster than sparse absorb;
    just outside, it is not (times summed here from each op's roofline)."""
    cost = CostModel(V32)
    row = analysis.crossover_table(cost, H200, [(1, prefix)]).windows[0]
    w = row.masked_by_time
    assert w is not None and w.count == w.last - w.first + 1

    def masked_wins(n):
        return plain_time(cost, "masked_expand", n, prefix) < plain_time(cost, "sparse_absorb", n, prefix)

    assert masked_wins(w.first) and masked_wins(w.last) and not masked_wins(w.last + 1)
    if w.first > 1:
        assert not masked_wins(w.first - 1)


def test_no_window_after_a_long_prefix():
    row = analysis.crossover_table(CostModel(V32), H200, [(1, 32768)]).windows[0]
    assert (row.masked_by_flops, row.masked_by_time, row.dense_by_time) == (None, None, None)


def test_dense_window_stays_within_topk():
    row = analysis.crossover_table(CostModel(V32), H200, [(1, 1024)]).windows[0]
    assert row.dense_by_time is not None and row.dense_by_time.last + 1024 <= 2048


def test_crossover_cli_csv_and_json():
    text = run("crossover", "-m", "deepseek-v3.2", "-g", "h200", "--prefix", "0,8K", "-f", "csv").output
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["masked_by_flops.last"] == "12812"
    assert rows[1]["masked_by_flops.first"] == "nan"  # none after 8K (as the MLA crossover CSV writes it)
    data = json.loads(run("crossover", "-m", "deepseek-v3.2", "-g", "h200", "--prefix", "0", "-f", "json").output)
    assert data["crossover"]["asymptotic_new"] is None
    assert data["crossover"]["by_prefix"][0]["dense_expand"]["by_time"]["last"] == 2048


# -- batch, engines, plot -------------------------------------------------------------------------------


def test_batch_strategies(tmp_path):
    requests = tmp_path / "requests.csv"
    requests.write_text("new,prefix,count\n1,8000,10\n512,0,1\n4000,1000,2\n")
    data = json.loads(run("batch", str(requests), "-m", "deepseek-v3.2", "-g", "h200", "-f", "json").output)
    assert set(data["totals"]) == {"per_request", "all_sparse_absorb", "all_masked_expand", "all_dense_expand"}
    assert data["totals"]["all_dense_expand"]["time_s"] is None  # two rows have more than 2048 tokens
    assert [r["path"] for r in data["requests"]] == ["sparse_absorb", "dense_expand", "masked_expand"]
    assert data["best_strategy"] == "per_request"
    assert data["engines"] == []


def test_engines_on_dsa_judges_none():
    data = json.loads(run("engines", "-m", "deepseek-v3.2", "-g", "h200", "-f", "json").output)
    assert data["engines"] == [] and data["best_time_s"] > 0
    assert "not modelled yet" in data["notes"][0]
    out = run("engines", "-m", "deepseek-v3.2", "-g", "h200").output
    assert "best path everywhere" in out


def test_pathmap_data_for_dsa(tmp_path):
    pytest.importorskip("matplotlib")
    image, drawn = tmp_path / "map.png", tmp_path / "map.json"
    run("plot", "pathmap", "-m", "deepseek-v3.2", "-g", "h200", "--new", "1,512,4096", "--prefix", "0,1024,32768",
        "-o", str(image), "--data", str(drawn))  # fmt: skip
    data = json.loads(drawn.read_text())
    best = np.asarray(data["best"])  # [prefix][new]
    assert best[0].tolist() == ["dense_expand", "dense_expand", "masked_expand"]
    assert best[2, 0] == "sparse_absorb"
    # dense MHA is never the best past 2048 tokens of context
    ctx = np.add.outer(np.asarray(data["prefix"]), np.asarray(data["new"]))
    assert not np.any((best == "dense_expand") & (ctx > 2048))
    refused = run("plot", "pathmap", "-m", "deepseek-v3.2", "--policy", "sglang", "-o", str(image), code=2).output
    assert refused.startswith("Error:")


def test_pathmap_csv_data_writes(tmp_path):
    pytest.importorskip("matplotlib")
    drawn = tmp_path / "map.csv"
    run("plot", "pathmap", "-g", "h200", "--new", "1,512", "--prefix", "0,1024", "--policy", "sglang",
        "-o", str(tmp_path / "m.png"), "--data", str(drawn))  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(drawn.read_text())))
    assert rows[0]["policy"] == "sglang" and rows[0]["policy_path"] in ("expand", "expand_chunked", "absorb")
