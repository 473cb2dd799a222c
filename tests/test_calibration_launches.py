"""A calibrated launch worked out by hand: what `batch_time`, `launch_parts` and `mlactl replay`'s
steps (all steps.PathLaunches) give for rows of requests run as one launch per op.

Every figure here is written from DeepSeek-V3's dims and the fits' parameters (FLOPs and bytes
of q_absorb and of absorb's decode attention counted by hand), never from the pricer's parts:
one fixed cost per launch, the rows' FLOPs and bytes summed, the weights read once, the decode fit
only where every row of the launch is decode-like, and the `near` factor of the launch's summed
shape, not of any row's.
"""

import numpy as np
import pytest

from mlactl.decide.calibration import store
from mlactl.decide.calibration.steps import PathLaunches
from mlactl.decide.calibration.time import batch_time, launch_parts
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.model.cost import CostModel

HW = hardware.resolve("h200")
PEAK, BW = HW.peak_flops("bf16"), HW.bandwidth
COST = CostModel(from_name("deepseek-v3"))  # H 128, dC 128, r 512, dR 64, dV 128, bf16
H, DC, R, DR, DV = 128, 128, 512, 64, 128
# q_absorb by hand: each token's q_nope (H x dC) times W_UK (H x dC x r): 2*H*dC*r FLOPs, reading
# H*dC and writing H*r bf16 numbers; the weights, H*dC*r bf16 numbers, are read once a launch
Q_FLOPS = 2 * H * DC * R  # 16,777,216 a token
Q_BYTES = (H * DC + H * R) * 2  # 163,840 a token
Q_WEIGHTS = H * DC * R * 2  # 16,777,216
Q_AT = [op.name for op in COST.ops("absorb", 1, 1, 0)].index("q_absorb")
A_AT = [op.name for op in COST.ops("absorb", 1, 1, 0)].index("attention")


def calibration(*fits):
    data = {"schema": "mlactl.calibration", "schema_version": 1, "name": "t", "hardware": "h200",
            "fits": list(fits)}  # fmt: skip
    return store.validate(data, "test")


def q_fit(t_fixed=4e-6, eta_c=0.5, eta_m=0.8, **more):
    params = {"t_fixed_s": t_fixed, "eta_c": eta_c, "eta_m": eta_m} | more.pop("params", {})
    return {"op": "q_absorb", "source": "t", "dtype": "bf16", "terms": more.pop("terms", ["fixed"]),
            "params": params}  # fmt: skip


def q_launch(tokens, t_fixed=4e-6, eta_c=0.5, eta_m=0.8) -> float:
    """One q_absorb launch over `tokens` tokens in all, by hand."""
    flops, nbytes = tokens * Q_FLOPS, tokens * Q_BYTES + Q_WEIGHTS
    return t_fixed + max(flops / (eta_c * PEAK), nbytes / (eta_m * BW))


def test_a_launch_pays_one_fixed_cost_and_reads_the_weights_once():
    cal = calibration(q_fit())
    new, prefix, count = np.array([100.0, 300.0]), np.zeros(2), np.array([1.0, 2.0])
    got = launch_parts(COST, HW, cal, "absorb", count, new, prefix)[Q_AT]
    # 100 + 2 x 300 = 700 tokens: 11,744,051,200 FLOPs, 114,688,000 + 16,777,216 bytes
    assert got == pytest.approx(4e-6 + 131_465_216 / (0.8 * BW), rel=1e-12)
    assert got == pytest.approx(q_launch(700), rel=1e-12)
    alone = [
        launch_parts(COST, HW, cal, "absorb", count[i : i + 1], new[i : i + 1], prefix[i : i + 1])[Q_AT] for i in (0, 1)
    ]
    # apart, each pays its own fixed cost and reads the weights itself
    assert sum(alone) - got == pytest.approx(4e-6 + Q_WEIGHTS / (0.8 * BW), rel=1e-9)


