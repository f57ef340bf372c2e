"""Layering rules of the `icefall` package, checked on its source (an import-linter contract, by AST).

Proves:
- runtime code (everything but `icefall.devstack` and `icefall.testing`, the development tooling that
  the wheel leaves out) never imports the development tooling, at module level or inside a function;
- the wheel configuration leaves both out of the distribution;
- one catalog mapping: no module but `icefall.catalog.config` builds a pyiceberg catalog client
  (`load_catalog`, `SqlCatalog`, `RestCatalog`) or writes `spark.sql.catalog.*` settings.
Not proved here: what the built wheel holds (tests/integration/test_installed.py builds and installs it).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "src" / "icefall"
DEV_PACKAGES = ("icefall.devstack", "icefall.testing")
CATALOG_MAPPING = "icefall.catalog.config"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not any(name == dev or name.startswith(dev + ".") for dev in DEV_PACKAGES):
            yield name, ast.parse(path.read_text(), filename=str(path))


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
        if name == CATALOG_MAPPING:
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
