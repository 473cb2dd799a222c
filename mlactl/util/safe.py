"""A name from a file made safe for where it goes: one function per sink.

Names that users' files give (a config.json's `_name_or_path`, a profile's `display`, a results
file's device name, a calibration's name and source) and paths they type travel into four sinks,
each with its own way of reading characters as commands:

    sink                          function    what it neutralises
    terminal, piped text, -o .txt `text`      control characters: ANSI escapes, C0/C1, DEL,
                                              bidirectional overrides, line separators, lone
                                              surrogates (which UTF-8 cannot even encode)
    rich markup (tables, lines)   `markup`    `[bold]`, `[link=...]`, a stray `[/]`
    matplotlib text               `mathtext`  `$...$` (mathtext), and control characters
    a file or folder name         `filename`  `/`, `..`, a leading `.` or `-`, more than 255 bytes

Each is applied where a name enters its sink: readers clean a name with `text` when they load it
(so what the library hands on is printable), and the code that builds rich markup or a chart
label wraps each name in `markup` or `mathtext`. `tests/test_fuzz.py` pushes arbitrary strings
through every function and through every command that prints a name.
"""

from __future__ import annotations

import re
import unicodedata

# Names are labels: a longer one is cut (with an ellipsis) so a 1 MB name cannot fill a screen.
MAX_NAME = 200
# The bytes a file name may have on every file system mlactl writes to (ext4, xfs, btrfs, tmpfs,
# APFS: NAME_MAX 255).
NAME_MAX = 255

# Categories shown escaped: control (Cc), format (Cf: bidi overrides, zero-width joiners, the BOM),
# surrogate (Cs), private use (Co), unassigned (Cn), line and paragraph separators (Zl, Zp).
_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def _visible(ch: str) -> str:
    if unicodedata.category(ch) not in _HIDDEN:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def text(value, limit: int = MAX_NAME) -> str:
    """`value` as printable text: every control, format or separator character written as its
    escape (`\\x1b`, `\\u202e`), and at most `limit` characters (the rest cut with '…')."""
    s = str(value)
    if len(s) > 4 * limit:  # do not even look at a megabyte of name
        s = s[: 4 * limit]
    if not s.isprintable() or any(unicodedata.category(c) in _HIDDEN for c in s):
        s = "".join(_visible(c) for c in s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


# What rich reads as a tag (rich/markup.py RE_TAGS: '[' then a-z, '#', '/' or '@'), with the
# backslashes before it; rich itself is not imported here, so the model layer stays light.
_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def markup(value, limit: int = MAX_NAME) -> str:
    """`value` for a string rich reads as markup: printable (`text`), every tag escaped, so
    `[/]` prints as `[/]` instead of raising and `[link=...]` is not a link. (Emoji codes such as
    `:fire:` have no escape in rich: mlactl's consoles are made with `emoji=False`.) A trailing
    run of backslashes is doubled, so that it cannot escape the markup that follows the name
    (rich halves a run of backslashes before a tag)."""
    escaped = _TAG.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", text(value, limit))
    trailing = len(escaped) - len(escaped.rstrip("\\"))
    return escaped + "\\" * trailing


def mathtext(value, limit: int = MAX_NAME) -> str:
    """`value` for a matplotlib text: printable (`text`), and each `$` escaped, so an even
    number of them does not switch to mathtext (which fails on most names)."""
    return text(value, limit).replace("$", r"\$")


_UNSAFE_FILE = re.compile(r"[^A-Za-z0-9.=\-_]+")


def filename(value, limit: int = 120) -> str:
    """`value` as one safe file or folder name: letters, digits, '.', '-', '_' and '=' kept, any
    other run of characters (a '/' above all) becomes '_'; no leading '.' or '-' (so '..' stays
    inside its folder and '-rf' is not read as an option); at most `limit` bytes (ASCII: one
    byte a character), never empty."""
    safe = _UNSAFE_FILE.sub("_", str(value).strip()).lstrip(".-_").rstrip("._") or "unnamed"
    return safe[: min(limit, NAME_MAX)].rstrip("._") or "unnamed"


def fit_name(name: str, tail: str = "", head: str = "", limit: int = NAME_MAX) -> str:
    """`head + name + tail` cut in `name` (on a character boundary) so the whole fits `limit`
    bytes of UTF-8: how a temporary, lock or backup name beside a 255-byte file still fits."""
    room = limit - len(head.encode()) - len(tail.encode())
    raw = name.encode()
    if len(raw) > room:
        name = raw[: max(room, 0)].decode("utf-8", "ignore")
    return f"{head}{name}{tail}"


def excerpts(message: str, longest: int = 300, shown: int = 120) -> str:
    """A message with every run of more than `longest` non-space characters (a rejected value
    quoted whole: a 100 KB name) cut to its first `shown` and its length, so that the sentence
    around it, which says why, stays on the line: `'aaaa…(100,000 characters)' is not ...`. (A
    path or a name, at most 255 bytes a component, is shown whole.)"""

    def cut(match: re.Match) -> str:
        return f"{match.group(0)[:shown]}…({len(match.group(0)):,} characters)"

    return re.sub(rf"\S{{{longest + 1},}}", cut, str(message))
