"""The module paths of mlactl 0.1 before its modules moved into layers, kept for one release.

`import mlactl.cost` (or `from mlactl import cost`) still works: it warns with a
DeprecationWarning naming the new path and gives the module at that path, the same object, so
monkeypatching and isinstance checks see one module. Remove in 0.3.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec  # loaded at interpreter start: costs nothing

# old module -> new module (a package's submodules follow it: mlactl.calibration.fit too)
MOVED = {
    "mlactl.errors": "mlactl.util.errors",
    "mlactl.io": "mlactl.util.io",
    "mlactl.limits": "mlactl.util.limits",
    "mlactl.schema": "mlactl.util.schema",
    "mlactl.dirs": "mlactl.util.dirs",
    "mlactl.defaults": "mlactl.util.defaults",
    "mlactl.suggest": "mlactl.util.suggest",
    "mlactl.hardware": "mlactl.model.hardware",
    "mlactl.shapes": "mlactl.model.shapes",
    "mlactl.cost": "mlactl.model.cost",
    "mlactl.roofline": "mlactl.model.roofline",
    "mlactl.measured": "mlactl.results.measured",
    "mlactl.engines": "mlactl.decide.engines",
    "mlactl.policy": "mlactl.decide.policy",
    "mlactl.workload": "mlactl.decide.workload",
    "mlactl.analysis": "mlactl.decide.analysis",
    "mlactl.requests": "mlactl.decide.requests",
    "mlactl.calibration": "mlactl.decide.calibration",
    "mlactl.render": "mlactl.output.render",
    "mlactl.report": "mlactl.output.report",
    "mlactl.csvout": "mlactl.output.csvout",
    "mlactl.chartdata": "mlactl.output.chartdata",
    "mlactl.narrow": "mlactl.output.tables",
    "mlactl.tablefit": "mlactl.output.tables",
    "mlactl.plot": "mlactl.output.plot",
    "mlactl.tune.report": "mlactl.output.tune_tables",
}


_OLDEST_FIRST = sorted(MOVED, key=len, reverse=True)  # the longest old path that matches wins


def new_path(name: str) -> str | None:
    """The module that `name` (an old path) is now, or None if it did not move."""
    for old in _OLDEST_FIRST:
        if name == old or name.startswith(old + "."):
            return MOVED[old] + name[len(old) :]
    return None


class _Moved:
    """A meta-path finder and loader for the old paths. Duck-typed, not built on importlib.abc:
    that module pulls importlib.resources (about 17 ms) into every start of mlactl, while this
    costs one string test per import until an old path is used."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith("mlactl.") or fullname.startswith(("mlactl.util.", "mlactl.model.")):
            return None
        new = new_path(fullname)
        if new is None:
            return None
        return ModuleSpec(fullname, _Moved, origin=new)

    @staticmethod
    def create_module(spec):
        new = spec.origin
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in mlactl 0.3", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)  # the module itself: one object under both names
        spec.loader_state = module.__spec__
        return module

    @staticmethod
    def exec_module(module):
        # already executed under its new name; the import system has just set its __spec__ to
        # the alias's: give it back its own
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    if _Moved not in sys.meta_path:
        sys.meta_path.insert(0, _Moved)  # before PathFinder, which would load a second copy
