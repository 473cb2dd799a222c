"""GPU ceilings: nominal from the vendor's datasheet, measured when `mlactl tune ceilings` ran.

Profiles are TOML files: the shipped ones in profiles/hardware/, a user's measured ones in
$MLACTL_HOME/hardware/ (these win), or any file given by path. Units in the files are the
datasheets' (TFLOP/s, TB/s, GB, KiB, MiB); in code everything is SI: FLOP/s and bytes/s.

    name = "h200"
    display = "NVIDIA H200 SXM 141GB"
    match = ["H200"]             # substrings of torch.cuda.get_device_name() this profile is for
    arch = "sm90"                # optional: the architecture the engines' rules resolve for (ARCHES)
    memory_gb = 141
    bandwidth_tbs = 4.8
    sm_count = 132               # optional, like smem_per_sm_kib, l2_mib and nvlink_gbps
    nvlink_gbps = 900            # NVLink per GPU, both directions (replay's all-reduces)
    sources = ["..."]
    [peak_tflops]                # dense, per compute dtype
    bf16 = 989
    fp8 = 1979
    [measured]                   # optional: written by `mlactl tune ceilings`
    bandwidth_tbs = 4.3
    device = "NVIDIA H200"
    [measured.peak_tflops]
    bf16 = 780
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlactl import profiles as shipped_profiles
from mlactl.util import dirs, safe
from mlactl.util.errors import MlactlError, warn
from mlactl.util.io import MAX_CONFIG_BYTES, read_text, store_files
from mlactl.util.suggest import did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TERA = 1e12
# The architectures a profile's `arch` may name: what SGLang's and vLLM's rules tell apart (Hopper
# sm90; sm100, every 10.x part; sm80 Ampere, sm89 Ada and sm120, the parts neither Hopper nor
# sm100; rocm). A profile without one is named by its name and display (engines.arch_of).
ARCHES = ("sm80", "sm89", "sm90", "sm100", "sm120", "rocm")


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    display: str
    peak_tflops: dict[str, float]
    bandwidth_tbs: float
    memory_gb: float
    sm_count: int | None = None
    smem_per_sm_kib: float | None = None
    l2_mib: float | None = None
    nvlink_gbps: float | None = None  # NVLink per GPU, both directions together (the datasheets' figure)
    arch: str | None = None  # one of ARCHES, or None: named by its name and display
    match: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    measured: dict | None = None  # the [measured] table as read
    using_measured: bool = False  # True when the ceilings below are the measured ones
    path: str | None = field(default=None, compare=False)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for a compute dtype."""
        if dtype not in self.peak_tflops:
            have = ", ".join(sorted(self.peak_tflops))
            raise MlactlError(f"hardware {self.name} has no {dtype} peak (it has: {have})")
        return self.peak_tflops[dtype] * TERA

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.bandwidth_tbs * TERA

    def ridge(self, dtype: str) -> float:
        """Arithmetic intensity (FLOP/byte) where compute and memory time are equal."""
        return self.peak_flops(dtype) / self.bandwidth

    def with_measured(self) -> HardwareProfile:
        """The same profile with the measured ceilings in place of the nominal ones."""
        if not self.measured:
            raise MlactlError(
                f"hardware {self.name} has no measured ceilings; run `mlactl tune ceilings` on "
                "that GPU first, or drop --measured"
            )
        peaks = dict(self.peak_tflops)
        peaks.update(self.measured.get("peak_tflops", {}))
        bandwidth = self.measured.get("bandwidth_tbs", self.bandwidth_tbs)
        return replace(self, peak_tflops=peaks, bandwidth_tbs=bandwidth, using_measured=True)

    @property
    def memory_bytes(self) -> float:
        """The GPU's memory in bytes (memory_gb is decimal GB)."""
        return self.memory_gb * 1e9

    @property
    def l2_bytes(self) -> float | None:
        """The GPU's L2 in bytes, or None where the profile gives no l2_mib."""
        return None if self.l2_mib is None else self.l2_mib * 1024 * 1024

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "display": self.display,
            "peak_flops": {k: v * TERA for k, v in sorted(self.peak_tflops.items())},
            "bandwidth_bytes_per_s": self.bandwidth,
            "memory_bytes": self.memory_bytes,
            "sm_count": self.sm_count,
            "smem_per_sm_bytes": None if self.smem_per_sm_kib is None else self.smem_per_sm_kib * 1024,
            "l2_bytes": self.l2_bytes,
            "measured": self.using_measured,
            "sources": list(self.sources),
        }


# Every ceiling lies between these, in the file's units (TFLOP/s, TB/s, GB, KiB, MiB): 1e-6 is a
# MFLOP/s or a MB/s, 1e6 a thousand times any GPU made. Outside them a time or ridge computed from
# the profile would be 0 or infinite (1e308 TFLOP/s, 1e-320 TB/s), and JSON has no Infinity.
LOWEST, HIGHEST = 1e-6, 1e6


