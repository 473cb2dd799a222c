"""A small checker for JSON read from files: each check returns None or what was expected.

Schemas are written with these pieces where the file format is defined (the results schema is
in mlactl/results/store.py), so every reader checks the same thing and no reader meets a string where
it wanted a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Check = Callable[[object], "str | None"]


class Invalid(Exception):
    """`where` (a JSON path like paths[3].median_s) is not `expected`."""

    def __init__(self, where: str, expected: str, value):
        text = repr(value)
        super().__init__(f"{where} must be {expected}, got {text if len(text) <= 40 else text[:37] + '...'}")


def string(value) -> str | None:
    return None if isinstance(value, str) else "a string"


def boolean(value) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def integer(minimum: int = 0, maximum: int = 2**63 - 1) -> Check:
    def check(value):
        ok = isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum
        return None if ok else f"an integer >= {minimum}"

    return check


def number(minimum: float = 0.0, positive: bool = False, maximum: float = math.inf) -> Check:
    """A finite JSON number (int or float, not a bool), >= minimum (> minimum with `positive`,
    whose default minimum is 0), and <= maximum."""

    def check(value):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            ok = ok and math.isfinite(value) and (value > minimum if positive else value >= minimum)
        except OverflowError:  # an int past float's range
            ok = False
        ok = ok and value <= maximum
        if ok:
            return None
        low = ("a positive finite number" if minimum == 0 else f"a number above {minimum:g}") if positive else None
        low = low or f"a finite number >= {minimum:g}"
        return low if maximum == math.inf else f"{low} and <= {maximum:g}"

    return check


def one_of(*choices: str) -> Check:
    def check(value):
        return None if value in choices else f"one of {', '.join(choices)}"

    return check


class nullable:  # noqa: N801 - reads as a check, like the functions above
    """`inner`, or null."""

    def __init__(self, inner):
        self.inner = inner


def anything(value) -> None:
    return None


def _walk(check, value, where: str) -> None:
    if isinstance(check, nullable):
        if value is not None:
            _walk(check.inner, value, where)
    elif isinstance(check, Obj):
        check.validate(value, where)
    elif isinstance(check, ListOf):
        if not isinstance(value, list):
            raise Invalid(where, "a list", value)
        for i, item in enumerate(value):
            _walk(check.item, item, f"{where}[{i}]")
    elif isinstance(check, MapOf):
        if not isinstance(value, dict):
            raise Invalid(where, "an object", value)
        for key, item in value.items():
            _walk(check.item, item, f"{where}.{key}")
    else:
        expected = check(value)
        if expected is not None:
            raise Invalid(where, expected, value)


class ListOf:
    def __init__(self, item):
        self.item = item


class MapOf:
    """An object whose keys are free and whose values all pass `item`."""

    def __init__(self, item):
        self.item = item


class Obj:
    """An object with `required` and `optional` fields; other fields are allowed (a newer mlactl
    may add them: a reader ignores what it does not know). `rule` checks across fields."""

    def __init__(self, required: dict | None = None, optional: dict | None = None, rule=None):
        self.required, self.optional, self.rule = required or {}, optional or {}, rule

    def validate(self, value, where: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(where, "an object", value)
        for key, check in self.required.items():
            if key not in value:
                raise Invalid(f"{where}.{key}".lstrip("."), "present", "nothing")
            _walk(check, value[key], f"{where}.{key}".lstrip("."))
        for key, check in self.optional.items():
            if key in value:
                _walk(check, value[key], f"{where}.{key}".lstrip("."))
        if self.rule is not None:
            self.rule(value, where)


def validate(check, value, where: str = "") -> None:
    """Raise Invalid naming the first place `value` breaks `check`."""
    _walk(check, value, where)
