"""``shardkeeper registry down`` then ``registry up`` in the same directory keeps the
data (issue 27 section 7; newcomer review: it came back with 0 jobs although the
docstring of ``down`` says data stays), on both backends, through the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardkeeper.registry import open_store

pytestmark = pytest.mark.timeout(240)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``shardkeeper ARGS`` in a process of its own."""
    env = {**os.environ}
    env.pop("SHARDKEEPER_REGISTRY", None)
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def up(directory: Path, backend: str, *extra: str) -> tuple[str, str]:
    """The URL ``registry up`` printed, and what it said on stderr."""
    result = cli("registry", "up", "--backend", backend, "--dir", str(directory), *extra)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr


def down(directory: Path) -> None:
    result = cli("registry", "down", "--dir", str(directory))
    assert result.returncode == 0 and result.stdout.startswith("stopped pids"), result


def put(url: str, path: str, value: bytes) -> None:
    store = open_store(url)
    store.start()
    try:
        store.put(path, value)
    finally:
        store.close()


def get(url: str, path: str) -> bytes | None:
    store = open_store(url)
    store.start()
    try:
        node = store.get(path)
        return None if node is None else node.value
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"])
def test_down_then_up_keeps_the_data(tmp_path: Path, backend: str) -> None:
    directory = tmp_path / "reg"
    try:
        url, said = up(directory, backend)
        assert "started" in said and "again" not in said
        put(url, "/jobs/kept/config", b"still here")
        down(directory)

        # the next up in that directory: the same servers on the same data
        again, said = up(directory, backend)
        assert "started again on its data" in said, said
        assert get(again, "/jobs/kept/config") == b"still here"
        status = json.loads(cli("registry", "status", "--dir", str(directory), "--json").stdout)
        assert status["healthy"] and status["url"] == again
        down(directory)

        # a registry that died (no `down`) comes back on its data too
        up(directory, backend)
        state = json.loads((directory / "state.json").read_text())
        for pid in state["pids"]:
            os.killpg(pid, 9)
        url4, said = up(directory, backend)
        assert "started again on its data" in said, said
        assert get(url4, "/jobs/kept/config") == b"still here"
    finally:
        cli("registry", "down", "--dir", str(directory))


def test_another_size_starts_empty(tmp_path: Path) -> None:
    """Data of another size does not fit (an ensemble's members know each other):
    that start is a fresh registry, and says so by not saying 'again'."""
    directory = tmp_path / "reg"
    try:
        url, _ = up(directory, "etcd")
        put(url, "/jobs/gone/config", b"x")
        down(directory)
        url, said = up(directory, "etcd", "--nodes", "3")
        assert "again" not in said
        assert get(url, "/jobs/gone/config") is None
    finally:
        cli("registry", "down", "--dir", str(directory))
