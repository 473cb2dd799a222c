"""The package's shape: the layers `ls` shows, imports that go only down, and no import hidden
inside a function except of a heavy optional module (or one the CLI defers by name, DEFERRED).

import-linter checks the layers and cycles (`lint-imports`, contracts in pyproject.toml); these
tests check what it does not: which imports may wait inside a function, which names a module
may load by name at run time, and that the old module paths still lead to the new modules.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HEAVY = tuple(PYPROJECT["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-module-level-imports"])
LAYERS = ("cli", "api", "output", "tune", "kernels", "decide", "results", "model", "util")
# light modules a CLI module may still import in a function, and why: what one branch of a
# command needs, kept off every start
DEFERRED = {
    "mlactl.cli.common": {"mlactl.output.progress": "rich.progress, for bars on a terminal's stderr only"},
    # what the names to complete are read from, when the shell asks for them (never on a start)
    "mlactl.cli.complete": {
        "mlactl.model.config": "the model presets",
        "mlactl.model.hardware": "the hardware profiles",
        "mlactl.decide.calibration.store": "the stored calibrations",
        "mlactl.decide.engines": "the engine rules",
    },
}
# modules that may import by name at run time (importlib.import_module), and why
BY_NAME = {
    "mlactl": "the front door (mlactl.analyze, ...) loads its mlactl.api module on first use",
    "mlactl.cli": "LazyGroup loads a command's module when that command runs",
    "mlactl.kernels": "the launchers load torch and triton only when first used",
    "mlactl._compat": "old module paths resolve to the new modules, with a warning",
}


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name, kernels/ as mlactl.kernels."""
    found = {}
    for path in sorted((ROOT / "mlactl").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] in ("kernels", "profiles"):  # the symlinks: found below by their real path
            continue
        found[_dotted(rel.with_suffix("").parts)] = path
    for path in sorted((ROOT / "kernels").glob("*.py")):
        found[_dotted(("mlactl", "kernels", path.stem))] = path
    return found


