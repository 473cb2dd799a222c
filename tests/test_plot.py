"""`mlactl plot`: every chart from the analysis alone and with a results file, checked through the
data each chart function returns (never pixels); image files by their magic bytes; errors. The
table --data writes, points above the roofline flagged, ceiling labels, legends outside the axes,
--results and --calibration named in the title.

Figures for DeepSeek-V3 (docs/design.md, "The math"): 81,920 FLOPs per (query, key) pair on the expand path's
attention, 278,528 on absorb's; 33,554,432 FLOPs to expand one cached token, the same for
absorb's two projections of one new token; asymptotic crossover 170.67 new tokens.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import cpu_results, error_line, mooncake, save_calibration
from conftest import run as mlactl
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide import analysis
from mlactl.decide.engines import parse_engines
from mlactl.model import config as model
from mlactl.model import hardware
from mlactl.model.cost import CostModel, causal_pairs
from mlactl.model.shapes import grid
from mlactl.output import plot
from mlactl.results import store as results
from mlactl.util.errors import MlactlError

runner = CliRunner()

ABSORB_PAIR = 278_528
EXPAND_PAIR = 81_920
PER_TOKEN = 33_554_432  # expand one cached token; absorb's projections of one new token
H200_BF16, H200_BW = 989e12, 4.8e12
MAGIC = {"png": b"\x89PNG", "svg": b"<svg", "pdf": b"%PDF"}


# -- a results file as the torch backend's tune writes one on a CPU --------------------------------


def torch_cpu_results(**overrides) -> dict:
    """A small results file laid out as `mlactl tune --backend torch` on a CPU writes it, made by
    hand so the checks below pin placement on known numbers (tests/test_tune.py runs the real
    tune into every chart). Times are placeholders: the checks are of placement, not of speed."""
    data = {
        "schema": "mlactl.results",
        "schema_version": 1,
        "run_id": "20261130-064500-cpu-deepseek-v3",
        "created": "2026-11-30T06:45:00Z",
        "mlactl_version": "0.1.0",
        "device": {"name": "cpu", "type": "cpu", "hardware": None},
        "versions": {"python": "3.11.2", "torch": "2.5.1"},
        "backend": "torch",
        "timing": {"method": "wall-clock", "l2": "warm", "warmup": 1, "repeats": 3, "meaningful": False},
        "model": model.from_name("deepseek-v3").to_dict(),
        "kv_dtype": "bf16",
        "dtype": "bf16",
        "chunk": 8192,
        "kernels": [
            {
                "kernel": "mla_decode",
                "bucket": "B=1,H=128,S_q=1,ctx=4096",
                "shape": {"B": 1, "H": 128, "S_q": 1, "ctx": 4096},
                "configs": [
                    {"config": {"BLOCK_N": 32, "num_warps": 4}, "status": "ok", "reason": "", "median_s": 2e-3},
                    {"config": {"BLOCK_N": 64, "num_warps": 4}, "status": "ok", "reason": "", "median_s": 1.5e-3},
                    {
                        "config": {"BLOCK_N": 128, "num_warps": 8},
                        "status": "failed",
                        "reason": "out of shared memory",
                        "median_s": None,
                    },
                    {
                        "config": {"BLOCK_N": 256, "num_warps": 8},
                        "status": "wrong",
                        "reason": "max error 0.3",
                        "median_s": None,
                    },
                ],
                "best": {"BLOCK_N": 64, "num_warps": 4},
                "best_median_s": 1.5e-3,
                "default_median_s": 1.8e-3,
                "twin_median_s": 9e-3,
            },
            {
                "kernel": "mla_prefill",
                "bucket": "B=1,H=128,S_q=256,ctx=4352",
                "configs": [{"config": {"BLOCK_M": 64}, "status": "ok", "reason": "", "median_s": 4e-3}],
                "best": {"BLOCK_M": 64},
                "best_median_s": 4e-3,
            },
        ],
        "paths": [
            {"batch": 1, "new": 1, "prefix": 4095, "path": "absorb", "median_s": 1e-4},
            {"batch": 1, "new": 1, "prefix": 4095, "path": "expand", "median_s": 2e-3},
            {"batch": 1, "new": 256, "prefix": 4096, "path": "expand", "median_s": 6e-4},
            {"batch": 1, "new": 256, "prefix": 4096, "path": "absorb", "median_s": 9e-4},
        ],
        "crossovers": [
            {"batch": 1, "prefix": 0, "measured": 1, "predicted": 1},
            {"batch": 1, "prefix": 4096, "measured": 190, "predicted": 160},
            {"batch": 1, "prefix": 32768, "measured": None, "predicted": 169},
            {"batch": 8, "prefix": 4096, "measured": 64, "predicted": 60},
        ],
        "ceilings": {"peak_tflops": {"bf16": 700.0}, "bandwidth_tbs": 4.0},
    }
    data.update(overrides)
    return data


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "torch-cpu.json"
    path.write_text(json.dumps(torch_cpu_results()))
    return path


def v3_analysis(new, prefix, batch=(1,), hw="h200", **kw):
    b, n, p = grid(list(batch), list(new), prefix=list(prefix))
    return analysis.analyze(model.from_name("deepseek-v3"), hardware.from_name(hw), b, n, p, **kw)


def decode_analysis():
    """The roofline's default shapes: decode after 4K and 32K, a 4K prefill."""
    return analysis.analyze(
        model.from_name("deepseek-v3"), hardware.from_name("h200"), [1, 1, 1], [1, 1, 4096], [4096, 32768, 0]
    )


