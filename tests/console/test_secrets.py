"""No registry or history credential in any page or answer of the console: a
console on a ZooKeeper namespace with digest credentials and on an etcd with
authentication, crawled as an operator (pages, forms, API, errors)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from shardkeeper.console import AuthConfig, open_console
from shardkeeper.ops import Operations
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.pytest_plugin import FAST_OPTIONS
from shardkeeper.testing.servers import EtcdCluster, ZooKeeperCluster
from tests.console.conftest import (
    ALICE,
    JOB,
    OPERATOR_TOKEN,
    Recording,
    bearer,
    csrf_of,
    login,
    rec_config,
)

pytestmark = pytest.mark.timeout(120)

ZK_USER = "zkuser-7f3a"
ZK_PASSWORD = "zk-Pa55word-9c1e"
HISTORY_PASSWORD = "hist-Pa55word-42ab"
#: a history database that refuses connections: its error message is shown
HISTORY_URL = f"postgresql://histuser:{HISTORY_PASSWORD}@127.0.0.1:1/jobs"


def _fast() -> str:
    return "&".join(f"{k}={v}" for k, v in FAST_OPTIONS.items())


@pytest.fixture(params=["zookeeper", "etcd"], ids=["zk", "etcd"])
def secured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """(registry URL with credentials, the strings that must never be shown)."""
    namespace = f"secrets-{uuid.uuid4().hex[:8]}"
    if request.param == "zookeeper":
        zk: ZooKeeperCluster = request.getfixturevalue("zk_server")
        url = f"zk://{ZK_USER}:{ZK_PASSWORD}@{zk.hosts_string}/{namespace}?{_fast()}"
        yield url, [ZK_PASSWORD, ZK_USER, HISTORY_PASSWORD]
        return
    with EtcdCluster(size=1, base_dir=tmp_path / "etcd", auth=True) as etcd:
        assert etcd.password
        yield (
            etcd.url(namespace, **FAST_OPTIONS),
            [
                etcd.password,
                f"{etcd.username}:{etcd.password}",
                HISTORY_PASSWORD,
            ],
        )


def test_no_credential_in_any_page_or_answer(secured: tuple[str, list[str]]) -> None:
    url, secrets = secured
    rt = Runtime(url, worker_threads=2, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(Recording(), rec_config())
    rt.start()
    auth = AuthConfig()
    auth.add_user(ALICE[0], "operator", password=ALICE[1])
    auth.add_token("bot", "operator", token=OPERATOR_TOKEN)
    try:
        with Operations.connect(url) as ops:
            wait_until(lambda: ops.job(JOB).leader, message="no leader")
        app = open_console(url, auth, history_url=HISTORY_URL)
        with TestClient(app) as client:
            login(client, ALICE)
            answers = [client.get(p) for p in ("/", "/instances", "/login", "/openapi.json")]
            answers += [client.get(f"/jobs/{JOB}"), client.get("/jobs/nope")]
            token = csrf_of(answers[0].text)
            answers.append(client.post(f"/jobs/{JOB}/trigger", data={"csrf": token}))
            answers.append(client.post(f"/jobs/{JOB}/config", data={"csrf": token, "cron": "x"}))
            op = bearer(OPERATOR_TOKEN)
            for path in ("status", "jobs", f"jobs/{JOB}", f"jobs/{JOB}/config", "instances"):
                answers.append(client.get(f"/api/{path}", headers=op))
            history = client.get(f"/api/jobs/{JOB}/history", headers=op)
            assert history.status_code == 503 and "histuser" in history.json()["detail"]
            answers.append(history)
            answers.append(client.post(f"/api/instances/{rt.instance_id}/disable", headers=op))
            answers.append(client.post("/api/instances/nobody/shutdown", headers=op))
            answers.append(client.patch(f"/api/jobs/{JOB}/config", json={"cron": "x"}, headers=op))
    finally:
        rt.stop_now()

    assert [a.status_code for a in answers[:5]] == [200, 200, 200, 200, 200]
    assert "cannot read history" in answers[4].text  # the history error is shown...
    for answer in answers:
        shown = answer.text + "".join(f"{k}: {v}\n" for k, v in answer.headers.items())
        leaked = [s for s in secrets if s in shown]
        assert not leaked, f"{answer.request.method} {answer.request.url}: shows {leaked}"
