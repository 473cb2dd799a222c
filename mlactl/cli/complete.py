"""Shell completion of option values (`mlactl --install-completion`): the names mlactl knows, so
`mlactl analyze --hardware b<TAB>` offers b200, b300. Model presets, hardware profiles, stored
calibrations, engine rules and policies, dtypes and formats. Each list is read when the shell
asks, never on a start of mlactl. Where no name starts with what was typed (a path to a
config.json, a .toml profile, a calibration file), nothing is offered and the shell completes a
file name instead (typer's bash script installs with `complete -o default`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mlactl.util.defaults import ACT_DTYPES, KV_DTYPES, OUTPUT_FORMATS, POLICIES


def offered(names: Iterable[str], incomplete: str) -> list[str]:
    """The names that start with `incomplete`."""
    return [n for n in names if n.startswith(incomplete)]


def listed(names: Iterable[str], incomplete: str) -> list[str]:
    """Completion of a comma-separated list (`--engines sglang,v<TAB>`): the last item's, each
    name once."""
    head, comma, last = incomplete.rpartition(",")
    taken = set(head.split(",")) if comma else set()
    return [head + comma + n for n in names if n.startswith(last) and n not in taken]


def models(incomplete: str) -> list[str]:
    from mlactl.model import config

    return offered(config.preset_names(), incomplete)


def hardware(incomplete: str) -> list[str]:
    from mlactl.model import hardware as profiles

    return offered(profiles.names(), incomplete)


def calibrations(incomplete: str) -> list[str]:
    from mlactl.decide.calibration import store

    return offered(store.names(), incomplete)


def engines(incomplete: str) -> list[str]:
    from mlactl.decide.engines import known_names

    return listed(known_names(), incomplete)


def policies(incomplete: str) -> list[str]:
    from mlactl.decide.engines import known_names

    return offered(dict.fromkeys([*POLICIES, *known_names()]), incomplete)


def one_of(values: Iterable[str]) -> Callable[[str], list[str]]:
    """A completion of fixed values (dtypes, formats, frameworks)."""
    names = tuple(values)

    def complete(incomplete: str) -> list[str]:
        return offered(names, incomplete)

    return complete


KV_DTYPE = one_of(KV_DTYPES)
DTYPE = one_of(ACT_DTYPES)
KV_AUTO = one_of(("auto", *KV_DTYPES))  # tune's: `auto` follows --dtype
AUTO = one_of(("auto", *ACT_DTYPES))
FORMAT = one_of(OUTPUT_FORMATS)
FRAMEWORKS = one_of(("sglang", "trtllm", "vllm"))
