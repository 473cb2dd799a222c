"""A DSA model (DeepSeek-V3.2) through analyze, crossover, batch, engines and plot: its three paths,
where dense MHA may run, the windows where an expand path beats sparse absorb, and the engines'
DSA rules in each command (their cases are pinned in test_engine_rules.py)."""

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
    assert [(e["name"], e["version"], e["backend"]) for e in data["engines"]] == [
        ("sglang", "0.5.23", "dsa"),
        ("vllm", "0.33.0", "FLASHMLA_SPARSE"),
    ]
    assert data["engines"][1]["dsa"]["masked_available"] is False  # an H200: no FA4 masked MHA
    # by hand, on an H200 with a bf16 cache, one request per point: SGLang 0.5.23 captures
    # extends of <= 2048 new tokens in its prefill graph (sparse there) and runs dense MHA only up
    # to 2048 tokens of sequence, so every point is sparse; vLLM's FLASHMLA_SPARSE (threshold 256
    # at 128 heads on SM90) runs a prefill of sequence <= 2048 dense, everything else sparse
    dense_for_vllm = {(512, 0), (512, 1024)}
    for row in data["rows"]:
        assert set(row["paths"]) == {"sparse_absorb", "masked_expand", "dense_expand"}
        assert row["engines"]["sglang"]["path"] == "sparse_absorb"
        want = "dense_expand" if (row["new"], row["prefix"]) in dense_for_vllm else "sparse_absorb"
        assert row["engines"]["vllm"]["path"] == want, row
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


def test_measured_policy_refused_for_dsa():
    out = run("analyze", "-m", "deepseek-v3.2", "--policy", "measured", code=2).output
    assert out.startswith("Error:") and "DSA" in out


def test_engine_policy_on_dsa():
    """--policy ENGINE@VERSION on DeepSeek-V3.2: the rule's path and loss at each point (B200, TP
    8, bf16: vLLM's FLASHMLA_SPARSE decodes up to 128 tokens at 16 heads; (700, 3000): seq 3700,
    bucket 4096, TP 8 entry 512 -> masked; (1500, 0): seq 1500 -> dense)."""
    data = json.loads(
        run(
            "analyze",
            "-m",
            "deepseek-v3.2",
            "-g",
            "b200",
            "--tp",
            "8",
            "--new",
            "100,700,1500",
            "--prefix",
            "0,3000",
            "--engines",
            "sglang",
            "--policy",
            "vllm@0.33.0",
            "-f",
            "json",
        ).output  # fmt: skip
    )
    got = {(r["new"], r["prefix"]): r["policy"]["path"] for r in data["rows"]}
    assert got == {
        (100, 0): "sparse_absorb",
        (100, 3000): "sparse_absorb",
        (700, 0): "dense_expand",
        (700, 3000): "masked_expand",
        (1500, 0): "dense_expand",
        (1500, 3000): "masked_expand",
    }
    assert all(r["policy"]["time_lost_s"] >= 0 for r in data["rows"])


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


def plain_windows(cost, path, prefixes, max_new, times=None):
    """Every count from 1 to max_new evaluated: (first, last, count) of the wins, or None."""
    from mlactl.model.roofline import path_times

    n = np.arange(1, max_new + 1, dtype=np.float64)[None, :]
    p = np.asarray(prefixes, dtype=np.float64)[:, None]
    pair = (path, "sparse_absorb")
    t = path_times(cost, H200, pair, 1, n, p) if times is None else times(1, n, p, pair)
    wins = (t[path].time_s < t["sparse_absorb"].time_s) & cost.applicable(path, 1, n, p)
    out = []
    for row in wins:
        hit = np.flatnonzero(row)
        out.append(None if not len(hit) else (int(hit[0]) + 1, int(hit[-1]) + 1, len(hit)))
    return out


@pytest.mark.parametrize("path", ["masked_expand", "dense_expand"])
def test_window_search_matches_the_plain_scan(path):
    """The bounded search gives what evaluating every count gives: prefixes where the window is
    empty, short, or runs thousands past the exact range; dense MHA's ending at top-k."""
    from mlactl.model.roofline import window_by_time

    cost = CostModel(V32)
    prefixes = [0, 100, 1024, 2000, 2047, 2048, 3000, 4096, 6000, 8192]
    assert window_by_time(cost, H200, prefixes, path=path, max_new=20_000) == plain_windows(
        cost, path, prefixes, 20_000
    )


