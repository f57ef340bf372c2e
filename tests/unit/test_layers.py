"""Layering rules of the `icefall` package, checked on its source (an import-linter contract, by AST).

Proves:
- runtime code (everything but `icefall.devstack` and `icefall.testing`, the development tooling that
  the wheel leaves out) never imports the development tooling, at module level or inside a function;
- the wheel configuration leaves both out of the distribution;
- one catalog mapping: no module but `icefall.catalog.config` builds a pyiceberg catalog client
  (`load_catalog`, `SqlCatalog`, `RestCatalog`) or writes `spark.sql.catalog.*` settings (the clients it
  builds are `icefall.catalog.confined`'s subclasses, the one other module that names them);
- the package root holds the entry points only (`icefall.cli`), every other module lives in a package;
- no import cycles between the package's modules (`decode.avro` and `decode.decode` once imported each
  other), counting every import: at module level, inside functions and under `TYPE_CHECKING`;
- the package order of `PACKAGES_BELOW`: decoding (`icefall.decode`) imports nothing of the batch engine
  (`icefall.ingest`) nor of anything above it, counting the same imports.
Not proved here: what the built wheel holds (tests/integration/test_installed.py builds and installs it).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "src" / "icefall"
DEV_PACKAGES = ("icefall.devstack", "icefall.testing")
CATALOG_MAPPING = "icefall.catalog.config"
CATALOG_CLIENTS = "icefall.catalog.confined"  # pyiceberg's clients, confined to Icefall's code
#: The only Icefall packages each of these packages may import (a package order, not yet of every package).
PACKAGES_BELOW = {
    "icefall.decode": {"icefall.api", "icefall.plan", "icefall.runtime", "icefall.catalog", "icefall.kafka"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield module_name(path), ast.parse(path.read_text(), filename=str(path))


def runtime_modules() -> Iterator[tuple[str, ast.Module]]:
    for name, tree in all_modules():
        if not any(name == dev or name.startswith(dev + ".") for dev in DEV_PACKAGES):
            yield name, tree


def imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every module an import statement names (`from a import b` counts as `a` and `a.b`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def test_runtime_code_never_imports_development_tooling() -> None:
    found = [
        f"{name}:{line} imports {target}"
        for name, tree in runtime_modules()
        for line, target in imported(tree)
        if any(target == dev or target.startswith(dev + ".") for dev in DEV_PACKAGES)
    ]
    assert list(runtime_modules()), "no runtime modules found"
    assert not found, "runtime code imports development tooling:\n" + "\n".join(found)


def test_the_wheel_leaves_development_tooling_out() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    excluded = set(setuptools["packages"]["find"]["exclude"])
    for dev in DEV_PACKAGES:
        assert {dev, f"{dev}.*"} <= excluded, dev
    data = [pattern for patterns in setuptools.get("package-data", {}).values() for pattern in patterns]
    assert not [p for p in data if p.startswith(("devstack", "testing"))], data


def test_one_catalog_mapping() -> None:
    clients = {"load_catalog", "SqlCatalog", "RestCatalog"}
    found = []
    for name, tree in runtime_modules():
        if name in (CATALOG_MAPPING, CATALOG_CLIENTS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name | ast.Attribute) and (
                getattr(node, "id", None) in clients or getattr(node, "attr", None) in clients
            ):
                found.append(f"{name}:{node.lineno} uses {getattr(node, 'id', None) or node.attr}")
            elif isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & clients:
                found.append(f"{name}:{node.lineno} imports a catalog client")
            elif isinstance(node, ast.Constant) and "spark.sql.catalog." in str(node.value):
                found.append(f"{name}:{node.lineno} writes {node.value!r}")
    assert not found, f"catalog clients or Spark catalog conf outside {CATALOG_MAPPING}:\n" + "\n".join(found)


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles_between_modules() -> None:
    trees = dict(all_modules())
    graph = {
        name: {target for _, target in imported(tree) if target in trees and target != name}
        for name, tree in trees.items()
    }
    # decode imports avro only inside a function and under TYPE_CHECKING: those count too.
    assert "icefall.decode.avro" in graph["icefall.decode.decode"], "the import graph misses lazy imports"
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_packages_import_only_the_packages_below_them() -> None:
    trees = dict(all_modules())
    found = [
        f"{name}:{line} imports {target}"
        for name, tree in trees.items()
        if package_of(name) in PACKAGES_BELOW
        for line, target in imported(tree)
        if target in trees
        and package_of(target) != package_of(name)
        and package_of(target) not in PACKAGES_BELOW[package_of(name)]
    ]
    assert set(PACKAGES_BELOW) <= {package_of(name) for name in trees}, "a package of PACKAGES_BELOW is gone"
    assert not found, "imports against the package order:\n" + "\n".join(found)


def test_the_package_root_holds_entry_points_only() -> None:
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "cli.py"], (
        "modules at the package root, not in a package: "
        + ", ".join(name for name in modules if name not in {"__init__.py", "cli.py"})
    )
