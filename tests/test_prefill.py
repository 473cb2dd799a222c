"""kernels/prefill.py (mla_prefill) against its twin, and the twin against the formula."""

import math

import pytest
import torch

from mlactl.kernels import reference as R
from mlactl.kernels.prefill import mla_prefill
from mlactl.kernels.prefill_naive import mla_prefill_naive

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
LSE_TOL = {
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=1e-2),
}


def cu(lengths, device=DEVICE):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def make(lens_q, lens_k, H=2, dC=32, dR=16, dV=32, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    T_q, T_k = sum(lens_q), sum(lens_k)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    return dict(
        q=rnd(T_q, H, dC + dR),
        k_nope=rnd(T_k, H, dC),
        k_rope=rnd(T_k, dR),
        v=rnd(T_k, H, dV),
        cu_seqlens_q=cu(lens_q, device),
        cu_seqlens_k=cu(lens_k, device),
        scale=1 / math.sqrt(dC + dR),
    )


def assert_matches_twin(args, causal, dtype, **kwargs):
    out, lse = mla_prefill(**args, causal=causal, **kwargs)
    ref_out, ref_lse = mla_prefill_naive(**args, causal=causal)
    assert out.dtype == args["q"].dtype and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.float(), ref_out.float(), **TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, **LSE_TOL[dtype])
    return out, lse