def test_window_search_counts_wins_that_are_not_one_run():
    """A times function whose wins come in two runs (1,500-2,999 and 9,000-9,999, both beyond the
    exact range): first, last and the count of both, as the plain scan has them."""
    from mlactl.model.roofline import PathTime, window_by_time

    def times(batch, n, p, paths):
        n = np.broadcast_to(n, np.broadcast_shapes(np.shape(n), np.shape(p))).astype(np.float64)
        # each time is 2n plus a step that never falls: masked is below absorb only inside the runs
        edges = [1500, 3000, 9000, 10_000]
        step_absorb = np.select([n < e for e in edges], [0, 2, 2, 4], 4)
        step_masked = np.select([n < e for e in edges], [1, 1, 3, 3], 5)
        out = {"masked_expand": 2 * n + step_masked, "sparse_absorb": 2 * n + step_absorb}
        return {k: PathTime(k, [], n, n, out[k], n > 0) for k in paths}

    cost = CostModel(V32)
    got = window_by_time(cost, H200, [0, 512], max_new=1 << 24, times=times)
    assert got == plain_windows(cost, "masked_expand", [0, 512], 12_000, times=times)
    assert got[0] == (1500, 9999, 2500)


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
    # SGLang 0.5.23: decodes apart; the extend batch's longest sequence is 5000 > 2048: sparse.
    # vLLM (threshold 256, uniform): the ten decodes first, then the prefills, whose longest
    # sequence is 5000 and no masked MHA on an H200: every token sparse
    assert [e["name"] for e in data["engines"]] == ["sglang", "vllm"]
    assert {r["engine_paths"]["sglang"] for r in data["requests"]} == {"sparse_absorb"}
    assert {r["engine_paths"]["vllm"] for r in data["requests"]} == {"sparse_absorb"}
    assert data["engines"][0]["time_s"] == pytest.approx(data["totals"]["all_sparse_absorb"]["time_s"])


def test_batch_dsa_engines_by_hand(tmp_path):
    """sglang@0.5.14 (no graph for DSA): the extend batch (512, 0) + 2 x (600, 1000): longest
    1600 <= 2048, sum 3712 <= 131072 -> dense; the decodes apart, sparse. vLLM: the prefills'
    longest sequence 1600 <= 2048 -> dense MHA for all three prefills."""
    requests = tmp_path / "requests.csv"
    requests.write_text("new,prefix,count\n1,8000,10\n512,0,1\n600,1000,2\n")
    data = json.loads(
        run(
            "batch", str(requests), "-m", "deepseek-v3.2", "-g", "h200", "--engines", "sglang@0.5.14,vllm", "-f", "json"
        ).output  # fmt: skip
    )
    paths = [(r["engine_paths"]["sglang@0.5.14"], r["engine_paths"]["vllm"]) for r in data["requests"]]
    assert paths == [
        ("sparse_absorb", "sparse_absorb"),
        ("dense_expand", "dense_expand"),
        ("dense_expand", "dense_expand"),
    ]
    # vLLM's dense MHA runs its whole indexer: it costs more than SGLang's on the same paths
    sglang, vllm = data["engines"]
    assert vllm["time_s"] > sglang["time_s"]


def test_engines_on_dsa_judges_both_engines():
    data = json.loads(run("engines", "-m", "deepseek-v3.2", "-g", "h200", "-f", "json").output)
    assert [e["name"] for e in data["engines"]] == ["sglang", "vllm"] and data["best_time_s"] > 0
    assert all(e["time_s"] >= data["best_time_s"] for e in data["engines"])
    out = run("engines", "-m", "deepseek-v3.2", "-g", "h200").output
    assert "best path everywhere" in out and "sglang: sglang@0.5.23 on h200" in out


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
    run("plot", "pathmap", "-m", "deepseek-v3.2", "-g", "h200", "--new", "1,512,4096", "--prefix", "0,1024,32768",
        "--policy", "vllm", "-o", str(image), "--data", str(drawn))  # fmt: skip
    engine = json.loads(drawn.read_text())["policy"]
    # vLLM on an H200 (threshold 256): (512, 0) and (512, 1024) dense, the rest sparse
    assert engine["path"] == [
        ["sparse_absorb", "dense_expand", "sparse_absorb"],
        ["sparse_absorb", "dense_expand", "sparse_absorb"],
        ["sparse_absorb", "sparse_absorb", "sparse_absorb"],
    ]


def test_pathmap_csv_data_writes(tmp_path):
    pytest.importorskip("matplotlib")
    drawn = tmp_path / "map.csv"
    run("plot", "pathmap", "-g", "h200", "--new", "1,512", "--prefix", "0,1024", "--policy", "sglang",
        "-o", str(tmp_path / "m.png"), "--data", str(drawn))  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(drawn.read_text())))
    assert rows[0]["policy"] == "sglang" and rows[0]["policy_path"] in ("expand", "expand_chunked", "absorb")
