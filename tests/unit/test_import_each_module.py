"""Every module of the package imports on its own, first, in a fresh interpreter.

``shardkeeper/__init__`` imports the runtime and so, today, nearly everything: an
import cycle between two modules is hidden as long as the top package happens to
import them in a working order (importing ``shardkeeper.metrics`` first failed at
3005b15 once the top ``__init__`` was bypassed). These tests import each module
with the top ``__init__`` bypassed (a bare package object with the source path, as
a lazy ``__init__`` would behave), one fresh process per module, and check what a
module's own closure loads where the architecture doc promises something.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shardkeeper

SRC = Path(shardkeeper.__file__).resolve().parent

# one worker builds the per-module imports once (the fixture is per module and worker)
pytestmark = pytest.mark.xdist_group("import-each-module")

#: modules that run something when imported (the CLI's ``python -m`` entry)
NOT_IMPORTED = {"shardkeeper.cli.__main__"}

#: third-party packages imported once before the per-module processes fork: they
#: cannot take part in a cycle of ours, and loading them once keeps the test short.
#: APScheduler's scheduler is left out on purpose (see test_configuration_...).
PRELOAD = [
    "pydantic",
    "yaml",
    "apscheduler.triggers.cron",
    "apscheduler.triggers.interval",
    "prometheus_client",
    "kazoo.client",
    "sqlalchemy",
    "typer",
    "rich.console",
    "httpx",
    "fastapi",
    "jinja2",
]

#: the helper that runs in a fresh interpreter: it preloads, then forks one child per
#: module; each child makes ``shardkeeper`` a bare package (its ``__init__`` not run),
#: imports the module and reports what failed and which modules it loaded
_FORKER = textwrap.dedent(
    """
    import importlib, json, os, sys, traceback, types

    src, modules, preload = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    results = {}
    for module in modules:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            bare = types.ModuleType("shardkeeper")
            bare.__path__ = [src]
            sys.modules["shardkeeper"] = bare
            try:
                importlib.import_module(module)
                watched = ("shardkeeper", "apscheduler", "etcd3", "grpc")
                report = {"ok": True, "loaded": [m for m in sys.modules if m.startswith(watched)]}
            except BaseException:
                report = {"ok": False, "error": traceback.format_exc(limit=-6)}
            with os.fdopen(write, "w") as out:
                json.dump(report, out)
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as got:
            text = got.read()
        os.waitpid(pid, 0)
        results[module] = json.loads(text) if text else {"ok": False, "error": "no report"}
    json.dump(results, sys.stdout)
    """
)


def _all_modules() -> list[str]:
    names = []
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name != "shardkeeper" and name not in NOT_IMPORTED:
            names.append(name)
    return names


def _import_each(modules: list[str]) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", _FORKER, str(SRC), json.dumps(modules), json.dumps(PRELOAD)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    results: dict[str, dict[str, object]] = json.loads(done.stdout)
    return results


@pytest.fixture(scope="module")
def imported() -> dict[str, dict[str, object]]:
    """Each module's result, imported first in a process of its own (about 30 s for
    the 160 modules on a loaded 2-core machine)."""
    return _import_each(_all_modules())


def test_the_module_list_is_the_package() -> None:
    """The walk finds the package's modules (a broken walk would check nothing)."""
    modules = _all_modules()
    assert len(modules) > 150
    for name in ("shardkeeper.metrics", "shardkeeper.config", "shardkeeper.runtime.job.jobstate"):
        assert name in modules


@pytest.mark.timeout(300)
def test_every_module_imports_on_its_own(imported: dict[str, dict[str, object]]) -> None:
    """No module needs another to have been imported before it (no hidden cycle)."""
    failed = {name: r["error"] for name, r in imported.items() if not r["ok"]}
    assert not failed, "\n\n".join(f"{name}:\n{error}" for name, error in failed.items())


def _loaded(imported: dict[str, dict[str, object]], module: str) -> set[str]:
    report = imported[module]
    assert report["ok"], report.get("error")
    loaded = report["loaded"]
    assert isinstance(loaded, list)
    return set(loaded)


def test_configuration_loads_no_scheduler(imported: dict[str, dict[str, object]]) -> None:
    """Validating a configuration (cron expressions, time zones) uses the pure
    triggers module: neither shardkeeper's scheduler nor APScheduler's
    BackgroundScheduler is loaded, nor the runtime, coordination or a store client
    (docs/architecture.md)."""
    for module in ("shardkeeper.config", "shardkeeper.scheduling.triggers"):
        loaded = _loaded(imported, module)
        unwanted = {
            "shardkeeper.scheduling.scheduler",
            "apscheduler.schedulers.background",
            "shardkeeper.runtime",
            "shardkeeper.coordination",
            "etcd3",
        }
        assert not unwanted & loaded, f"{module} loads {sorted(unwanted & loaded)}"


def test_the_metrics_load_no_runtime(imported: dict[str, dict[str, object]]) -> None:
    """The Prometheus metrics are an observer of the runtime, below it: importing them
    does not import the runtime (at 3005b15 it did, and failed when first)."""
    loaded = _loaded(imported, "shardkeeper.metrics")
    assert not {m for m in loaded if m.startswith("shardkeeper.runtime")}


def test_the_registry_contract_loads_no_client(imported: dict[str, dict[str, object]]) -> None:
    """The store contract and the reference MemoryStore need no store client: a user's
    test double or a MemoryStore test imports neither kazoo's connection nor etcd3."""
    for module in ("shardkeeper.registry.base", "shardkeeper.registry.memory"):
        loaded = _loaded(imported, module)
        assert "etcd3" not in loaded and "grpc" not in loaded, module
