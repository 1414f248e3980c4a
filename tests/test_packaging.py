"""Packaging: a lean core, extras that say their name, lazy imports, one version.

The runtime is run in a child process whose imports of every optional dependency
fail (a ``sys.meta_path`` blocker, as if the extras were not installed): it must
work with the core alone (kazoo, APScheduler, pydantic), and each feature that needs
an extra must fail with one line naming it. The import tests check what
``import shardkeeper``, ``shardkeeper --help`` and ``status`` load (the times are in
bench/startup_imports.py, not here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from shardkeeper._imports import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: the top-level modules of every extra (what a core-only install lacks)
OPTIONAL = sorted({module for modules in EXTRAS.values() for module in modules})

#: run first in each child: the named top-level modules cannot be imported
BLOCKER = """
import importlib.abc, json, sys
BLOCKED = set(json.loads(sys.argv[1]))
class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
def loaded(*tops):
    return sorted(m for m in sys.modules if m.partition(".")[0] in tops or m in tops)
"""


def _child(code: str, blocked: list[str], timeout: float = 90) -> dict[str, Any]:
    """Run ``code`` after the blocker; it prints one JSON line, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + code, json.dumps(blocked)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() for r in requirements}


def test_the_core_is_kazoo_apscheduler_and_pydantic() -> None:
    assert _requirement_names(PYPROJECT["project"]["dependencies"]) == {
        "kazoo",
        "apscheduler",
        "pydantic",
    }


def test_the_extras_are_the_ones_needs_extra_names() -> None:
    """Every extra pyproject publishes is one needs_extra knows (and back), ``all``
    holds every one, and development tools are dependency groups, not an extra."""
    extras: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) == {*EXTRAS, "all"}
    assert extras["all"] == [f"shardkeeper[{','.join(EXTRAS)}]"]
    assert "dev" not in extras and "bench" not in extras
    groups = PYPROJECT["dependency-groups"]
    assert {"test", "lint", "dev", "bench"} <= set(groups)
    assert {"pytest", "mypy", "ruff"} <= _requirement_names(
        [r for name in ("test", "lint") for r in groups[name]]
    )


