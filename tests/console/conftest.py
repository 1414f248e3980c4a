"""Console fixtures: a running cluster of in-process runtimes, its history, the app.

* ``cluster_job``: ``start(n=1)`` -> runtimes running the recording job ``rec``
  (3 items, a cron that never fires during a test: every execution is one the test
  triggered), recording history in a SQLite file of the test.
* ``auth``: accounts ``alice`` (operator) and ``bob`` (viewer), tokens
  ``OPERATOR_TOKEN`` and ``VIEWER_TOKEN``.
* ``app`` / ``client``: the console over an :class:`Operations` on the test's
  namespace, and a FastAPI TestClient for it (not logged in).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardkeeper.config import JobConfig
from shardkeeper.console import AuthConfig, create_app
from shardkeeper.history import HistoryReader, HistoryRecorder
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

JOB = "rec"
NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: no spontaneous fire during a test
OPERATOR_TOKEN = "op-token-0123456789abcdef"
VIEWER_TOKEN = "view-token-0123456789abcdef"
ALICE = ("alice", "alice-password-1")
BOB = ("bob", "bob-password-1")


class Recording(ShardedJob):
    """Records each execution's item and one-off params."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[tuple[int, dict[str, str]]] = []

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.ran.append((ctx.item, dict(ctx.params)))

    def items(self) -> list[int]:
        with self.lock:
            return sorted(i for i, _ in self.ran)

    def runs(self) -> list[tuple[int, dict[str, str]]]:
        with self.lock:
            return list(self.ran)


@dataclass
class Cluster:
    """The runtimes of a test, their jobs and the history they record."""

    history_url: str
    runtimes: list[Runtime] = field(default_factory=list)
    jobs: list[Recording] = field(default_factory=list)

    def ran(self) -> list[int]:
        """Every item executed so far, over all runtimes, sorted."""
        return sorted(i for j in self.jobs for i in j.items())


def rec_config(**changes: object) -> JobConfig:
    """The recording job's config."""
    base: dict[str, object] = {
        "name": JOB,
        "cron": NEVER,
        "sharding_total_count": 3,
        "sharding_item_parameters": "0=a,1=b,2=c",
        "sharding_wait_timeout": 5.0,
        "execution_wait_timeout": 5.0,
    }
    return JobConfig.parse(**{**base, **changes})


Start = Callable[..., Cluster]


@pytest.fixture
def history_url(tmp_path: Path) -> str:
    """A SQLite history of this test."""
    return f"sqlite:///{tmp_path / 'history.db'}"


@pytest.fixture
def cluster_job(registry_url: str, history_url: str) -> Iterator[Start]:
    """``start(n=1)``: n runtimes of ``rec`` with history; waits for a leader's
    assignment (stopped at teardown)."""
    cluster = Cluster(history_url)
    recorders: list[HistoryRecorder] = []

    def start(n: int = 1) -> Cluster:
        for _ in range(n):
            recorder = HistoryRecorder(history_url)
            recorders.append(recorder)
            job = Recording()
            rt = Runtime(
                registry_url,
                worker_threads=4,
                coordinator_threads=2,
                shutdown_grace=2.0,
                observers=[recorder],
            )
            rt.add_job(job, rec_config())
            cluster.runtimes.append(rt)
            cluster.jobs.append(job)
            rt.start()
        return cluster

    yield start
    for rt in cluster.runtimes:
        rt.stop_now()
    for recorder in recorders:
        recorder.close(timeout=10)


@pytest.fixture
def auth() -> AuthConfig:
    """alice (operator), bob (viewer) and a token of each role."""
    config = AuthConfig()
    config.add_user(*ALICE[:1], "operator", password=ALICE[1])
    config.add_user(*BOB[:1], "viewer", password=BOB[1])
    config.add_token("deploy-bot", "operator", token=OPERATOR_TOKEN)
    config.add_token("dashboard", "viewer", token=VIEWER_TOKEN)
    return config


@pytest.fixture
def app(store: CoordinationStore, auth: AuthConfig, history_url: str) -> Iterator[FastAPI]:
    """The console over the test's namespace and history."""
    reader = HistoryReader(history_url)
    yield create_app(Operations(store), auth, history=reader, refresh_seconds=0)
    reader.close()


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """A TestClient of the console (no credentials)."""
    with TestClient(app) as c:
        yield c


def csrf_of(html: str) -> str:
    """The CSRF token of a rendered page."""
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def login(client: TestClient, user: tuple[str, str]) -> None:
    """Log ``client`` in through the login form."""
    page = client.get("/login")
    response = client.post(
        "/login",
        data={"username": user[0], "password": user[1], "csrf": csrf_of(page.text), "next": "/"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text


def bearer(token: str) -> dict[str, str]:
    """The Authorization header of a bearer token."""
    return {"Authorization": f"Bearer {token}"}


def wait_leader(ops: Operations) -> str:
    """Until ``rec`` has a leader; its id."""
    return wait_until(lambda: ops.job(JOB).leader, message="no leader elected")


def wait_idle(ops: Operations, cluster: Cluster, count: int) -> None:
    """Until ``count`` executions ran in all and no item is running."""
    wait_until(
        lambda: len(cluster.ran()) >= count,
        message=lambda: f"items ran: {cluster.ran()}",
    )
    wait_until(
        lambda: all(i.running_on is None for i in ops.job(JOB).items),
        message="running marks were not cleared",
    )