def _dotted(parts) -> str:
    parts = list(parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(module: str, node, is_package: bool, known) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*parts, node.module] if node.module else parts)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _top_level_imports(tree) -> list:
    nodes = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            nodes.append(stmt)
        elif isinstance(stmt, ast.Try):  # `try: import fcntl except ImportError`
            nodes += [n for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return nodes


def heavy_modules(files: dict[str, Path]) -> set[str]:
    """Our modules that import a heavy module at their top, directly or through another."""
    tops = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        tops[name] = {t for n in _top_level_imports(tree) for t in _targets(name, n, path.name == "__init__.py", files)}
    heavy: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, targets in tops.items():
            if name not in heavy and any(t.split(".")[0] in HEAVY or t in heavy for t in targets):
                heavy.add(name)
                grew = True
    return heavy


def deferred_imports(source: str, module: str, is_package: bool, known, heavy: set[str]) -> list[str]:
    """The imports inside functions of `source` that are not of a heavy module, as
    'line: statement' strings (empty when the module keeps the rule)."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = _targets(module, node, is_package, known)
                if not all(t.split(".")[0] in HEAVY or t in heavy for t in targets):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_ls_shows_the_layers():
    names = sorted(p.name for p in (ROOT / "mlactl").iterdir() if p.name != "__pycache__")
    assert names == sorted([*LAYERS, "profiles", "__init__.py", "__main__.py", "_compat.py"])
    for link in ("kernels", "profiles"):  # the repository's top level keeps the real folders
        assert (ROOT / "mlactl" / link).is_symlink() and (ROOT / "mlactl" / link).resolve() == ROOT / link


def test_the_layer_list_is_the_contract():
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")
    assert layers["layers"] == [f"mlactl.{name}" for name in LAYERS]
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["mlactl"] for c in contracts)


def test_imports_inside_functions_are_of_heavy_modules_only():
    files = module_files()
    heavy = heavy_modules(files)
    assert "mlactl.kernels.decode" in heavy  # torch and triton at its top
    # tune's inputs load torch where inputs are made, so the tuner's other modules import them at their top
    assert not heavy & {"mlactl.decide.analysis", "mlactl.cli.analyze", "mlactl.output.plot", "mlactl.tune.inputs"}
    broken = {}
    for name, path in files.items():
        allowed = heavy | set(DEFERRED.get(name, ()))
        found = deferred_imports(path.read_text(), name, path.name == "__init__.py", files, allowed)
        if found:
            broken[name] = found
    assert broken == {}, "import these at the top of the module (heavy modules: pyproject's ruff TID253 list)"


def test_the_check_sees_a_light_import_in_a_function():
    """The scan above can fail: a light module imported in a function is reported, a heavy one
    (directly, or one of ours that imports torch at its top) is not."""
    source = (
        "def f():\n    import json\n    from mlactl.model import cost\n"
        "def g():\n    import torch\n    from mlactl.kernels import decode\n"
    )
    known = {"mlactl.model.cost": None, "mlactl.kernels.decode": None}
    found = deferred_imports(source, "mlactl.x", False, known, {"mlactl.kernels.decode"})
    assert found == ["2: import json", "3: from mlactl.model import cost"]


def test_imports_by_name_only_where_listed():
    files = module_files()
    users = set()
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module"):
                users.add(name)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "__import__":
                users.add(name)
    assert users == set(BY_NAME)


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter is in the test extra")
def test_import_linter_contracts_are_kept():
    out = subprocess.run(["lint-imports"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "0 broken" in out.stdout


OLD_PATHS = {
    "mlactl.cost": "mlactl.model.cost",
    "mlactl.hardware": "mlactl.model.hardware",
    "mlactl.engines": "mlactl.decide.engines",
    "mlactl.calibration.fit": "mlactl.decide.calibration.fit",
    "mlactl.plot": "mlactl.output.plot",
    "mlactl.tune.report": "mlactl.output.tune_tables",
}


def test_old_module_paths_lead_to_the_new_modules_with_a_warning():
    code = (
        "import importlib, sys, warnings\n"
        f"pairs = {OLD_PATHS!r}\n"
        "for old, new in pairs.items():\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    assert module is importlib.import_module(new), old\n"
        "    assert module.__spec__.name == new, (old, module.__spec__.name)\n"
        "    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in seen), old\n"
        "from mlactl import analysis, model, results\n"
        "assert analysis.__name__ == 'mlactl.decide.analysis'\n"
        "assert model.MLAConfig is importlib.import_module('mlactl.model.config').MLAConfig\n"
        "assert callable(results.load) and callable(results.find_crossovers)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# what `mlactl analyze` must not load: the heavy optional modules (pyproject's list), and
# importlib.abc and importlib.resources (about 17 ms between them, pulled in by a finder built on
# importlib.abc), which the old-path finder in mlactl/_compat.py does without
NOT_AT_START = (*HEAVY, "importlib.abc", "importlib.resources")


@pytest.mark.parametrize("argv", [["analyze"], ["analyze", "--help"]], ids=["analyze", "analyze-help"])
def test_analyze_loads_no_heavy_module(argv):
    code = (
        "import contextlib, io, sys\n"
        f"sys.argv = ['mlactl', *{argv!r}]\n"
        "from mlactl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as stop:\n"
        "        assert stop.code in (0, None), stop.code\n"
        f"names = {NOT_AT_START!r}\n"
        "print([m for m in sys.modules if m in names or m.split('.')[0] in names])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_old_paths_cost_nothing_until_used():
    # importlib.abc pulls importlib.resources, tempfile and zipfile (about 17 ms) into every start,
    # and a plain np.unique numpy.ma (about 7 ms): the old-path finder and analyze need neither
    code = (
        "import sys\n"
        "sys.argv = ['mlactl', 'analyze', '--new', '1', '--prefix', '4096', '-f', 'json']\n"
        "from mlactl.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('importlib.abc', 'importlib.resources', 'numpy.ma') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
