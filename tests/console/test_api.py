"""The REST API against real stores and in-process runtimes (both backends):
credentials and roles, every operation, errors, history, the OpenAPI document."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.console.conftest import (
    ALICE,
    BOB,
    JOB,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    Start,
    bearer,
    login,
    wait_idle,
    wait_leader,
)

pytestmark = pytest.mark.timeout(90)


def basic(user: tuple[str, str]) -> dict[str, str]:
    token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


def test_reads_need_credentials(client: TestClient, cluster_job: Start, ops: Operations) -> None:
    [rt] = cluster_job().runtimes
    wait_leader(ops)

    anonymous = client.get("/api/status")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert client.get("/api/status", headers=bearer("wrong-token-0123456789")).status_code == 401
    assert client.get("/api/jobs", headers=basic((BOB[0], "wrong"))).status_code == 401
    assert client.get("/api/jobs", headers={"Authorization": "Digest x"}).status_code == 401

    status = client.get("/api/status", headers=bearer(VIEWER_TOKEN)).json()
    assert status["instances"] == [rt.instance_id]
    [job] = status["jobs"]
    assert (job["name"], job["leader"], job["sharding_total_count"]) == (JOB, rt.instance_id, 3)
    assert job["health"] in {"ok", "reshard-pending"}

    detail = client.get(f"/api/jobs/{JOB}", headers=basic(BOB)).json()
    assert [i["parameter"] for i in detail["items"]] == ["a", "b", "c"]
    assert client.get("/api/jobs", headers=basic(BOB)).json()["jobs"][0]["name"] == JOB
    [view] = client.get("/api/instances", headers=basic(BOB)).json()["instances"]
    assert view["instance_id"] == rt.instance_id and view["jobs"] == [JOB]
    config = client.get(f"/api/jobs/{JOB}/config", headers=basic(BOB)).json()
    assert config["config"]["cron"] == "0 0 1 1 *" and config["error"] is None
    assert client.get("/api/whoami", headers=basic(BOB)).json() == {
        "name": "bob",
        "role": "viewer",
        "via": "basic",
    }

    missing = client.get("/api/jobs/nope", headers=bearer(VIEWER_TOKEN))
    assert missing.status_code == 404
    assert missing.json() == {"detail": "unknown job 'nope'", "error": "JobLookupError"}
    assert client.get("/api/instances/x", headers=basic(BOB)).status_code in (404, 405)


def test_writes_need_an_operator(client: TestClient, cluster_job: Start, ops: Operations) -> None:
    cluster_job()
    wait_leader(ops)
    url = f"/api/jobs/{JOB}/disable"
    assert client.post(url).status_code == 401
    assert client.post(url, headers=bearer(VIEWER_TOKEN)).status_code == 403
    refused = client.post(url, headers=basic(BOB))
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]
    # a logged-in operator's browser session never writes through the API (CSRF)
    login(client, ALICE)
    assert client.get("/api/whoami").json()["name"] == "alice"
    assert client.post(url).status_code == 401
    assert ops.job(JOB).enabled

    assert client.post(url, headers=bearer(OPERATOR_TOKEN)).json() == {
        "job": JOB,
        "enabled": False,
    }
    assert not ops.job(JOB).enabled
    conflict = client.post(f"/api/jobs/{JOB}/trigger", headers=basic(ALICE))
    assert conflict.status_code == 409 and "disabled" in conflict.json()["detail"]
    assert client.post(f"/api/jobs/{JOB}/enable", headers=basic(ALICE)).status_code == 200
    assert ops.job(JOB).enabled


def test_trigger_params_item_switches_and_history(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster = cluster_job()
    [rt] = cluster.runtimes
    wait_leader(ops)
    op = bearer(OPERATOR_TOKEN)

    asked = client.post(f"/api/jobs/{JOB}/trigger", json={"params": {"batch": "7"}}, headers=op)
    assert asked.json() == {"job": JOB, "asked": [rt.instance_id]}
    wait_idle(ops, cluster, 3)
    assert sorted(cluster.jobs[0].runs()) == [(i, {"batch": "7"}) for i in range(3)]

    def history(**query: str) -> list[dict[str, object]]:
        response = client.get(f"/api/jobs/{JOB}/history", params=query, headers=op)
        assert response.status_code == 200, response.text
        rows: list[dict[str, object]] = response.json()["executions"]
        return rows

    wait_until(lambda: len(history()) == 3, message=lambda: str(history()))
    assert {(r["item"], r["outcome"]) for r in history()} == {(0, "ok"), (1, "ok"), (2, "ok")}
    assert [r["item"] for r in history(item="1")] == [1]
    assert history(failed="true") == []
    assert history(instance="nobody") == []
    bad = client.get(f"/api/jobs/{JOB}/history", params={"since": "soon"}, headers=op)
    assert bad.status_code == 422 and "'soon'" in bad.json()["detail"]

    bad_param = client.post(f"/api/jobs/{JOB}/trigger", json={"params": {"1x": "y"}}, headers=op)
    assert bad_param.status_code == 422 and "'1x'" in bad_param.json()["detail"]
    out_of_range = client.post(f"/api/jobs/{JOB}/items/7/disable", headers=op)
    assert out_of_range.status_code == 422 and "0..2" in out_of_range.json()["detail"]

    assert client.post(f"/api/jobs/{JOB}/items/1/disable", headers=op).json()["disabled"]
    assert [i.disabled for i in ops.job(JOB).items] == [False, True, False]
    client.post(f"/api/jobs/{JOB}/trigger", headers=op).raise_for_status()
    wait_idle(ops, cluster, 5)
    # item 1's part of the request is recorded skipped (by the leader), naming the item
    wait_until(lambda: len(history()) == 6, message=lambda: str(history()))
    assert cluster.ran() == [0, 0, 1, 2, 2]  # item 1 skipped in the second fire
    ones = [(r["outcome"], r["error_message"]) for r in history(item="1")]
    assert ones == [("skipped", "item disabled by an operator"), ("ok", "")]
    assert client.post(f"/api/jobs/{JOB}/items/1/enable", headers=op).status_code == 200
    assert not any(i.disabled for i in ops.job(JOB).items)


def test_config_patch_reports_errors_by_field(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster_job()
    wait_leader(ops)
    url = f"/api/jobs/{JOB}/config"
    op = bearer(OPERATOR_TOKEN)

    bad = client.patch(url, json={"sharding_total_count": 0, "time_zone": "Mars/Base"}, headers=op)
    assert bad.status_code == 422
    errors = bad.json()["errors"]
    assert set(errors) == {"sharding_total_count", "time_zone"}
    assert "greater than 0" in errors["sharding_total_count"] and "Mars/Base" in errors["time_zone"]
    both = client.patch(url, json={"interval": 5}, headers=op).json()["errors"]
    assert "exactly one of cron" in both["_config"]
    fixed = client.patch(url, json={"name": "other"}, headers=op)
    assert fixed.status_code == 422 and "name" in fixed.json()["detail"]
    assert client.patch(url, json={}, headers=op).status_code == 422
    assert (
        client.patch(url, json={"description": "x"}, headers=bearer(VIEWER_TOKEN)).status_code
        == 403
    )
    assert ops.job(JOB).config["sharding_total_count"] == 3  # nothing was written

    ok = client.patch(url, json={"sharding_total_count": 4, "description": "four"}, headers=op)
    assert ok.status_code == 200, ok.text
    assert ok.json()["config"]["sharding_total_count"] == 4
    assert ops.job(JOB).config["description"] == "four"
    assert ops.job(JOB).reshard_pending


def test_instances_shutdown_and_removal(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    a, b = cluster_job(2).runtimes
    wait_until(lambda: len(ops.job(JOB).instances) == 2, message="both instances joined")
    op = basic(ALICE)

    off = client.post(f"/api/instances/{b.instance_id}/disable", json={"job": JOB}, headers=op)
    assert off.json() == {"instance": b.instance_id, "disabled": True, "jobs": [JOB]}
    assert ops.job(JOB).disabled_instances == [b.instance_id]
    on = client.post(f"/api/instances/{b.instance_id}/enable", headers=op)
    assert on.json()["jobs"] == [JOB] and ops.job(JOB).disabled_instances == []
    unknown = client.post("/api/instances/nobody/disable", headers=op)
    assert unknown.status_code == 404 and "nobody" in unknown.json()["detail"]

    refused = client.delete(f"/api/jobs/{JOB}", headers=op)
    assert refused.status_code == 409 and "stop them first" in refused.json()["detail"]
    for rt in (a, b):
        assert (
            client.post(f"/api/instances/{rt.instance_id}/shutdown", headers=op).status_code == 200
        )
    wait_until(lambda: not ops.instances(), 30, message=lambda: str(ops.instances()))
    wait_until(lambda: not ops.job(JOB).instances, 30, message="members left")
    removed = client.delete(f"/api/jobs/{JOB}", headers=op)
    assert removed.status_code == 200 and removed.json()["removed"]
    assert client.get(f"/api/jobs/{JOB}", headers=op).status_code == 404


@pytest.mark.parametrize("backend", ["zookeeper"], ids=["zk"])
def test_openapi_document_lists_the_operations(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    assert set(paths["/api/jobs/{name}"]) == {"get", "delete"}
    assert "post" in paths["/api/jobs/{name}/trigger"]
    assert "patch" in paths["/api/jobs/{name}/config"]
    assert "post" in paths["/api/instances/{instance}/shutdown"]
    assert not [p for p in paths if not p.startswith("/api/")]  # pages stay out of it
    assert client.get("/docs").status_code == 404  # no page loading outside scripts
