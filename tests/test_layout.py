"""The package layout is the architecture: data flows one way through the layers, and importing the plugin
imports no framework.

Layers, lowest first (a module may import from its own layer and the layers below it, never above):
``device``/``options``/``ci_summary``/``graph_replay``/``meters``/``anchor``/``ratios``/``progress`` -> ``model`` ->
``observation`` -> ``paths`` -> ``numerics`` -> ``speed`` -> ``workloads`` -> ``session``/``run_report`` -> ``hooks``
-> ``testing`` -> ``plugin``/``cli``. Imports only needed for type annotations (under ``if TYPE_CHECKING:``) count
too: a reader follows them the same way (a lower layer that needs a higher one's type states what it reads of it as a
``Protocol``). No upward import remains: one would have to be listed in ``ALLOWED`` with the reason, a new one fails,
and so does an entry that is no longer needed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_lstmperf"

LAYERS = (
    ("device", "options", "ci_summary", "graph_replay", "meters", "anchor", "host_counters", "ratios", "progress"),
    ("model",),
    ("observation",),
    ("paths",),
    ("numerics",),
    ("speed",),
    ("workloads",),
    ("session", "run_report"),
    ("hooks",),
    ("testing",),
    ("plugin", "cli", "__init__"),
)

#: (importing module, imported module) -> why the lower layer reaches up; none does
ALLOWED: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    top = module.split(".")[0]
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"module {module!r} is in no layer: add its subpackage to LAYERS")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return skipped


def imported_modules(source: str, module: str, is_package: bool, annotations: bool = False) -> list[str]:
    """The package modules (dotted, relative to the package) that ``module``'s source imports at run time (and
    under ``if TYPE_CHECKING:`` too, with ``annotations``)."""
    tree = ast.parse(source)
    skipped = set() if annotations else _type_checking_nodes(tree)
    here = [] if module == "__init__" else module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
            found += [".".join(base)] if base else [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_lstmperf"):
            rest = node.module.split(".")[1:]
            found += [".".join(rest)] if rest else [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name.split(".", 1)[1] for a in node.names if a.name.startswith("pytest_lstmperf.")]
    return found


def _modules(root: Path):
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        yield path, ".".join(parts[:-1] if is_package and len(parts) > 1 else parts), is_package


def missing_imports(root: Path) -> list[str]:
    """Imports of package modules, or of names from a subpackage, that do not exist (a lazy import inside a
    function fails only when it runs: after a module moves, a stale one would pass every import-time check)."""
    missing = []
    for path, module, is_package in _modules(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                stmt = ast.ImportFrom(module=node.module, names=[alias], level=node.level)
                for target in imported_modules(ast.unparse(stmt), module, is_package, annotations=True):
                    if not _exists(root, target, alias.name):
                        missing.append(f"{module}: from {target} import {alias.name}: no such module or name")
    return missing


def _exists(root: Path, target: str, name: str) -> bool:
    if target in ("", "__init__"):
        return True
    base = root.joinpath(*target.split("."))
    if base.with_suffix(".py").is_file():
        return True
    if not (base / "__init__.py").is_file():
        return False
    # from a package: a submodule, or a name its __init__ defines or imports
    return (
        (base / name).with_suffix(".py").is_file()
        or (base / name / "__init__.py").is_file()
        or (name in (base / "__init__.py").read_text())
    )


def upward_imports(root: Path) -> dict[tuple[str, str], str]:
    """(module, imported module) -> file, for every import from a lower layer to a higher one under ``root``."""
    found = {}
    for path, module, is_package in _modules(root):
        for target in imported_modules(path.read_text(), module, is_package, annotations=True):
            if layer_of(target) > layer_of(module):
                found[(module, target)] = str(path.relative_to(root))
    return found


def test_no_module_imports_a_higher_layer() -> None:
    found = upward_imports(PACKAGE)
    new = {pair: where for pair, where in found.items() if pair not in ALLOWED}
    assert not new, "imports from a lower layer to a higher one: " + "; ".join(f"{a} -> {b}" for a, b in new)
    stale = set(ALLOWED) - set(found)
    assert not stale, f"ALLOWED lists imports that no longer exist (remove them): {sorted(stale)}"


def test_no_module_outside_testing_imports_it() -> None:
    """``testing/`` holds test helpers (planted faults): the installed code imports nothing from it, whatever the
    layer (a test hands its helper to a subprocess through an environment hook instead)."""
    found = [
        f"{module} -> {target}"
        for path, module, is_package in _modules(PACKAGE)
        if module.split(".")[0] != "testing"
        for target in imported_modules(path.read_text(), module, is_package, annotations=True)
        if target.split(".")[0] == "testing"
    ]
    assert not found, f"modules outside testing/ import it: {found}"


def test_layer_check_catches_a_planted_upward_import(tmp_path: Path) -> None:
    """The check fails on one planted upward import, relative or absolute, annotation-only ones included."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__init__.py").write_text("")
    (tmp_path / "model" / "spec.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..hooks.bench import BenchRunner\n"
        "def f():\n    from ..numerics import tolerance\n"
    )
    (tmp_path / "model" / "case.py").write_text("from pytest_lstmperf.speed.timing import paired_rounds\n")
    (tmp_path / "speed.py").write_text("from .model.spec import f\n")  # downward: fine
    assert set(upward_imports(tmp_path)) == {
        ("model.spec", "hooks.bench"),
        ("model.spec", "numerics"),
        ("model.case", "speed.timing"),
    }


def test_every_import_of_the_package_resolves(tmp_path: Path) -> None:
    assert missing_imports(PACKAGE) == []
    (tmp_path / "speed").mkdir()
    (tmp_path / "speed" / "__init__.py").write_text("")
    (tmp_path / "speed" / "timing.py").write_text("def f():\n    from .trace import profiled_events\n")
    (tmp_path / "speed" / "report.py").write_text("from . import timing, shapes\n")
    assert missing_imports(tmp_path) == [
        "speed.report: from speed import shapes: no such module or name",
        "speed.timing: from speed.trace import profiled_events: no such module or name",
    ]


def test_every_module_is_in_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))


@pytest.mark.parametrize("what", ["pytest_lstmperf.plugin", "every module"])
def test_importing_imports_no_framework(what: str) -> None:
    """The plugin (what ``pytest --help`` loads) and every module of the package import neither torch nor
    TensorFlow at import time: the frameworks are loaded inside the functions that use them."""
    if what == "every module":
        load = (
            "import importlib, pkgutil, pytest_lstmperf\n"
            "for m in pkgutil.walk_packages(pytest_lstmperf.__path__, 'pytest_lstmperf.'):\n"
            "    importlib.import_module(m.name)\n"
        )
    else:
        load = f"import {what}\n"
    check = "import sys\nheavy = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]\nprint(heavy)\n"
    result = subprocess.run(
        [sys.executable, "-c", load + check], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"importing {what} imported {result.stdout.strip()}"