def find(points, **match):
    hits = [pt for pt in points if all(pt[k] == v for k, v in match.items())]
    assert len(hits) == 1, (match, hits)
    return hits[0]


# -- roofline ------------------------------------------------------------------------------------


def test_roofline_ridge_ceilings_and_analytic_points():
    fig, data = plot.roofline(decode_analysis())
    assert data["analytic_only"] and "analytic only" in data["title"]
    for word in ("deepseek-v3", "NVIDIA H200", "kv cache bf16"):
        assert word in data["title"]
    assert data["ridge"] == {"intensity": pytest.approx(H200_BF16 / H200_BW), "flops_per_s": H200_BF16}
    nominal = {c["dtype"]: c for c in data["ceilings"] if c["label"] == "nominal"}
    assert set(nominal) == {"bf16", "fp16", "fp8", "fp32"}
    assert nominal["fp8"]["peak_flops"] == 1979e12 and nominal["fp8"]["ridge"] == pytest.approx(1979e12 / H200_BW)
    assert len(data["ceilings"]) == 4  # no measured ceilings anywhere
    # three shapes x three paths x (path, attention op)
    assert len(data["points"]) == 18
    k = 4097  # decode after 4096 cached tokens
    attention = find(data["points"], path="absorb", op="attention", new=1, prefix=4096)
    assert attention["flops"] == ABSORB_PAIR * k
    # FlashMLA's convention: the bf16 latent cache + the latent queries + the latent outputs
    assert attention["bytes"] == k * 576 * 2 + 128 * 576 * 2 + 128 * 512 * 2
    long = find(data["points"], path="absorb", op="attention", new=1, prefix=32768)
    assert long["intensity"] == pytest.approx(242, rel=0.01)  # docs/design.md: decode ~242 FLOP/byte
    # an op alone sits on the roofline: min(peak, bandwidth * intensity)
    assert attention["flops_per_s"] == pytest.approx(min(H200_BF16, H200_BW * attention["intensity"]))
    whole = find(data["points"], path="absorb", op=None, new=1, prefix=4096)
    assert whole["flops"] == ABSORB_PAIR * k + PER_TOKEN
    expand = find(data["points"], path="expand", op=None, new=1, prefix=4096)
    assert expand["flops"] == PER_TOKEN * k + EXPAND_PAIR * k
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"


def test_roofline_measured_points_come_from_cost_over_median():
    cpu = torch_cpu_results()
    _, data = plot.roofline(decode_analysis(), [cpu])
    assert not data["analytic_only"]
    assert "measured: cpu, torch backend, torch 2.5.1, wall-clock" in data["title"]
    assert len(data["measured"]) == 4
    decode = find(data["measured"], path="absorb", new=1, prefix=4095)
    flops = ABSORB_PAIR * 4096 + PER_TOKEN  # computed here, not read back from cost.py
    assert decode["flops"] == flops
    assert decode["flops_per_s"] == pytest.approx(flops / 1e-4)
    cost = CostModel(model.from_name("deepseek-v3"))
    nbytes = sum(float(op.bytes) for op in cost.ops("absorb", 1, 1, 4095))
    assert decode["intensity"] == pytest.approx(flops / nbytes)
    assert decode["fraction"] == pytest.approx(decode["predicted_s"] / 1e-4)
    prefill = find(data["measured"], path="expand", new=256, prefix=4096)
    pairs = causal_pairs(256, 4096)
    assert prefill["flops"] == PER_TOKEN * (4096 + 256) + EXPAND_PAIR * pairs
    assert prefill["flops_per_s"] == pytest.approx(prefill["flops"] / 6e-4)
    # the results' measured ceilings, beside the datasheet's
    measured = [c for c in data["ceilings"] if c["label"] == "measured on cpu"]
    assert measured == [
        {
            "label": "measured on cpu",
            "dtype": "bf16",
            "peak_flops": 700e12,
            "bandwidth": 4e12,
            "ridge": pytest.approx(175),
        }
    ]


def test_roofline_profile_with_measured_ceilings(tmp_path):
    toml = (hardware.shipped_dir() / "h200.toml").read_text()
    path = tmp_path / "h200.toml"
    path.write_text(
        toml + '\n[measured]\nbandwidth_tbs = 4.3\ndevice = "NVIDIA H200"\n[measured.peak_tflops]\nbf16 = 780\n'
    )
    for use_measured in (False, True):
        hw = hardware.resolve(str(path), measured=use_measured)
        result = analysis.analyze(model.from_name("deepseek-v3"), hw, [1], [1], [4096])
        _, data = plot.roofline(result)
        labels = {(c["label"], c["dtype"]): c for c in data["ceilings"]}
        # the datasheet's roof is drawn either way; the measured one beside it
        assert labels[("nominal", "bf16")]["peak_flops"] == H200_BF16
        assert labels[("measured on NVIDIA H200", "bf16")]["ridge"] == pytest.approx(780 / 4.3)
        ridge = 780 / 4.3 if use_measured else H200_BF16 / H200_BW
        assert data["ridge"]["intensity"] == pytest.approx(ridge)