def test_compute_adds_up_over_the_rows_of_a_launch():
    # eta_m so high that the launch is compute-bound: the rows' FLOPs add up, one t_fixed
    cal = calibration(q_fit(eta_c=0.05, eta_m=1.2))
    got = launch_parts(COST, HW, cal, "absorb", np.ones(3), np.array([64.0, 128.0, 256.0]), np.zeros(3))[Q_AT]
    assert got == pytest.approx(4e-6 + 448 * Q_FLOPS / (0.05 * PEAK), rel=1e-12)


def test_steps_priced_at_once_are_each_its_own_launch():
    cal = calibration(q_fit())
    new = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    launches = PathLaunches(COST, HW, cal, "absorb", new, np.zeros(6), layers=3)
    starts = np.array([0, 1, 4])  # steps of rows {0}, {1, 2, 3}, {4, 5}
    got = launches.class_seconds(starts)[Q_AT]
    want = [3 * q_launch(t) for t in (10, 90, 110)]  # each layer launches its own
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # a masked row leaves its step: {1, 3} of the second
    masked = launches.class_seconds(starts, mask=np.array([1, 1, 0, 1, 1, 1]))[Q_AT]
    assert masked[1] == pytest.approx(3 * q_launch(60), rel=1e-12)


def decode_attention(ctx):
    """Absorb's decode attention of one request at `ctx` keys (itself included), by hand:
    FLOPs 2H(r+dR) + 2Hr a key; bytes: the cache ctx(r+dR), the query H(r+dR), the output H*r."""
    return ctx * (2 * H * (R + DR) + 2 * H * R), (ctx * (R + DR) + H * (R + DR) + H * R) * 2


def test_the_decode_fit_times_a_launch_only_where_every_row_is_decode_like():
    decode = {"t_fixed_s": 1e-5, "eta_c": 0.5, "eta_m": 0.8}
    prefill = {"t_fixed_s": 3e-5, "eta_c": 0.25, "eta_m": 0.4}
    cal = calibration(
        {"op": "absorb_attention", "source": "x:decode", "dtype": "bf16", "terms": ["fixed"], "params": decode},
        {"op": "absorb_attention", "source": "x:prefill", "dtype": "bf16", "terms": ["fixed"], "params": prefill},
    )
    ctx = np.array([4096.0, 100.0])
    f, b = (sum(v) for v in zip(*(decode_attention(c) for c in ctx)))
    got = launch_parts(COST, HW, cal, "absorb", np.ones(2), np.ones(2), ctx - 1)[A_AT]
    assert got == pytest.approx(1e-5 + max(f / (0.5 * PEAK), b / (0.8 * BW)), rel=1e-12)
    # the same rows at 8 new tokens each are still decode-like; a ninth makes the launch prefill's
    for n, p in ((8.0, decode), (9.0, prefill)):
        t = launch_parts(COST, HW, cal, "absorb", np.ones(2), np.full(2, n), ctx - 1)[A_AT]
        ops = COST.ops("absorb", np.ones(2), np.full(2, n), ctx - 1)[A_AT]
        want = p["t_fixed_s"] + max(ops.flops.sum() / (p["eta_c"] * PEAK), ops.bytes.sum() / (p["eta_m"] * BW))
        assert t == pytest.approx(want, rel=1e-12)
    # one prefill row (no cached prefix) puts the whole launch on the prefill fit
    mixed = launch_parts(COST, HW, cal, "absorb", np.ones(2), np.ones(2), np.array([4095.0, 0.0]))[A_AT]
    f2, b2 = (a + c for a, c in zip(decode_attention(4096.0), decode_attention(1.0)))
    assert mixed == pytest.approx(3e-5 + max(f2 / (0.25 * PEAK), b2 / (0.4 * BW)), rel=1e-12)


