"""The 80% intervals of a calibrated replay's totals (mlactl.decide.replay.intervals).

Pinned three ways: by hand (a calibration whose every draw scales every op by exactly 1.1 makes
every total's interval [point, 1.1 x point]); against a plain second implementation that draws
each step's launches from each row's own draws, with no cells and no sample; and the sample of
steps against drawing them all.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_replay import H200, V3, mooncake, parse, run, schedule
from test_uncertainty import FIXTURE, QUICK_TERMS

from mlactl.decide.calibration import store
from mlactl.decide.calibration import uncertainty as u
from mlactl.decide.calibration.estimate import estimates
from mlactl.decide.calibration.model import OP_CLASSES, PROJECTIONS
from mlactl.decide.calibration.store import load
from mlactl.decide.loss import RuleLoss
from mlactl.decide.replay import intervals as I
from mlactl.decide.replay.pricing import Pricer, rows_of
from mlactl.model.cost import CostModel

# a few requests: prefills, an extend after a shared prefix, decodes, and steps that mix them
SMALL = [(0, 3000, 4, [1, 2, 3, 4, 5, 6]), (0, 700, 3, []), (5, 4000, 3, [1, 2, 3, 4, 5, 6, 7, 8]), (9, 20, 2, [])]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The test tables' calibration (as tests/test_uncertainty.py fits it): members, residuals,
    bases; no fit of expand's attention or the merge (their draws are the roofline's)."""
    folder = tmp_path_factory.mktemp("calibrations")
    run("calibrate", "--from", "aiconfigurator", "--system", "h200_sxm", "--framework", "sglang",
        "--data-dir", FIXTURE, "--name", "fx", "--terms", QUICK_TERMS, "--dir", folder)  # fmt: skip
    return folder / "fx.json"


def scaled_calibration(home, factor: float) -> str:
    """Every op class fitted ('fixed' only: no step), no range (every point extrapolated by an
    unknown distance: twice its residual) and every residual quantile log(factor) / 2: each draw
    multiplies every op's time by exactly `factor`."""
    q = [math.log(factor) / 2] * len(u.LEVELS)
    params = {"t_fixed_s": 2e-6, "eta_c": 0.6, "eta_m": 0.8}
    fits = [
        {"op": c, "source": "t", "dtype": "bf16", "terms": ["fixed"], "params": params,
         "interval": {"random": q, "blocked": None, "scale": 1.0}}
        for c in OP_CLASSES
    ]  # fmt: skip
    store.write({"schema": "mlactl.calibration", "schema_version": 1, "name": "x", "hardware": "h200", "fits": fits})
    return "x"