# -- crossover -----------------------------------------------------------------------------------


def test_crossover_markers_sit_at_the_analysis_crossover():
    prefixes = (0, 4096, 32768)
    result = v3_analysis(range(1, 513), prefixes)
    _, data = plot.crossover(result)
    assert data["analytic_only"] and data["asymptotic_new"] == pytest.approx(170.667, abs=1e-3)
    hw, cost = hardware.from_name("h200"), CostModel(model.from_name("deepseek-v3"))
    solved = analysis.crossover_table(cost, hw, [(1, p) for p in prefixes])
    assert [panel["prefix"] for panel in data["panels"]] == list(prefixes)
    for panel, row in zip(data["panels"], solved.rows):
        assert panel["predicted"] == {"expand": row.by_time, "expand_chunked": row.by_time_chunked}
        assert panel["new"] == list(range(1, 513))
        # curves are the analysis's roofline times
        at = (result.prefix == panel["prefix"]) & (result.new == 64)
        assert panel["time_s"]["absorb"][63] == result.paths["absorb"].time_s[at][0]
    assert data["panels"][1]["predicted"]["expand"] == 160  # H200, prefix 4K: 160 new tokens


def test_crossover_with_results():
    result = v3_analysis(range(1, 257), (0, 4096, 32768))
    _, data = plot.crossover(result, [torch_cpu_results()])
    by_prefix = {panel["prefix"]: panel for panel in data["panels"]}
    # batch 8's measured crossover is for another batch size: not drawn here
    assert by_prefix[4096]["measured_crossovers"] == [{"source": 0, "new": 190}]
    assert by_prefix[32768]["measured_crossovers"] == [{"source": 0, "new": None}]
    points = by_prefix[4096]["measured"]
    assert {(m["path"], m["new"], m["median_s"]) for m in points} == {("expand", 256, 6e-4), ("absorb", 256, 9e-4)}
    assert by_prefix[0]["measured"] == []


def test_crossover_too_many_panels():
    with pytest.raises(MlactlError, match="at most 12"):
        plot.crossover(v3_analysis([1, 2], range(13)))


# -- path map ------------------------------------------------------------------------------------

NEW = [1, 16, 64, 256, 1024, 4096]
PREFIX = [0, 1024, 4096, 8192, 32768]


def test_pathmap_best_speedup():
    result = v3_analysis(NEW, PREFIX)
    _, data = plot.pathmap(result)
    assert data["new"] == NEW and data["prefix"] == PREFIX and data["analytic_only"]
    assert data["policy"] is None
    best, speedup = np.array(data["best"]), np.array(data["speedup"])
    at = {(n, p): i for i, (n, p) in enumerate(zip(result.new.tolist(), result.prefix.tolist()))}
    for r, p in enumerate(PREFIX):
        for c, n in enumerate(NEW):
            i = at[(n, p)]
            assert best[r, c] == result.best[i]
            t = {path: result.paths[path].time_s[i] for path in ("expand", "expand_chunked", "absorb")}
            other = min(t["expand"], t["expand_chunked"]) if best[r, c] == "absorb" else t["absorb"]
            assert speedup[r, c] == pytest.approx(other / t[best[r, c]])
    assert (speedup >= 1).all()


def test_pathmap_engine_loss_map():
    """--policy sglang@0.5.14 (no prefill graph): batch 1, so the summed prefix is the prefix.
    SGLang expands at prefix 0 and from 8192, absorbs between (and for every decode after a prefix)."""
    result = v3_analysis(NEW, PREFIX, engines=parse_engines("sglang@0.5.14"))
    _, data = plot.pathmap(result, policy="sglang@0.5.14")
    pol = data["policy"]
    assert pol["name"] == "sglang@0.5.14" and "attention_backend_handler.py" in pol["source"]
    path = np.array(pol["path"])
    assert list(path[PREFIX.index(1024)]) == ["absorb"] * len(NEW)
    assert list(path[PREFIX.index(8192)]) == ["absorb"] + ["expand"] * (len(NEW) - 1)
    assert path[PREFIX.index(0), NEW.index(1)] == "expand"  # one token, no prefix: an extend
    wrong, slowdown = np.array(pol["wrong"]), np.array(pol["slowdown"], dtype=float)
    assert wrong[PREFIX.index(1024), NEW.index(4096)]  # long prefill after 1K: SGLang absorbs
    assert wrong[PREFIX.index(32768), NEW.index(16)]  # 16 new after 32K: SGLang expands
    assert not wrong[PREFIX.index(32768), NEW.index(1)]  # decode: absorb, the best
    assert (slowdown >= 1).all()
    with pytest.raises(MlactlError, match="no vllm rule"):
        plot.pathmap(result, policy="vllm")


