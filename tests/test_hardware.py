from dataclasses import replace

import pytest

from mlactl.decide.engines import arch_of, context_for, parse_engines
from mlactl.model import hardware
from mlactl.model.config import from_name
from mlactl.tune import ceilings
from mlactl.util.errors import MlactlError

# name -> (bf16 TFLOP/s, fp8 TFLOP/s or None, TB/s, GB, SMs): the vendors' published figures (dense
# peaks from the datasheets, SM counts from the datasheets and whitepapers each profile's `sources`
# cites), typed here, not read from the profiles; `teaching` is the profile of round numbers
DATASHEET_FIGURES = {
    "a100-sxm": (312, None, 2.039, 80, 108),
    "h100-sxm": (989, 1979, 3.35, 80, 132),
    "h800": (989, 1979, 3.35, 80, 132),
    "h200": (989, 1979, 4.8, 141, 132),
    "b200": (2250, 4500, 8.0, 180, 148),
    "mi300x": (1307, 2614, 5.3, 192, 304),
    "teaching": (100, 200, 3.0, 80, 100),
}


@pytest.mark.parametrize("name", sorted(DATASHEET_FIGURES))
def test_shipped_profiles(name):
    hw = hardware.from_name(name)
    bf16, fp8, tbs, gb, sms = DATASHEET_FIGURES[name]
    assert hw.peak_flops("bf16") == bf16 * 1e12
    assert hw.bandwidth == tbs * 1e12
    assert hw.memory_gb == gb and hw.sm_count == sms
    assert hw.sources, "every profile cites its sources"
    if fp8 is None:
        with pytest.raises(MlactlError, match="has no fp8 peak"):
            hw.peak_flops("fp8")
    else:
        assert hw.peak_flops("fp8") == fp8 * 1e12


def test_h100_details_and_ridge():
    hw = hardware.from_name("h100-sxm")
    assert (hw.smem_per_sm_kib, hw.l2_mib) == (228, 50)
    assert hw.ridge("bf16") == pytest.approx(989 / 3.35)  # 295.2 FLOP/byte


def test_unknown_name():
    with pytest.raises(MlactlError, match="unknown hardware 'tpu'.*h200"):
        hardware.from_name("tpu")


GOOD = """
name = "mygpu"
memory_gb = 24
bandwidth_tbs = 1.0
[peak_tflops]
bf16 = 100
[measured]
bandwidth_tbs = 0.8
[measured.peak_tflops]
bf16 = 70
"""


def test_user_profile_and_measured(tmp_path):
    path = tmp_path / "mygpu.toml"
    path.write_text(GOOD)
    hw = hardware.resolve(str(path))
    assert hw.peak_flops("bf16") == 100e12 and not hw.using_measured
    measured = hardware.resolve(str(path), measured=True)
    assert measured.peak_flops("bf16") == 70e12 and measured.bandwidth == 0.8e12 and measured.using_measured


def test_measured_missing():
    with pytest.raises(MlactlError, match="no measured ceilings; run `mlactl tune ceilings`"):
        hardware.resolve("h200", measured=True)


def test_user_folder_overrides_shipped(tmp_path, monkeypatch):
    monkeypatch.setenv("MLACTL_HOME", str(tmp_path))
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "h200.toml").write_text(GOOD.replace('"mygpu"', '"h200"'))
    assert hardware.from_name("h200").peak_flops("bf16") == 100e12
    assert "h200" in hardware.names()


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param(
            GOOD.replace("bandwidth_tbs = 1.0", "bandwidth_tbs = 0"),
            "bandwidth_tbs must be a positive number, got 0",
            id="zero-bandwidth",
        ),
        pytest.param(GOOD.replace("memory_gb = 24\n", ""), "missing required key 'memory_gb'", id="missing-key"),
        pytest.param(
            GOOD.replace("bf16 = 100", "bf16 = -1"), "peak_tflops.bf16 must be a positive number", id="negative-peak"
        ),
        pytest.param(GOOD.replace("[peak_tflops]", "[peak_tflops\n"), r"invalid TOML: .*line 5", id="malformed-toml"),
        pytest.param(
            GOOD.replace("[peak_tflops]", 'arch = "sm91"\n[peak_tflops]'),
            "arch must be one of sm80, sm89, sm90, sm100, sm120, rocm, got 'sm91'",
            id="unknown-arch",
        ),
    ],
)
def test_bad_profiles(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(MlactlError, match=message):
        hardware.resolve(str(path))


@pytest.mark.parametrize(
    "device, name",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H800", "h800"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_detect(device, name):
    found = hardware.detect(device)
    assert (found.name if found else None) == name


# The architecture of each shipped profile, as the engines' sources tell the parts apart (Hopper,
# every compute capability 10.x part, the others): typed here from the datasheets, not read back
ARCHITECTURES = {
    "a100-sxm": "sm80",
    "h100-sxm": "sm90",
    "h800": "sm90",
    "h200": "sm90",
    "b200": "sm100",
    "b300": "sm100",
    "gb200": "sm100",
    "gb300": "sm100",
    "l40s": "sm89",
    "rtx-pro-6000": "sm120",
    "mi300x": "rocm",
    "teaching": None,
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_shipped_profile_names_its_architecture_and_its_name_agrees(name):
    hw = hardware.from_name(name)
    assert hw.arch == ARCHITECTURES[name]
    # a profile without `arch` (an older user file) is named by its name and display: the same
    assert arch_of(replace(hw, arch=None)) == ARCHITECTURES[name]


def test_a_profile_of_ones_own_takes_its_arch_where_its_name_says_nothing(tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(GOOD)
    plain = hardware.resolve(str(path))
    assert plain.arch is None and arch_of(plain) is None  # the engines then assume an SM90 part, and say so
    path.write_text(GOOD.replace("[peak_tflops]", 'arch = "sm100"\n[peak_tflops]'))
    lab = hardware.resolve(str(path))
    sglang, vllm = parse_engines("sglang,vllm", [], context_for(from_name("deepseek-v3"), lab))
    assert (sglang.backend, vllm.backend) == ("trtllm_mla", "FLASHINFER_MLA")
    assert "(sm100)" in sglang.why[0] and not any("assumed" in w for w in vllm.why)


def test_a_measured_profile_keeps_its_gpus_architecture(tmp_path):
    path = ceilings.write_measured_profile(
        "NVIDIA L40S", {"bandwidth_tbs": 0.8, "peak_tflops": {"bf16": 300}}, tmp_path
    )
    hw = hardware.load_profile(path)
    assert hw.name == "l40s" and hw.arch == "sm89" and hw.measured["bandwidth_tbs"] == 0.8
