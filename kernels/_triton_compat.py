"""What the kernels need from Triton that older releases lack, in one place.

Triton's CPU interpreter (TRITON_INTERPRET=1) holds every scalar as a numpy array of shape [1],
and a loop ``for n0 in range(start, end, BLOCK_N)`` over run-time bounds turns each bound into a
Python int through ``tensor.__index__``. Triton 3.6 writes that as ``int(handle.data)``, which
numpy 2.4 and later refuse for a 1-D array ("only 0-dimensional arrays can be converted to
Python scalars"; numpy 2.3 warns that it will); Triton 3.9 squeezes the array first (triton/runtime/interpreter.py,
``_patch_lang_tensor``). Every decode kernel loops over run-time key ranges, so under Triton 3.6
with a current numpy no kernel ran in the interpreter. `patch_interpreter_index` gives the older
interpreter the newer rule. It changes nothing on a GPU (the interpreter is not used there) and
nothing where the interpreter already accepts a [1] array.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np

_MARK = "_mlactl_index_compat"


def _index_of(self) -> int:
    return int(np.asarray(self.handle.data).reshape(-1)[0])


def _needs_patch(original) -> bool:
    """True when this interpreter's `__index__` rejects a [1]-shaped scalar (tried on a stand-in)."""

    class Handle:
        data = np.ones(1, dtype=np.int32)

    class Stand:
        handle = Handle()

    class Scope:
        def set_attr(self, obj, name, value):
            setattr(obj, name, value)

    try:  # the rule under test gives Stand its __index__
        original(Stand, Scope())
        with warnings.catch_warnings():  # numpy 2.3 still converts, with a DeprecationWarning per bound
            warnings.simplefilter("error", DeprecationWarning)
            operator.index(Stand())  # type: ignore[arg-type]
    except (TypeError, DeprecationWarning):
        return True
    except Exception:  # noqa: BLE001 - an interpreter we do not know: leave it alone
        return False
    return False


def patch_interpreter_index() -> bool:
    """Make the interpreter's scalar-to-int rule accept numpy's [1] arrays; True if it patched."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # no interpreter in this Triton build: nothing to do
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, _MARK, False) or not _needs_patch(original):
        return False

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index_of)

    setattr(patched, _MARK, True)
    interpreter._patch_lang_tensor = patched
    return True
