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
# The forms users write: `4096`, `8K`, `32k`, `1M`, `1e3`, `1.5K`, `1_000` (Python's digit
# grouping: one underscore between two digits). A value must come out whole (`1.5` is refused as
# a size, `1.5K` is 1536); ASCII digits only.
_DIGITS = r"[0-9](?:_?[0-9])*"
INT = re.compile(rf"^\s*([+-]?)({_DIGITS})(?:\.({_DIGITS})?)?(?:[eE]([+-]?[0-9]{{1,9}}))?\s*([kKmM]?)\s*$", re.ASCII)
FLOAT = re.compile(r"^\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$", re.ASCII)
# the same with digit grouping (`1_000.5`), for `real`
_REAL = re.compile(
    rf"^\s*[+-]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?[0-9]{{1,9}})?\s*([kKmM]?)\s*$", re.ASCII
)
MAX_TEXT = 64
_HEX = re.compile(r"^\s*[+-]?0[xXoObB]", re.ASCII)


def why_not_number(text: str) -> str:
    """Why `text` is not a number mlactl reads, in words: another script's digits, hex, or
    just not digits."""
    if any(ch.isdigit() or ch.isnumeric() for ch in text if not ch.isascii()):
        return "it has a digit of another script; write ASCII digits 0-9"
    if _HEX.match(text):
        return "hexadecimal, octal and binary are not read; write decimal digits"
    if text.strip().lower().lstrip("+-") in ("inf", "infinity", "nan"):
        return "it is not a finite number"
    return ""


def must_be(minimum: int) -> str:
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def integer(
    text: str, what: str, minimum: int = 0, maximum: int = MAX_SIZE, item: str | None = None, negative: str = ""
) -> int:
    """ASCII digits with an optional K (1024) or M (1024^2), from `minimum` to `maximum`.
    `item` is the text to quote in a message when `text` is part of a longer value; `negative`
    what a negative value is told it must be (default: what `minimum` asks)."""
    item = _short(text if item is None else item)
    match = INT.match(text) if isinstance(text, str) else None
    if not match:
        why = why_not_number(text) if isinstance(text, str) else ""
        raise MlactlError(
            f"{what}: {item!r} is not a whole number ({why or 'use digits, e.g. 4096, 8K, 1e3 or 1_000'})"
        )
    value = whole(match, maximum)
    if value is None:
        raise MlactlError(f"{what}: {item.strip()!r} is not a whole number")
    if value > maximum:
        limit = f"{maximum:,} (2^31 - 1)" if maximum == MAX_SIZE else f"{maximum:,}"
        raise MlactlError(f"{what}: {item.strip()!r} is above the limit of {limit}")
    if value < minimum or value < 0:
        wanted = negative if value < 0 and negative else must_be(max(minimum, 0))
        raise MlactlError(f"{what}: {item.strip()} must be {wanted}")
    return value


def whole(match: re.Match, maximum: int = MAX_SIZE) -> int | None:
    """The exact value of a matched INT (sign, digits, fraction, exponent, suffix), None when it
    is not whole; past `maximum` (however far: `1e999999`) it is `maximum + 1`, never a huge int."""
    sign, digits, fraction, exponent, suffix = match.groups()
    digits, fraction = digits.replace("_", ""), (fraction or "").replace("_", "")
    body = (digits + fraction).lstrip("0")
    if not body:
        return 0
    exp = int(exponent or 0) - len(fraction)
    mantissa = body.rstrip("0")  # trailing zeros into the exponent: 1000e-3 is 1
    exp += len(body) - len(mantissa)
    magnitude = len(mantissa) + exp  # digits before the point
    if magnitude > 25:  # do not even build a 10**4300-digit int
        return maximum + 1 if sign != "-" else -(maximum + 1)
    if magnitude < -8 or len(mantissa) > MAX_TEXT:  # below 1 even times 1M (no 10**-1e9 built), or
        return None  # 65 significant digits of a size below 2^31: int() of 5,000 digits would raise
    scale = SUFFIX[suffix.lower()]
    if exp >= 0:
        value = int(mantissa) * 10**exp * scale
    else:
        value, rest = divmod(int(mantissa) * scale, 10**-exp)
        if rest:
            return None
    return -value if sign == "-" else value


def _short(text: str, limit: int = 40) -> str:
    """A value as quoted in a message: a 10,000-digit one would hide the sentence around it."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_text(value, limit: int = 40) -> str:
    """A value quoted in a message: its repr (escapes, no control character), at most `limit`."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


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


def real(text: str, what: str, minimum: float, maximum: float, above: bool = False) -> float:
    """ASCII decimal text (`1.5`, `2e-6`, `.5`) from `minimum` (excluded with `above`) to
    `maximum`; never 'inf', 'nan' or digits of another script."""
    match = _REAL.match(text) if isinstance(text, str) and len(text) <= 4 * MAX_TEXT else None
    if match is None:
        shown = shown_text(text)
        why = why_not_number(text) if isinstance(text, str) else ""
        raise MlactlError(f"{what}: {shown} is not a number ({why or 'ASCII digits, e.g. 1.5, 2e-6 or 1_000'})")
    suffix = match.group(1)
    body = text.strip()[: len(text.strip()) - len(suffix)].replace("_", "")
    value = float(body) * SUFFIX[suffix.lower()]  # 1e400 is inf here: refused with the range
    if not math.isfinite(value):
        raise MlactlError(f"{what}: {shown_text(text)} is out of range: it must be {_range(minimum, maximum, above)}")
    return check_real(value, what, minimum, maximum, above)
