"""Every way of naming an engine resolves through one path (mlactl/decide/engines/params.py):
`--engines NAME`, `--policy NAME`, a forced-backend shorthand (`sglang-triton`), a bare family
for its newest release, `@VERSION` on any of them, and an option given as `family.key`,
`name.key` or a bare `key`. For the same rule set and options, each gives the same path at every
shape, or every one of them refuses with the same one-line error."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mlactl.cli import app
from mlactl.decide.engines import (
    NEWEST,
    RULESETS,
    SHORTHANDS,
    context_for,
    grid_paths,
    parse_engines,
    parse_policy,
    ruleset_for,
)
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.util.errors import MlactlError

runner = CliRunner()
BATCH = np.array([1, 1, 8, 1, 64, 2, 1, 4])
NEW = np.array([1, 64, 1, 300, 1, 2048, 9000, 600])
PREFIX = np.array([0, 8192, 30000, 4096, 1000, 0, 20000, 70000])


def ctx(model="deepseek-v3", gpu="h200", kv="bf16"):
    return context_for(from_name(model), hardware.resolve(gpu), kv)


def option_text(rs, key):
    """A value of the option as a user would write it, drawn from what it takes."""
    o = rs.options[key]
    if o.choices:
        return st.sampled_from(o.choices)
    if o.kind is bool:
        return st.sampled_from(["true", "false"])
    return st.integers(max(o.minimum, 0), min(o.maximum, 1 << 20)).map(str)


@st.composite
def rule_and_options(draw):
    name = draw(st.sampled_from(sorted(RULESETS)))
    rs = RULESETS[name]
    keys = draw(st.lists(st.sampled_from(sorted(rs.options)), max_size=2, unique=True))
    return name, {k: draw(option_text(rs, k)) for k in keys}


def outcome(fn):
    """The paths a resolution gives, or the error it raises (the message, whatever named it)."""
    try:
        p = fn()
    except MlactlError as exc:
        return ("error", str(exc).split(":")[-1].strip())
    return ("paths", tuple(grid_paths(p, BATCH, NEW, PREFIX).tolist()), p.backend, p.threshold)


MODELS = st.sampled_from(["deepseek-v3", "deepseek-v3.2"])
GPUS = st.sampled_from(["h200", "b200", "a100-sxm"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_and_options(), MODELS, GPUS)
def test_every_name_gives_the_same_paths(drawn, model, gpu):
    name, opts = drawn
    family = RULESETS[name].engine
    c = ctx(model, gpu)
    by_name = [f"{name}.{k}={v}" for k, v in opts.items()]
    by_family = [f"{family}.{k}={v}" for k, v in opts.items()]
    bare = [f"{k}={v}" for k, v in opts.items()]
    ways = {
        "--engines NAME, NAME.key": lambda: parse_engines(name, by_name, c)[0],
        "--engines NAME, family.key": lambda: parse_engines(name, by_family, c)[0],
        "--engines NAME, key": lambda: parse_engines(name, bare, c)[0],
        # beside the default engines, `family.key` would reach the newest rule of the family too
        "--policy NAME, NAME.key": lambda: parse_policy(name, None, by_name, c),
        "--policy NAME, --engines NAME, family.key": lambda: parse_policy(name, name, by_family, c),
        "--policy NAME among --engines": lambda: parse_policy(name, f"{name},sglang,vllm", by_name, c),
    }
    if NEWEST[family] == name:
        ways["bare family"] = lambda: parse_engines(family, by_family, c)[0]
    got = {way: outcome(fn) for way, fn in ways.items()}
    assert len(set(got.values())) == 1, got


@pytest.mark.parametrize("short", sorted(SHORTHANDS))
@pytest.mark.parametrize("version", sorted({rs.version for rs in RULESETS.values() if rs.engine == "sglang"}))
def test_a_shorthand_at_a_version_is_that_version_with_its_backend(short, version):
    family, fixed = SHORTHANDS[short]
    rs, fixed_too = ruleset_for(f"{short}@{version}")
    assert rs.name == f"{family}@{version}" and fixed_too == fixed
    c = ctx()
    forced = [f"{k}={v}" for k, v in fixed.items()]
    assert outcome(lambda: parse_engines(f"{short}@{version}", [], c)[0]) == outcome(
        lambda: parse_engines(f"{family}@{version}", forced, c)[0]
    )
    if NEWEST[family] == rs.name:
        assert outcome(lambda: parse_engines(short, [], c)[0]) == outcome(
            lambda: parse_engines(f"{short}@{version}", [], c)[0]
        )


def test_a_shorthand_at_an_unknown_version_lists_the_versions():
    with pytest.raises(MlactlError, match=r"no rule set for sglang-triton@0\.1; sglang versions: "):
        ruleset_for("sglang-triton@0.1")


def cli_policy_paths(*args):
    out = runner.invoke(app, ["analyze", "--hardware", "h200", "--new", "1,64,200,600", "--prefix", "8K", "-f", "json",
                              *args])  # fmt: skip
    assert out.exit_code == 0, out.output
    return [row["policy"]["path"] for row in json.loads(out.stdout)["rows"]]


def cli_engine_paths(name, *args):
    out = runner.invoke(app, ["analyze", "--hardware", "h200", "--new", "1,64,200,600", "--prefix", "8K", "-f", "json",
                              "--engines", name, *args])  # fmt: skip
    assert out.exit_code == 0, out.output
    return [row["engines"][name]["path"] for row in json.loads(out.stdout)["rows"]]


def test_policy_takes_the_engine_options_as_engines_does():
    # vLLM at 0014ca6b on an H200 with a bf16 cache: FLASH_ATTN_MLA, decode threshold 512, so 200
    # and 600 new tokens split at 512; FLASHMLA's threshold is 128 (docs/engines.md): 200 new
    # tokens become a prefill, so expand_chunked after the 8K prefix
    flashmla = ["--engine-option", "vllm.backend=flashmla"]
    plain = cli_policy_paths("--policy", "vllm@0014ca6b")
    forced = cli_policy_paths("--policy", "vllm@0014ca6b", *flashmla)
    assert plain[2] == "absorb" and forced[2] == "expand_chunked"
    assert forced == cli_engine_paths("vllm@0014ca6b", *flashmla)
    assert plain == cli_engine_paths("vllm@0014ca6b")


def test_a_shorthand_with_a_version_is_accepted_by_every_command():
    assert cli_engine_paths("sglang-triton@0.5.14") == cli_engine_paths(
        "sglang@0.5.14", "--engine-option", "attention_backend=triton"
    )
