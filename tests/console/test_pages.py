"""The pages and their forms through a TestClient against real stores and
in-process runtimes: login, roles, CSRF, every form, config errors by field."""

from __future__ import annotations

import html
import re

import pytest
from fastapi.testclient import TestClient

from shardkeeper.console.throttle import LoginThrottle
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.console.conftest import ALICE, BOB, JOB, Start, csrf_of, login, wait_idle, wait_leader

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


def flash(page: str) -> str:
    match = re.search(r'id="flash"[^>]*>([^<]*)<', page)
    return html.unescape(match.group(1)) if match else ""


def post(client: TestClient, url: str, **fields: str) -> str:
    """Post a form of the job page as the logged-in user; the page shown after it."""
    token = csrf_of(client.get(f"/jobs/{JOB}").text)
    response = client.post(url, data={"csrf": token, **fields})
    assert response.status_code == 200, response.text
    return response.text


def test_pages_need_a_login(client: TestClient, cluster_job: Start, ops: Operations) -> None:
    [rt] = cluster_job().runtimes
    wait_leader(ops)
    first = client.get(f"/jobs/{JOB}?item=1", follow_redirects=False)
    assert first.status_code == 303
    assert first.headers["location"] == f"/login?next=/jobs/{JOB}%3Fitem%3D1"

    form = client.get("/login?next=https://elsewhere.example/")
    assert 'name="next" value="/"' in form.text  # never sent to another site
    wrong = client.post(
        "/login", data={"username": "bob", "password": "nope", "csrf": csrf_of(form.text)}
    )
    assert wrong.status_code == 401 and "wrong user name or password" in wrong.text
    no_csrf = client.post("/login", data={"username": BOB[0], "password": BOB[1]})
    assert no_csrf.status_code == 403

    login(client, BOB)
    overview = client.get("/").text
    row = re.search(rf'<tr id="job-{JOB}">(.*?)</tr>', overview, re.S)
    assert row and rt.instance_id in row.group(1) and "health-" in row.group(1)
    assert rt.instance_id in client.get("/instances").text
    page = client.get(f"/jobs/{JOB}").text
    assert all(f'id="item-{i}"' in page for i in range(3))
    assert "Trigger now" not in page and "disable-item-" not in page  # a viewer's page
    assert client.get("/jobs/nope").status_code == 404

    assert (
        client.post("/logout", data={"csrf": csrf_of(page)}, follow_redirects=False).status_code
        == 303
    )
    assert client.get("/", follow_redirects=False).status_code == 303


