"""``shardkeeper audit`` and the recording of every write command, as an operator runs
them: a real process per command, a real instance, on ZooKeeper and on etcd.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

JOB = "audited"
NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: no spontaneous fire during a test
CLI_TIMEOUT = 60
ENTRY_KEYS = {
    "id",
    "at",
    "who",
    "via",
    "host",
    "action",
    "outcome",
    "job",
    "item",
    "instance",
    "error",
    "details",
    "namespace",
}


def cli(
    *args: str, registry: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m shardkeeper.cli ARGS`` with the registry (and no history URL unless
    ``env`` gives one) in the environment."""
    full_env = {**os.environ, "COLUMNS": "250", "SHARDKEEPER_REGISTRY": registry}
    full_env.pop("SHARDKEEPER_HISTORY_URL", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=CLI_TIMEOUT,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def trail(registry: str, *args: str) -> list[dict[str, Any]]:
    """The entries ``audit ARGS --json`` prints."""
    doc = json.loads(ok(cli("audit", *args, "--json", registry=registry)))
    assert set(doc) == {"job", "since", "source", "entries"}
    entries: list[dict[str, Any]] = doc["entries"]
    for entry in entries:
        assert set(entry) == ENTRY_KEYS
    return entries


@pytest.fixture
def runtime(registry_url: str) -> Iterator[Runtime]:
    """A started runtime running ``audited`` (4 items), its assignment made."""
    rt = Runtime(registry_url, worker_threads=2, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(RecordingJob(), JobConfig.parse(name=JOB, cron=NEVER, sharding_total_count=4))
    rt.start()
    try:
        yield rt
    finally:
        rt.stop_now()


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


def test_every_write_command_is_recorded(
    registry_url: str, runtime: Runtime, ops: Operations, namespace: str
) -> None:
    wait_until(lambda: ops.job(JOB).leader, message="no leader elected")
    me = f"{getpass.getuser()}@{socket.gethostname().split('.')[0]}"
    ok(cli("disable", JOB, registry=registry_url))
    ok(cli("enable", JOB, registry=registry_url))
    ok(cli("disable", JOB, "--item", "1", registry=registry_url))
    ok(cli("enable", JOB, "--item", "1", registry=registry_url))
    ok(cli("trigger", JOB, "--param", "batch=7", registry=registry_url))
    ok(cli("config", "set", JOB, "description=nightly", "retries=2", registry=registry_url))
    refused = cli("remove", JOB, "--yes", registry=registry_url)  # a live instance runs it
    assert refused.returncode == 1, refused.stderr

    entries = trail(registry_url, JOB)
    assert [e["action"] for e in entries] == [
        "remove-job",
        "config-set",
        "trigger",
        "enable-item",
        "disable-item",
        "enable-job",
        "disable-job",
    ]
    assert {(e["who"], e["via"], e["namespace"]) for e in entries} == {(me, "cli", namespace)}
    by_action = {e["action"]: e for e in entries}
    assert by_action["remove-job"]["outcome"] == "refused"
    assert runtime.instance_id in by_action["remove-job"]["error"]
    assert all(e["outcome"] == "ok" for e in entries[1:])
    assert by_action["disable-item"]["item"] == 1
    assert by_action["trigger"]["details"] == {
        "params": {"batch": "7"},
        "asked": [runtime.instance_id],
    }
    assert by_action["config-set"]["details"]["changes"] == {
        "description": {"before": "", "after": "nightly"},
        "retries": {"before": 0, "after": 2},
    }
    times = [e["at"] for e in entries]
    assert times == sorted(times, reverse=True)

    # the human table, one job or all
    table = ok(cli("audit", JOB, registry=registry_url))
    assert "config-set" in table and 'description: "" -> "nightly"' in table
    assert "batch" in table and f"item 1 of {JOB}" in table
    assert len(trail(registry_url)) == len(entries)


def test_since_and_bad_input(registry_url: str, runtime: Runtime, ops: Operations) -> None:
    wait_until(lambda: ops.job(JOB).leader, message="no leader elected")
    ok(cli("disable", JOB, registry=registry_url))
    assert [e["action"] for e in trail(registry_url, JOB, "--since", "1h")] == ["disable-job"]
    assert trail(registry_url, JOB, "--since", "2999-01-01T00:00:00Z") == []
    assert "no audit entries for job 'nothing-here'" in ok(
        cli("audit", "nothing-here", registry=registry_url)
    )

    bad = cli("audit", JOB, "--since", "yesterday", registry=registry_url)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert "'yesterday'" in line and "30s" in line and "ISO 8601" in line

    # a job lookup failure touches nothing: not recorded
    ghost = cli("disable", "ghost-job", registry=registry_url)
    assert ghost.returncode == 1
    assert trail(registry_url, "ghost-job") == []


def test_the_history_database_and_a_trail_entry_that_cannot_be_written(
    registry_url: str, runtime: Runtime, ops: Operations, tmp_path: Path, namespace: str
) -> None:
    wait_until(lambda: ops.job(JOB).leader, message="no leader elected")
    db = f"sqlite:///{tmp_path / 'history.db'}"
    ok(
        cli(
            "disable",
            JOB,
            "--item",
            "2",
            registry=registry_url,
            env={"SHARDKEEPER_HISTORY_URL": db},
        )
    )
    doc = json.loads(ok(cli("audit", JOB, "--history-url", db, "--json", registry=registry_url)))
    (entry,) = doc["entries"]
    assert doc["source"] != "registry" and "history.db" in doc["source"]
    assert (entry["action"], entry["item"], entry["namespace"]) == ("disable-item", 2, namespace)
    assert entry["id"] == trail(registry_url, JOB)[0]["id"]  # the same entry in both

    # a database that cannot be written: the action is done, the registry keeps the
    # entry, and the operator is told (exit 0: the action is not undone)
    broken = "sqlite:////proc/no-such-dir/history.db"
    result = cli(
        "enable", JOB, "--item", "2", registry=registry_url,
        env={"SHARDKEEPER_HISTORY_URL": broken},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"enabled item 2 of {JOB}" in result.stdout
    assert result.stderr.startswith("warning: the action was done, but its audit entry")
    assert "enable-item" in result.stderr
    assert not ops.job(JOB).items[2].disabled
    assert trail(registry_url, JOB)[0]["action"] == "enable-item"


def test_shutdown_goes_to_the_namespace_trail(
    registry_url: str, runtime: Runtime, ops: Operations
) -> None:
    wait_until(lambda: ops.job(JOB).leader, message="no leader elected")
    ok(cli("shutdown", runtime.instance_id, "--wait", "30", registry=registry_url))
    (entry,) = trail(registry_url)
    assert (entry["action"], entry["instance"], entry["job"]) == (
        "shutdown",
        runtime.instance_id,
        None,
    )
    assert trail(registry_url, JOB) == []