def test_near_corrects_a_launch_at_its_summed_shape():
    # measured q_absorb shapes (log2 rows, log2 heads, unaligned): a residual of +0.5 around 200
    # rows and of -0.5 around 400. Two rows of 200 tokens are one GEMM of 400 rows: its factor is
    # exp(+0.5), though each row alone takes exp(-0.5)
    low = [[float(np.log2(m)), 7.0, 0.0] for m in range(160, 248, 4)]
    high = [[float(np.log2(m)), 7.0, 0.0] for m in range(380, 424, 4)]
    near = {"features": low + high, "log_residual": [0.5] * len(low) + [-0.5] * len(high)}
    cal = calibration(q_fit(terms=["fixed", "near"], params={"near": near}))
    two = launch_parts(COST, HW, cal, "absorb", np.ones(2), np.full(2, 200.0), np.zeros(2))[Q_AT]
    assert two == pytest.approx(q_launch(400) * np.exp(0.5), rel=1e-9)
    one = launch_parts(COST, HW, cal, "absorb", np.ones(1), np.full(1, 200.0), np.zeros(1))[Q_AT]
    assert one == pytest.approx(q_launch(200) * np.exp(-0.5), rel=1e-9)


def test_a_whole_path_fit_times_the_launch_as_one():
    # path:absorb at its own efficiencies: the path's FLOPs and bytes over both rows, the weights
    # of q_absorb and out_absorb (H*r*dV bf16 numbers) once, one fixed cost
    params = {"t_fixed_s": 2e-5, "eta_c": 0.5, "eta_m": 0.8}
    cal = calibration({"op": "path:absorb", "source": "r", "dtype": "bf16", "terms": ["fixed"], "params": params})
    new, prefix = np.array([1.0, 1.0]), np.array([4095.0, 99.0])
    parts = launch_parts(COST, HW, cal, "absorb", np.ones(2), new, prefix)
    assert len(parts) == 1
    f, b = (sum(v) for v in zip(*(decode_attention(c) for c in (4096.0, 100.0))))
    f += 2 * (Q_FLOPS + 2 * H * R * DV)
    b += 2 * (Q_BYTES + (H * R + H * DV) * 2) + Q_WEIGHTS + H * R * DV * 2
    want = 2e-5 + max(f / (0.5 * PEAK), b / (0.8 * BW))
    assert parts[0] == pytest.approx(want, rel=1e-12)
    assert batch_time(COST, HW, cal, new, prefix, np.ones(2), np.array(["absorb", "absorb"])) == pytest.approx(want)


def test_a_roofline_launch_reads_the_weights_as_often_as_its_most_chunked_row():
    # expand_chunked at chunk 8192: a prefix of 20,000 is 3 chunks and the new tokens a fourth
    # partial, so kv_expand reads its weights (H*(dC+dV)*r bf16 numbers) 4 times; of 100, twice
    cost = CostModel(from_name("deepseek-v3"), chunk=8192)
    new, prefix = np.array([100.0, 100.0]), np.array([20000.0, 100.0])
    weights = H * (DC + DV) * R * 2
    kv = cost.ops("expand_chunked", 1, new, prefix)[0]
    assert kv.name == "kv_expand" and kv.weight_bytes.tolist() == [4 * weights, 2 * weights]
    # the roofline of the launch: every op's summed FLOPs and bytes, each op's weights at the most
    want = 0.0
    for op in cost.ops("expand_chunked", 1, new, prefix):
        w = np.broadcast_to(op.weight_bytes, (2,))
        want += max(op.flops.sum() / PEAK, (op.bytes.sum() - w.sum() + w.max()) / BW)
    got = batch_time(cost, HW, None, new, prefix, np.ones(2), np.array(["expand_chunked"] * 2))
    assert got == pytest.approx(want, rel=1e-12)


def test_a_row_of_several_requests_is_a_batch_at_its_shape():
    # count = 3: three requests of 100 tokens in the launch, as three rows of one
    cal = calibration(q_fit())
    three = launch_parts(COST, HW, cal, "absorb", np.array([3.0]), np.array([100.0]), np.zeros(1))[Q_AT]
    assert three == pytest.approx(q_launch(300), rel=1e-12)
    rows = launch_parts(COST, HW, cal, "absorb", np.ones(3), np.full(3, 100.0), np.zeros(3))[Q_AT]
    assert rows == pytest.approx(three, rel=1e-12)
