"""Small array helpers the hot paths share."""

from __future__ import annotations

import numpy as np


def unique(values) -> np.ndarray:
    """The sorted distinct values of a 1-D array, as np.unique gives them. np.unique without
    return_index/inverse/counts asks numpy.ma whether the array is masked, which imports
    numpy.ma (about 7 ms) into every start of a command that calls it."""
    a = np.sort(np.asarray(values).reshape(-1))
    if a.size == 0:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    if a.dtype.kind == "f":  # NaN != NaN: keep one NaN, as np.unique does (equal_nan)
        nan = np.isnan(a)
        keep &= ~nan | np.concatenate(([True], ~nan[:-1]))
    return a[keep]