def _positive(where: str, key: str, value, optional: bool = False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not LOWEST <= value <= HIGHEST:
        raise MlactlError(f"{where}: {key} must be a positive number, got {value!r} (from {LOWEST:g} to {HIGHEST:g})")
    return value


def _strings(where: str, key: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MlactlError(f'{where}: {key} must be a list of strings, e.g. {key} = ["..."], got {value!r}')
    return tuple(value)


def _string(where: str, key: str, value) -> str:
    """A name from the file, printable from here on (markup and mathtext are escaped where drawn)."""
    if not isinstance(value, str) or not value.strip():
        raise MlactlError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return safe.text(value)


def _arch(where: str, value) -> str | None:
    if value is None:
        return None
    if value not in ARCHES:
        raise MlactlError(f"{where}: arch must be one of {', '.join(ARCHES)}, got {safe.text(repr(value), 40)}")
    return str(value)


def _peaks(where: str, table) -> dict[str, float]:
    if not isinstance(table, dict) or not table:
        raise MlactlError(f"{where}: [peak_tflops] must list at least one dtype, e.g. bf16 = 989")
    return {str(k): float(_positive(where, f"peak_tflops.{k}", v)) for k, v in table.items()}


def parse_profile(data: dict, where: str) -> HardwareProfile:
    """Build a profile from a parsed TOML table; `where` names the file in error messages."""
    for key in ("name", "peak_tflops", "bandwidth_tbs", "memory_gb"):
        if key not in data:
            raise MlactlError(f"{where}: missing required key {key!r}")
    measured = data.get("measured")
    if measured is not None:
        if not isinstance(measured, dict):
            raise MlactlError(f"{where}: [measured] must be a table")
        if "peak_tflops" in measured:
            measured = dict(measured, peak_tflops=_peaks(f"{where} [measured]", measured["peak_tflops"]))
        if "bandwidth_tbs" in measured:
            _positive(f"{where} [measured]", "bandwidth_tbs", measured["bandwidth_tbs"])
    sm_count = data.get("sm_count")
    if sm_count is not None and (isinstance(sm_count, bool) or not isinstance(sm_count, int)):
        raise MlactlError(f"{where}: sm_count must be a whole number, got {sm_count!r}")
    return HardwareProfile(
        name=_string(where, "name", data["name"]),
        display=_string(where, "display", data.get("display", data["name"])),
        peak_tflops=_peaks(where, data["peak_tflops"]),
        bandwidth_tbs=float(_positive(where, "bandwidth_tbs", data["bandwidth_tbs"])),
        memory_gb=float(_positive(where, "memory_gb", data["memory_gb"])),
        sm_count=_positive(where, "sm_count", data.get("sm_count"), optional=True),
        smem_per_sm_kib=_positive(where, "smem_per_sm_kib", data.get("smem_per_sm_kib"), optional=True),
        l2_mib=_positive(where, "l2_mib", data.get("l2_mib"), optional=True),
        nvlink_gbps=_positive(where, "nvlink_gbps", data.get("nvlink_gbps"), optional=True),
        arch=_arch(where, data.get("arch")),
        match=_strings(where, "match", data.get("match", [])),
        sources=_strings(where, "sources", data.get("sources", [])),
        measured=measured,
        path=where,
    )


def load_profile(path: str | Path) -> HardwareProfile:

    text = read_text(path, "hardware profile", limit=MAX_CONFIG_BYTES)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MlactlError(f"{path}: invalid TOML: {exc}") from None
    return parse_profile(data, str(path))


def shipped_dir() -> Path:

    # the package is installed as files (setuptools, never zipped); importlib.resources would
    # cost every start about 17 ms of imports for the same answer
    return Path(shipped_profiles.__file__).parent / "hardware"


def _profile_files() -> dict[str, Path]:
    """name -> file; a user's file of the same name replaces the shipped one."""
    found = {p.stem: p for p in store_files(shipped_dir(), "*.toml")}
    # a FIFO or a directory named x.toml in the user's folder is skipped with a warning
    found.update({p.stem: p for p in store_files(dirs.user_hardware_dir(), "*.toml")})
    return found


def names() -> list[str]:
    return sorted(_profile_files())


def from_name(name: str) -> HardwareProfile:
    files = _profile_files()
    key = name.strip().lower()
    if key not in files:
        raise MlactlError(
            f"unknown hardware {name!r}{did_you_mean(key, files)}; known: {', '.join(sorted(files))} "
            "(or give the path of a .toml profile)"
        )
    return load_profile(files[key])


def resolve(spec: str, measured: bool = False) -> HardwareProfile:
    """A profile name or a path to a .toml file; `measured` swaps in the measured ceilings."""
    if spec.endswith(".toml") or "/" in spec:
        profile = load_profile(spec)
    else:
        profile = from_name(spec)
    return profile.with_measured() if measured else profile


def all_profiles() -> list[HardwareProfile]:
    """Every profile that loads. A bad file in $MLACTL_HOME/hardware/ is skipped with a warning
    naming it: it must not break `list` or `tune`, which did not ask for it."""

    profiles = []
    for _, path in sorted(_profile_files().items()):
        try:
            profiles.append(load_profile(path))
        except MlactlError as exc:
            warn(f"skipped hardware profile: {exc}")
    return profiles


def detect(device_name: str) -> HardwareProfile | None:
    """The profile whose longest `match` substring occurs in a device name, e.g. 'NVIDIA H200'."""
    best, best_len = None, 0
    lowered = device_name.lower()
    for profile in all_profiles():
        for pattern in profile.match:
            if pattern.lower() in lowered and len(pattern) > best_len:
                best, best_len = profile, len(pattern)
    return best
