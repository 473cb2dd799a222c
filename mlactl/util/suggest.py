"""'Did you mean ...?' for a mistyped name: the known names it begins, else the closest ones."""

from __future__ import annotations

import difflib


def did_you_mean(typed: str, known) -> str:
    """' (did you mean h100-sxm?)' for 'h100', or '' when nothing is close."""
    names = sorted(known)
    typed = typed.strip().lower()
    found = [n for n in names if n.startswith(typed)] if typed else []
    if not found:
        found = difflib.get_close_matches(typed, names, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(found)}?)" if found else ""