def test_pathmap_measured_boundary():
    result = v3_analysis(NEW, PREFIX)
    _, data = plot.pathmap(result, [torch_cpu_results()])
    assert data["measured_boundary"] == [
        {"source": 0, "batch": 1, "prefix": 0, "new": 1},
        {"source": 0, "batch": 1, "prefix": 4096, "new": 190},
        {"source": 0, "batch": 1, "prefix": 32768, "new": None},
    ]
    _, batch8 = plot.pathmap(v3_analysis(NEW, PREFIX, batch=(8,)), [torch_cpu_results()])
    assert [m["new"] for m in batch8["measured_boundary"]] == [64]


@pytest.mark.parametrize(
    "new, prefix, batch, message",
    [
        pytest.param([1], PREFIX, (1,), "at least two", id="one-new"),
        pytest.param(NEW, [0], (1,), "at least two", id="one-prefix"),
        pytest.param(NEW, PREFIX, (1, 8), "one batch size", id="two-batches"),
    ],
)
def test_pathmap_bad_grids(new, prefix, batch, message):
    with pytest.raises(MlactlError, match=message):
        plot.pathmap(v3_analysis(new, prefix, batch=batch))


# -- tune ----------------------------------------------------------------------------------------


def test_tune_configs_failures_and_best():
    _, data = plot.tune(torch_cpu_results())
    assert data["kernel"] == "mla_decode" and data["bucket"] == "B=1,H=128,S_q=1,ctx=4096"
    assert [(c["label"], c["status"], c["median_s"]) for c in data["configs"]] == [
        ("BLOCK_N=32, num_warps=4", "ok", 2e-3),
        ("BLOCK_N=64, num_warps=4", "ok", 1.5e-3),
        ("BLOCK_N=128, num_warps=8", "failed", None),
        ("BLOCK_N=256, num_warps=8", "wrong", None),
    ]
    assert data["configs"][2]["reason"] == "out of shared memory"
    assert data["best"] == "BLOCK_N=64, num_warps=4" and data["best_median_s"] == 1.5e-3
    assert data["default_median_s"] == 1.8e-3 and data["twin_median_s"] == 9e-3
    assert "cpu, torch backend" in data["title"]


def test_tune_picks_kernel_and_bucket():
    _, data = plot.tune(torch_cpu_results(), kernel="mla_prefill")
    assert data["bucket"] == "B=1,H=128,S_q=256,ctx=4352" and data["best_median_s"] == 4e-3
    _, data = plot.tune(torch_cpu_results(), bucket="B=1,H=128,S_q=256,ctx=4352")
    assert data["kernel"] == "mla_prefill"
    with pytest.raises(MlactlError, match="no sweep of kernel 'mla_nope'"):
        plot.tune(torch_cpu_results(), kernel="mla_nope")
    with pytest.raises(MlactlError, match="bucket 'B=2' is not in the results"):
        plot.tune(torch_cpu_results(), kernel="mla_decode", bucket="B=2")
    with pytest.raises(MlactlError, match="no kernel sweeps"):
        plot.tune(torch_cpu_results(kernels=[]))


# -- files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_save_writes_the_format_of_the_extension(tmp_path, fmt):
    fig, _ = plot.tune(torch_cpu_results())
    path = tmp_path / f"chart.{fmt.upper() if fmt == 'pdf' else fmt}"
    plot.save(fig, path)
    head = path.read_bytes()[:400]
    assert MAGIC[fmt] in head
    first = path.read_bytes()
    plot.save(fig, path)  # no date in the file: regenerating gives the same bytes
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_save_rejects_other_extensions(tmp_path):
    fig, _ = plot.tune(torch_cpu_results())
    with pytest.raises(MlactlError, match=r"'\.jpg'; use \.png, \.svg or \.pdf"):
        plot.save(fig, tmp_path / "chart.jpg")
    assert not list(tmp_path.iterdir())


# -- the command line ----------------------------------------------------------------------------


def run(*args):
    return runner.invoke(app, ["plot", *map(str, args)])


@pytest.mark.parametrize(
    "chart, fmt, extra",
    [
        pytest.param("roofline", "svg", [], id="roofline-svg"),
        pytest.param("crossover", "pdf", ["--new", "1:512:*2", "--prefix", "0,4K"], id="crossover-pdf"),
        pytest.param("pathmap", "png", ["--new", "1:4K:*4", "--prefix", "0,1K,8K,32K"], id="pathmap-png"),
    ],
)
@pytest.mark.parametrize("measured", [False, True], ids=["analytic", "measured"])
def test_cli_charts(tmp_path, results_file, chart, fmt, extra, measured):
    out = tmp_path / f"{chart}.{fmt}"
    args = [chart, "--hardware", "h200", *extra, "--output", out]
    if measured:
        args += ["--results", results_file, "--results", results_file]  # several files are fine
    result = run(*args)
    assert result.exit_code == 0, result.output
    # with --results, first the line naming where the model, tp and dtypes came from
    note = f"settings from {results_file} (measured on cpu): model deepseek-v3, tp 1, dtype bf16, kv bf16\n"
    assert result.output == (note if measured else "") + f"Wrote {out}\n"
    assert MAGIC[fmt] in out.read_bytes()[:400]


