"""One ``ancestors()`` for the whole registry (review: four helpers with different orders).

The backends call :func:`shardkeeper.registry.base.ancestors` and reverse it, or add the
root, where they need to; none keeps a helper of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import shardkeeper.registry
from shardkeeper.registry.base import ancestors

REGISTRY = Path(shardkeeper.registry.__file__).parent


def test_ancestors_are_nearest_first_without_the_root() -> None:
    """The one definition: nearest first, the root left out."""
    assert ancestors("/a/b/c") == ["/a/b", "/a"]
    assert ancestors("/a") == []
    assert ancestors("/") == []


def test_no_backend_defines_an_ancestors_helper_of_its_own() -> None:
    """Only base.py defines a function named ``*ancestors``, other than helpers that
    read the store (ZooKeeper's ``_missing_ancestors`` asks which ones exist)."""
    found = []
    for path in sorted(REGISTRY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.strip("_").endswith("ancestors")
                and "missing" not in node.name
            ):
                found.append(f"{path.relative_to(REGISTRY)}:{node.lineno} {node.name}")
    assert found == ["base.py:" + str(_line_of_base_ancestors()) + " ancestors"], found


def _line_of_base_ancestors() -> int:
    tree = ast.parse((REGISTRY / "base.py").read_text())
    return next(
        n.lineno for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "ancestors"
    )