# (lens_q, lens_k, H): one odd shape (lq 17), long contexts, varlen mixes with len_q < len_k
SHAPES = [
    pytest.param([1], [1], 1, id="B1-H1-lq1-lk1"),
    pytest.param([17], [17], 2, id="B1-H2-lq17-lk17"),
    pytest.param([17], [300], 2, id="B1-H2-lq17-lk300"),
    pytest.param([100], [100], 1, id="B1-H1-lq100-lk100"),
    pytest.param([1, 17, 100], [1, 100, 300], 2, id="B3-H2-lq1,17,100-lk1,100,300"),
    pytest.param([0, 5, 33, 1], [7, 5, 40, 300], 3, id="B4-H3-lq0,5,33,1-lk7,5,40,300"),
    pytest.param([300, 100], [300, 300], 2, id="B2-H2-lq300,100-lk300,300"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("lens_q, lens_k, H", SHAPES)
def test_matches_twin(lens_q, lens_k, H, causal, dtype):
    assert_matches_twin(make(lens_q, lens_k, H=H, dtype=dtype), causal, dtype)


# block geometries around the causal diagonal: BLOCK_M < = > BLOCK_N
CONFIGS = [
    pytest.param(dict(BLOCK_M=16, BLOCK_N=16), id="M16-N16"),
    pytest.param(dict(BLOCK_M=16, BLOCK_N=32), id="M16-N32"),
    pytest.param(dict(BLOCK_M=64, BLOCK_N=16), id="M64-N16"),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("config", CONFIGS)
def test_block_geometries(config, causal):
    args = make([1, 17, 70], [1, 50, 130], H=1)
    assert_matches_twin(args, causal, torch.float32, config=config)


def test_odd_head_dims_are_padded():
    """dC 40, dR 8, dV 24: none a power of two, dR below tl.dot's 16."""
    args = make([17, 3], [40, 3], H=3, dC=40, dR=8, dV=24)
    assert_matches_twin(args, True, torch.float32)


def test_every_element_of_out_is_written():
    args = make([1, 17, 33], [9, 17, 60], H=2)
    out = torch.full((51, 2, 32), float("nan"), device=DEVICE)
    got, _ = mla_prefill(**args, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert not out.isnan().any()
    torch.testing.assert_close(out, mla_prefill_naive(**args)[0], **TOL[torch.float32])


def test_twin_writes_every_element_too():
    args = make([1, 17], [9, 17], H=2)
    out = torch.full((18, 2, 32), float("nan"), device=DEVICE)
    mla_prefill_naive(**args, out=out)
    assert not out.isnan().any()


def test_strided_views_are_read_in_place():
    """k_nope and v as views of one [T, H, dC+dV] tensor, k_rope a column slice of cache rows."""
    lens_q, lens_k, H, dC, dR, dV = [5, 17], [20, 17], 2, 32, 16, 32
    g = torch.Generator().manual_seed(4)
    kv = torch.randn(37, H, dC + dV, generator=g).to(DEVICE)
    rows = torch.randn(37, 48 + dR, generator=g).to(DEVICE)
    q = torch.randn(22, H, 2 * (dC + dR), generator=g).to(DEVICE)[..., : dC + dR]
    args = dict(
        q=q,
        k_nope=kv[..., :dC],
        k_rope=rows[:, 48:],
        v=kv[..., dC:],
        cu_seqlens_q=cu(lens_q),
        cu_seqlens_k=cu(lens_k),
        scale=0.1,
    )
    out, lse = mla_prefill(**args)
    contig = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    ref_out, ref_lse = mla_prefill_naive(**contig)
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    torch.testing.assert_close(lse, ref_lse, **LSE_TOL[torch.float32])


def test_rows_without_keys_are_zero_with_lse_minus_inf():
    """Non-causal requests with len_k = 0: out 0, lse -inf, no NaN (kernel and twin)."""
    args = make([3, 4, 2], [0, 6, 0], H=2)
    for fn in (mla_prefill, mla_prefill_naive):
        out, lse = fn(**args, causal=False)
        assert not out.isnan().any()
        assert (out[:3] == 0).all() and (out[7:] == 0).all()
        assert (lse[:3] == float("-inf")).all() and (lse[7:] == float("-inf")).all()
        assert torch.isfinite(lse[3:7]).all()


def test_no_queries_at_all():
    args = make([0, 0], [0, 5], H=2)
    out, lse = mla_prefill(**args)
    assert out.shape == (0, 2, 32) and lse.shape == (0, 2)


def test_twin_matches_a_loop_over_queries_and_heads():
    """The twin against the formula written out, one (query, head) at a time, in fp64."""
    lens_q, lens_k, H, dC, dR = [2, 3], [4, 3], 2, 4, 2
    args = make(lens_q, lens_k, H=H, dC=dC, dR=dR, dV=3, device="cpu")
    for causal in (True, False):
        out, lse = mla_prefill_naive(**args, causal=causal)
        q, kn, kr, v, scale = (args[k] for k in ("q", "k_nope", "k_rope", "v", "scale"))
        q0 = k0 = 0
        for lq, lk in zip(lens_q, lens_k):
            for i in range(lq):
                for h in range(H):
                    visible = [j for j in range(lk) if not causal or j <= i + lk - lq]
                    s = [
                        scale
                        * (
                            sum(q[q0 + i, h, c].item() * kn[k0 + j, h, c].item() for c in range(dC))
                            + sum(q[q0 + i, h, dC + d].item() * kr[k0 + j, d].item() for d in range(dR))
                        )
                        for j in visible
                    ]
                    z = sum(math.exp(x) for x in s)
                    assert abs(lse[q0 + i, h].item() - math.log(z)) < 1e-5
                    for e in range(3):
                        o = sum(math.exp(x) / z * v[k0 + j, h, e].item() for x, j in zip(s, visible))
                        assert abs(out[q0 + i, h, e].item() - o) < 1e-5
            q0 += lq
            k0 += lk


def test_twin_matches_the_reference_expand_path():
    """mla_prefill_naive on the expanded keys of reference.py's layer == reference attend_expand."""
    w = R.random_weights(2, 32, 16, 32, 32, 48, q_lora_rank=24, seed=7)
    x = torch.randn(30, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    q_nope, q_rope, c, k_r = R.project(w, x, prefix_len=21)
    ref_o, ref_lse = R.attend_expand(q_nope, q_rope, c, k_r, w.w_uk, w.w_uv, w.scale)
    k_nope = torch.einsum("tr,hcr->thc", c, w.w_uk).float()
    v = torch.einsum("tr,hvr->thv", c, w.w_uv).float()
    q = torch.cat([q_nope, q_rope], -1).float()
    out, lse = mla_prefill_naive(q, k_nope, k_r.float(), v, cu([9], "cpu"), cu([30], "cpu"), w.scale)
    torch.testing.assert_close(out, ref_o.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse.float(), atol=1e-5, rtol=1e-5)


def _bad(name):
    """Mutations of valid inputs, each with the word its error message must contain."""
    T = torch.int32
    cases = {
        "q-2d": (lambda a: a.update(q=a["q"][:, 0]), "q must have 3 dimensions"),
        "q-int": (lambda a: a.update(q=a["q"].to(torch.int32)), "q has dtype"),
        "k_nope-fp16": (lambda a: a.update(k_nope=a["k_nope"].half()), "k_nope has dtype"),
        "k_rope-per-head": (lambda a: a.update(k_rope=a["k_rope"][:, None].expand(-1, 2, -1)), "k_rope must have 2"),
        "q-width": (lambda a: a.update(q=a["q"][..., :40]), r"q.shape\[2\]"),
        "v-heads": (lambda a: a.update(v=a["v"][:, :1]), r"v.shape\[1\]"),
        "k_rope-tokens": (lambda a: a.update(k_rope=a["k_rope"][:-1]), r"k_rope.shape\[0\]"),
        "q-inner-stride": (
            lambda a: a.update(q=a["q"].transpose(0, 2).contiguous().transpose(0, 2)),
            "q must have unit stride",
        ),
        "cu-int64": (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].long()), "cu_seqlens_q has dtype"),
        "cu-not-monotone": (
            lambda a: a.update(cu_seqlens_q=torch.tensor([0, 9, 5, 22], dtype=T, device=DEVICE)),
            "cu_seqlens_q must be non-decreasing",
        ),
        "cu-first": (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"] + 1), r"cu_seqlens_k\[0\]"),
        "cu-total": (
            lambda a: a.update(cu_seqlens_k=torch.tensor([0, 10, 30, 40], dtype=T, device=DEVICE)),
            r"cu_seqlens_k\[-1\]",
        ),
        "cu-batch": (
            lambda a: a.update(cu_seqlens_k=torch.tensor([0, 41], dtype=T, device=DEVICE)),
            "both must be B\\+1",
        ),
        "lq-gt-lk": (
            lambda a: a.update(cu_seqlens_k=torch.tensor([0, 4, 24, 41], dtype=T, device=DEVICE)),
            "len_q <= len_k",
        ),
        "scale-zero": (lambda a: a.update(scale=0.0), "scale"),
        "scale-negative": (lambda a: a.update(scale=-0.1), "scale"),
        "scale-nan": (lambda a: a.update(scale=float("nan")), "scale"),
        "scale-none": (lambda a: a.update(scale=None), "scale"),
        "max-seqlen-small": (lambda a: a.update(max_seqlen_q=4), "max_seqlen_q"),
        "out-shape": (lambda a: a.update(out=torch.empty(22, 2, 31, device=DEVICE)), "out has shape"),
        "out-dtype": (
            lambda a: a.update(out=torch.empty(22, 2, 32, device=DEVICE, dtype=torch.float16)),
            "out has dtype",
        ),
        "devices": (lambda a: a.update(k_rope=a["k_rope"].to("meta")), "different devices"),
    }
    return cases[name]


BAD = [
    "q-2d",
    "q-int",
    "k_nope-fp16",
    "k_rope-per-head",
    "q-width",
    "v-heads",
    "k_rope-tokens",
    "q-inner-stride",
    "cu-int64",
    "cu-not-monotone",
    "cu-first",
    "cu-total",
    "cu-batch",
    "lq-gt-lk",
    "scale-zero",
    "scale-negative",
    "scale-nan",
    "scale-none",
    "max-seqlen-small",
    "out-shape",
    "out-dtype",
    "devices",
]


@pytest.mark.parametrize("fn", [mla_prefill, mla_prefill_naive], ids=["kernel", "twin"])
@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_name_the_argument(case, fn):
    args = make([5, 12, 5], [10, 20, 11], H=2)
    mutate, match = _bad(case)
    mutate(args)
    with pytest.raises(ValueError, match=match):
        fn(**args)


@pytest.mark.parametrize(
    "config, match",
    [
        pytest.param(dict(BLOCK_M=24), r"config\['BLOCK_M'\] must be a power of two >= 16", id="BLOCK_M-24"),
        pytest.param(dict(BLOCK_N=8), r"config\['BLOCK_N'\] must be a power of two >= 16", id="BLOCK_N-8"),
        pytest.param(dict(num_warps=3), "num_warps", id="warps-3"),
        pytest.param(dict(BLOCK_K=32), "unknown keys", id="unknown-key"),
        pytest.param([64, 64], "config must be a dict", id="not-a-dict"),
        pytest.param(dict(num_stages=0), "num_stages", id="stages-0"),
    ],
)
def test_bad_config(config, match):
    with pytest.raises(ValueError, match=match):
        mla_prefill(**make([5], [10]), config=config)


def test_cpu_tensors_refused_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="need CUDA tensors"):
        mla_prefill(**make([5], [10], device="cpu"))


# ---- GPU: DeepSeek-V3 shapes, bf16, against the twin --------------------------------------

DSV3 = dict(H=128, dC=128, dR=64, dV=128)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens_q, lens_k",
    [
        pytest.param([1], [1], id="B1-lq1-lk1"),
        pytest.param([1000], [1000], id="B1-lq1000-lk1000"),
        pytest.param([8192], [8192], id="B1-lq8192-lk8192"),
        pytest.param([512, 1, 2048, 77], [4096, 3000, 2048, 8192], id="B4-varlen-prefix"),
    ],
)
def test_gpu_deepseek_bf16(lens_q, lens_k):
    args = make(lens_q, lens_k, dtype=torch.bfloat16, device="cuda", **DSV3)
    assert_matches_twin(args, True, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_deepseek_other_dtypes(dtype, causal):
    args = make([300, 17], [1000, 17], dtype=dtype, device="cuda", **DSV3)
    assert_matches_twin(args, causal, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        pytest.param(dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2), id="M128-N128-s2"),
        pytest.param(dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3), id="M64-N64-s3"),
    ],
)
def test_gpu_deepseek_configs(config):
    args = make([777, 128], [2000, 128], dtype=torch.bfloat16, device="cuda", **DSV3)
    assert_matches_twin(args, True, torch.bfloat16, config=config)


