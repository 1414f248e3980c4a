"""shardkeeper.testing for users: the pytest plugin (opt-in, enabled as a user's
project does: ``pytest_plugins`` in its conftest.py or ``-p``) and RecordingJob."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardkeeper.job import ShardingContext
from shardkeeper.testing.jobs import RecordingJob

USER_TEST = """
from shardkeeper import JobConfig, Runtime
from shardkeeper.registry import open_store


def test_a_job_runs_on_the_plugin_server(shardkeeper_registry_url, recording_job):
    assert shardkeeper_registry_url.startswith("zk://")
    rt = Runtime(shardkeeper_registry_url, shutdown_grace=2)
    rt.add_job(recording_job, JobConfig(name="sync", interval=1, sharding_total_count=3))
    with rt:
        runs = recording_job.wait_for(
            lambda runs: {r.item for r in runs} == {0, 1, 2} and runs, timeout=30
        )
    assert {r.job for r in runs} == {"sync"}


def test_namespaces_differ(shardkeeper_namespace, shardkeeper_zookeeper):
    store = open_store(shardkeeper_zookeeper.url(shardkeeper_namespace))
    store.start()
    try:
        assert store.children("/") == []  # a fresh namespace: nothing of other tests
    finally:
        store.close()
"""


PLUGIN = "shardkeeper.testing.pytest_plugin"
#: a pytest session in the user's project directory
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def test_plugin_fixtures_in_a_users_project(tmp_path: Path) -> None:
    """A project whose conftest.py enables the plugin gets a real ZooKeeper, a
    namespace per test and a URL from it; its tests pass."""
    (tmp_path / "test_user.py").write_text(USER_TEST)
    (tmp_path / "conftest.py").write_text(f"pytest_plugins = [{PLUGIN!r}]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_plugin_refuses_an_unknown_backend(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text("def test_url(shardkeeper_registry_url):\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nshardkeeper_backend = mysql\n")
    proc = subprocess.run(
        [*PYTEST, "-p", PLUGIN, "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "'mysql'" in proc.stdout + proc.stderr
    assert "zookeeper, etcd" in proc.stdout + proc.stderr


def test_plugin_is_not_loaded_unless_enabled(tmp_path: Path) -> None:
    """Installing shardkeeper adds nothing to another project's test sessions: no
    fixture, no option, no server (the plugin has no pytest11 entry point)."""
    (tmp_path / "test_user.py").write_text(
        "def test_url(request):\n"
        "    assert 'shardkeeper_registry_url' not in request.fixturenames\n"
        "    assert not request.config.pluginmanager.has_plugin("
        f"{PLUGIN!r})\n"
    )
    proc = subprocess.run(
        [*PYTEST, "--fixtures", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shardkeeper_registry_url" not in proc.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _ctx(item: int, fire: float, **extra: object) -> ShardingContext:
    return ShardingContext(
        job_name="j",
        item=item,
        item_parameter="",
        sharding_total_count=4,
        job_parameter="",
        fire_time=datetime.fromtimestamp(fire, UTC),
        instance_id="h@1@x",
        execution_id=f"j@{fire}#{item}",
        **extra,  # type: ignore[arg-type]
    )


def test_recording_job_records_and_wakes_a_waiter() -> None:
    """Executions on other threads are recorded with their context and wake wait_for."""
    job = RecordingJob()
    threads = [
        threading.Thread(target=job.execute, args=(_ctx(i, 10.0 + i, params={"k": "v"}),))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    got = job.wait_for(lambda runs: len(runs) == 4 and runs, timeout=10)
    for t in threads:
        t.join(5)
    assert sorted(r.item for r in got) == [0, 1, 2, 3] == job.items()
    assert all(r.params == {"k": "v"} and r.instance == "h@1@x" and r.valid for r in got)
    assert job.items_after(11.0) == {2, 3}
    assert job.count() == 4 and job.count(2) == 1
    job.clear()
    assert job.runs == []


def test_recording_job_wait_for_fails_at_its_deadline() -> None:
    job = RecordingJob()
    job.execute(_ctx(1, 5.0))
    with pytest.raises(AssertionError, match=r"item 7 never ran \(waited 0.2 s; 1 execution"):
        job.wait_for(lambda runs: any(r.item == 7 for r in runs), 0.2, "item 7 never ran")
