"""Shell completion of option values (`mlactl --install-completion`): the names mlactl knows, so
`mlactl analyze --hardware b<TAB>` offers b200, b300. Model presets, hardware profiles, stored
calibrations, engine rules and policies, dtypes and formats. Each list is read when the shell
asks, never on a start of mlactl; where a value may also be a file (a config.json, a .toml
profile, a calibration file) and no name starts with what was typed, or it looks like a path,
the shell completes a file instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mlactl.util.defaults import ACT_DTYPES, KV_DTYPES, OUTPUT_FORMATS, POLICIES

try:  # typer >= 0.24 carries its own click
    from typer._click.shell_completion import CompletionItem
except ImportError:  # pragma: no cover
    from click.shell_completion import CompletionItem  # type: ignore[assignment]


def _path_like(text: str) -> bool:
    return "/" in text or text.startswith((".", "~"))


def offered(names: Iterable[str], incomplete: str, files: bool = False) -> list[CompletionItem]:
    """The names that start with `incomplete`; with `files`, a file where it looks like a path or
    no name matches (the option also takes a path)."""
    if files and _path_like(incomplete):
        return [CompletionItem(incomplete, type="file")]
    out = [CompletionItem(n) for n in names if n.startswith(incomplete)]
    return out or ([CompletionItem(incomplete, type="file")] if files else [])


def listed(names: Iterable[str], incomplete: str) -> list[CompletionItem]:
    """Completion of a comma-separated list (`--engines sglang,v<TAB>`): the last item's."""
    head, comma, last = incomplete.rpartition(",")
    taken = set(head.split(",")) if comma else set()
    return [CompletionItem(head + comma + n) for n in names if n.startswith(last) and n not in taken]


def models(ctx, param, incomplete: str) -> list[CompletionItem]:
    from mlactl.model import config

    return offered(config.preset_names(), incomplete, files=True)


def hardware(ctx, param, incomplete: str) -> list[CompletionItem]:
    from mlactl.model import hardware as profiles

    return offered(profiles.names(), incomplete, files=True)


def calibrations(ctx, param, incomplete: str) -> list[CompletionItem]:
    from mlactl.decide.calibration import store

    return offered(store.names(), incomplete, files=True)


def engines(ctx, param, incomplete: str) -> list[CompletionItem]:
    from mlactl.decide.engines import known_names

    return listed(known_names(), incomplete)


def policies(ctx, param, incomplete: str) -> list[CompletionItem]:
    from mlactl.decide.engines import known_names

    return offered(dict.fromkeys([*POLICIES, *known_names()]), incomplete)


def one_of(values: Iterable[str]) -> Callable:
    """A completion of fixed values (dtypes, formats, frameworks)."""
    names = tuple(values)

    def complete(ctx, param, incomplete: str) -> list[CompletionItem]:
        return offered(names, incomplete)

    return complete


KV_DTYPE = one_of(KV_DTYPES)
DTYPE = one_of(ACT_DTYPES)
FORMAT = one_of(OUTPUT_FORMATS)
FRAMEWORKS = one_of(("sglang", "trtllm", "vllm"))
