"""Shell completion of option values (mlactl/cli/complete.py): the names each option takes, the
last item of a comma list, nothing for a path (the shell completes a file); and through the
shell's own protocol (bash's COMP_WORDS), so `mlactl analyze --hardware b<TAB>` offers what
`mlactl list` has."""

from conftest import runner

from mlactl.cli import app
from mlactl.cli.complete import listed, offered


def test_offered_names_and_nothing_for_a_path():
    names = ["h100-sxm", "h200", "h800", "b200"]
    assert offered(names, "h") == ["h100-sxm", "h200", "h800"]
    assert offered(names, "b") == ["b200"]
    # a path (or any value no name starts with): nothing, so the shell completes a file name
    assert offered(names, "./h") == [] and offered(names, "x") == []


def test_listed_completes_the_last_item_and_offers_no_name_twice():
    names = ["sglang", "sglang-triton", "vllm", "vllm@0.33.0"]
    assert listed(names, "v") == ["vllm", "vllm@0.33.0"]
    assert listed(names, "sglang,v") == ["sglang,vllm", "sglang,vllm@0.33.0"]
    assert listed(names, "sglang,s") == ["sglang,sglang-triton"]


def _complete(words: str, home) -> list[str]:
    """What bash's completion of `words` (the last one being typed) prints, one value a line."""
    parts = words.split(" ")
    env = {"_MLACTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}
    out = runner.invoke(app, [], env=env | {"MLACTL_HOME": str(home)}, prog_name="mlactl")
    assert out.exit_code == 0, out.output
    return out.stdout.split()


def test_the_shell_completes_the_names_each_option_takes(tmp_path):
    home = tmp_path / "home"
    (home / "calibrations").mkdir(parents=True)
    for name in ("h200-sgl", "h200-mine", "b300-from-h200-sgl"):
        (home / "calibrations" / f"{name}.json").write_text("{}")  # names only: nothing is read
    assert _complete("mlactl analyze --hardware b", home) == ["b200", "b300"]
    assert _complete("mlactl analyze -g h1", home) == ["h100-sxm"]
    assert "deepseek-v3.2" in _complete("mlactl batch r.csv --model deepseek-v3", home)
    assert _complete("mlactl analyze --kv-dtype fp", home) == ["fp16", "fp8", "fp32"]
    assert _complete("mlactl engines --engines sglang,vllm@", home) == ["sglang,vllm@0014ca6b", "sglang,vllm@0.33.0"]
    assert _complete("mlactl analyze --policy fl", home) == ["flops"]
    assert _complete("mlactl crossover --calibration h200", home) == ["h200-mine", "h200-sgl"]
    assert _complete("mlactl calibrate show b", home) == ["b300-from-h200-sgl"]
    assert _complete("mlactl calibrate --from aiconfigurator --framework t", home) == ["trtllm"]
    assert _complete("mlactl analyze --format j", home) == ["json"]
    assert _complete("mlactl calibrate transfer h200-sgl --hardware gb", home) == ["gb200", "gb300"]
    assert _complete("mlactl tune --kv-dtype a", home) == ["auto"]
