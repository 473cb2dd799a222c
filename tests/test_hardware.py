import pytest

from mlactl.model import hardware
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
