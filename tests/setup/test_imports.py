"""Shared test code lives in helper modules: no module imports a conftest (pytest loads those itself) or a test
module, the test cluster is the testcluster package, never tests.upstream or tests.operator.server, and nothing
outside tests/ (testcluster, bench, scripts) imports tests.*."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, and for `from package import name` also `package.name` (which may be a module:
    `from tests.api import test_cel_rules` imported a test module past a check of `from` modules alone)."""
    tree = ast.parse(path.read_text())
    found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def python_files() -> list[Path]:
    return [p for top in ("tests", "bench", "scripts", "testcluster") for p in (REPO / top).rglob("*.py")]


def test_no_module_imports_a_conftest() -> None:
    importing = {
        str(p.relative_to(REPO)) for p in python_files() if any(m.endswith("conftest") for m in imported_modules(p))
    }
    assert importing == set()


def test_the_test_cluster_is_imported_from_its_package() -> None:
    old = ("tests.upstream.controlplane", "tests.upstream.cluster", "tests.upstream.kubelet", "tests.operator.server")
    importing = {str(p.relative_to(REPO)) for p in python_files() if set(old) & imported_modules(p)}
    assert importing == set()


def test_nothing_outside_tests_imports_tests() -> None:
    """The test cluster, the benchmarks and the scripts import what they share with the tests from testcluster:
    a benchmark resting on a test helper broke when the tests were reorganised."""
    outside = [p for p in python_files() if p.relative_to(REPO).parts[0] != "tests"]
    assert {"bench", "testcluster", "scripts"} <= {p.relative_to(REPO).parts[0] for p in outside}
    importing = {
        str(p.relative_to(REPO))
        for p in outside
        if any(m == "tests" or m.startswith("tests.") for m in imported_modules(p))
    }
    assert importing == set()


def test_no_module_imports_a_test_module() -> None:
    def is_test_module(name: str) -> bool:
        return name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")

    importing = {str(p.relative_to(REPO)) for p in python_files() if any(map(is_test_module, imported_modules(p)))}
    assert importing == set()