def test_forms_need_an_operator_and_the_csrf_token(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster_job()
    wait_leader(ops)
    url = f"/jobs/{JOB}/disable"
    # another site's form: no session, no token
    assert client.post(url, follow_redirects=False).status_code == 303
    login(client, BOB)
    viewer = client.post(url, data={"csrf": csrf_of(client.get("/").text)})
    assert viewer.status_code == 403 and "operator" in viewer.text

    login(client, ALICE)
    assert client.post(url).status_code == 403
    assert client.post(url, data={"csrf": "forged"}).status_code == 403
    with TestClient(client.app) as other:  # a token of another session
        assert client.post(url, data={"csrf": csrf_of(other.get("/login").text)}).status_code == 403
    assert ops.job(JOB).enabled

    assert flash(post(client, url)) == f"job {JOB} disabled"
    assert not ops.job(JOB).enabled
    refused = post(client, f"/jobs/{JOB}/trigger")
    assert flash(refused).startswith("refused: job 'rec' is disabled")
    assert flash(post(client, f"/jobs/{JOB}/enable")) == f"job {JOB} enabled"
    assert ops.job(JOB).enabled


def test_item_switch_trigger_with_params_and_history(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster = cluster_job()
    wait_leader(ops)
    login(client, ALICE)

    shown = post(client, f"/jobs/{JOB}/trigger", params="batch=9\n\nregion = eu")
    assert "with 2 parameter(s)" in flash(shown)
    wait_idle(ops, cluster, 3)
    assert {tuple(sorted(p.items())) for _, p in cluster.jobs[0].runs()} == {
        (("batch", "9"), ("region", "eu"))
    }
    page = post(client, f"/jobs/{JOB}/items/1/disable")
    assert flash(page) == f"item 1 of {JOB} disabled"
    assert re.search(r'id="item-1" class="disabled"', page)
    post(client, f"/jobs/{JOB}/trigger")
    wait_idle(ops, cluster, 5)
    assert cluster.ran() == [0, 0, 1, 2, 2]

    def rows(query: str = "") -> list[str]:
        return re.findall(
            r'class="history-row[^"]*"[^>]*data-item="(\d+)"',
            client.get(f"/jobs/{JOB}{query}").text,
        )

    # 5 runs and item 1's part of the second request, recorded skipped naming the item
    wait_until(lambda: len(rows()) == 6, message=lambda: str(rows()))
    assert rows("?item=1") == ["1", "1"]
    skipped = re.findall(
        r'data-item="1" data-outcome="skipped">.*?<td class="error">([^<]*)',
        client.get(f"/jobs/{JOB}?item=1").text,
        re.S,
    )
    assert skipped == ["item disabled by an operator"]
    assert rows("?failed=1") == []
    assert "is not a whole number" in client.get(f"/jobs/{JOB}?item=x").text
    assert "Item" in client.get(f"/jobs/{JOB}?since=1h").text and len(rows("?since=1h")) == 6

    bad = post(client, f"/jobs/{JOB}/trigger", params="no equals sign")
    assert "is not name=value" in flash(bad)
    assert "out of range" in flash(post(client, f"/jobs/{JOB}/items/9/disable"))


def test_config_errors_are_shown_next_to_their_field(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    cluster_job()
    wait_leader(ops)
    login(client, ALICE)
    token = csrf_of(client.get(f"/jobs/{JOB}").text)
    url = f"/jobs/{JOB}/config"

    bad = client.post(
        url, data={"csrf": token, "sharding_total_count": "many", "cron": "61 * * * *"}
    )
    assert bad.status_code == 422
    errors = dict(re.findall(r'id="error-(\w+)">([^<]*)<', bad.text))
    assert set(errors) == {"sharding_total_count", "cron"}
    assert "&#39;many&#39;" in errors["sharding_total_count"]
    assert 'id="cfg-sharding_total_count" value="many"' in bad.text  # the input is kept
    assert ops.job(JOB).config["sharding_total_count"] == 3

    whole = client.post(url, data={"csrf": token, "cron": "", "interval": ""})
    assert whole.status_code == 422 and 'id="config-error"' in whole.text

    same = client.post(url, data={"csrf": token, "cron": "0 0 1 1 *"})
    assert flash(same.text) == "nothing changed"
    done = client.post(
        url, data={"csrf": token, "description": "nightly", "sharding_item_parameters": "0=x"}
    )
    assert flash(done.text) == f"config of {JOB} changed: description, sharding_item_parameters"
    assert "(operator) at" in re.sub(r"\s+", " ", done.text.split('id="config-written"')[1])
    assert ops.job(JOB).config["description"] == "nightly"
    assert [i.parameter for i in ops.job(JOB).items] == ["x", "", ""]


def test_instance_forms_shutdown_and_removal(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    a, b = cluster_job(2).runtimes
    wait_until(lambda: len(ops.job(JOB).instances) == 2, message="both instances joined")
    login(client, ALICE)
    token = csrf_of(client.get("/instances").text)

    def act(url: str, **fields: str) -> str:
        response = client.post(url, data={"csrf": token, "back": "/instances", **fields})
        assert response.status_code == 200, response.text
        return flash(response.text)

    assert act(f"/instances/{b.instance_id}/disable", job=JOB) == (
        f"instance {b.instance_id} disabled in {JOB}"
    )
    assert ops.job(JOB).disabled_instances == [b.instance_id]
    assert "enable</button>" in client.get("/instances").text
    assert act(f"/instances/{b.instance_id}/enable") == f"instance {b.instance_id} enabled in {JOB}"

    assert "stop them first" in flash(post(client, f"/jobs/{JOB}/remove"))
    assert 'id="remove-job"' not in client.get(f"/jobs/{JOB}").text
    for rt in (a, b):
        assert (
            act(f"/instances/{rt.instance_id}/shutdown") == f"asked {rt.instance_id} to shut down"
        )
    wait_until(lambda: not ops.job(JOB).instances, 30, message="members left")
    assert 'id="remove-job"' in client.get(f"/jobs/{JOB}").text
    removed = post(client, f"/jobs/{JOB}/remove")
    assert flash(removed) == f"job {JOB} removed" and "No job is registered" in removed


@pytest.mark.parametrize("backend", ["zookeeper"], ids=["zk"])
def test_password_guessing_is_slowed_down(client: TestClient) -> None:
    client.app.state.console.throttle = LoginThrottle(limit=3, window=60)  # type: ignore[attr-defined]
    token = csrf_of(client.get("/login").text)
    for _ in range(3):
        wrong = client.post("/login", data={"username": "bob", "password": "x", "csrf": token})
        assert wrong.status_code == 401
    right = client.post("/login", data={"username": BOB[0], "password": BOB[1], "csrf": token})
    assert right.status_code == 429 and "too many failed logins for &#39;bob&#39;" in right.text
    basic = client.get("/api/whoami", auth=BOB)
    assert basic.status_code == 429 and 0 < int(basic.headers["retry-after"]) <= 61
    login(client, ALICE)  # another name is not affected
    assert client.get("/api/whoami").json()["name"] == "alice"