def test_cli_tune_and_default_output(tmp_path, results_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(
        "tune",
        "--results",
        results_file,
        "--kernel",
        "mla_decode",
        "--bucket",
        "B=1,H=128,S_q=1,ctx=4096",
        "--dpi",
        "50",
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "tune.png").read_bytes().startswith(MAGIC["png"])


def write_results(tmp_path, name, **overrides):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(torch_cpu_results(**overrides)))
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["roofline", "-o", "{tmp}/chart.jpg"], "'.jpg'; use .png, .svg or .pdf", id="extension"),
        pytest.param(["crossover", "-o", "{tmp}/chart"], "no extension; use .png", id="no-extension"),
        pytest.param(
            ["roofline", "-r", "{tmp}/missing.json", "-o", "{tmp}/x.png"], "cannot read results", id="missing"
        ),
        pytest.param(["roofline", "-r", "{tmp}/corrupt.json", "-o", "{tmp}/x.png"], "not valid JSON", id="corrupt"),
        # the first file's settings are taken (as analyze --results takes them); a typed flag
        # that contradicts them, or a second file measured otherwise, is an error
        pytest.param(
            ["roofline", "--model", "deepseek-v3", "-r", "{kimi}", "-o", "{tmp}/x.png"],
            "measured with other settings: --model deepseek-v3 (the file has kimi-k2)",
            id="other-model",
        ),
        pytest.param(
            ["roofline", "-r", "{cpu}", "-r", "{kimi}", "-o", "{tmp}/x.png"],
            "was measured for model 'kimi-k2', not 'deepseek-v3'",
            id="second-file-other-model",
        ),
        pytest.param(
            ["pathmap", "--hardware", "h200", "-r", "{h100}", "-o", "{tmp}/x.png"],
            "--hardware h200 (the file has h100-sxm)",
            id="other-device",
        ),
        pytest.param(
            ["crossover", "--kv-dtype", "fp8", "-r", "{cpu}", "-o", "{tmp}/x.png"],
            "--kv-dtype fp8 (the file has bf16)",
            id="other-kv-dtype",
        ),
        pytest.param(
            ["crossover", "--tp", "8", "-r", "{cpu}", "-o", "{tmp}/x.png"],
            "--tp 8 (the file has 1)",
            id="other-tp",
        ),
        pytest.param(
            ["tune", "-r", "{cpu}", "--bucket", "B=9", "-o", "{tmp}/x.png"],
            "bucket 'B=9' is not in the results",
            id="bucket",
        ),
        pytest.param(
            ["tune", "-r", "{cpu}", "--kernel", "nope", "-o", "{tmp}/x.png"], "no sweep of kernel 'nope'", id="kernel"
        ),
        pytest.param(["pathmap", "--new", "1,", "-o", "{tmp}/x.png"], "--new: empty item", id="empty-grid"),
        pytest.param(["pathmap", "--new", "64", "-o", "{tmp}/x.png"], "at least two values each", id="one-column"),
        pytest.param(["crossover", "--batch", "1,8", "-o", "{tmp}/x.png"], "--batch takes one value", id="two-batches"),
        pytest.param(["crossover", "--prefix", "0:13", "-o", "{tmp}/x.png"], "at most 12 prefixes", id="many-panels"),
        pytest.param(["roofline", "--new", "1:64", "-o", "{tmp}/x.png"], "at most 24 shapes", id="many-shapes"),
        pytest.param(
            ["roofline", "--prefix", "0", "--context", "8", "-o", "{tmp}/x.png"], "not both", id="prefix-and-context"
        ),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "corrupt.json").write_text('{"schema": "mlactl.res')
    names = {
        "tmp": tmp_path,
        "cpu": write_results(tmp_path, "cpu"),
        "kimi": write_results(tmp_path, "kimi", model=model.from_name("kimi-k2").to_dict()),
        "h100": write_results(tmp_path, "h100", device={"name": "NVIDIA H100", "type": "cuda", "hardware": "h100-sxm"}),
    }
    result = run(*(a.format(**names) for a in args))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output
    assert not list(tmp_path.glob("x.png"))


def test_plot_does_not_load_torch_or_triton(tmp_path):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from mlactl.cli import app\n"
        f"r = CliRunner().invoke(app, ['plot', 'crossover', '--new', '1:64:*2', '-o', {str(tmp_path / 'c.png')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(','.join(m for m in ('torch', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


TRACE_LINE = '{"timestamp": 0, "input_length": 3000, "output_length": 4, "hash_ids": [1, 2]}\n'


