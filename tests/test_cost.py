"""The cost model against figures worked out by hand and against a plain second implementation.

The second implementation below counts causal pairs by enumerating queries, and takes FLOPs and
bytes from an inventory of each op's matmuls and tensors (shape tuples), one request at a time in
plain Python: a different route to the same numbers than cost.py's closed forms over arrays.
"""

import math
import random

import numpy as np
import pytest

from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel, causal_pairs
from mlactl.model.roofline import crossover_by_time, path_times
from mlactl.util.errors import MlactlError

V3 = model.from_name("deepseek-v3")


# -- figures from docs/design.md, by hand ----------------------------------------------------


def test_pair_flops_deepseek_v3():
    cost = CostModel(V3)
    # expand: 2*128*(128+64) + 2*128*128 = 49152 + 32768
    assert cost.pair_flops("expand") == 81_920
    # absorb: 2*128*(512+64) + 2*128*512 = 147456 + 131072
    assert cost.pair_flops("absorb") == 278_528
    assert cost.pair_flops("absorb") / cost.pair_flops("expand") == pytest.approx(3.4, abs=0.01)


def test_expand_one_token_deepseek_v3():
    # 2 * 512 * 128 * (128 + 128)
    assert CostModel(V3).expand_token_flops() == 33_554_432


def test_asymptotic_crossover_deepseek_v3():
    # 33554432 / (278528 - 81920) = 33554432 / 196608 = 170 + 2/3
    assert CostModel(V3).asymptotic_crossover() == pytest.approx(170 + 2 / 3, rel=1e-12)


@pytest.mark.parametrize(
    "kv_dtype, expected",
    [
        pytest.param("bf16", 278_528 / 1_152, id="bf16-242"),  # 576 numbers * 2 bytes per token
        pytest.param("fp8", 278_528 / 576, id="fp8-484"),
    ],
)
def test_decode_intensity_long_cache(kv_dtype, expected):
    cost = CostModel(V3, kv_dtype=kv_dtype)
    attention = cost.ops("absorb", 1, 1, 10**9)[1]
    assert attention.name == "attention"
    assert float(attention.flops / attention.bytes) == pytest.approx(expected, rel=1e-5)
    assert expected == pytest.approx({"bf16": 241.8, "fp8": 483.6}[kv_dtype], abs=0.05)


def test_causal_pairs_by_hand():
    assert causal_pairs(1, 0) == 1
    assert causal_pairs(1, 99) == 100  # decode sees the whole context
    assert causal_pairs(3, 0) == 1 + 2 + 3
    assert causal_pairs(3, 10) == 11 + 12 + 13


def test_roofline_by_hand_on_teaching_gpu():
    """teaching: 100 TFLOP/s, 3 TB/s. Decode of one request with prefix 999 on the teaching model
    (H=32, r=512, dR=64): attention FLOPs = 1000 pairs * (2*32*576 + 2*32*512) = 69,632,000;
    bytes = 1000 rows * 1152 + q 32*576*2 + out 32*512*2 = 1,152,000 + 36,864 + 32,768
    = 1,221,632 -> memory 407.21 ns vs compute 696.32 ns: compute-bound, 696.32 ns."""
    cost = CostModel(model.from_name("teaching"))
    hw = hardware.from_name("teaching")
    times = path_times(cost, hw, ["absorb"], 1, 1, 999)["absorb"]
    att = times.ops[1]
    assert float(att.flops) == 69_632_000
    assert float(att.bytes) == 1_221_632
    assert float(att.time_s) == pytest.approx(696.32e-9, rel=1e-12)
    assert bool(att.compute_bound)


def test_crossover_by_flops_known_values():
    cost = CostModel(V3)
    assert cost.crossover_by_flops(0) == 1  # no prefix: expanding costs nothing extra
    for p in (4096, 32768, 10**6):
        n = cost.crossover_by_flops(p)
        assert n <= 171 and n >= 150
    assert cost.crossover_by_flops(10**9) == 171  # ceil of 170.67 as the prefix grows


# -- a plain second implementation -------------------------------------------------------------


def plain_pairs(n, p):
    return sum(p + i + 1 for i in range(n))  # new token i sees the prefix and tokens 0..i


