"""``POST /api/jobs/{job}/trigger`` with ``items``: only those items run (newcomer
review N28, as ``shardkeeper trigger JOB --item N``); an item out of range is a 422
naming the valid range."""

from __future__ import annotations

from fastapi.testclient import TestClient

from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.console.conftest import JOB, OPERATOR_TOKEN, Start, bearer, wait_leader


def test_trigger_only_some_items(
    client: TestClient, cluster_job: Start, store: CoordinationStore
) -> None:
    ops = Operations(store)
    cluster = cluster_job()
    wait_leader(ops)
    op = bearer(OPERATOR_TOKEN)
    asked = client.post(
        f"/api/jobs/{JOB}/trigger", json={"items": [2], "params": {"why": "retry"}}, headers=op
    )
    assert asked.status_code == 200, asked.text
    wait_until(lambda: cluster.ran() == [2], message=lambda: str(cluster.ran()))
    wait_until(lambda: not store.children(f"/jobs/{JOB}/runnow"), message="request left")
    assert cluster.jobs[0].runs() == [(2, {"why": "retry"})]
    bad = client.post(f"/api/jobs/{JOB}/trigger", json={"items": [3]}, headers=op)
    assert bad.status_code == 422 and "0..2" in bad.json()["detail"]
