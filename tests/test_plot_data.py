"""The charts' data functions (mlactl.output.plot.X_data) on their numbers, against figures worked
out here: the H200's ceilings read from its profile file, DeepSeek-V3's roofline times written
out again below from the formulas of docs/design.md ("The math"), cell edges and boundaries by a
plain loop. Nothing here calls the code path it checks a second time, and no pixel is read.

DeepSeek-V3 per GPU (tp 1): H = 128 heads, latent rank r = 512, RoPE dim dR = 64, nope and value
head dims dC = dV = 128; bf16 cache and compute (2 bytes).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
from test_plot import torch_cpu_results

from mlactl.decide import analysis
from mlactl.decide.engines import parse_engines
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.shapes import grid
from mlactl.output import plot
from mlactl.output.plot.common import roles
from mlactl.output.plot.crossover import Marker

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

H, R, DR, DC, DV = 128, 512, 64, 128, 128
A = 2  # bytes of a bf16 value
EXPAND_PAIR = 2 * H * (DC + DR) + 2 * H * DV  # 81,920 FLOPs per (query, key) pair
ABSORB_PAIR = 2 * H * (R + DR) + 2 * H * R  # 278,528
PER_TOKEN = 2 * R * H * (DC + DV)  # 33,554,432: expand one cached token
CHUNK = 8192  # expand_chunked's prefix tokens per chunk (the default)

H200_TOML = tomllib.loads((Path(__file__).parents[1] / "profiles" / "hardware" / "h200.toml").read_text())
PEAKS = {dtype: tflops * 1e12 for dtype, tflops in H200_TOML["peak_tflops"].items()}
BW = H200_TOML["bandwidth_tbs"] * 1e12
PEAK = PEAKS["bf16"]


def t(flops, nbytes, peak=PEAK, bw=BW):
    return max(flops / peak, nbytes / bw)


def hand_ops(path, n, p):
    """(flops, bytes) of each op of `path` for one request of n new tokens after p cached ones."""
    k = n + p
    pairs = n * k - n * (n - 1) / 2
    kv_weights = H * (DC + DV) * R * A
    if path in ("expand", "expand_chunked"):
        m = 1 if path == "expand" or p == 0 else math.ceil(p / CHUNK) + 1  # partial results merged
        ops = [(PER_TOKEN * k, k * R * A + m * kv_weights + k * H * (DC + DV) * A)]
        out = m * n * H * (DV * A + 4) if m > 1 else n * H * DV * A  # partial outputs (+ fp32 lse)
        ops.append((EXPAND_PAIR * pairs, m * n * H * (DC + DR) * A + k * H * (DC + DV) * A + k * DR * A + out))
        if m > 1:  # pairwise merges of (query, head) rows: 3 FLOPs an element, two partials read, one written
            ops.append(((m - 1) * n * H * 3 * DV, (m - 1) * n * H * 3 * (DV * A + 4)))
        return ops
    assert path == "absorb"
    return [
        (2 * H * DC * R * n, n * H * DC * A + H * DC * R * A + n * H * R * A),  # q_absorb
        (ABSORB_PAIR * pairs, k * (R + DR) * A + n * H * (R + DR) * A + n * H * R * A),  # attention
        (2 * H * R * DV * n, n * H * R * A + H * R * DV * A + n * H * DV * A),  # out_absorb
    ]


def hand_time(path, n, p):
    return sum(t(f, b) for f, b in hand_ops(path, n, p))


def hand_intensity(path, n, p, op=None):
    ops = hand_ops(path, n, p)
    if op == "attention":
        ops = [ops[1]]
    return sum(f for f, _ in ops) / sum(b for _, b in ops)


def v3(new, prefix, batch=(1,), name="deepseek-v3", **kw):
    b, n, p = grid(list(batch), list(new), prefix=list(prefix))
    return analysis.analyze(model.from_name(name), hardware.from_name("h200"), b, n, p, **kw)


def test_the_hand_figures_are_deepseek_v3s():
    cfg = model.from_name("deepseek-v3")
    assert (cfg.H, cfg.r, cfg.dR, cfg.dC, cfg.dV) == (H, R, DR, DC, DV)
    assert (EXPAND_PAIR, ABSORB_PAIR, PER_TOKEN) == (81_920, 278_528, 33_554_432)  # docs/design.md


# -- roofline ------------------------------------------------------------------------------------

DECODE_SHAPES = [(1, 4096), (1, 32768), (4096, 0)]  # (new, prefix): the chart's default shapes


def default_roofline(results=()):
    cfg, hw = model.from_name("deepseek-v3"), hardware.from_name("h200")
    n, p = zip(*DECODE_SHAPES)
    return plot.roofline_data(analysis.analyze(cfg, hw, [1] * 3, list(n), list(p)), list(results))


def test_roofline_ridge_is_the_profiles_peak_over_its_bandwidth():
    chart = default_roofline()
    assert chart.ridge["intensity"] == pytest.approx(989e12 / 4.8e12)  # 206.0 FLOP/byte
    assert chart.ridge["intensity"] == pytest.approx(PEAK / BW) and chart.ridge["flops_per_s"] == PEAK
    (nominal,) = chart.roofs  # no measured ceilings anywhere: one source, drawn first
    assert nominal.label == "nominal" and nominal.rank == 0
    assert nominal.bandwidth_text == "4.8 TB/s (nominal)"
    x, y = nominal.bandwidth_at  # the memory roof's label sits on the memory roof
    assert y == pytest.approx(BW * x) and x < PEAK / BW
    # one line per distinct peak of the profile (bf16 and fp16 share 989): min(peak, bw * x),
    # bent at that peak's ridge
    distinct = sorted(set(PEAKS.values()))
    assert sorted(max(ys) for _, ys in nominal.lines) == distinct
    lo, hi = chart.xlim
    for xs, ys in nominal.lines:
        peak = max(ys)
        assert ys == pytest.approx([min(peak, BW * v) for v in xs])
        assert xs[0] == lo and xs[-1] == hi
        if lo < peak / BW < hi:
            assert xs[1] == pytest.approx(peak / BW)
    texts = {label.text: label for label in chart.peak_labels}
    assert set(texts) == {"bf16/fp16 989 TFLOP/s, nominal", "fp8 1979 TFLOP/s, nominal", "fp32 67 TFLOP/s, nominal"}
    # 67, 989 and 1979 are each more than 1.6x apart: every label 6 points above its roof
    assert {label.offset for label in chart.peak_labels} == {6}
    assert [label.peak for label in chart.peak_labels] == distinct  # lowest first


def test_roofline_points_and_axis_range_by_hand():
    chart = default_roofline()
    got = {(pt["path"], pt["op"], pt["new"], pt["prefix"]): pt for pt in chart.points}
    assert len(got) == 18  # three shapes x three paths x (whole path, attention op)
    for path in ("expand", "expand_chunked", "absorb"):
        for n, p in DECODE_SHAPES:
            whole, attention = got[(path, None, n, p)], got[(path, "attention", n, p)]
            assert whole["intensity"] == pytest.approx(hand_intensity(path, n, p), rel=1e-12)
            assert attention["intensity"] == pytest.approx(hand_intensity(path, n, p, "attention"), rel=1e-12)
            flops = sum(f for f, _ in hand_ops(path, n, p))
            assert whole["flops_per_s"] == pytest.approx(flops / hand_time(path, n, p), rel=1e-12)
            # an op alone sits on the roofline
            assert attention["flops_per_s"] == pytest.approx(min(PEAK, BW * attention["intensity"]), rel=1e-12)
    # decode after 32K on absorb: ~242 FLOP/byte (docs/design.md)
    assert got[("absorb", "attention", 1, 32768)]["intensity"] == pytest.approx(242, rel=0.01)
    # x: a quarter of the lowest intensity (of the points, and the ridges: fp32's 67 / 4.8 = 14.0)
    # to 12x the highest; y: a third of the lowest FLOP/s to twice the highest peak
    intensities = [hand_intensity(path, n, p, op) for path, op, n, p in got] + [v / BW for v in PEAKS.values()]
    assert chart.xlim == pytest.approx((min(intensities) / 4, max(intensities) * 12), rel=1e-12)
    rates = [pt["flops_per_s"] for pt in chart.points] + list(PEAKS.values())
    assert chart.ylim == pytest.approx((min(rates) / 3, 2 * 1979e12))
    assert chart.shapes == ("b=1 n=1 p=4K", "b=1 n=1 p=32K", "b=1 n=4K p=0")
    assert chart.note is None and chart.numbers == {} and chart.keys == ()


def test_roofline_measured_ceilings_and_numbered_points():
    cpu = torch_cpu_results()  # measured ceilings 700 TFLOP/s bf16, 4 TB/s; four path times
    chart = default_roofline([cpu])
    nominal, measured = chart.roofs
    assert (measured.label, measured.rank) == ("measured on cpu", 1)
    assert measured.bandwidth_text == "4 TB/s (measured on cpu)"
    ((xs, ys),) = measured.lines  # bf16 only
    assert max(ys) == 700e12 and xs[1] == pytest.approx(700 / 4)  # its ridge: 175 FLOP/byte
    # peaks sorted 67, 700, 989, 1979: only 989 is within 1.6x of one below (989 / 700 = 1.41),
    # so its label stacks 9 points above 700's
    offsets = {label.peak: label.offset for label in chart.peak_labels}
    assert offsets == {67e12: 6, 700e12: 6, 989e12: 15, 1979e12: 6}
    assert [label.rank for label in chart.peak_labels] == [0, 1, 0, 0]
    # four measured points, at most 12: every one numbered, in the file's order
    assert chart.numbers == {0: "1", 1: "2", 2: "3", 3: "4"}
    fraction = hand_time("absorb", 1, 4095) / 1e-4  # the roofline's time over the measured median
    shown = f"{100 * fraction:.0f}%" if fraction >= 0.1 else f"{100 * fraction:.2g}%"
    assert chart.keys[0] == (f"1: b=1 n=1 p=4095 absorb, {shown} of the roofline", "absorb")
    assert chart.labelled == ["b=1 n=1 p=4095 absorb", "b=1 n=1 p=4095 expand", "b=1 n=256 p=4K expand",
                              "b=1 n=256 p=4K absorb"]  # fmt: skip


def test_roofline_point_faster_than_the_roof_is_numbered_and_noted():
    cpu = torch_cpu_results()
    cpu["paths"][0]["median_s"] = hand_time("absorb", 1, 4095) / 2  # twice the roofline's speed
    chart = default_roofline([cpu])
    assert "too low" in chart.note
    assert chart.keys[0][0] == "1: b=1 n=1 p=4095 absorb, 200% of the roofline (above the roofline!)"


# -- crossover -----------------------------------------------------------------------------------


def first_win(path, p, up_to=4096):
    """The smallest new-token count where `path` beats absorb by the hand roofline times."""
    return next(n for n in range(1, up_to) if hand_time(path, n, p) < hand_time("absorb", n, p))


def test_crossover_at_long_cache_on_h200_is_near_171_new_tokens():
    prefixes = (32768, 131072)
    chart = plot.crossover_data(v3(range(1, 513), prefixes))
    # asymptotically absorb's extra FLOPs per pair pay for expanding each cached token:
    # n = PER_TOKEN / (ABSORB_PAIR - EXPAND_PAIR)
    assert chart.asymptotic_new == pytest.approx(33_554_432 / 196_608)  # 170.67
    for panel, p in zip(chart.panels, prefixes):
        expand, chunked = first_win("expand", p), first_win("expand_chunked", p)
        assert panel.predicted == {"expand": expand, "expand_chunked": chunked}
        assert all(w.last is None for w in panel.wins.values())  # crossovers: winning from there on
        assert 160 <= expand <= 171
        assert [(m.new, m.kind, m.path) for m in panel.markers] == [
            (expand, "predicted", "expand"),
            (chunked, "predicted", "expand_chunked"),
            (pytest.approx(170.667, abs=1e-3), "flops", None),
        ]
        assert panel.heading.splitlines()[1] == (
            f"crossover (new tokens): predicted {expand}, chunked {chunked}, by FLOPs 170.7"
        )
        assert panel.time_s["absorb"][63] == pytest.approx(hand_time("absorb", 64, p), rel=1e-12)
        assert panel.time_s["expand_chunked"][199] == pytest.approx(hand_time("expand_chunked", 200, p), rel=1e-12)
        # x from 0.8 (1 / 1.5 is less) to 1.5 x 512; every other power of two (more than 7 in range)
        assert panel.xlim == pytest.approx((0.8, 768)) and panel.xticks == [1, 4, 16, 64, 256]
    assert chart.panels[1].predicted["expand"] == pytest.approx(171, abs=2)  # 128K cached tokens
    assert chart.legend[0] == ("predicted", "predicted crossover (colour of its path)")
    assert chart.marked == "expand_chunked" and chart.ylabel == "time, 1 layer (µs)"


def test_crossover_where_expand_never_wins_says_so():
    chart = plot.crossover_data(v3(range(1, 65), (32768,)))
    # the crossover lies past the grid, but the table searched up to max_new: the markers sit
    # where it found it, and the axis reaches them
    (panel,) = chart.panels
    assert panel.predicted["expand"] == first_win("expand", 32768)
    furthest = max(
        first_win("expand", 32768), first_win("expand_chunked", 32768), PER_TOKEN / (ABSORB_PAIR - EXPAND_PAIR)
    )
    assert panel.xlim[1] == pytest.approx(1.5 * furthest)


def test_crossover_measured_crossovers_are_markers():
    chart = plot.crossover_data(v3(range(1, 257), (4096, 32768)), [torch_cpu_results()])
    at_4k, at_32k = chart.panels
    assert at_4k.markers[-1] == Marker(190, "measured", "measured 190")
    assert "measured: expand never faster" in at_32k.heading
    assert ("measured time", "measured time") in chart.legend and ("measured", "measured crossover") in chart.legend


def test_roles_come_from_the_cost_models_paths():
    v3_cost = v3([1], [0]).cost
    dsa_cost = v3([1], [0], name="deepseek-v3.2").cost
    assert roles(v3_cost).absorb == "absorb" and roles(v3_cost).expand == ("expand", "expand_chunked")
    assert roles(dsa_cost).absorb == "sparse_absorb"
    assert roles(dsa_cost).expand == ("masked_expand", "dense_expand")
    assert roles(v3_cost).kind_words() == ("absorb", "expand")
    assert roles(dsa_cost).kind_words() == ("sparse absorb", "masked or dense MHA")


def test_dsa_crossover_windows_and_where_dense_mha_cannot_run():
    """DeepSeek-V3.2 reads top-k = 2048 tokens per query: dense MHA runs only where the whole
    context is at most 2048, so after 4K cached tokens it cannot run at all, and after 1K at
    most 1024 new tokens."""
    cfg = model.from_name("deepseek-v3.2")
    assert cfg.topk == 2048
    prefixes = (0, 1024, 4096)
    result = v3(range(1, 4097), prefixes, name="deepseek-v3.2")
    chart = plot.crossover_data(result)
    assert chart.legend[0] == ("predicted", "predicted window's ends (colour of its path)")
    assert chart.marked == "dense_expand" and chart.asymptotic_new is None
    for panel, p in zip(chart.panels, prefixes):
        assert panel.heading.splitlines()[1].startswith("wins (new tokens): masked_expand ")
        # each window's ends checked on the curves (new = 1, 2, ...: index n - 1): faster at both
        # ends, not faster (or not running: NaN) just outside them
        for path, w in panel.wins.items():
            if w is None:
                continue
            times, absorb = np.asarray(panel.time_s[path], dtype=float), np.asarray(panel.time_s["sparse_absorb"])
            assert times[w.first - 1] < absorb[w.first - 1]
            if w.first > 1:
                assert not times[w.first - 2] < absorb[w.first - 2]
            if w.last < len(times):
                assert times[w.last - 1] < absorb[w.last - 1] and not times[w.last] < absorb[w.last]
            assert [(m.new, m.path) for m in panel.markers if m.path == path] == [(w.first, path), (w.last, path)]
        dense = panel.wins["dense_expand"]
        if p + 1 > 2048:
            assert dense is None and "dense_expand cannot run (context > top-k 2K)" in panel.heading
            assert "never faster" not in panel.heading
        else:
            assert dense.last <= 2048 - p and panel.time_s["dense_expand"][2048 - p] is None  # n = 2049 - p
    assert chart.panels[0].as_dict()["windows"]["dense_expand"] == [chart.panels[0].wins["dense_expand"].first, 2048]


# -- path map ------------------------------------------------------------------------------------

NEW = [1, 16, 64, 256, 1024, 4096]
PREFIX = [0, 1024, 4096, 8192, 32768]


def test_pathmap_cells_and_axes_by_hand():
    chart = plot.pathmap_data(v3(NEW, PREFIX))
    # log2 of each count, the last cell as wide as the one before it
    assert chart.x_edges.tolist() == [0, 4, 6, 8, 10, 12, 14]
    assert chart.y_edges.tolist() == [10, 12, 13, 15, 17]  # the positive prefixes
    assert chart.zero_row == (8, 10)  # prefix 0 below, as high as the first row (2 octaves)
    assert chart.xlim == (0, 14) and chart.ylim == (8, 17)
    # powers of two: 13 from 1 to 4096 are too many, every other one (at most 9)
    assert chart.xticks[0].tolist() == [0, 2, 4, 6, 8, 10, 12]
    assert chart.xticks[1] == ["1", "4", "16", "64", "256", "1K", "4K"]
    assert chart.yticks[0].tolist() == [9, 10, 11, 12, 13, 14, 15]  # prefix 0 mid-row
    assert chart.yticks[1] == ["0", "1K", "2K", "4K", "8K", "16K", "32K"]


def hand_regions():
    """Per (prefix, new): the fastest path by the hand times, and the signed log2 speedup over
    the best of the other kind (negative: absorb's side)."""
    best, signed = [], []
    for p in PREFIX:
        best.append([]), signed.append([])
        for n in NEW:
            times = {path: hand_time(path, n, p) for path in ("expand", "expand_chunked", "absorb")}
            fastest = min(times, key=times.get)
            expand = min(times["expand"], times["expand_chunked"])
            best[-1].append(fastest)
            if fastest == "absorb":
                signed[-1].append(-math.log2(expand / times["absorb"]))
            else:
                signed[-1].append(math.log2(times["absorb"] / expand))
    return best, np.array(signed)


def test_pathmap_regions_against_the_hand_times():
    chart = plot.pathmap_data(v3(NEW, PREFIX))
    best, signed = hand_regions()
    assert chart.best == best
    assert chart.shade == pytest.approx(signed, rel=1e-9)
    # the colour scale: whole octaves either side, ticks every quarter of it
    vmax = max(1, math.ceil(np.abs(signed).max()))
    assert chart.colours == {"cmap": "RdBu_r", "vmin": -vmax, "vmax": vmax}
    step = max(1, vmax // 4)
    assert chart.bar_ticks.tolist() == list(range(-vmax // step * step, vmax + 1, step))
    assert chart.bar_labels[-1] == f"×{2**vmax}"
    assert chart.bar_label == "speedup of the best path:  ← absorb faster  |  expand faster →"
    # a + at the centre of each cell where expand_chunked is best
    mids_x = [2, 5, 7, 9, 11, 13]
    mids_y = [9, 11, 12.5, 14, 16]
    want = [
        (mids_x[c], mids_y[r]) for r in range(len(PREFIX)) for c in range(len(NEW)) if best[r][c] == "expand_chunked"
    ]
    assert list(zip(*(v.tolist() for v in chart.marked_cells))) == want
    assert ("marked", "expand_chunked best") in chart.legend or not want


def test_pathmap_engine_boundaries_by_a_plain_loop():
    """SGLang 0.5.14 at batch 1 (no prefill graph): expand with no prefix, absorb for a decode
    after one, and from 8192 cached tokens expand again; absorb in between."""
    chart = plot.pathmap_data(v3(NEW, PREFIX, engines=parse_engines("sglang@0.5.14")), policy="sglang@0.5.14")

    def rule(n, p):
        return "expand" if p == 0 or (p >= 8192 and n > 1) else "absorb"

    path = [[rule(n, p) for n in NEW] for p in PREFIX]
    assert chart.policy["path"] == path
    x = [0, 4, 6, 8, 10, 12, 14]
    y = [8, 10, 12, 13, 15, 17]  # row r spans y[r] to y[r + 1]; prefix 0's row first
    want = set()
    for r in range(len(PREFIX)):
        for c in range(len(NEW)):
            if c + 1 < len(NEW) and path[r][c] != path[r][c + 1]:  # the edge between two columns
                want.add(((x[c + 1], x[c + 1]), (y[r], y[r + 1])))
            if r + 1 < len(PREFIX) and path[r][c] != path[r + 1][c]:  # between two rows
                want.add(((x[c], x[c + 1]), (y[r + 1], y[r + 1])))
    got = {(tuple(float(v) for v in xs), tuple(float(v) for v in ys)) for xs, ys in chart.boundaries}
    # 2 column edges (prefixes 8192 and 32768, after new = 1), 6 + 5 row edges (above prefix 0,
    # above 4096 but for new = 1)
    assert got == want and len(chart.boundaries) == len(want) == 13
    assert chart.colours["cmap"] == "Reds" and chart.colours["vmin"] == 0
    assert chart.legend[:2] == (("boundary", "sglang@0.5.14 path boundary"), ("wrong", "over 5% slower than the best"))
    assert chart.legend_title == f"{chart.policy['label']}: {chart.policy['source']}"


def test_pathmap_measured_crossovers_as_marks():
    chart = plot.pathmap_data(v3(NEW, PREFIX), [torch_cpu_results()])
    # batch 1 measured: prefix 0 at 1 new token, 4096 at 190, 32768 never (expand never won)
    kinds = [(m.kind, m.xy) for m in chart.marks]
    assert kinds == [
        ("point", ((0, 9),)),  # log2(1) = 0, prefix 0 mid-row
        ("point", ((pytest.approx(math.log2(190)), 12),)),
        ("run", ((0, 9), (pytest.approx(math.log2(190)), 12))),  # the line through both, ended by the None
        ("never", ((pytest.approx(14 - 0.12), 15),)),  # a > at the grid's right edge
    ]
    assert ("never", "expand never won (measured)") in chart.legend


def test_pathmap_of_a_dsa_model_names_its_paths():
    chart = plot.pathmap_data(v3([1, 512, 4096], [0, 1024, 32768], name="deepseek-v3.2"))
    assert chart.marked == "dense_expand"
    assert chart.bar_label == "speedup of the best path:  ← sparse absorb faster  |  masked or dense MHA faster →"
    # dense MHA runs only where the context is at most top-k (2048): never the best past it
    best = np.array(chart.best)
    assert not (best[2] == "dense_expand").any() and best[1, 2] != "dense_expand"


# -- tune, replay, transfer ----------------------------------------------------------------------


def test_tune_bars_and_range():
    chart = plot.tune_data(torch_cpu_results())
    # configs timed 2.0 and 1.5 ms (the file's best), the default 1.8 ms, the twin 9 ms
    assert chart.best_index == 1 and chart.best == "BLOCK_N=64, num_warps=4" and chart.best_median_s == 1.5e-3
    assert not chart.default_faster and chart.best_word == "  best"
    assert chart.left == pytest.approx(0.75e-3)  # half the fastest time
    assert chart.xlim == pytest.approx((0.75e-3 / 1.2, 9e-3 * 4))
    docs = json.loads((Path(__file__).parents[1] / "docs/results/interpret-teaching-tp8-mla_decode.json").read_text())
    interp = plot.tune_data(docs)
    sweep = docs["kernels"][0]
    times = [c["median_s"] for c in sweep["configs"] if c["status"] == "ok"]
    times += [v for v in (sweep.get("default_median_s"), sweep.get("twin_median_s")) if v]
    assert interp.default_faster and interp.best_word == "  best tried: default faster"
    assert interp.xlim == pytest.approx((min(times) / 2 / 1.2, max(times) * 40))  # room for the longer label
    assert interp.warning.startswith("interpreter times")


def replay_report(hours: float = 0.0) -> dict:
    def engine(label, lost, mix):
        return {
            "label": label,
            "timeline": {"edges_s": [0.0, 10.0 + 3600 * hours, 20.0 + 3600 * hours], "lost_s": lost},
            "by_step_type": mix,
        }

    return {
        "schema": "mlactl.replay",
        "schema_version": 1,
        "trace": {"path": "t.jsonl", "requests": 3},
        "engines": [
            engine("a", [0.5, 0.0], [{"type": "decode", "steps": 4, "paths": {"absorb": 1.0}}]),
            engine(
                "b",
                [0.0, 2.0],
                [
                    {"type": "decode", "steps": 4, "paths": {"absorb": 0.25, "expand": 0.75}},
                    {"type": "prefill", "steps": 1, "paths": {"expand": 1.0}},
                ],
            ),
        ],
    }


def test_replay_lines_and_columns():
    report = replay_report()
    plot.check_report(report, "hand")
    chart = plot.replay_data(report)
    assert chart.time_unit == "seconds"  # a 20 s trace
    # lost seconds over each 10 s bin, in ms per second: a step per bin
    assert chart.lines == (
        ([0, 10, 10, 20], pytest.approx([50, 50, 0, 0])),
        ([0, 10, 10, 20], pytest.approx([0, 0, 200, 200])),
    )
    assert chart.types == ["decode", "prefill"] and chart.paths == ["absorb", "expand"]
    assert chart.width == 0.4  # two engines share 0.8 of a step type's width
    got = [(c.x, c.label, [(b.path, b.share, b.bottom) for b in c.bars]) for c in chart.columns]
    assert got == [
        (pytest.approx(-0.2), "a", [("absorb", 1.0, 0.0)]),
        (pytest.approx(0.2), "b", [("absorb", 0.25, 0.0), ("expand", 0.75, 0.25)]),
        (pytest.approx(1.2), "b", [("expand", 1.0, 0.0)]),
    ]
    long = plot.replay_data(replay_report(hours=4))
    assert long.time_unit == "hours" and long.lines[0][0][-1] == pytest.approx(20 / 3600 + 4)


def test_transfer_panels_are_thinned_and_ranged():
    n = 9000
    y = np.geomspace(1e-6, 1e-3, n)
    panel = {"op": "kv_expand", "n": n, "measured_s": y.tolist(), "predicted_s": (y * 1.1).tolist(),
             "lo_s": [math.nan] * n, "hi_s": [math.nan] * n, "roofline_s": (y / 2).tolist(),
             "median": 0.1, "p90": 0.1, "roofline_median": 0.5, "coverage": None}  # fmt: skip
    (drawn,) = plot.transfer_data([panel], "t").drawn
    assert len(drawn.measured_us) == 4500  # every second point: at most 4000 drawn
    assert drawn.measured_us[1] == pytest.approx(y[2] * 1e6)
    assert drawn.bars == ()  # no finite interval
    assert drawn.range_us == pytest.approx((1e-6 * 1e6 / 2, y[::2].max() * 1.1 * 1e6 * 2))  # of the points drawn
    assert drawn.heading == "kv_expand: 9,000 points\nmedian 10%, p90 10%, in 80% —; roofline 50%"


# -- data without matplotlib; drawing on a Figure given ------------------------------------------------


def test_the_data_functions_do_not_load_matplotlib():
    code = (
        "import sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_plot_data import v3, replay_report, torch_cpu_results\n"
        "from mlactl.output import plot\n"
        "plot.roofline_data(v3([1], [4096]), [torch_cpu_results()])\n"
        "plot.crossover_data(v3([1, 64, 512], [0, 4096]))\n"
        "plot.pathmap_data(v3([1, 64], [0, 4096]))\n"
        "plot.tune_data(torch_cpu_results())\n"
        "plot.replay_data(replay_report())\n"
        "print('matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])  # fmt: skip
    assert out.stdout.strip() == "False"


def test_draw_functions_draw_on_the_figure_given():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    assert plot.draw_pathmap(plot.pathmap_data(v3(NEW, PREFIX)), fig) is fig
    assert "Path map" in fig.get_suptitle()
    fig = Figure()
    chart = plot.crossover_data(v3(range(1, 65), (0, 4096)))
    assert plot.draw_crossover(chart, fig) is fig
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == [p.heading for p in chart.panels]
