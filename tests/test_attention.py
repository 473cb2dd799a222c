"""mla_attention: every path and backend against the fp64 reference layer on random mixed
batches; the auto policy's three sources; bad input."""

import json

import numpy as np
import pytest
import torch

from mlactl.kernels.attention import auto_policy, mla_attention
from mlactl.kernels.reference import attend_expand, build_paged_cache

H, R, DR, DC, DV, PAGE = 2, 32, 16, 16, 16, 16
SCALE = 1 / (DC + DR) ** 0.5


def make_batch(news, prefixes, dtype, seed=0, fp8=False):
    """Random requests; returns kernel inputs and the fp64 expected output from reference.py."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(n + p, R + DR, generator=g, dtype=torch.float64) for n, p in zip(news, prefixes)]
    w_uk = torch.randn(H, DC, R, generator=g, dtype=torch.float64) / R**0.5
    w_uv = torch.randn(H, DV, R, generator=g, dtype=torch.float64) / R**0.5
    T = sum(news)
    q_nope = torch.randn(T, H, DC, generator=g, dtype=torch.float64)
    q_rope = torch.randn(T, H, DR, generator=g, dtype=torch.float64)
    kv_scale = None
    if fp8:
        kv_scale = 0.25
        rows = [(x / kv_scale).to(torch.float8_e4m3fn).to(torch.float64) * kv_scale for x in rows]
    cast = lambda t: t.to(dtype)  # noqa: E731
    # the reference sees what the kernels see: inputs rounded to the test dtype
    rows_ref = [x.to(dtype).to(torch.float64) if not fp8 else x for x in rows]
    q_nope_ref, q_rope_ref = cast(q_nope).double(), cast(q_rope).double()
    w_uk_ref, w_uv_ref = cast(w_uk).double(), cast(w_uv).double()
    expected, start = [], 0
    for n, x in zip(news, rows_ref):
        o, _ = attend_expand(
            q_nope_ref[start : start + n], q_rope_ref[start : start + n], x[:, :R], x[:, R:], w_uk_ref, w_uv_ref, SCALE
        )
        expected.append(o)
        start += n
    cache_rows = [(x / kv_scale).to(torch.float8_e4m3fn) for x in rows] if fp8 else [cast(x) for x in rows]
    kv_cache, table, seqlens = (
        build_paged_cache(cache_rows, PAGE, seed=seed) if not fp8 else _paged_fp8(cache_rows, seed)
    )
    inputs = dict(
        q_nope=cast(q_nope),
        q_rope=cast(q_rope),
        kv_cache=kv_cache,
        block_table=table,
        cache_seqlens=seqlens,
        new_lens=torch.tensor(news, dtype=torch.int32),
        w_uk=cast(w_uk),
        w_uv=cast(w_uv),
        scale=SCALE,
    )
    return inputs, kv_scale, torch.cat(expected)


def _paged_fp8(rows, seed):
    as_bytes = [x.view(torch.uint8) for x in rows]
    kv, table, seqlens = build_paged_cache(as_bytes, PAGE, seed=seed)
    return kv.view(torch.float8_e4m3fn), table, seqlens


TOL = {torch.float32: 2e-3, torch.float16: 2e-2}
BATCHES = [
    pytest.param([1, 1, 1], [0, 17, 300], id="decode-B3-p0,17,300"),
    pytest.param([5, 1, 33, 2], [40, 100, 0, 16], id="mixed-B4-n5,1,33,2"),
    pytest.param([20], [70], id="extend-B1-n20-p70"),
]


def rel_err(out, expected):
    return ((out.double() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("news, prefixes", BATCHES)
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("path", ["expand", "expand_chunked", "absorb"])
def test_paths_agree_with_reference(path, backend, news, prefixes, dtype):
    inputs, _, expected = make_batch(news, prefixes, dtype)
    out = mla_attention(**inputs, path=path, chunk=7, backend=backend)
    assert out.shape == (sum(news), H, DV) and out.dtype == dtype
    assert not torch.isnan(out).any()
    assert rel_err(out, expected) < TOL[dtype]


def test_per_request_paths_and_auto_in_one_batch():
    news, prefixes = [1, 4, 1, 30], [50, 0, 8, 30]
    inputs, _, expected = make_batch(news, prefixes, torch.float32, seed=3)
    out, chosen = mla_attention(
        **inputs, path=["absorb", "expand", "expand_chunked", "absorb"], chunk=16, return_paths=True
    )
    assert chosen == ["absorb", "expand", "expand_chunked", "absorb"]
    assert rel_err(out, expected) < 2e-3
    out, chosen = mla_attention(**inputs, path="auto", return_paths=True)
    assert rel_err(out, expected) < 2e-3
    assert set(chosen) <= {"expand", "expand_chunked", "absorb"}


def test_fp8_cache():
    news, prefixes = [1, 3], [40, 20]
    inputs, kv_scale, expected = make_batch(news, prefixes, torch.float16, fp8=True, seed=5)
    for path in ("absorb", "expand", "expand_chunked"):
        out = mla_attention(**inputs, path=path, chunk=8, kv_scale=kv_scale)
        assert rel_err(out, expected) < 3e-2, path


def test_auto_policy_sources(tmp_path, monkeypatch):
    """cpu has no hardware profile: FLOPs; a results file with measured crossovers for these dims
    and this device: measured. (The roofline source needs a profiled GPU; policy tests cover it.)"""
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path))
    from mlactl.kernels import attention

    attention._auto_policy.cache_clear()
    inputs, _, _ = make_batch([1, 50], [100, 100], torch.float32)
    args = (inputs["q_nope"], inputs["kv_cache"], inputs["w_uk"], inputs["w_uv"])
    policy = auto_policy(*args)
    assert policy.kind == "flops"
    # by FLOPs, decode after a prefix is absorb and a 50-token extend of this tiny model is expand
    assert list(policy([1, 50], [100, 100])) == ["absorb", "expand"]

    folder = tmp_path / "results" / "cpu"
    folder.mkdir(parents=True)
    data = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "created": "2026-11-30T00:00:00Z",
        "device": {"name": "cpu", "type": "cpu"},
        "backend": "torch",
        "timing": {},
        "model": {"name": "tiny", "H": H, "r": R, "dC": DC, "dR": DR, "dV": DV},
        "kv_dtype": "fp32",
        "crossovers": [{"batch": 1, "prefix": 100, "measured": 64, "predicted": 10}],
    }
    (folder / "tiny.json").write_text(json.dumps(data))
    attention._auto_policy.cache_clear()
    policy = auto_policy(*args)
    assert policy.kind == "measured" and "tiny.json" in policy.source
    assert list(policy([1, 50, 64], [100, 100, 100])) == ["absorb", "absorb", "expand"]
    attention._auto_policy.cache_clear()


def test_custom_policy_callable():
    inputs, _, expected = make_batch([2, 2], [10, 10], torch.float32)
    out, chosen = mla_attention(**inputs, policy=lambda new, prefix: np.array(["absorb"] * len(new)), return_paths=True)
    assert chosen == ["absorb", "absorb"] and rel_err(out, expected) < 2e-3


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda i: i.update(new_lens=torch.tensor([2, 2], dtype=torch.int32)), "new_lens sums to 4"),
        (lambda i: i.update(new_lens=torch.tensor([1, 300], dtype=torch.int32)), "new_lens[1] is 300"),
        (lambda i: i.update(q_rope=i["q_rope"][:, :1]), "q_rope is"),
        (lambda i: i.update(w_uk=i["w_uk"][:1]), "w_uk is"),
        (lambda i: i.update(w_uv=i["w_uv"][:, :, :8]), "w_uv is"),
        (lambda i: i.update(scale=0.0), "softmax scale must be a positive"),
        (lambda i: i.update(new_lens=i["new_lens"].long()), "new_lens has dtype int64"),
        (lambda i: i.update(kv_cache=i["kv_cache"][..., :40]), "kv_cache rows hold 40 numbers"),
    ],
)
def test_bad_input(change, message):
    inputs, _, _ = make_batch([1, 2], [10, 20], torch.float32)
    change(inputs)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        mla_attention(**inputs, path="absorb")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"path": "fast"}, "path must be one of"),
        ({"path": ["absorb"]}, "per-request path list needs 2 entries"),
        ({"backend": "cuda"}, "backend must be one of"),
        ({"chunk": 0}, "chunk must be an int >= 1"),
    ],
)
def test_bad_options(kwargs, message):
    inputs, _, _ = make_batch([1, 2], [10, 20], torch.float32)
    with pytest.raises(ValueError, match=message):
        mla_attention(**inputs, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["expand", "expand_chunked", "absorb"])
def test_deepseek_v3_mixed_batch_gpu(path):
    """DeepSeek-V3 dims per GPU at TP 8 (H=16), bf16, page 64: every path against the torch twins."""
    g = torch.Generator(device="cuda").manual_seed(0)
    news, prefixes, page = [1, 1, 64, 300], [4000, 100, 2000, 0], 64
    rows = [torch.randn(n + p, 576, generator=g, device="cuda", dtype=torch.bfloat16) for n, p in zip(news, prefixes)]
    kv, table, seqlens = build_paged_cache(rows, page)
    T = sum(news)
    inputs = dict(
        q_nope=torch.randn(T, 16, 128, generator=g, device="cuda", dtype=torch.bfloat16),
        q_rope=torch.randn(T, 16, 64, generator=g, device="cuda", dtype=torch.bfloat16),
        kv_cache=kv,
        block_table=table,
        cache_seqlens=seqlens,
        new_lens=torch.tensor(news, dtype=torch.int32, device="cuda"),
        w_uk=torch.randn(16, 128, 512, generator=g, device="cuda", dtype=torch.bfloat16) / 512**0.5,
        w_uv=torch.randn(16, 128, 512, generator=g, device="cuda", dtype=torch.bfloat16) / 512**0.5,
        scale=1 / 192**0.5,
    )
    out = mla_attention(**inputs, path=path, chunk=1024)
    ref = mla_attention(**inputs, path=path, chunk=1024, backend="torch")
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-2


def test_auto_policy_takes_a_calibration_of_its_own_paths_first(tmp_path, monkeypatch):
    """With a cpu hardware profile and a calibration of mlactl's own paths on it (these dims, this
    cache dtype), auto follows the calibrated times; a calibration of another engine's kernels,
    or of other dims, is never taken."""
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path))
    from mlactl.kernels import attention

    (tmp_path / "hardware").mkdir(parents=True)
    (tmp_path / "hardware" / "cpu.toml").write_text(
        'name = "cpu"\nmatch = ["cpu"]\nmemory_gb = 16\nbandwidth_tbs = 0.02\n[peak_tflops]\nfp32 = 0.2\n'
    )
    folder = tmp_path / "calibrations"
    folder.mkdir()
    dims = {"H": H, "r": R, "dC": DC, "dR": DR, "dV": DV}

    def write(name, expand_fixed, absorb_fixed, **source):
        fits = [
            {
                "op": f"path:{p}",
                "source": "mlactl-torch",
                "dtype": "fp32",
                "terms": ["fixed"],
                "params": {"t_fixed_s": t, "eta_c": 1.0, "eta_m": 1.0},
            }
            for p, t in (("expand", expand_fixed), ("absorb", absorb_fixed))
        ]
        src = {"kind": "results", "files": [], "dtype": "fp32", "model": dims, "kv_dtype": "fp32", **source}
        data = {
            "schema": "mlactl.calibration",
            "schema_version": 1,
            "name": name,
            "hardware": "cpu",
            "ceilings": {"dtype": "fp32"},
            "source": src,
            "created": f"2026-11-30T0{len(list(folder.iterdir()))}:00:00Z",
            "fits": fits,
        }
        (folder / f"{name}.json").write_text(json.dumps(data))

    inputs, _, _ = make_batch([1, 50], [100, 100], torch.float32)
    args = (inputs["q_nope"], inputs["kv_cache"], inputs["w_uk"], inputs["w_uv"])
    # another engine's kernels, and our own at other dims: not taken (FLOPs would pick
    # absorb, expand; both of these say expand everywhere)
    write("aiconfigurator", 0.0, 1.0, kind="aiconfigurator")
    write("other-dims", 0.0, 1.0, model=dict(dims, H=H * 2))
    attention._auto_policy.cache_clear()
    assert auto_policy(*args).kind == "roofline"
    # our own paths, expand a second slower than absorb everywhere: absorb for the 50-token extend too
    write("own", 1.0, 0.0)
    attention._auto_policy.cache_clear()
    policy = auto_policy(*args)
    assert policy.kind == "calibrated" and "own.json" in policy.source
    assert list(policy([1, 50], [100, 100])) == ["absorb", "absorb"]
    # a newer one the other way round: expand for the decode too
    write("own-newer", 0.0, 1.0)
    attention._auto_policy.cache_clear()
    assert list(auto_policy(*args)([1, 50], [100, 100])) == ["expand", "expand"]
    attention._auto_policy.cache_clear()
