"""History is scoped by registry and namespace (issue 27 section 7), on real SQLite
and real PostgreSQL: rows carry the scope of the runtime that recorded them, every
reader of the tools filters on it, and a table of an older release gains the column
(its rows read as legacy)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import MetaData, Table, insert, inspect

from shardkeeper.config import JobConfig
from shardkeeper.history import (
    ALL_SCOPES,
    LEGACY_SCOPE,
    HistoryQuery,
    HistoryReader,
    HistoryRecorder,
    resolve_url,
)
from shardkeeper.history.engine import open_engine
from shardkeeper.history.schema import executions
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, Observers, Outcome
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore, RegistrySettings, open_store
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "city-report"
A = "zk://10.0.0.1:2181/team-a"
B = "etcd://10.0.0.2:2379/team-a"


def run(item: int, instance: str) -> ExecutionRecord:
    now = time.time()
    return ExecutionRecord(
        job=JOB,
        item=item,
        fire_time=now,
        execution_id=f"{JOB}@{round(now * 1000)}#{item}",
        instance=instance,
        started=now,
        ended=now + 0.1,
        outcome=Outcome.OK,
    )


def test_identity_names_the_registry_not_its_credentials_or_options() -> None:
    """Hosts sorted, no user, password, timeouts or TLS files: two instances listing one
    ensemble differently (or with other timeouts) record into one scope."""
    one = RegistrySettings.from_url("zk://u:secret@h2:2181,h1:2181/app?session_timeout=6")
    other = RegistrySettings.from_url("zk://h1:2181,h2:2181/app")
    assert one.identity() == other.identity() == "zk://h1:2181,h2:2181/app"
    assert "secret" not in one.identity()
    assert RegistrySettings.from_url("etcd://h1:2379/app").identity() == "etcd://h1:2379/app"
    assert RegistrySettings.from_url("zk://h1:2181/other").identity() != other.identity()
    store = open_store("memory://scope-test/ns")  # not started: identity needs no I/O
    assert store.identity() == "memory://scope-test/ns"


def test_readers_see_their_own_scope_only(history_url: str) -> None:
    """Two deployments with one job name write one database: a scoped reader sees its
    own rows, ALL_SCOPES both, and ``elsewhere`` counts the others."""
    recorder = HistoryRecorder(history_url)
    Observers([recorder], scope=A).on_execution(run(0, "a-1"))
    Observers([recorder], scope=B).on_execution(run(0, "b-1"))
    Observers([recorder], scope=B).on_execution(run(1, "b-1"))
    assert recorder.close(timeout=30)

    with HistoryReader(history_url, scope=A) as reader:
        assert [(e.instance, e.scope) for e in reader.executions(JOB)] == [("a-1", A)]
        assert reader.elsewhere(JOB) == 2
        every = reader.query(HistoryQuery(job=JOB, scope=ALL_SCOPES))
        assert sorted(e.scope for e in every) == sorted([A, B, B])
        assert [e.instance for e in reader.query(HistoryQuery(job=JOB, scope=B))] == [
            "b-1",
            "b-1",
        ]
    with HistoryReader(history_url, scope=B) as reader:
        assert {e.instance for e in reader.executions(JOB)} == {"b-1"}
    with HistoryReader(history_url) as unscoped:  # Python code's reader: every row
        assert len(unscoped.executions(JOB)) == 3
        assert unscoped.elsewhere(JOB) == 0


def _older_table() -> Table:
    """The executions table as releases before the scope column created it."""
    return Table(
        "executions",
        MetaData(),
        *(c._copy() for c in executions.columns if c.name != "scope"),
    )


def test_an_older_table_gains_the_scope_and_its_rows_read_as_legacy(history_url: str) -> None:
    """A database written before scoping: still readable (legacy rows, under no
    registry's scope), and the first write adds the column and its index."""
    url = resolve_url(history_url)
    assert url is not None
    engine = open_engine(url)
    try:
        old = _older_table()
        old.metadata.create_all(engine)
        legacy = {
            k: v
            for k, v in {
                **run(5, "old-1").__dict__,
                "outcome": "ok",
                "duration": 0.1,
                "covers": "",
            }.items()
            if k in {c.name for c in old.columns}
        }
        with engine.begin() as conn:
            conn.execute(insert(old), [legacy])

        # read before any write: the scoped reader sees nothing, the legacy scope does
        with HistoryReader(history_url, scope=A) as reader:
            assert reader.executions(JOB) == []
            assert reader.elsewhere(JOB) == 1
            (row,) = reader.query(HistoryQuery(job=JOB, scope=LEGACY_SCOPE))
            assert (row.item, row.scope) == (5, LEGACY_SCOPE)

        recorder = HistoryRecorder(history_url)
        Observers([recorder], scope=A).on_execution(run(0, "a-1"))
        assert recorder.close(timeout=30)
        have = {c["name"] for c in inspect(engine).get_columns("executions")}
        assert "scope" in have
        indexes = {i["name"] for i in inspect(engine).get_indexes("executions")}
        assert "ix_executions_scope_job_started" in indexes
    finally:
        engine.dispose()

    with HistoryReader(history_url, scope=A) as reader:
        assert [e.item for e in reader.executions(JOB)] == [0]
        every = reader.query(HistoryQuery(job=JOB, scope=ALL_SCOPES))
        assert sorted((e.item, e.scope) for e in every) == [(0, A), (5, LEGACY_SCOPE)]


# -- real runtimes on ZooKeeper, two namespaces, one history file ----------------------


class Quick(ShardedJob):
    """Does nothing: only its history rows matter."""

    def execute(self, ctx: ShardingContext) -> None:
        pass


@pytest.fixture
def backend() -> str:
    return "zookeeper"


@pytest.fixture
def two_deployments(
    registry_url: str, tmp_path: Path, store_factory: object
) -> Iterator[tuple[str, str, str]]:
    """A runtime of ``JOB`` in the test's namespace and one in a sibling namespace of
    the same ZooKeeper, both recording to one SQLite file: (url A, url B, history URL)
    once each has a recorded run (the runtimes are stopped and flushed by then)."""
    history = f"sqlite:///{tmp_path / 'shared.db'}"
    settings = RegistrySettings.from_url(registry_url)
    other = registry_url.replace(f"/{settings.namespace}?", f"/{settings.namespace}-b?")
    assert other != registry_url
    runtimes: list[Runtime] = []
    recorders: list[HistoryRecorder] = []
    try:
        for url in (registry_url, other):
            recorder = HistoryRecorder(history)
            recorders.append(recorder)
            rt = Runtime(url, worker_threads=2, coordinator_threads=2, observers=[recorder])
            rt.add_job(Quick(), JobConfig(name=JOB, interval=0.5, sharding_total_count=2))
            runtimes.append(rt)
            rt.start()
        for url in (registry_url, other):
            scope = RegistrySettings.from_url(url).identity()

            def recorded(scope: str = scope) -> bool:
                with HistoryReader(history, scope=scope) as reader:
                    return any(e.outcome == "ok" for e in reader.executions(JOB))

            wait_until(recorded, 30, 0.05, f"no run recorded in {scope}")
    finally:
        for rt in runtimes:
            rt.stop_now()
        for recorder in recorders:
            recorder.close(timeout=30)
    yield registry_url, other, history


def cli(*args: str, registry: str | None, history: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "SHARDKEEPER_HISTORY_URL": history}
    env.pop("SHARDKEEPER_REGISTRY", None)
    if registry is not None:
        env["SHARDKEEPER_REGISTRY"] = registry
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_history_command_shows_its_registrys_runs_only(
    two_deployments: tuple[str, str, str], store: CoordinationStore
) -> None:
    """D11: one job name in two namespaces, one history file. The runtime stamps its
    scope on every row; ``history JOB`` shows the registry's own runs,
    ``--all-scopes`` both with a SCOPE column; no registry at all is a clear error."""
    url_a, url_b, history = two_deployments
    scope_a = RegistrySettings.from_url(url_a).identity()
    scope_b = RegistrySettings.from_url(url_b).identity()
    with HistoryReader(history) as everything:
        assert {e.scope for e in everything.executions(JOB, limit=500)} == {scope_a, scope_b}

    import json

    mine = cli("history", JOB, "--json", "--limit", "500", registry=url_a, history=history)
    assert mine.returncode == 0, mine.stderr
    rows = [json.loads(line) for line in mine.stdout.splitlines()]
    assert rows and {r["scope"] for r in rows} == {scope_a}
    theirs = cli("history", JOB, "--json", "--limit", "500", registry=url_b, history=history)
    assert {json.loads(line)["scope"] for line in theirs.stdout.splitlines()} == {scope_b}

    both = cli("history", JOB, "--all-scopes", "--limit", "500", registry=None, history=history)
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines()[0].split()[-1] == "SCOPE"
    assert scope_a in both.stdout and scope_b in both.stdout

    none = cli("history", JOB, registry=None, history=history)
    assert none.returncode == 2
    assert "history is kept per registry and namespace" in none.stderr
    assert "--registry" in none.stderr and "--all-scopes" in none.stderr

    # a namespace with no runs of the job says where the rows it has not shown are
    elsewhere = url_a.replace(f"/{store.namespace}?", f"/{store.namespace}-c?")
    empty = cli("history", JOB, registry=elsewhere, history=history)
    assert empty.returncode == 0, empty.stderr
    assert "no executions of 'city-report' match" in empty.stdout
    assert "--all-scopes shows them" in empty.stdout

    # the console over namespace A reads A's rows only (its REST API likewise)
    from fastapi.testclient import TestClient

    from shardkeeper.console import AuthConfig, create_app

    auth = AuthConfig()
    auth.add_token("dashboard", "viewer", token="view-token-0123456789abcdef")
    app = create_app(Operations(store), auth, history=HistoryReader(history))
    with TestClient(app) as client:
        answer = client.get(
            f"/api/jobs/{JOB}/history?limit=500",
            headers={"Authorization": "Bearer view-token-0123456789abcdef"},
        )
        assert answer.status_code == 200, answer.text
        assert {r["scope"] for r in answer.json()["executions"]} == {scope_a}
