"""The codebase a maintainer picks up: one definition of each default and check, the shared
helpers behaving as documented, the public kernel API typed and documented in one style, the docs
that comments point to existing, and the tooling wired into CI.

Expected values are written out by hand here (8192, the dtype names, the Apache-2.0 text's
well-known md5), never read back from the module under test.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mlactl
from mlactl.kernels import _checks, configs
from mlactl.kernels.reference import build_paged_cache
from mlactl.util import defaults

REPO = Path(__file__).resolve().parent.parent


# -- one definition of each default ----------------------------------------------------------------


def test_defaults_module_imports_nothing_heavy():
    code = "import sys, mlactl.util.defaults; print(sorted(m for m in ('numpy', 'torch', 'typer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_chunk_defaults_to_8192_everywhere():
    from mlactl.cli.analyze import analyze as analyze_cmd
    from mlactl.decide.analysis import analyze, analyze_batch
    from mlactl.decide.engines import default_params
    from mlactl.kernels import mla_attention, mla_prefill_chunked
    from mlactl.model.config import from_name
    from mlactl.model.cost import CostModel

    assert CostModel(from_name("teaching")).chunk == 8192
    for fn, name in (
        (analyze, "chunk"),
        (analyze_batch, "chunk"),
        (mla_attention, "chunk"),
        (mla_prefill_chunked, "chunk"),
    ):
        assert inspect.signature(fn).parameters[name].default == 8192, (fn.__name__, name)
    cli = inspect.signature(analyze_cmd).parameters
    assert cli["chunk"].default == "8192"
    # SGLang's own default (SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD), independent of the chunk
    assert default_params("sglang").threshold == 8192


def test_choice_lists_are_the_same_objects_everywhere():
    from mlactl.cli import common as cli
    from mlactl.decide import policy
    from mlactl.decide import setup as settings
    from mlactl.kernels import attention
    from mlactl.model import cost

    assert defaults.KV_DTYPES == ("bf16", "fp16", "fp8", "fp32")
    assert defaults.ACT_DTYPES == ("bf16", "fp16", "fp32")
    assert settings.KV_DTYPES is cost.KV_DTYPES is defaults.KV_DTYPES
    assert settings.ACT_DTYPES is cli.DTYPES is cost.ACT_DTYPES is defaults.ACT_DTYPES
    assert cost.MLA_PATHS is attention.PATHS is defaults.MLA_PATHS
    assert policy.POLICIES is defaults.POLICIES
    assert attention.BACKENDS is defaults.KERNEL_BACKENDS == ("triton", "torch")
    assert defaults.TUNE_BACKENDS == ("triton", "torch", "interpret")


# -- kernels/_checks: dtype names and positive numbers ----------------------------------------------


@pytest.mark.parametrize(
    "dtype, name",
    [(torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32"), (torch.float8_e4m3fn, "fp8")],
)
def test_dtype_name(dtype, name):
    assert _checks.dtype_name(dtype) == name
    if name != "fp8":
        assert _checks.TORCH_DTYPES[name] is dtype


def test_dtype_name_refuses_what_mlactl_has_no_name_for():
    with pytest.raises(ValueError, match="dtype int32 has no mlactl name"):
        _checks.dtype_name(torch.int32)


@pytest.mark.parametrize(
    "value, message",
    [
        pytest.param(0, "must be a positive finite number", id="zero"),
        pytest.param(-1.5, "must be a positive finite number", id="negative"),
        pytest.param(float("nan"), "must be a positive finite number", id="nan"),
        pytest.param(float("inf"), "must be a positive finite number", id="inf"),
        pytest.param("x", "must be a number or a scalar tensor", id="text"),
        pytest.param(torch.ones(2), "must be a number or a scalar tensor", id="two-elements"),
    ],
)
def test_check_positive_refuses(value, message):
    with pytest.raises(ValueError, match=f"kv_scale {message}"):
        _checks.check_positive("kv_scale", value)


def test_check_positive_accepts_numbers_and_scalar_tensors():
    assert _checks.check_positive("x", 0.25) == 0.25
    assert _checks.check_positive("x", torch.tensor([0.5])) == 0.5
    with pytest.raises(ValueError, match="softmax scale must be a positive"):
        _checks.check_scale(0.0)


# -- kernels/configs: one validator, no shipped lookup ----------------------------------------------


@pytest.mark.parametrize(
    "config, message",
    [
        pytest.param([64], r"config must be a dict", id="not-a-dict"),
        pytest.param({"BLOCK_K": 64}, r"unknown keys \['BLOCK_K'\]", id="unknown"),
        pytest.param({"BLOCK_N": 24}, r"config\['BLOCK_N'\] must be a power of two >= 16", id="not-pow2"),
        pytest.param({"BLOCK_N": 8}, r"config\['BLOCK_N'\] must be a power of two >= 16", id="too-small"),
        pytest.param({"BLOCK_N": True}, r"config\['BLOCK_N'\]", id="bool"),
        pytest.param({"num_stages": 0}, r"config\['num_stages'\] must be a positive integer", id="stages-0"),
    ],
)
def test_check_config_refuses(config, message):
    with pytest.raises(ValueError, match=message):
        configs.check_config(config, "config", pow2={"BLOCK_N": 16}, positive=("num_stages",))


def test_check_config_accepts_a_subset():
    cfg = {"BLOCK_N": 32, "num_stages": 3}
    assert configs.check_config(cfg, "config", pow2={"BLOCK_N": 16, "num_warps": 1}, positive=("num_stages",)) == cfg


def test_merge_uses_the_shared_validator():
    from mlactl.kernels import merge_attn_states

    o = torch.zeros(2, 2, 16)
    lse = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"config\['BLOCK_H'\] must be a power of two >= 1, got 3"):
        merge_attn_states(o, lse, o, lse, config={"BLOCK_H": 3})


def test_tuned_configs_come_from_the_user_folder_only(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_TUNED_DIR", str(tmp_path))
    monkeypatch.delenv("MLACTL_NO_TUNED", raising=False)
    assert not hasattr(configs, "shipped_dir")
    assert configs.lookup("mla_decode", "NVIDIA H200", "bf16", B=1, H=128, S_q=1, ctx=1024) is None
    name = configs.file_name("mla_decode", "NVIDIA H200", "bf16")
    (tmp_path / name).write_text(
        '{"version": 1, "configs": {"B=1,H=128,S_q=1,ctx=1024": {"BLOCK_N": 32}}}', encoding="utf-8"
    )
    assert configs.lookup("mla_decode", "NVIDIA H200", "bf16", B=2, H=128, S_q=1, ctx=1024) == {"BLOCK_N": 32}
    packaged = "\n".join(line for line in (REPO / "pyproject.toml").read_text().splitlines() if "profiles" in line)
    assert "tuned" not in packaged


# -- one paged-cache builder -------------------------------------------------------------------------


def _read_back(kv, table, lens) -> list[torch.Tensor]:
    """Each request's rows, read token by token through the block table (a plain second reading)."""
    block = kv.shape[1]
    return [
        torch.stack([kv[int(table[b, t // block]), t % block] for t in range(int(n))])
        if n
        else kv.new_zeros(0, kv.shape[2])
        for b, n in enumerate(lens.tolist())
    ]


@pytest.mark.parametrize("block_size", [1, 4, 5], ids=lambda b: f"page{b}")
def test_build_paged_cache_round_trips(block_size):
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(n, 6, generator=g) for n in (7, 0, 4)]
    kv, table, lens = build_paged_cache(rows, block_size, seed=1)
    assert lens.tolist() == [7, 0, 4] and table.dtype == torch.int32 and lens.dtype == torch.int32
    need = [math.ceil(7 / block_size), 0, math.ceil(4 / block_size)]
    assert kv.shape == (sum(need) + 1, block_size, 6)
    used = [int(table[b, i]) for b in range(3) for i in range(need[b])]
    assert len(set(used)) == len(used)  # no block shared between requests
    for got, want in zip(_read_back(kv, table, lens), rows):
        assert torch.equal(got, want)


def test_build_paged_cache_takes_one_tensor_fp8_and_a_generator():
    rows = (torch.randn(2, 9, 8) * 4).to(torch.float8_e4m3fn)  # [B, L, D]
    kv, table, lens = build_paged_cache(rows, 4, generator=torch.Generator().manual_seed(0))
    assert kv.dtype == torch.float8_e4m3fn and lens.tolist() == [9, 9] and table.shape == (2, 3)
    for got, want in zip(_read_back(kv, table, lens), rows):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))  # byte-exact
    again = build_paged_cache(rows, 4, generator=torch.Generator().manual_seed(0))[1]
    assert torch.equal(again, table)
    with pytest.raises(ValueError, match="extra_blocks must be >= 1"):
        build_paged_cache(rows, 4, extra_blocks=0)


def test_tune_inputs_lay_their_cache_out_with_the_shared_builder():
    from mlactl.tune.inputs import FP8_SCALE, paged_cache

    g = torch.Generator().manual_seed(0)
    kv, table, kv_scale = paged_cache(3, 10, 8, "fp8", torch.float32, "cpu", g, page=4)
    assert kv.dtype == torch.float8_e4m3fn and kv_scale == FP8_SCALE == 0.05
    assert kv.shape == (3 * 3 + 1, 4, 8) and table.shape == (3, 3)  # ceil(10 / 4) = 3 pages each, one spare
    assert len(set(table.flatten().tolist())) == 9


# -- shared measurement helpers ---------------------------------------------------------------------


def test_relative_error_by_hand():
    from mlactl.tune.common import relative_error

    ref = torch.tensor([3.0, 4.0])  # norm 5
    assert relative_error(torch.tensor([3.0, 5.0]), ref) == pytest.approx(0.2)  # |[0, 1]| / 5
    assert relative_error(torch.tensor([1.0, float("nan")]), ref) == math.inf
    assert relative_error(torch.tensor([0.0, 2.0]), torch.zeros(2)) == pytest.approx(2.0)  # absolute


def test_versions(tmp_path):
    from mlactl.tune.common import versions

    v = versions()
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    assert v["torch"] == torch.__version__ and v["mlactl"] == mlactl.__version__ == "0.2.0" and "git_commit" not in v
    assert "triton" in v and "cuda" in v
    assert versions(git_dir=tmp_path)["git_commit"] is None  # not a checkout
    if (REPO / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", versions(git_dir=REPO)["git_commit"] or "")


def test_measured_crossovers_names_one_thing():
    from mlactl.output import plot
    from mlactl.results import store as results

    assert not hasattr(plot, "measured_crossovers")
    data = {"crossovers": [{"batch": 1, "prefix": 0, "measured": 5}, {"batch": 8, "prefix": 0, "measured": 9}]}
    assert results.measured_crossovers(data, 6) == {0: 9}  # nearest batch in log2: 8
    assert plot.measured_crossover_rows([dict(data, device={"name": "cpu"})], 1) == [
        {"source": 0, "batch": 1, "prefix": 0, "new": 5}
    ]


# -- the public kernel API ---------------------------------------------------------------------------

PUBLIC = [
    "mla_decode",
    "mla_prefill",
    "mla_attention",
    "merge_attn_states",
    "expand_kv",
    "gather_latents",
    "mla_prefill_expand",
    "mla_prefill_chunked",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_kernel_entry_points_are_typed_and_documented(name):
    import mlactl.kernels

    fn = getattr(mlactl.kernels, name)
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty
    untyped = [p for p, v in sig.parameters.items() if v.annotation is inspect.Parameter.empty]
    assert untyped == []
    doc = inspect.getdoc(fn) or ""
    assert all(section in doc for section in ("Args:", "Returns:", "Raises:")), name
    for p in sig.parameters:  # every argument is described (grouped names count)
        assert re.search(rf"\b{p}\b[^\n]*:", doc), (name, p)


# -- docs and tooling -------------------------------------------------------------------------------


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    return [REPO / f for f in listed.stdout.split() if f.endswith((".py", ".md", ".toml", ".sh", ".yaml"))]


def test_no_pointer_to_a_document_that_is_not_in_the_repo():
    headings = set(re.findall(r"^#+ (.+)$", (REPO / "docs" / "design.md").read_text(), re.M))
    this = Path(__file__).resolve()
    for path in _tracked_text_files():
        if path == this:
            continue
        text = path.read_text(encoding="utf-8")
        assert "DESIGN.md" not in text, path
        for section in re.findall(r"docs/design\.md[,:]? \(?\"([^\"]+)\"", text):
            assert " ".join(section.split()) in headings, (path, section)
    assert "(docs/design.md)" in (REPO / "README.md").read_text()


def test_ci_runs_ruff_then_mypy_then_pytest():
    ci = (REPO / ".ci" / "run").read_text()
    steps = [ci.index("ruff check ."), ci.index("\nlint-imports "), ci.index("\nmypy "), ci.index("\npytest ")]
    assert steps == sorted(steps)
    readme = (REPO / "README.md").read_text()
    assert "ruff format --check . && lint-imports && mypy && pytest" in readme
    assert 'pytest -m "not slow and not gpu"' in readme
    hooks = (REPO / ".pre-commit-config.yaml").read_text()
    assert re.findall(r"- id: (\S+)", hooks) == ["ruff", "ruff-format", "mypy", "lint-imports"]


def test_license_is_the_apache_2_text():
    # 175792518e4ac015ab6696d16c4f607e: the md5 of https://www.apache.org/licenses/LICENSE-2.0.txt
    assert hashlib.md5((REPO / "LICENSE").read_bytes()).hexdigest() == "175792518e4ac015ab6696d16c4f607e"


def test_what_users_read_names_sources_not_how_they_were_found():
    """The docs, the README, the changelog and every string in mlactl/ and kernels/ cite a
    repository, a release or commit, a file and a line: never the tools a developer read the
    source with, an index id, or the project's issue numbers."""
    pattern = re.compile(r"search tools?|index id \d|tools hold|\(issue \d+|issue \d+'s|issue \d+\)", re.IGNORECASE)
    files = [REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").glob("*.md")]
    files += [*(REPO / "mlactl").rglob("*.py"), *(REPO / "kernels").glob("*.py")]
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in files for m in pattern.finditer(p.read_text())]
    assert not found, found
