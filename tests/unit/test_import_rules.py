"""The layering of docs/architecture.md, checked on the real import graph.

The rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``):
the layers of the package (exhaustive: every module is placed), the registry's
backends independent of each other, the scheduler imported by the runtime only, the
store clients by their backends only. ``make lint`` runs ``lint-imports``; these
tests run it too, so a plain pytest run sees a broken layer. What import-linter
cannot see (importing ``a.b.c`` first runs ``a/__init__`` and ``a/b/__init__``) is
checked in a fresh interpreter per module by test_import_each_module.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(config: Path, cwd: Path, pythonpath: str | None = None) -> tuple[int, str]:
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(config)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_package_keeps_its_import_contracts() -> None:
    """Every contract of pyproject.toml holds on the package's import graph."""
    code, output = _lint_imports(ROOT / "pyproject.toml", ROOT)
    assert code == 0, output
    assert "0 broken" in output, output


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a lower layer importing a higher one, even lazily inside
    a function, breaks a layers contract like ours."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg import high\n")
    (package / "high.py").write_text("from pkg import low\n")
    config = tmp_path / "contracts.toml"
    config.write_text(
        textwrap.dedent(
            """
            [tool.importlinter]
            root_package = "pkg"

            [[tool.importlinter.contracts]]
            name = "layers"
            type = "layers"
            containers = ["pkg"]
            layers = ["high", "low"]
            """
        )
    )
    code, output = _lint_imports(config, tmp_path, pythonpath=str(tmp_path))
    assert code != 0, output
    assert "pkg.low -> pkg.high" in output, output
