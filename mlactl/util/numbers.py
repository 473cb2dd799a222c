"""One bounded parser for every number that enters mlactl: an option's value, a CSV cell, an
environment variable, a number read from a JSON or TOML file.

Text is read as ASCII digits only: `str.isdigit`, `int()` and `float()` all accept '٣' or '²'
(and `float()` 'inf', 'nan' and '1e999'), which would enter as a number nobody typed. Every value
has a range; what falls outside it (a negative count, 1e308 seconds, an efficiency of 1e-300) is
one MlactlError line naming the value, its range and where it came from, before any arithmetic
can overflow or divide by it.

    integer("4K", "--chunk", 1)                  -> 4096
    real("2.5e-6", "line 3: time_s", 0, 1e3)     -> 2.5e-06
    check_real(x, "fits[0].params.eta_c", 0, 1.2, above=True)   # a JSON value already parsed
"""

from __future__ import annotations

import math
import re

from mlactl.util.errors import MlactlError

# Largest size (batch, new, prefix, context, count): shapes are int64 arrays and the analysis
# keys a (batch, prefix) pair as batch * (max prefix + 1) + prefix: with both below 2^31 that
# stays below 2^62. 2^31 tokens is 200x the longest context any MLA model serves (10M).
MAX_SIZE = 2**31 - 1

SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
INT = re.compile(r"^\s*([+-]?[0-9]+)\s*([kKmM]?)\s*$", re.ASCII)
FLOAT = re.compile(r"^\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$", re.ASCII)


def must_be(minimum: int) -> str:
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def integer(
    text: str, what: str, minimum: int = 0, maximum: int = MAX_SIZE, item: str | None = None, negative: str = ""
) -> int:
    """ASCII digits with an optional K (1024) or M (1024^2), from `minimum` to `maximum`.
    `item` is the text to quote in a message when `text` is part of a longer value; `negative`
    what a negative value is told it must be (default: what `minimum` asks)."""
    item = _short(text if item is None else item)
    match = INT.match(text)
    if not match:
        raise MlactlError(f"{what}: {item!r} is not a whole number (use digits, optionally K or M)")
    digits = match.group(1).lstrip("+-").lstrip("0")
    if len(digits) > 19:  # do not even build a 10**4300-digit int
        value = maximum + 1
    else:
        value = int(match.group(1)) * SUFFIX[match.group(2).lower()]
    if value > maximum:
        limit = f"{maximum:,} (2^31 - 1)" if maximum == MAX_SIZE else f"{maximum:,}"
        raise MlactlError(f"{what}: {item.strip()!r} is above the limit of {limit}")
    if value < minimum or value < 0:
        wanted = negative if value < 0 and negative else must_be(max(minimum, 0))
        raise MlactlError(f"{what}: {item.strip()} must be {wanted}")
    return value


def _short(text: str, limit: int = 40) -> str:
    """A value as quoted in a message: a 10,000-digit one would hide the sentence around it."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _range(minimum: float, maximum: float, above: bool) -> str:
    return f"{'above' if above else 'from'} {minimum:g} {'and at most' if above else 'to'} {maximum:g}"


def check_real(value, what: str, minimum: float, maximum: float, above: bool = False) -> float:
    """A number already parsed (JSON, TOML): an int or float, not a bool, finite, from
    `minimum` (excluded with `above`) to `maximum`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)
        except OverflowError:  # an int past float's range
            ok = False
        else:
            ok = math.isfinite(number) and (number > minimum if above else number >= minimum) and number <= maximum
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise MlactlError(f"{what} must be a number {_range(minimum, maximum, above)}, got {shown}")
    return number


def check_integer(value, what: str, minimum: int = 0, maximum: int = MAX_SIZE) -> int:
    """A whole number already parsed (JSON, TOML): an int, not a bool, within the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise MlactlError(f"{what} must be a whole number from {minimum:,} to {maximum:,}, got {shown}")
    return value


def real(text: str, what: str, minimum: float, maximum: float, above: bool = False) -> float:
    """ASCII decimal text (`1.5`, `2e-6`, `.5`) from `minimum` (excluded with `above`) to
    `maximum`; never 'inf', 'nan' or digits of another script."""
    if not isinstance(text, str) or not FLOAT.match(text):
        shown = repr(text) if len(repr(text)) <= 40 else repr(text)[:37] + "..."
        raise MlactlError(f"{what}: {shown} is not a number (ASCII digits, e.g. 1.5 or 2e-6)")
    return check_real(float(text), what, minimum, maximum, above)