def matmul(m, k, n):
    return 2 * m * k * n


def plain_ops(cfg, path, b, n, p, kvb, ab, chunk):
    """[(op, flops, bytes)] for one point, from shapes. kvb/ab: bytes per cache/activation number."""
    H, r, dC, dR, dV = cfg.H, cfg.r, cfg.dC, cfg.dR, cfg.dV
    k = n + p
    pairs = b * plain_pairs(n, p)

    def size(shape, nbytes):
        return math.prod(shape) * nbytes

    if path in ("expand", "expand_chunked"):
        passes = (-(-p // chunk) + 1 if p else 1) if path == "expand_chunked" else 1
        expand_flops = b * matmul(k, r, H * (dC + dV))
        expand_bytes = (
            size((b, k, r), kvb)
            + passes * size((r, H, dC + dV), ab)
            + size((b, k, H, dC), ab)
            + size((b, k, H, dV), ab)
        )
        att_flops = pairs * H * (2 * (dC + dR) + 2 * dV)
        out = size((b, n, H, dV), ab) if passes == 1 else passes * (size((b, n, H, dV), ab) + size((b, n, H), 4))
        att_bytes = (
            passes * size((b, n, H, dC + dR), ab)
            + size((b, k, H, dC), ab)
            + size((b, k, H, dV), ab)
            + size((b, k, dR), kvb)
            + out
        )
        ops = [("kv_expand", expand_flops, expand_bytes), ("attention", att_flops, att_bytes)]
        if path == "expand_chunked":
            merges = passes - 1
            ops.append(
                ("lse_merge", merges * b * n * H * dV * 3, merges * 3 * (size((b, n, H, dV), ab) + size((b, n, H), 4)))
            )
        return ops
    if path == "absorb":
        return [
            (
                "q_absorb",
                b * n * H * matmul(1, dC, r),
                size((b, n, H, dC), ab) + size((H, dC, r), ab) + size((b, n, H, r), ab),
            ),
            (
                "attention",
                pairs * H * (2 * (r + dR) + 2 * r),
                size((b, k, r + dR), kvb) + size((b, n, H, r + dR), ab) + size((b, n, H, r), ab),
            ),
            (
                "out_absorb",
                b * n * H * matmul(1, r, dV),
                size((b, n, H, r), ab) + size((H, r, dV), ab) + size((b, n, H, dV), ab),
            ),
        ]
    if path == "mha":
        return [
            (
                "attention",
                pairs * H * (2 * (dC + dR) + 2 * dV),
                size((b, k, H, dC + dR + dV), kvb) + size((b, n, H, dC + dR), ab) + size((b, n, H, dV), ab),
            )
        ]
    raise AssertionError(path)


def random_config(rng):
    return model.MLAConfig(
        "random",
        1024,
        rng.choice([1, 2, 8, 16, 128]),
        None,
        rng.choice([32, 64, 512]),
        rng.choice([16, 64, 128]),
        rng.choice([16, 64]),
        rng.choice([16, 128]),
        1,
    )


@pytest.mark.parametrize("seed", range(8))
def test_every_op_against_plain_implementation(seed):
    rng = random.Random(seed)
    cfg = random_config(rng)
    kv_dtype = rng.choice(["bf16", "fp8"])
    chunk = rng.choice([1, 7, 64, 8192])
    cost = CostModel(cfg, kv_dtype=kv_dtype, chunk=chunk)
    points = [(rng.randint(1, 64), rng.randint(1, 300), rng.choice([0, 1, rng.randint(2, 5000)])) for _ in range(12)]
    b, n, p = (np.array(x) for x in zip(*points))
    for path in ("expand", "expand_chunked", "absorb", "mha"):
        ops = cost.ops(path, b, n, p)
        for i, (bi, ni, pi) in enumerate(points):
            expected = plain_ops(cfg, path, bi, ni, pi, 1 if kv_dtype == "fp8" else 2, 2, chunk)
            assert [o.name for o in ops] == [e[0] for e in expected]
            for op, (name, flops, nbytes) in zip(ops, expected):
                assert op.flops[i] == flops, (path, name, points[i])
                assert op.bytes[i] == nbytes, (path, name, points[i])


@pytest.mark.parametrize("seed", range(4))
def test_crossover_by_flops_against_brute_force(seed):
    rng = random.Random(100 + seed)
    cfg = random_config(rng)
    cost = CostModel(cfg)
    for p in [0, 1, rng.randint(2, 300), rng.randint(300, 20000)]:

        def expand_minus_absorb(n, p=p):
            e = sum(f for _, f, _ in plain_ops(cfg, "expand", 1, n, p, 2, 2, 8192))
            a = sum(f for _, f, _ in plain_ops(cfg, "absorb", 1, n, p, 2, 2, 8192))
            return e - a

        got = cost.crossover_by_flops(p)
        if got is None:
            assert all(expand_minus_absorb(n) >= 0 for n in range(1, 400))
            continue
        assert expand_minus_absorb(got) < 0
        assert got == 1 or expand_minus_absorb(got - 1) >= 0
        # and expand keeps winning after it (the difference is monotone in n)
        assert all(expand_minus_absorb(n) < 0 for n in range(got, got + 50))


def test_crossover_by_time_against_plain_roofline():
    cfg = V3.with_tp(8)
    hw = hardware.from_name("h200")
    cost = CostModel(cfg)
    peak, bw = 989e12, 4.8e12

    def plain_time(path, n, p, b):
        return sum(max(f / peak, by / bw) for _, f, by in plain_ops(cfg, path, b, n, p, 2, 2, 8192))

    for b in (1, 32):
        prefixes = [0, 512, 4096]
        got = crossover_by_time(cost, hw, prefixes, batch=b)
        for p, n in zip(prefixes, got):
            first = next(m for m in range(1, 5000) if plain_time("expand", m, p, b) < plain_time("absorb", m, p, b))
            assert n == first


def test_peak_expanded_and_cache_bytes_by_hand():
    cost = CostModel(V3, chunk=1000)
    per_token = 128 * (128 + 128) * 2  # k_nope + v of 128 heads in bf16: 65536 bytes
    assert float(cost.peak_expanded_bytes("expand", 2, 10, 5000)) == 2 * 5010 * per_token
    assert float(cost.peak_expanded_bytes("expand_chunked", 2, 10, 5000)) == 2 * 1000 * per_token
    assert float(cost.peak_expanded_bytes("expand_chunked", 1, 3000, 5000)) == 3000 * per_token
    assert float(cost.peak_expanded_bytes("absorb", 2, 10, 5000)) == 0
    assert float(cost.kv_cache_bytes(2, 10, 5000)) == 2 * 5010 * 576 * 2
    assert float(cost.mha_cache_bytes(2, 10, 5000)) == 2 * 5010 * 128 * 320 * 2
    assert float(CostModel(V3, kv_dtype="fp8").kv_cache_bytes(1, 1, 0)) == 576


def test_tp_divides_heads_not_the_latent_cache():
    tp8 = CostModel(V3.with_tp(8))
    assert tp8.cfg.H == 16
    assert tp8.latent_row_bytes() == CostModel(V3).latent_row_bytes()
    assert tp8.pair_flops("absorb") * 8 == CostModel(V3).pair_flops("absorb")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kv_dtype": "int4"}, "unknown kv dtype"),
        ({"dtype": "fp8"}, "unknown dtype"),
        ({"chunk": 0}, "--chunk must be a positive integer"),
    ],
)
def test_bad_cost_arguments(kwargs, message):
    with pytest.raises(MlactlError, match=message):
        CostModel(V3, **kwargs)


