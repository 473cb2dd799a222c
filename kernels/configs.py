"""Tuned launch configs: one JSON file per kernel, device and cache dtype, keyed by shape bucket.

File names follow the engines' convention, e.g.
``kernel=mla_decode,device_name=NVIDIA_H200,dtype=bf16.json``. A file holds::

    {"version": 1, "kernel": "mla_decode", "device_name": "NVIDIA H200", "dtype": "bf16",
     "triton_version": "3.6.0",
     "configs": {"B=128,H=128,S_q=1,ctx=8192": {"BLOCK_N": 64, "num_warps": 8, ...}, ...}}

A bucket key is ``name=value`` pairs of positive integers joined by commas. Lookup takes the
nearest bucket: the smallest sum of |log2(asked) - log2(bucket)| over the names, among buckets
that have exactly the asked names; the heads ``H`` count 4 times (they set the tile shapes, and
come from the model and its tensor parallelism, not from the traffic). Files live in the user
folder (``$MLACTL_TUNED_DIR``, else ``$MLACTL_HOME/tuned``, see mlactl.util.dirs); mlactl ships none
until they are measured on the GPU they name. ``MLACTL_NO_TUNED=1`` turns lookups off.
`check_config` is the one validator of a launch config (given or tuned) that the launchers share.
Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from functools import lru_cache
from pathlib import Path

from mlactl.util.dirs import device_slug, home
from mlactl.util.errors import warn

FORMAT_VERSION = 1
ENV_DIR = "MLACTL_TUNED_DIR"
ENV_OFF = "MLACTL_NO_TUNED"
WEIGHTS = {"H": 4.0}  # per-name weights of the log2 distance (names not listed weigh 1)


def user_dir() -> Path:
    """The folder new tuned configs are written to and looked up in first."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    return home() / "tuned"


def file_name(kernel: str, device_name: str, dtype: str) -> str:
    return f"kernel={kernel},device_name={device_slug(device_name)},dtype={dtype}.json"


def bucket_key(**shape: int) -> str:
    """bucket_key(H=128, S_q=1) -> 'H=128,S_q=1' (names sorted, so the key is canonical)."""
    for name, value in shape.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"bucket value {name}={value!r} must be a positive integer")
    return ",".join(f"{name}={shape[name]}" for name in sorted(shape))


def parse_bucket(key: str) -> dict[str, int]:
    out = {}
    for part in key.split(","):
        name, sep, value = part.partition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise ValueError(f"malformed bucket key {key!r}: want name=positive_int,...")
        out[name] = int(value)
    return out


def nearest(buckets: dict[str, dict], **shape: int) -> dict | None:
    """The config of the bucket nearest to `shape` in log2 distance, or None if none matches."""
    best, best_dist = None, math.inf
    names = set(shape)
    for key in sorted(buckets):
        try:
            bucket = parse_bucket(key)
        except ValueError:
            continue
        if set(bucket) != names:
            continue
        dist = sum(WEIGHTS.get(n, 1.0) * abs(math.log2(shape[n]) - math.log2(bucket[n])) for n in names)
        if dist < best_dist:
            best, best_dist = buckets[key], dist
    return best


@lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> dict:
    del mtime_ns  # part of the cache key only: a rewritten file is read again
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: not a version-{FORMAT_VERSION} mlactl tuned-config file")
    if not isinstance(data.get("configs"), dict):
        raise ValueError(f"{path}: has no 'configs' object")
    return data


def load(path: Path) -> dict:
    """Read one tuned-config file (cached until it changes). Raises ValueError if malformed."""
    try:
        return _read(str(path), path.stat().st_mtime_ns)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: line {exc.lineno}: {exc.msg}") from None


def _skip(path: Path, why) -> None:

    warn(f"skipped tuned configs {path}: {str(why).removeprefix(f'{path}: ')}")


def lookup(kernel: str, device_name: str, dtype: str, **shape: int) -> dict | None:
    """The tuned config of the nearest bucket in the user folder's file for this kernel, device
    and dtype.

    Returns None when no file or bucket fits (the launcher then uses its heuristic). A malformed
    file is skipped rather than failing a kernel launch; `mlactl tune` reports such files.
    """
    if os.environ.get(ENV_OFF, "0") not in ("", "0"):
        return None
    path = user_dir() / file_name(kernel, device_name, dtype)
    if not path.is_file():
        return None
    try:
        data = load(path)
    except (OSError, ValueError, RecursionError) as exc:
        _skip(path, exc)
        return None
    found = nearest(data["configs"], **shape)
    if found is not None and not isinstance(found, dict):
        _skip(path, f"a bucket's config is {type(found).__name__}, not an object")
        return None
    return None if found is None else dict(found)


def _pow2_at_least(value, low: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= low and value & (value - 1) == 0


def check_config(
    config, source: str, pow2: dict[str, int], positive: tuple[str, ...] = (), flags: tuple[str, ...] = ()
) -> dict:
    """Validate a launch config and return it; a ValueError names `source` and the bad key.

    pow2: keys whose value must be a power of two at least the given minimum (16 for a tile that
        feeds tl.dot, 1 for num_warps); positive: keys whose value must be an integer >= 1;
        flags: keys whose value must be 0 or 1 (a JSON file's false/true too).
    Keys outside these are refused, so a misspelt key never passes silently.
    """
    allowed = (*pow2, *positive, *flags)
    if not isinstance(config, dict):
        raise ValueError(f"{source} must be a dict with keys from {', '.join(allowed)}, got {type(config).__name__}")
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"{source} has unknown keys {unknown}; allowed: {', '.join(allowed)}")
    for key, value in config.items():
        if key in pow2 and not _pow2_at_least(value, pow2[key]):
            raise ValueError(f"{source}[{key!r}] must be a power of two >= {pow2[key]}, got {value!r}")
        if key in positive and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{source}[{key!r}] must be a positive integer, got {value!r}")
        if key in flags and (not isinstance(value, int) or value not in (0, 1)):
            raise ValueError(f"{source}[{key!r}] must be 0 or 1, got {value!r}")
    return config


def choose(kernel: str, cfg: dict, config, check, device_name: str, dtype_name: str, num_splits, **bucket) -> dict:
    """Overlay on `cfg` (the launcher's heuristic config, updated in place) the caller's `config`,
    or without one the tuned config of the bucket, then `num_splits` when given; return the
    overlay taken (config, tuned, or {}). `check(config, what)` raises ValueError on a bad one:
    the caller's config or split count is an error, a tuned config that fails is warned about and
    ignored, like a malformed file (a launch never fails over a tuned file)."""
    tuned = None
    if config is None:
        tuned = lookup(kernel, device_name, dtype_name, **bucket)
        if tuned is not None:
            try:
                check(tuned, "tuned config")
            except ValueError as exc:
                warnings.warn(f"{kernel}: ignoring {exc}", stacklevel=3)  # at the launcher's caller
                tuned = None
    else:
        if not isinstance(config, dict):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")
        check(config, "config")
    chosen = config or tuned or {}
    cfg.update(chosen)
    if num_splits is not None:
        check({"num_splits": num_splits}, "num_splits")
        cfg["num_splits"] = num_splits
    return chosen