def test_build_and_metadata() -> None:
    """setuptools 77 reads the PEP 639 license expression; the version has one
    source; the plugin is opt-in; the classifiers name the tested Pythons."""
    assert PYPROJECT["build-system"]["requires"] == ["setuptools>=77"]
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "version" not in project and project["dynamic"] == ["version"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "shardkeeper._version.__version__"
    assert "pytest11" not in project.get("entry-points", {})
    for minor in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {minor}" in project["classifiers"]
    assert "## [Unreleased]" in (ROOT / "CHANGELOG.md").read_text()


def test_the_cli_names_the_registry_variable_as_the_registry_does() -> None:
    from shardkeeper.cli.common import ENV_VAR as CLI_ENV_VAR
    from shardkeeper.registry.url import ENV_VAR

    assert CLI_ENV_VAR == ENV_VAR


RUN_A_JOB = """
import threading
import shardkeeper
from shardkeeper import JobConfig, ShardedJob
from shardkeeper.registry.memory import named_server

ran = threading.Event()

class Job(ShardedJob):
    def execute(self, ctx):
        ran.set()

server = named_server("core-only")
runtime = shardkeeper.Runtime(server.url("core"), shutdown_grace=2)
runtime.add_job(Job(), JobConfig.parse(name="core-only", interval=1, sharding_total_count=2))
with runtime:
    ok = ran.wait(60)
server.shutdown()
print(json.dumps({"ran": ok, "optional": loaded(*BLOCKED)}))
"""


@pytest.mark.timeout(120)
def test_a_runtime_runs_with_the_core_alone() -> None:
    """With every extra's modules unimportable, a Runtime starts, runs an item and
    stops, and imports none of them."""
    result = _child(RUN_A_JOB, OPTIONAL)
    assert result == {"ran": True, "optional": []}


MISSING_EXTRAS = """
import os, tempfile
from shardkeeper import ConfigError, Runtime, load_job_configs
from shardkeeper.alerts import webhook_handler
from shardkeeper.cli import main

errors = {}
def error(what, call):
    try:
        call()
    except ConfigError as exc:
        errors[what] = str(exc)
    else:
        errors[what] = None

error("metrics", lambda: Runtime("memory://missing-extras/ns", metrics_port=0))
error("http", lambda: webhook_handler("http://127.0.0.1:9/hook"))
path = os.path.join(tempfile.mkdtemp(), "jobs.yaml")
open(path, "w").write("jobs: []\\n")
error("yaml", lambda: load_job_configs(path))
import contextlib, io
stderr = io.StringIO()
with contextlib.redirect_stderr(stderr):
    rc = main(["--help"])
errors["cli"] = f"{rc} {stderr.getvalue()}"
print(json.dumps(errors))
"""


@pytest.mark.timeout(120)
def test_a_missing_extra_is_one_line_naming_it() -> None:
    errors = _child(MISSING_EXTRAS, OPTIONAL)
    assert errors["metrics"] == (
        "metrics_port (the /metrics endpoint) needs the 'metrics' extra "
        "(prometheus_client is not installed): pip install 'shardkeeper[metrics]'"
    )
    assert errors["http"].endswith(
        "needs the 'http' extra (httpx is not installed): pip install 'shardkeeper[http]'"
    )
    assert "pip install 'shardkeeper[cli]'" in errors["yaml"]
    assert "a YAML job file" in errors["yaml"]
    rc, _, line = errors["cli"].partition(" ")
    assert rc == "2"
    assert line == (
        "error: the shardkeeper command needs the 'cli' extra (rich is not installed): "
        "pip install 'shardkeeper[cli]'\n"
    )


def test_needs_extra_passes_other_import_errors_through() -> None:
    """Only the extra's own modules are translated: a broken import elsewhere is not
    reported as a missing extra."""
    from shardkeeper._imports import needs_extra

    with pytest.raises(ModuleNotFoundError), needs_extra("metrics", "x"):
        import shardkeeper_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    with (
        pytest.raises(ValueError, match="unknown extra 'metric'; the extras are cli, "),
        needs_extra("metric", "x"),
    ):
        pass


HEAVY = ["pydantic", "apscheduler", "kazoo", "sqlalchemy", "prometheus_client", "httpx"]
HEAVY += ["yaml", "fastapi", "etcd3", "typer", "rich"]

IMPORT_ONLY = """
import shardkeeper
assert shardkeeper.__version__
print(json.dumps({"loaded": loaded(*BLOCKED_NOT, "shardkeeper.config", "shardkeeper.runtime")}))
"""

CLI = """
import contextlib, io
from shardkeeper.cli import main
argv = sys.argv[2:]
if argv != ["--help"]:  # a store for the command (the memory one: no client library)
    from shardkeeper.registry.memory import named_server
    argv += ["-r", named_server("cli-imports").url("ns")]
with contextlib.redirect_stdout(io.StringIO()) as out:
    rc = main(argv)
print(json.dumps({"rc": rc, "out": out.getvalue(), "loaded": sorted(
    m for m in sys.modules
    if m.partition(".")[0] in BLOCKED_NOT
    or m.startswith(("shardkeeper.runtime", "shardkeeper.history", "shardkeeper.console",
                     "shardkeeper.scheduling.scheduler", "shardkeeper.ops", "shardkeeper.config"))
)}))
"""


def _loaded_by(code: str, *argv: str) -> dict[str, Any]:
    # nothing blocked: the child reports which of HEAVY it imported
    prelude = f"BLOCKED_NOT = {HEAVY!r}\n"
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + prelude + code, "[]", *argv],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_import_shardkeeper_loads_nothing_heavy() -> None:
    """The public names are imported on first use (PEP 562)."""
    assert _loaded_by(IMPORT_ONLY) == {"loaded": []}


def test_cli_help_loads_typer_and_rich_only() -> None:
    result = _loaded_by(CLI, "--help")
    assert result["rc"] == 0
    assert "status" in result["out"]
    assert {m.partition(".")[0] for m in result["loaded"]} == {"typer", "rich"}


def test_cli_status_loads_what_it_uses_only() -> None:
    """``status`` reads the store and renders views: the configuration model (next
    fire times) is used, the runtime, its scheduler, history and console are not."""
    result = _loaded_by(CLI, "status")
    assert result["rc"] == 0
    assert "0 job(s)" in result["out"]
    unused: tuple[str, ...] = ("shardkeeper.runtime", "shardkeeper.history")
    unused += ("shardkeeper.console", "shardkeeper.scheduling.scheduler", "sqlalchemy")
    unused += ("fastapi", "httpx", "prometheus_client", "kazoo", "etcd3")
    wrong = [m for m in result["loaded"] if m.startswith(unused)]
    assert not wrong, wrong