# -- the whole forward outside attention (ForwardCost), by hand ---------------------------------------


def test_forward_flops_deepseek_v3_batch_1_by_hand():
    """One token, no prefix, TP 1: 2 FLOPs per activated weight, plus absorb's one pair.

    Per layer, attention: qkv_a 7168 * (1536 + 512 + 64) = 15,138,816; q_b 1536 * 128 * 192 =
    37,748,736; o 128 * 128 * 7168 = 117,440,512; W_UK + W_UV (absorb's projections)
    512 * 128 * 256 = 16,777,216: 187,105,280 a layer, 11,413,422,080 over 61.
    Dense MLP 3 * 7168 * 18432 = 396,361,728, 3 layers: 1,189,085,184.
    MoE layer: router 7168 * 256 = 1,835,008; 8 routed + 1 shared experts of 3 * 7168 * 2048 =
    44,040,192: 396,361,728; 398,196,736 a layer, 23,095,410,688 over 58.
    LM head 129,280 * 7168 = 926,679,040.
    Sum 36,624,596,992 weights: 73,249,193,984 FLOPs; absorb's attention, one pair:
    2 * 128 * 576 + 2 * 128 * 512 = 278,528 a layer, 16,990,208 over 61.
    Total 73,266,184,192: 2 x DeepSeek-V3's 37B activated parameters, within 1%."""
    from mlactl.model.cost import ForwardCost
    from mlactl.model.weights import from_name as weights_of

    fc = ForwardCost(V3, weights_of("deepseek-v3"))
    flops, _, comm = fc.totals(1, 1)
    attention = sum(float(o.flops) for o in CostModel(V3).ops("absorb", 1, 1, 0)) * 61
    assert flops == 73_249_193_984 - 16_777_216 * 2 * 61  # the paths' ops hold W_UK and W_UV
    assert flops + attention == 73_266_184_192
    assert (flops + attention) / 73e9 == pytest.approx(1.0, abs=0.01)
    assert comm == 0.0  # TP 1: no collectives


