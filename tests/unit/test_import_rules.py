"""The layering the architecture doc states, checked on the source (imports drawn
from each module's AST, including imports inside functions and TYPE_CHECKING blocks):

* registry/ imports nothing of shardkeeper above it (only errors, the import helper
  and itself);
* coordination/ never imports APScheduler, the scheduler, the runtime or the CLI;
* scheduling/ never imports the registry, coordination or the runtime;
* config.py does not import the scheduler (only the pure triggers module).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "shardkeeper"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _modules(package: str) -> list[Path]:
    root = SRC / package
    return sorted(root.rglob("*.py")) if root.is_dir() else [SRC / f"{package}.py"]


def _violations(package: str, allowed: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    bad = []
    for path in _modules(package):
        for name in sorted(_imports(path)):
            inside = name == "shardkeeper" or name.startswith("shardkeeper.")
            if inside and not name.startswith(allowed):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
            if name.startswith(banned):
                bad.append(f"{path.relative_to(SRC)} imports {name}")
    return bad


@pytest.mark.parametrize(
    ("package", "allowed", "banned"),
    [
        (
            "registry",
            ("shardkeeper.registry", "shardkeeper.errors", "shardkeeper._imports"),
            (),
        ),
        (
            "coordination",
            (
                "shardkeeper.coordination",
                "shardkeeper.registry",
                "shardkeeper.errors",
                "shardkeeper._imports",
                "shardkeeper.config",
            ),
            ("apscheduler",),
        ),
        (
            "scheduling",
            ("shardkeeper.scheduling", "shardkeeper.errors", "shardkeeper.config"),
            (),
        ),
        (
            "config",
            (
                "shardkeeper._imports",
                "shardkeeper.errors",
                "shardkeeper.coordination.assignment_codec",
                "shardkeeper.scheduling.triggers",
            ),
            ("shardkeeper.scheduling.scheduler", "apscheduler.schedulers"),
        ),
    ],
)
def test_layers_import_only_downwards(
    package: str, allowed: tuple[str, ...], banned: tuple[str, ...]
) -> None:
    assert _modules(package), f"no modules found for {package}"
    assert _violations(package, allowed, banned) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rule checker itself: a module importing upwards is reported."""
    module = tmp_path / "m.py"
    module.write_text(
        "from __future__ import annotations\n"
        "def f():\n"
        "    from shardkeeper.runtime import Runtime\n"
        "    import apscheduler.schedulers.background\n"
    )
    assert _imports(module) == {
        "__future__",
        "shardkeeper.runtime",
        "apscheduler.schedulers.background",
    }


def test_one_ancestors_order_for_every_backend() -> None:
    """The backends share one documented ancestors(): nearest first, root excluded."""
    from shardkeeper.registry.base import ancestors
    from shardkeeper.registry.etcd.keys import strict_ancestors
    from shardkeeper.registry.memory.tree import _ancestors as memory_ancestors
    from shardkeeper.registry.zookeeper.nodes import _ancestors as zk_ancestors

    assert ancestors("/a/b/c") == ["/a/b", "/a"]
    assert ancestors("/a") == [] and ancestors("/") == []
    assert strict_ancestors("/a/b/c") == ancestors("/a/b/c")
    assert zk_ancestors("/a/b/c") == ["/a", "/a/b"]  # top-down: parents are made in order
    assert memory_ancestors("/a/b/c") == ["/a/b", "/a", "/"]