# ---- Hopper code generation without a GPU -------------------------------------------------------

_COMPILE_SM90 = r"""
import inspect, json, os, re, subprocess, sys, tempfile
import triton
# The offline-compile API this script drives (Triton 3.2-3.9). Where it differs, say so and exit
# 77, the one status the test skips on; any other error (ours included) fails the test.
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    api = (list(inspect.signature(ASTSource).parameters)[:4], list(inspect.signature(triton.compile).parameters)[:3])
except ImportError as exc:
    api = repr(exc)
if api != (["fn", "signature", "constexprs", "attrs"], ["src", "target", "options"]):
    print(f"triton {triton.__version__}: offline-compile API differs: {api}", file=sys.stderr)
    sys.exit(77)
from mlactl.kernels.prefill import _mla_prefill_kernel, BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES
from mlactl.kernels.merge import _merge_kernel, NUM_WARPS as MERGE_WARPS

target = GPUTarget("cuda", 90, 32)
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

def build(fn, sig, consts, aligned, num_warps, num_stages):
    # integer and pointer arguments that are multiples of 16, as the launcher's specialisation sees them
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=target,
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    usage = subprocess.run([os.path.join(bindir, "cuobjdump"), "--dump-resource-usage", f.name],
                           capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", usage, re.S)
    ptx = k.asm["ptx"]
    return dict(shared=k.metadata.shared, regs=int(m.group(1)), stack=int(m.group(2)), local=int(m.group(3)),
                wgmma=ptx.count("wgmma.mma_async"), cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"))

names = _mla_prefill_kernel.arg_names
ptrs = ["p_q", "p_kn", "p_kr", "p_v", "p_o"]
sig = {n: ("*bf16" if n in ptrs else "*fp32" if n == "p_lse" else "*i32" if n.startswith("p_")
           else "fp32" if n == "qk_scale" else "i32" if n.startswith("s_") else "constexpr") for n in names}
aligned = [n for n in names if n.startswith("p_") or (n.startswith("s_") and n != "s_lse_h")]
dims = dict(DC=128, DR=64, DV=128, BLOCK_DC=128, BLOCK_DR=64, BLOCK_DV=128, PRECISION="tf32")
out = {}
for name, (bm, bn, w, s, causal) in {"default-causal": (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES, True),
                                     "default-full": (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES, False),
                                     "short-q": (64, BLOCK_N, 4, NUM_STAGES, True)}.items():
    out[name] = build(_mla_prefill_kernel, sig, dict(dims, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal), aligned, w, s)
mn = _merge_kernel.arg_names
msig = {n: ("*bf16" if n in ("p_oa", "p_ob", "p_o") else "*fp32" if n.startswith("p_") else "i32"
            if n == "H" or n.startswith("s_") else "constexpr") for n in mn}
maligned = [n for n in mn if n.startswith("p_") or n in ("s_oa_t", "s_oa_h", "s_ob_t", "s_ob_h", "s_o_t", "s_o_h")]
out["merge-D512"] = build(_merge_kernel, msig, dict(D=512, BLOCK_H=8, BLOCK_D=512), maligned, MERGE_WARPS, 1)
print(json.dumps(out))
"""


API_DIFFERS = 77  # _COMPILE_SM90's exit status when this triton's offline-compile API is not the one it drives


@pytest.mark.slow
def test_compiles_for_hopper(tmp_path):
    """The Hopper defaults compile for sm_90 (ptxas from the triton wheel, no GPU needed): they fit
    in shared memory, do not spill, and use wgmma with cp.async pipelining."""
    import json
    import os
    import subprocess
    import sys

    triton = pytest.importorskip("triton")
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")):
        pytest.skip("triton wheel without the NVIDIA tools (ptxas, cuobjdump)")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-c", _COMPILE_SM90], capture_output=True, text=True, env=env, timeout=300)
    if run.returncode == API_DIFFERS:
        pytest.skip(run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for name, k in got.items():
        assert k["shared"] <= 227 * 1024, (name, k)
        assert k["stack"] == 0 and k["local"] == 0, (name, k)  # no register spills
    for name in ("default-causal", "default-full", "short-q"):
        assert got[name]["wgmma"] > 0 and got[name]["cp_async"] > 0, (name, got[name])