@pytest.mark.parametrize(
    "name, text",
    [
        ("t.jsonl", TRACE_LINE * 2),
        ("one.jsonl", TRACE_LINE),
        ("t.csv", "arrival_s,input_tokens,output_tokens\n0,9,2\n"),
    ],
    ids=["jsonl", "one-line", "csv"],
)
def test_plot_replay_of_a_trace_says_what_to_run(tmp_path, name, text):
    """It said 'not valid JSON' (two lines) or 'not a replay report' (one)."""
    trace = tmp_path / name
    trace.write_text(text)
    out = runner.invoke(app, ["plot", "replay", str(trace), "-o", str(tmp_path / "r.png")])
    assert out.exit_code == 2
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "is a request trace, not a replay report" in lines[0], out.output
    assert f"mlactl replay {trace} -f json -o report.json" in lines[0]
    assert not (tmp_path / "r.png").exists()


def test_tune_chart_of_a_torch_run_without_configs_says_why():
    data = torch_cpu_results()
    for sweep in data["kernels"]:
        sweep["configs"] = []
    with pytest.raises(MlactlError, match="tried no configs: the results were measured with --backend torch"):
        plot.tune(data)


def test_tune_chart_of_interpreter_times_warns_that_they_mean_nothing():
    data = torch_cpu_results()
    data["backend"] = "interpret"
    fig, drawn = plot.tune(data)
    assert drawn["warning"].startswith("interpreter times")
    assert drawn["warning"] in fig.axes[0].get_title()
    _, plain = plot.tune(torch_cpu_results())
    assert plain["warning"] is None


def test_roofline_ridge_marker_is_in_the_legend():
    """The black diamond at the ridge was drawn and never explained."""
    fig, _ = plot.roofline(decode_analysis())
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    labels = [t.get_text() for legend in legends for t in legend.get_texts()]
    assert "ridge (bf16): memory and compute bound meet" in labels


def test_pathmap_measured_never_stays_inside_the_grid():
    """torch_cpu_results measured expand never winning at prefix 32768: that point was drawn half an
    octave right of the grid, joined by a diagonal, and the axis widened to hold it (a blank strip)."""
    result = v3_analysis(NEW, PREFIX)
    fig, data = plot.pathmap(result, results=[torch_cpu_results()])
    ax = fig.axes[0]
    right = ax.get_xlim()[1]
    assert right == pytest.approx(np.log2(NEW[-1]) + np.log2(NEW[-1] / NEW[-2]))  # the last cell edge: no strip
    for line in ax.get_lines():
        xs = np.asarray(line.get_xdata(), dtype=float)
        assert (xs <= right + 1e-9).all()
    assert any(m["new"] is None for m in data["measured_boundary"])


def test_a_replay_report_edited_by_hand_is_refused_in_one_line_or_drawn_safely(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE_LINE + TRACE_LINE.replace('"timestamp": 0', '"timestamp": 5'))
    report = tmp_path / "r.json"
    assert (
        runner.invoke(app, ["replay", str(trace), "--engines", "vllm", "-f", "json", "-o", str(report)]).exit_code == 0
    )
    data = json.loads(report.read_text())
    data["engines"][0]["lost_s"] = "fast"  # a string where a number belongs
    report.write_text(json.dumps(data))
    out = runner.invoke(app, ["plot", "replay", str(report), "-o", str(tmp_path / "c.png")])
    assert out.exit_code == 2 and out.output.strip().splitlines() == [
        f"Error: {report}: engines[0].lost_s must be a finite number >= 0, got 'fast'"
    ]
    data["engines"][0]["lost_s"] = 1.5
    data["engines"][0]["label"] = "[bold]x[/] $a^2$ \x1b[31m"  # markup, mathtext and an escape
    report.write_text(json.dumps(data))
    out = runner.invoke(app, ["plot", "replay", str(report), "-o", str(tmp_path / "c.png")])
    assert out.exit_code == 0 and "Warning" not in out.output and "glyph" not in out.output, out.output


