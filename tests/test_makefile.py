"""``make demo`` installs only what its BACKEND needs; ``make test`` everything (issue
37, newcomer review N23: the demo on etcd installed PostgreSQL, Chromium and a JRE).

The install recipes are run for real, with ``apt-get`` and ``id`` replaced by stubs
that record the packages asked for, on a PATH where none of the programs is found."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: every Debian package of the suite (make test)
SUITE = {
    "zookeeper",
    "etcd-server",
    "etcd-client",
    "default-jre-headless",
    "iproute2",
    "openssl",
    "postgresql-15",
    "docker-compose",
    "chromium",
    "chromium-driver",
}

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _installed(target: str, tmp_path: Path, *variables: str) -> set[str]:
    """The packages ``make TARGET`` asks apt-get for on a machine that has none, as
    root (stubs: nothing is installed). Debian's file checks still see this machine,
    so ZooKeeper's jar and PostgreSQL's initdb count as present where they are."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "apt.log"
    _stub(stubs / "apt-get", f'echo "$@" >> {calls}')
    _stub(stubs / "id", "echo 0")
    for tool in ("sh", "bash", "make", "cat", "env"):
        found = shutil.which(tool)
        assert found, tool
        (stubs / tool).symlink_to(found)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHARDKEEPER_", "JAVA_HOME", "ZOOKEEPER_HOME", "MAKE", "MFLAGS"))
    }
    env["PATH"] = str(stubs)
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), target, *variables],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    asked: set[str] = set()
    for line in calls.read_text().splitlines() if calls.exists() else []:
        words = line.split()
        if words and words[0] == "install":
            asked |= {w for w in words[1:] if not w.startswith("-")}
    return asked


def test_the_demo_on_etcd_installs_etcd_only(tmp_path: Path) -> None:
    """The default BACKEND, and BACKEND=etcd: no JRE, PostgreSQL or browser."""
    (tmp_path / "default").mkdir()
    (tmp_path / "etcd").mkdir()
    assert _installed("demo-deps", tmp_path / "default") == {"etcd-server"}
    assert _installed("demo-deps", tmp_path / "etcd", "BACKEND=etcd") == {"etcd-server"}


def test_the_demo_on_zookeeper_installs_zookeeper_and_java_only(tmp_path: Path) -> None:
    """ZooKeeper and a JRE (the jar is found on this machine, so maybe not ZooKeeper)."""
    asked = _installed("demo-deps", tmp_path, "BACKEND=zookeeper")
    assert "default-jre-headless" in asked
    assert asked <= {"zookeeper", "default-jre-headless"}, asked


def test_make_test_installs_every_package_of_the_suite(tmp_path: Path) -> None:
    """system-deps (make test, chaos, bench) still asks for every package."""
    asked = _installed("system-deps", tmp_path)
    # the file checks (ZooKeeper's jar, PostgreSQL's initdb) see this machine
    present = {
        "zookeeper": Path("/usr/share/java/zookeeper.jar").is_file(),
        "postgresql-15": Path("/usr/lib/postgresql/15/bin/initdb").exists(),
    }
    assert asked == {p for p in SUITE if not present.get(p, False)}, asked


def test_an_unknown_backend_is_refused() -> None:
    """A misspelt BACKEND names the valid ones instead of installing nothing."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "demo-deps", "BACKEND=zk"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "BACKEND=zk: valid backends are etcd and zookeeper" in done.stdout + done.stderr


def _demo_venv(tmp_path: Path, *variables: str, full: bool = False) -> list[str]:
    """The pip commands ``make demo-venv`` runs for a fresh VENV (``full``: one that
    ``make test`` filled already), with ``python3`` and the venv's python as stubs
    that record their arguments."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "python.log"
    venv = tmp_path / "venv"
    python = tmp_path / "python-stub"
    _stub(python, f'echo "$@" >> {calls}')
    # python3 -m venv DIR: a venv whose python is the recording stub
    _stub(stubs / "python3", f'mkdir -p "$3/bin" && cp {python} "$3/bin/python"')
    for tool in ("sh", "bash", "make", "touch", "mkdir", "cp", "env"):
        found = shutil.which(tool)
        assert found, tool
        (stubs / tool).symlink_to(found)
    if full:
        (venv / "bin").mkdir(parents=True)
        shutil.copy(python, venv / "bin" / "python")
        (venv / ".installed").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env["PATH"] = str(stubs)
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "demo-venv", f"VENV={venv}", *variables],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (venv / f".demo-{variables[0].split('=')[1] if variables else 'etcd'}").exists()
    return calls.read_text().splitlines() if calls.exists() else []


def test_the_demo_installs_the_cli_and_its_stores_client_only(tmp_path: Path) -> None:
    """Newcomer review N23: a first ``make demo`` built the venv with every extra and
    the dev group (PostgreSQL's driver, the console, the linters, ...). The demo
    installs the CLI and its BACKEND's client; a venv ``make test`` filled is kept."""
    (tmp_path / "etcd").mkdir()
    (tmp_path / "zk").mkdir()
    (tmp_path / "full").mkdir()
    installs = [c for c in _demo_venv(tmp_path / "etcd") if "install" in c.split()]
    assert installs[-1].endswith("-e .[cli,etcd]"), installs
    assert not any("--group" in c or "[all]" in c for c in installs), installs
    zk = [c for c in _demo_venv(tmp_path / "zk", "BACKEND=zookeeper") if "install" in c.split()]
    assert zk[-1].endswith("-e .[cli]"), zk
    assert _demo_venv(tmp_path / "full", full=True) == []
