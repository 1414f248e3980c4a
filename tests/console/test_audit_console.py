"""The audit trail through the console (both backends): the forms and the REST API
record every write under the user's or the token's name, in the registry and in the
history database; the page and ``GET /api/audit`` for a viewer; nothing edits it; an
entry that cannot be written leaves the action done and says so."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from shardkeeper.console import AuthConfig, create_app
from shardkeeper.history import HistoryReader
from shardkeeper.history.audit import AuditTable
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from tests.console.conftest import (
    ALICE,
    BOB,
    JOB,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    Start,
    bearer,
    csrf_of,
    login,
    wait_leader,
)

pytestmark = pytest.mark.timeout(90)
WARNING_HEADER = "x-shardkeeper-audit-warning"


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


def flash(page: str) -> str:
    match = re.search(r'id="flash"[^>]*>([^<]*)<', page)
    return html.unescape(match.group(1)) if match else ""


def post_form(client: TestClient, url: str, **fields: str) -> str:
    """Post a form as the logged-in user; the page shown after it."""
    token = csrf_of(client.get(f"/jobs/{JOB}").text)
    response = client.post(url, data={"csrf": token, **fields})
    assert response.status_code == 200, response.text
    return response.text


def test_forms_and_rest_writes_are_recorded(
    client: TestClient, cluster_job: Start, ops: Operations, history_url: str, namespace: str
) -> None:
    [rt] = cluster_job().runtimes
    wait_leader(ops)
    login(client, ALICE)
    assert flash(post_form(client, f"/jobs/{JOB}/disable")) == f"job {JOB} disabled"
    assert flash(post_form(client, f"/jobs/{JOB}/enable")) == f"job {JOB} enabled"
    post_form(client, f"/jobs/{JOB}/config", description="nightly")
    api = TestClient(client.app)
    answer = api.post(
        f"/api/jobs/{JOB}/trigger", json={"params": {"k": "v"}}, headers=bearer(OPERATOR_TOKEN)
    )
    assert answer.status_code == 200 and WARNING_HEADER not in answer.headers
    refused = api.delete(f"/api/jobs/{JOB}", headers=bearer(OPERATOR_TOKEN))
    assert refused.status_code == 409  # a live instance runs it

    doc = api.get("/api/audit", params={"job": JOB}, headers=bearer(VIEWER_TOKEN)).json()
    entries = doc["entries"]
    assert [(e["action"], e["who"], e["via"], e["outcome"]) for e in entries] == [
        ("remove-job", "deploy-bot", "api", "refused"),
        ("trigger", "deploy-bot", "api", "ok"),
        ("config-set", "alice", "console", "ok"),
        ("enable-job", "alice", "console", "ok"),
        ("disable-job", "alice", "console", "ok"),
    ]
    assert doc["source"] == "registry" and doc["job"] == JOB
    assert entries[1]["details"] == {"params": {"k": "v"}, "asked": [rt.instance_id]}
    assert entries[2]["details"]["changes"] == {"description": {"before": "", "after": "nightly"}}
    assert all(e["host"] and e["namespace"] == namespace for e in entries)
    # the stored config names the console user as its editor
    assert ops.stored_config(JOB).by == "alice (console)"

    # the history database holds the same entries
    table = AuditTable(history_url)
    try:
        stored = table.read(namespace, JOB)
    finally:
        table.close()
    assert [e.id for e in stored] == [e["id"] for e in entries]
    assert stored[2].details["changes"]["description"]["after"] == "nightly"
    table = AuditTable(history_url)
    try:
        assert table.read("another-namespace", JOB) == []
    finally:
        table.close()


def test_a_viewer_reads_the_trail_and_nobody_edits_it(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster_job()
    wait_leader(ops)
    api = TestClient(client.app)
    assert api.post(f"/api/jobs/{JOB}/disable", headers=bearer(OPERATOR_TOKEN)).status_code == 200
    assert (
        api.post(f"/api/jobs/{JOB}/items/2/disable", headers=bearer(OPERATOR_TOKEN)).status_code
        == 200
    )

    login(client, BOB)  # a viewer
    page = client.get("/audit")
    assert page.status_code == 200
    assert '<a href="/audit">Audit</a>' in page.text
    rows = re.findall(r'class="audit-row outcome-ok"[^>]*data-action="([\w-]+)"', page.text)
    assert rows == ["disable-item", "disable-job"]
    assert "deploy-bot" in page.text and f"item 2 of {JOB}" in page.text
    assert '<form method="post"' not in page.text.split("<main>")[1].split("audit-filters")[0]

    one = client.get("/audit", params={"job": JOB, "since": "1h", "limit": "1"})
    assert re.findall(r'data-action="([\w-]+)"', one.text) == ["disable-item"]
    future = client.get("/audit", params={"since": "2999-01-01"})
    assert 'id="audit-empty"' in future.text

    bad = client.get("/audit", params={"since": "yesterday"})
    assert bad.status_code == 422 and 'id="audit-error"' in bad.text
    assert "&#39;yesterday&#39;" in bad.text and "ISO 8601" in bad.text
    bad_api = api.get("/api/audit", params={"since": "soon"}, headers=bearer(VIEWER_TOKEN))
    assert bad_api.status_code == 422 and "'soon'" in bad_api.json()["detail"]
    assert (
        api.get("/api/audit", params={"limit": "0"}, headers=bearer(VIEWER_TOKEN)).status_code
        == 422
    )

    # no tool route edits or deletes an entry, whatever the role
    for method in ("post", "put", "patch", "delete"):
        for url in ("/audit", "/api/audit"):
            answer = api.request(method.upper(), url, headers=bearer(OPERATOR_TOKEN))
            assert answer.status_code == 405, (method, url, answer.status_code)
    assert len(api.get("/api/audit", headers=bearer(VIEWER_TOKEN)).json()["entries"]) == 2


@pytest.fixture
def broken_db_client(store: CoordinationStore, auth: AuthConfig) -> Iterator[TestClient]:
    """A console whose history database cannot be written (its directory cannot be
    made): every audit entry fails there."""
    reader = HistoryReader("sqlite:////proc/no-such-dir/history.db")
    app = create_app(Operations(store), auth, history=reader, refresh_seconds=0)
    with TestClient(app) as c:
        yield c
    reader.close()


def test_an_entry_that_cannot_be_written_leaves_the_action_done(
    broken_db_client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster_job()
    wait_leader(ops)
    client = broken_db_client
    answer = client.post(f"/api/jobs/{JOB}/disable", headers=bearer(OPERATOR_TOKEN))
    assert answer.status_code == 200 and answer.json() == {"job": JOB, "enabled": False}
    warning = answer.headers[WARNING_HEADER]
    assert "disable-job on job rec" in warning and "AuditTable" in warning
    assert not ops.job(JOB).enabled
    # the registry's trail has it all the same
    assert [e.action for e in ops.audit(JOB)] == ["disable-job"]

    login(client, ALICE)
    shown = flash(post_form(client, f"/jobs/{JOB}/enable"))
    assert shown.startswith(f"job {JOB} enabled (warning: the action was done, but its audit")
    assert ops.job(JOB).enabled
    # a read sends no warning
    assert WARNING_HEADER not in client.get("/api/audit", headers=bearer(VIEWER_TOKEN)).headers