def test_forward_bytes_deepseek_v3_decode_tp8_by_hand():
    """One decode token at TP 8 (16 heads a GPU), fp8 weights, bf16 activations, per GPU:
    qkv_a (replicated) 7168 * 2112 + (7168 + 2112) * 2 = 15,157,376; q_b 1536 * 3072 + (1536 +
    3072) * 2 = 4,727,808; o 2048 * 7168 + (2048 + 7168) * 2 = 14,698,496: 34,583,680 a layer.
    Dense MLP (width 18432 / 8 = 2304): 3 * 7168 * 2304 + (2 * 7168 + 6 * 2304) * 2 = 49,601,536.
    Router (bf16, replicated): 7168 * 256 * 2 + 7168 * 2 + 256 * 4 = 3,685,376; shared expert
    (width 256): 5,505,024 + (14,336 + 1,536) * 2 = 5,536,768; one token hits 256 * (1 - (1 -
    8/256)) = 8 routed experts: 8 * 5,536,768 = 44,294,144. LM head (bf16, 129,280 / 8 = 16,160
    columns): 7168 * 16160 * 2 + 7168 * 2 + 16160 * 2 = 231,716,416.
    Sum 61 * 34,583,680 + 3 * 49,601,536 + 58 * 53,516,288 + 231,716,416 = 5,594,070,208 bytes.
    Each all-reduce sends 2 * 7/8 * 7168 * 2 = 25,088 bytes, 122 of them; the logits' gather
    7/8 * 129,280 * 2 = 226,240."""
    from mlactl.model.cost import ForwardCost
    from mlactl.model.weights import from_name as weights_of

    fc = ForwardCost(V3.with_tp(8), weights_of("deepseek-v3"))
    flops, nbytes, comm = fc.totals(1, 1)
    assert nbytes == 5_594_070_208
    assert comm == 122 * 25_088 + 226_240
    by = {o.name: o for o in fc.ops(1, 1)}
    assert by["qkv_a_proj"].weight_bytes == 7168 * 2112  # not split: a ReplicatedLinear
    assert by["routed_experts"].weight_bytes == pytest.approx(8 * 3 * 7168 * 256)
    assert by["all_reduce"].count == 122 and by["all_reduce"].comm_bytes == 25_088


def test_forward_lm_head_only_where_a_token_samples():
    from mlactl.model.cost import ForwardCost
    from mlactl.model.weights import from_name as weights_of

    head = {o.name: o for o in ForwardCost(V3.with_tp(8), weights_of("deepseek-v3")).ops(4096, 0)}["lm_head"]
    assert head.flops == 0 and head.bytes == 0  # a chunk that does not finish its prompt samples nothing


def test_forward_dense_model_has_no_experts():
    from mlactl.model.cost import ForwardCost
    from mlactl.model.weights import from_name as weights_of

    names = [o.name for o in ForwardCost(model.from_name("teaching"), weights_of("teaching")).ops(1, 1)]
    assert "routed_experts" not in names and "router" not in names and "dense_mlp" in names