def test_replay_chart_reads_a_short_trace_in_seconds_and_keeps_lines_apart(tmp_path):
    """A 25 s trace was drawn in minutes (0 to 0.4), coinciding lines hid each other, labels were
    6 pt and the legend sat over a line."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(TRACE_LINE.replace('"timestamp": 0', f'"timestamp": {500 * i}') for i in range(50)))
    report = tmp_path / "r.json"
    assert runner.invoke(app, ["replay", str(trace), "-f", "json", "-o", str(report)]).exit_code == 0
    fig, drawn = plot.replay(json.loads(report.read_text()))
    assert drawn["time_unit"] == "seconds"
    top = fig.axes[0]
    assert "seconds" in top.get_xlabel()
    styles = [(line.get_linestyle(), line.get_linewidth()) for line in top.get_lines()]
    assert len(set(styles)) == len(styles) == 4  # four rules, four looks
    legend = top.get_legend()
    assert legend.get_bbox_to_anchor().y0 >= top.bbox.y1 - 1  # above the panel
    assert min(t.get_fontsize() for t in fig.axes[1].texts) >= 7


# -- chart data, points above the roofline, labels, legends and calibrated titles ------------------


def test_plot_data_csv_holds_what_was_drawn(tmp_path):
    import csv

    png, table = tmp_path / "c.png", tmp_path / "c.csv"
    out = runner.invoke(
        app, ["plot", "crossover", "--new", "1:64", "--prefix", "0", "-o", str(png), "--data", str(table)]
    )
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(table.open()))
    timed = [r for r in rows if r["kind"] == "predicted time"]
    assert len(timed) == 3 * 64  # expand, expand_chunked, absorb at new = 1..64
    assert {r["path"] for r in timed} == {"expand", "expand_chunked", "absorb"}
    (asym,) = [r for r in rows if r["kind"] == "asymptotic crossover by FLOPs"]
    assert float(asym["new"]) == pytest.approx(170.67, abs=0.01)  # DeepSeek-V3 (docs/design.md)
    bad = runner.invoke(app, ["plot", "crossover", "-o", str(png), "--data", str(tmp_path / "c.xml")])
    assert bad.exit_code == 2 and "--data" in bad.output


def test_one_new_value_is_a_clear_error(tmp_path):
    out = runner.invoke(app, ["plot", "crossover", "--new", "1", "-o", str(tmp_path / "c.png")])
    assert out.exit_code == 2 and "at least two values" in out.output
    out = runner.invoke(app, ["plot", "pathmap", "--new", "1", "--prefix", "0", "-o", str(tmp_path / "p.png")])
    assert out.exit_code == 2 and "plot crossover" in out.output


def _teaching_analysis():
    return analysis.analyze(model.from_name("teaching"), hardware.from_name("teaching"), [1], [64], [0])


def test_points_above_the_roofline_are_flagged():
    result = _teaching_analysis()
    predicted = float(result.paths["absorb"].time_s[0])
    data = cpu_results(
        model=result.cfg.to_dict(),
        kv_dtype="bf16",
        dtype="bf16",
        paths=[
            {"batch": 1, "new": 64, "prefix": 0, "path": "absorb", "median_s": predicted / 2},  # 200%
            {"batch": 1, "new": 64, "prefix": 0, "path": "expand", "median_s": 1.0},
        ],
    )
    fig, drawn = plot.roofline(result, [data])
    by_path = {m["path"]: m for m in drawn["measured"]}
    assert by_path["absorb"]["fraction"] == pytest.approx(2.0) and by_path["absorb"]["above_ceiling"] is True
    assert by_path["expand"]["above_ceiling"] is False
    assert "too low" in drawn["note"]
    # labelled points get a number beside them; what each is, in the legend below the axes (no text
    # on the points or curves)
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text().isdigit()] == ["1", "2"]
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "1: b=1 n=64 p=0 absorb, 200% of the roofline (above the roofline!)" in legend
    assert "measured, joined to predicted" in legend


def test_ceiling_labels_read_plainly_and_are_drawn_once():
    from mlactl.model.hardware import HardwareProfile

    cpu = HardwareProfile(
        "cpu",
        "CPU",
        {"fp32": 0.2},
        0.02,
        16,
        measured={"device": "cpu", "peak_tflops": {"fp32": 0.19}, "bandwidth_tbs": 0.018},
    )
    same_run = {"device": {"name": "cpu"}, "ceilings": {"peak_tflops": {"fp32": 0.19}, "bandwidth_tbs": 0.018}}
    lines = plot.ceilings(cpu, "fp32", [same_run])
    assert [c["label"] for c in lines] == ["nominal", "measured on cpu"]  # not "measured (cpu)", and once


def test_tune_chart_says_when_the_default_is_faster():
    from pathlib import Path

    docs = Path(__file__).parents[1] / "docs" / "results" / "interpret-teaching-tp8-mla_decode.json"
    fig, drawn = plot.tune(results.load(docs))
    # the docs' sweep: best tried 59.7 ms, the launcher's default 30.7 ms (spreads ~5%: not noise)
    assert drawn["best_median_s"] == pytest.approx(0.0597, abs=1e-4)
    assert drawn["default_median_s"] == pytest.approx(0.0307, abs=1e-4)
    assert drawn["default_faster"] is True
    assert any("best tried: default faster" in t.get_text() for t in fig.axes[0].texts)


def test_plot_results_takes_the_files_settings_and_measured_prefixes(tmp_path, home):
    from mlactl.model.config import from_name

    cfg = from_name("teaching").with_tp(8)
    rows = [
        {"batch": 1, "new": n, "prefix": p, "path": path, "median_s": 1e-4 * n + 1e-5}
        for p in (256, 1024)
        for n in (1, 8, 64)
        for path in ("expand", "absorb")
    ]
    crossovers = [{"batch": 1, "prefix": p, "measured": 64, "measured_status": "found"} for p in (256, 1024)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cpu_results(model=cfg.to_dict(), paths=rows, crossovers=crossovers)))
    data = tmp_path / "drawn.json"
    out = runner.invoke(
        app, ["plot", "crossover", "--results", str(path), "-o", str(tmp_path / "c.png"), "--data", str(data)]
    )
    assert out.exit_code == 0, out.output
    assert "settings from" in out.stdout and "model teaching, tp 8, dtype fp32, kv fp32" in out.stdout
    drawn = json.loads(data.read_text())
    # the panels are the prefixes measured (not the default 0,4K,32K), for the file's model and dtypes
    assert [panel["prefix"] for panel in drawn["panels"]] == [256, 1024]
    assert "teaching, tp 8" in drawn["title"] and "fp32 compute" in drawn["title"]
    assert "cpu has no hardware profile" in drawn["title"]  # and against whose roofline


def test_calibrated_charts_name_the_calibration(home):
    from mlactl.decide.calibration import store as cal_store

    cal = cal_store.resolve(save_calibration(home))
    args = (model.from_name("deepseek-v3"), hardware.from_name("h200"), [1] * 4, [1, 64, 512, 4096], [4096] * 4)
    roof, calibrated = analysis.analyze(*args), analysis.analyze(*args, calibration=cal)
    for _, drawn in (plot.crossover(roof, calibrated=calibrated), plot.roofline(roof, calibrated=calibrated)):
        assert "calibrated times" in drawn["title"] and "fit-h200" in drawn["title"]
        assert "analytic only" not in drawn["title"]
    grid = analysis.analyze(*args[:2], [1] * 4, [1, 64, 1, 64], [0, 0, 64, 64], calibration=cal)
    assert "calibrated times: fit-h200" in plot.pathmap(grid)[1]["title"]


def test_legends_sit_outside_the_axes_and_no_label_sits_on_a_curve(home):
    cfg, hw = model.from_name("deepseek-v3"), hardware.from_name("h800")
    grid = analysis.analyze(cfg, hw, [1] * 6, [1, 64, 512] * 2, [0] * 3 + [4096] * 3)
    fig, drawn = plot.crossover(grid)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    # the crossover values are in each panel's title, not written over the curves
    assert all(not ax.texts for ax in fig.axes)
    assert "crossover (new tokens): predicted" in fig.axes[1].get_title()
    fig, _ = plot.roofline(analysis.analyze(cfg, hw, [1], [1], [4096]))
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1


def test_the_path_map_has_no_blank_band_above_prefix_zero(home):
    from matplotlib.collections import QuadMesh

    news, prefixes = [1, 16, 256], [0, 64, 256, 1024]
    grid = analysis.analyze(
        model.from_name("deepseek-v3"),
        hardware.from_name("h800"),
        [1] * 12,
        [n for _ in prefixes for n in news],
        [p for p in prefixes for _ in news],
    )
    fig, _ = plot.pathmap(grid)
    meshes = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]
    (zero, rows) = sorted(meshes, key=lambda m: m.get_coordinates()[0, 0, 1])
    zero_top = zero.get_coordinates()[-1, 0, 1]
    rows_bottom = rows.get_coordinates()[0, 0, 1]
    assert zero_top == pytest.approx(rows_bottom)  # prefix 0's row touches 64's: no band between


# -- mlactl plot replay -----------------------------------------------------------------------------


def test_plot_replay_draws_the_report(tmp_path):
    # two lines of Mooncake's conversation trace, as tests/test_traces.py reads them
    trace = mooncake(tmp_path / "t.jsonl", [(0, 6758, 500, range(14)), (3000, 915, 355, [0, 462])])
    rep = tmp_path / "r.json"
    mlactl("replay", trace, "--engines", "sglang,vllm", "-o", rep)
    mlactl("plot", "replay", rep, "-o", tmp_path / "r.svg", "--data", tmp_path / "d.json")
    drawn = json.loads((tmp_path / "d.json").read_text())
    data = json.loads(rep.read_text())
    engines = [e["label"] for e in data["engines"]]
    assert {t["engine"] for t in drawn["timeline"]} == set(engines)
    for e in data["engines"]:
        mine = [t for t in drawn["timeline"] if t["engine"] == e["label"]]
        lost = sum(t["lost_per_s"] * (t["end_s"] - t["start_s"]) for t in mine)
        assert lost == pytest.approx(e["lost_s"], rel=1e-9, abs=1e-12)
        for row in e["by_step_type"]:
            shares = [m["share"] for m in drawn["mix"] if m["engine"] == e["label"] and m["type"] == row["type"]]
            assert sum(shares) == pytest.approx(1.0)
    assert (tmp_path / "r.svg").read_text().startswith("<?xml")


def test_plot_replay_legend_gives_each_loss_and_its_interval(tmp_path):
    from mlactl.output.plot.replay import replay as chart

    line = {"label": "e", "timeline": {"edges_s": [0.0, 1.0], "lost_s": [0.5]}, "by_step_type": []}
    report = {"schema": "mlactl.replay", "schema_version": 1, "engines": [line]}
    assert chart(report)[1]["legend"] == ["e"]  # a report without totals: the label alone
    line.update(lost_s=468.07, lost_interval_s=[280.2, 468.07])
    assert chart(report)[1]["legend"] == ["e: lost 468s (280–468s)"]
    line.update(lost_s=0.0132, lost_interval_s=None)
    assert chart(report)[1]["legend"] == ["e: lost 13.2ms"]


def test_plot_replay_refuses_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "mlactl.analysis"}')
    assert "is not a replay report" in error_line(mlactl("plot", "replay", bad, ok=False))
    bad.write_text('{"schema": "mlactl.replay", "schema_version": 1, "engines": [{"label": 3}]}')
    assert "engines[0].label must be a string" in error_line(mlactl("plot", "replay", bad, ok=False))
