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


def spellings(name):
    """Every name of rule set `name`, with the options each fixes: its own; its family's, where
    it is the newest; each forced-backend shorthand's, with `@VERSION` and (the newest) bare."""
    rs = RULESETS[name]
    out = {name: {}}
    if NEWEST[rs.engine] == name:
        out[rs.engine] = {}
    for short, (family, fixed) in SHORTHANDS.items():
        if family == rs.engine:
            out[f"{short}@{rs.version}"] = fixed
            if NEWEST[family] == name:
                out[short] = fixed
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_and_options(), MODELS, GPUS, st.data())
def test_every_spelling_takes_the_same_options(drawn, model, gpu, data):
    """A rule set under any of its names (`sglang`, `sglang-triton@0.5.23`, ...), among --engines
    or as --policy, takes an option qualified by that name, by its family or by the rule set's
    own name (`sglang@0.5.23.key` reaches `sglang` and `sglang-triton`), or bare, and gives what
    the rule set gives with the forced backend set as an option."""
    name, opts = drawn
    rs = RULESETS[name]
    spelling, fixed = data.draw(st.sampled_from(sorted(spellings(name).items())))
    opts = {k: v for k, v in opts.items() if k not in fixed}
    c = ctx(model, gpu)
    explicit = [f"{k}={v}" for k, v in {**fixed, **opts}.items()]

    def same(fn):  # the outcome, an error's naming of the forced option as the user would give it
        got = outcome(fn)
        return (got[0], got[1].replace(f"{spelling} fixes ", "")) if got[0] == "error" else got

    reference = same(lambda: parse_engines(name, explicit, c)[0])
    other = "vllm" if rs.engine == "sglang" else "sglang"
    ways = {"bare key": lambda: parse_engines(spelling, [f"{k}={v}" for k, v in opts.items()], c)[0]}
    for target in sorted({spelling, rs.engine, name}):
        keyed = [f"{target}.{k}={v}" for k, v in opts.items()]
        ways[f"--engines {spelling}, {target}.key"] = lambda keyed=keyed: parse_engines(spelling, keyed, c)[0]
        ways[f"--policy {spelling}, {target}.key"] = lambda keyed=keyed: parse_policy(spelling, spelling, keyed, c)
        ways[f"--policy {spelling} beside {other}"] = lambda keyed=keyed: parse_policy(spelling, other, keyed, c)
    got = {way: same(fn) for way, fn in ways.items()}
    assert set(got.values()) == {reference}, (spelling, got)


def test_an_option_named_for_the_rule_set_reaches_its_other_names():
    c = ctx()
    for selected in ("sglang", "sglang-triton", "sglang-trtllm@0.5.23"):
        p = parse_engines(selected, ["sglang@0.5.23.threshold=3"], c)[0]
        assert p.threshold == 3 and p.given == ("chunked_prefix_cache_threshold",)
    assert parse_engines("sglang-triton@0.5.23", ["sglang-triton.threshold=3"], c)[0].threshold == 3
    with pytest.raises(MlactlError, match=r"sglang-triton is not among --engines \(sglang\)"):
        parse_engines("sglang", ["sglang-triton.threshold=3"], c)  # it forces a backend sglang does not
    with pytest.raises(MlactlError, match=r"sglang@0\.5\.14 is not among --engines \(sglang\)"):
        parse_engines("sglang", ["sglang@0.5.14.threshold=3"], c)


def test_each_engine_has_its_own_params_type():
    from mlactl.decide.engines import SGLangParams, VLLMParams

    c = ctx()
    sgl, vll = parse_engines("sglang-triton,vllm", [], c)
    assert type(sgl) is SGLangParams and type(vll) is VLLMParams
    assert not hasattr(vll, "decode_backend") and not hasattr(sgl, "workspace")
    assert "decode_backend" in sgl.to_json() and "decode_backend" not in vll.to_json()


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v3.2"])
@pytest.mark.parametrize("name", ["sglang", "sglang@0.5.14", "sglang-triton", "sglang-trtllm", "vllm", "vllm@0014ca6b"])
@pytest.mark.parametrize("gpu", ["h200", "b200"])
def test_what_a_rule_says_of_itself_is_what_replay_asks(model, name, gpu):
    """The resolved rule's own answers (its swept threshold, decode and chunked paths, whether its
    threshold matters) are those replay's adapter works out from its family and kind, so callers
    can ask the rule instead of testing for DSA."""
    from mlactl.decide.engines import steps as rules

    try:
        e = rules.parse(name, [], from_name(model), hardware.resolve(gpu))[0]
    except MlactlError:
        return
    p = e.params
    assert p.describe == p.why[0]
    assert p.chunked_path == rules.chunked_path(e) and p.decode_path == rules.decode_path(e)
    assert p.reads_threshold == e.sweeps
    assert p.swept.option == e.sweep_option and p.swept.compares == e.compares
    assert p.swept.maximum == e.threshold_max
    if e.sweeps:
        assert p.swept.value == e.threshold
    assert p.with_threshold(7) == e.with_threshold(7).params