def replay_json(trace, *args) -> dict:
    return json.loads(run("replay", trace, "--hardware", "h200", "-f", "json", *args).stdout)


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v3.2"])
def test_a_factor_every_draw_shares_scales_every_total_by_it(model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    name = scaled_calibration(tmp_path / "home", 1.1)
    trace = mooncake(tmp_path / "t.jsonl", SMALL)
    data = replay_json(trace, "--calibration", name, "--model", model)
    keys = {
        "time_s": "time_interval_s",
        "best_time_s": "best_time_interval_s",
        "lost_s": "lost_interval_s",
        "lost_vs_step_s": "lost_vs_step_interval_s",
        "lost_vs_request_s": "lost_vs_request_interval_s",
    }
    for e in data["engines"]:
        for point, span in keys.items():
            assert e[span] == pytest.approx([e[point], 1.1 * e[point]], rel=1e-9, abs=1e-15), (e["name"], span)
        assert e["time_s"] > 0
    assert any(e["lost_s"] > 0 for e in data["engines"])  # something is lost: the loss is pinned too
    roof = replay_json(trace, "--model", model)
    assert "time_interval_s" not in roof["engines"][0] and "lost_interval_s" not in roof["engines"][0]
    table = run("replay", trace, "--hardware", "h200", "--calibration", name, "--model", model).stdout
    assert "calibrated: (80% interval;" in " ".join(table.split())
    assert "–" in table.split("│ sglang ")[1].splitlines()[0]


def schedule_rows(trace, engine: str):
    s = schedule(trace, engine)
    return CostModel(V3), parse(engine), s, rows_of(s, 0, len(s))


def plain_draws(pricer: Pricer, figs, launches, codes, rows) -> np.ndarray:
    """[steps, S + 1], step by step and launch by launch: a row-level op's factor is the sum of
    its rows' own draws over the sum of their own times, a projection's the draws at the
    launch's summed shape over its time there; each estimated at the rows' exact shapes. Last,
    the point seconds."""
    out = np.zeros((rows.steps, u.SCENARIOS + 1))
    for k, parts in enumerate(launches):
        if parts is None:
            continue
        fig = figs[k]
        whole = fig.class_names[0].startswith("path:")
        for g in range(rows.steps):
            on = np.flatnonzero((rows.step == g) & (codes == k))
            if not len(on):
                continue
            n, p = rows.new[on].astype(float), rows.prefix[on].astype(float)
            per_row = estimates(fig.cost, H200, pricer.cal, 1, n, p, (fig.path,))[fig.path]
            summed = estimates(fig.cost, H200, pricer.cal, 1, n.sum(), p.sum(), (fig.path,))[fig.path]
            for c, cls in enumerate(fig.class_names):
                op = fig.path if whole else fig.op_names[c]
                est = summed.ops[op] if cls in PROJECTIONS else per_row.ops[op]
                t = np.reshape(est.time, -1)
                d = est.scenarios().reshape(u.SCENARIOS, -1)
                f = d.sum(axis=1) / t.sum() if t.sum() > 0 else np.ones(u.SCENARIOS)
                out[g, :-1] += parts[c][g] * f
                out[g, -1] += parts[c][g]
    return out


def plain_totals(pricer: Pricer, rows) -> dict:
    figs = pricer.figures(rows)
    codes = pricer.engine_codes(rows)
    every = np.arange(len(rows.new))
    engine = plain_draws(pricer, pricer.engine_figs, pricer.engine_class_launches(rows, codes), codes, rows)
    choice = pricer.own_choice(rows)
    launches = pricer.class_launches(figs, rows, choice, every, rows.step, rows.steps)
    request = plain_draws(pricer, figs, launches, choice, rows)
    step = np.full_like(engine, np.inf)
    for k, ok in enumerate(pricer.step_fits(rows)):
        one = [None] * len(pricer.paths)
        one[k] = figs[k].class_seconds(rows.starts)
        t = plain_draws(pricer, figs, one, np.full(len(rows.new), k), rows)
        step = np.where(ok[:, None], np.minimum(step, t), step)
    best = np.minimum(np.minimum(engine, step), request)
    totals = {
        "time": engine.sum(axis=0),
        "best": best.sum(axis=0),
        "lost": (engine - best).sum(axis=0),
        "lost_step": np.maximum(engine - step, 0.0).sum(axis=0),
        "lost_request": np.maximum(engine - request, 0.0).sum(axis=0),
    }
    return {name: (t[:-1], t[-1]) for name, t in totals.items()}  # (draws, point value)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_cells_and_launch_sums_match_a_plain_step_by_step_draw(engine, fitted, tmp_path, monkeypatch):
    """With cells fine enough to hold one shape each (or 0.3% wide), the drawer's totals are the
    plain implementation's to 1% (of the time, for a loss: a difference of times); at the
    shipped 8 cells to the octave, their 80% intervals' ends are within 5%. vLLM's own chunk
    (its workspace) and SGLang's MHA/MLA switch both run."""
    cal = load(fitted)
    trace = mooncake(tmp_path / "t.jsonl", SMALL)
    cost, e, sched, rows = schedule_rows(trace, engine)
    assert rows.steps >= 4 and (rows.new > 1).sum() >= 3  # decodes and chunks
    want = plain_totals(Pricer(cost, H200, cal, e), rows)
    for cells, rel in ((256, 0.01), (I.CELLS_PER_OCTAVE, None)):
        monkeypatch.setattr(I, "CELLS_PER_OCTAVE", cells)
        drawer = I.Drawer(Pricer(cost, H200, cal, e), np.ones(len(sched)))
        drawer.add(rows)
        for name in I.TOTALS:
            draws, point = want[name]
            got = point + getattr(drawer.totals, name)  # the drawer keeps draws less the point
            # a loss is a difference of times: its error is the times', so measured against them
            scale = want["time"][0] if name.startswith("lost") else np.abs(draws)
            if rel is not None:
                assert np.all(np.abs(got - draws) <= rel * scale), (cells, name)
            else:
                (a, b), (c, d) = u.percentiles(got), u.percentiles(draws)
                spread = float(np.median(scale))
                assert abs(a - c) <= 0.05 * max(abs(c), spread) and abs(b - d) <= 0.05 * max(abs(d), spread), name


def test_the_sample_of_steps_stays_near_drawing_them_all(fitted, tmp_path, monkeypatch):
    """Above INTERVAL_STEPS the draws are summed over a weighted sample of steps: with a tenth
    of the steps, each interval end stays within 10% (of its value or of the interval's width,
    the larger) of drawing every step, and the point values are every step's."""
    rng = np.random.default_rng(3)
    at, size, out = np.sort(rng.uniform(0, 60_000, 40)), rng.integers(200, 6000, 40), rng.integers(2, 40, 40)
    reqs = [(int(t), int(i), int(o), []) for t, i, o in zip(at, size, out)]
    trace = mooncake(tmp_path / "t.jsonl", reqs)
    args = ("--calibration", fitted, "--engines", "sglang,vllm")
    full = replay_json(trace, *args)
    steps = min(e["steps"] for e in full["engines"])
    monkeypatch.setattr(I, "INTERVAL_STEPS", steps // 10)
    sampled = replay_json(trace, *args)
    for a, b in zip(full["engines"], sampled["engines"]):
        assert (a["time_s"], a["lost_s"]) == (b["time_s"], b["lost_s"])
        for key in ("time_interval_s", "lost_interval_s"):
            (lo, hi), got = a[key], b[key]
            allowed = 0.10 * np.maximum(hi - lo, np.abs([lo, hi]))
            assert np.all(np.abs(np.subtract(got, [lo, hi])) <= allowed), (a["name"], key, got, a[key])


def test_step_weights_by_hand():
    assert I.step_weights(np.array([3.0, 1.0, 2.0]), target=5).tolist() == [1.0, 1.0, 1.0]
    size = np.r_[1000.0, np.ones(9999)]
    w = I.step_weights(size, target=100)
    assert w[0] == 1.0  # a step of a tenth of the time is always drawn, as itself
    drawn = w[1:] > 0
    assert 60 < drawn.sum() < 140  # the other 99 draws: about 99 of 9,999 steps
    assert np.allclose(w[1:][drawn], 9999 / 99)  # each standing for 1 / probability
    assert I.step_weights(size, target=100).tolist() == w.tolist()  # seeded


def test_cells_by_hand():
    # 8 to the octave: new 1 -> 0; 2 -> 8; 3 -> floor(8 log2 3) = 12; prefix 0 -> 0, 1 -> 1, 4096 -> 97
    codes = I.cell_codes([1, 2, 3, 1], [0, 1, 4096, 0])
    assert codes.tolist() == [0, 8 * I.CELL_SPAN + 1, 12 * I.CELL_SPAN + 97, 0]
    new, prefix = I.cell_shapes(codes)
    # each cell's geometric middle: 4096 * 2**(1/16) = 4277.3 for prefix cell 97
    assert new.tolist() == [1, 2, 3, 1] and prefix.tolist() == [0, 1, 4277, 0]
    # every count's cell holds the count standing for it
    n = np.arange(1, 200_000, 7)
    some = np.unique(I.cell_codes(n, n[::-1]))
    assert (I.cell_codes(*I.cell_shapes(some)) == some).all()


def test_a_sampled_loss_never_goes_below_zero():
    """The sample adds each draw's departure from the point value: for a loss of 0.1 s a sampled
    departure of -0.3 s would make -0.2 s, and a loss is never negative."""
    t = I.Totals.zeros(4)
    t.lost[:] = [-0.3, 0.0, 0.1, 0.2]
    t.time[:] = [-0.3, 0.0, 0.1, 0.2]
    spans = t.spans(RuleLoss(0.1, 0.1, 0.1, 0.1, 0.1))
    # draws 0, 0.1, 0.2, 0.3 (the first held at 0): the 10th percentile 0.03; the time's draws
    # -0.2, 0.1, 0.2, 0.3 are not held: -0.2 + 0.3 x 0.3 = -0.11
    assert spans.lost_span is not None and spans.time_span is not None
    assert spans.lost_span[0] == pytest.approx(0.03) and spans.time_span[0] == pytest.approx(-0.11)


def test_a_priced_gpu_time_past_the_roofline_clocks_trace_time_is_said(tmp_path, monkeypatch):
    # every op at a thousandth of the ceilings: the priced attention takes far longer than the
    # roofline clock that served the trace, and the table says so in one line; at the ceilings'
    # own efficiencies it does not
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path / "home"))
    trace = mooncake(tmp_path / "t.jsonl", SMALL)
    for eta, said in ((1e-3, True), (1.0, False)):
        params = {"t_fixed_s": 0.0, "eta_c": eta, "eta_m": eta}
        fits = [{"op": c, "source": "t", "dtype": "bf16", "terms": ["fixed"], "params": params} for c in OP_CLASSES]
        store.write({"schema": "mlactl.calibration", "schema_version": 1, "name": "slow", "hardware": "h200",
                     "fits": fits})  # fmt: skip
        data = replay_json(trace, "--calibration", "slow")
        over = [e for e in data["engines"] if e["gpu_time_s"] > e["duration_s"]]
        assert bool(over) is said
        table = " ".join(run("replay", trace, "--hardware", "h200", "--calibration", "slow").stdout.split())
        assert ("GPU time as priced passes the trace time" in table) is said
