"""A job's secret setting (``alert_webhook_url``) on both real stores: a literal
webhook URL stored in a job's config is shown nowhere (the CLI's text and JSON, the
REST API, the console's pages, the log records of the whole test), a masked value
saved back keeps it, and an ``env:`` reference is stored as written and read by the
instance that sends the alert (one that cannot be read drops the alert, counted,
and the instance goes on)."""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errorhandlers import resolve_error_handler
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.cli.test_cli import cli, ok
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

pytestmark = pytest.mark.timeout(180)

TOKEN = "XyzT0kenS3cret"
HOOK = f"https://hooks.example.com/services/T0AAAA/B0BBBB/{TOKEN}"
SHOWN = "https://hooks.example.com/***"


def stored_hook(store: CoordinationStore, job: str = JOB) -> Any:
    """The alert_webhook_url the store holds for ``job``, read raw."""
    node = store.get(JobPaths(job).config)
    assert node is not None
    return json.loads(node.value)["alert_webhook_url"]


@pytest.fixture
def hooked(registry_url: str, store: CoordinationStore) -> Iterator[Runtime]:
    """A runtime running ``rec`` with a literal webhook URL, its leader elected."""
    rt = Runtime(registry_url, worker_threads=2, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(Recording(), rec_config(error_handler="webhook", alert_webhook_url=HOOK))
    rt.start()
    try:
        wait_until(lambda: Operations(store).job(JOB).leader, message="no leader elected")
        yield rt
    finally:
        rt.stop_now()


def test_the_cli_never_shows_a_literal_webhook_url(
    hooked: Runtime, registry_url: str, store: CoordinationStore
) -> None:
    assert stored_hook(store) == HOOK  # the instance stored it as written
    runs = {
        "job --json": cli("job", JOB, "--json", registry=registry_url),
        "job": cli("job", JOB, registry=registry_url),
        "config get": cli("config", "get", JOB, registry=registry_url),
        "config get --json": cli("config", "get", JOB, "--json", registry=registry_url),
        "dump --json": cli("dump", "--json", registry=registry_url),
        "config set": cli("config", "set", JOB, "description=one", registry=registry_url),
        # the masked value read back and written again: the secret stays
        "config set masked": cli(
            "config", "set", JOB, f"alert_webhook_url={SHOWN}", "description=two", "--json",
            registry=registry_url,
        ),
    }  # fmt: skip
    for what, run in runs.items():
        shown = ok(run) + run.stderr
        assert TOKEN not in shown, f"{what} shows the secret:\n{shown}"
    assert json.loads(runs["job --json"].stdout)["config"]["alert_webhook_url"] == SHOWN
    assert json.loads(runs["config get --json"].stdout)["alert_webhook_url"] == SHOWN
    assert SHOWN in runs["config get"].stdout and SHOWN in runs["dump --json"].stdout
    assert json.loads(runs["config set masked"].stdout)["description"] == "two"
    assert stored_hook(store) == HOOK
    # another secret's mask is refused, naming the field; the secret stays
    refused = cli(
        "config", "set", JOB, "alert_webhook_url=https://evil.example.com/***",
        registry=registry_url,
    )  # fmt: skip
    assert refused.returncode != 0 and "alert_webhook_url" in refused.stderr
    assert "masked value" in refused.stderr and TOKEN not in refused.stdout + refused.stderr
    assert stored_hook(store) == HOOK


def test_the_console_and_the_api_never_show_a_literal_webhook_url(
    hooked: Runtime, client: TestClient, store: CoordinationStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    login(client, ALICE)
    op = bearer(OPERATOR_TOKEN)
    answers = [client.get(p) for p in ("/", f"/jobs/{JOB}", "/instances")]
    answers += [client.get(f"/api/{p}", headers=op) for p in ("status", "jobs", f"jobs/{JOB}")]
    answers.append(client.get(f"/api/jobs/{JOB}/config", headers=op))
    page = answers[1].text
    assert answers[1].status_code == 200 and f'value="{SHOWN}"' in page
    assert answers[5].json()["config"]["alert_webhook_url"] == SHOWN
    assert answers[6].json()["config"]["alert_webhook_url"] == SHOWN

    # the editor saved as shown, with one field changed: the secret stays
    fields = dict(re.findall(r'<input name="([a-z_]+)" id="cfg-[a-z_]+" value="([^"]*)"', page))
    assert fields["alert_webhook_url"] == SHOWN
    form = {**fields, "description": "from the form", "csrf": csrf_of(page)}
    saved = client.post(f"/jobs/{JOB}/config", data=form, follow_redirects=False)
    assert saved.status_code == 303, saved.text
    assert stored_hook(store) == HOOK
    assert Operations(store).get_config(JOB).description == "from the form"
    # the API's PATCH with the masked value: kept; with another mask: refused
    patch = {"alert_webhook_url": SHOWN, "description": "from the api"}
    patched = client.patch(f"/api/jobs/{JOB}/config", json=patch, headers=op)
    assert patched.status_code == 200 and patched.json()["config"]["alert_webhook_url"] == SHOWN
    evil = {"alert_webhook_url": "https://evil.example.com/***"}
    refused = client.patch(f"/api/jobs/{JOB}/config", json=evil, headers=op)
    assert refused.status_code >= 400 and "masked value" in refused.text
    assert stored_hook(store) == HOOK
    answers += [saved, patched, refused, client.get(f"/jobs/{JOB}")]

    for answer in answers:
        assert TOKEN not in answer.text, f"{answer.request.method} {answer.request.url}"
    leaked = [r.getMessage() for r in caplog.records if TOKEN in r.getMessage()]
    assert not leaked, f"log records show the secret: {leaked[:3]}"


class Receiver:
    """A local webhook endpoint: the path of every POST it was sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list[str]:
        with self.lock:
            return list(self.paths)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


class FailsOne(ShardedJob):
    """Item 1 fails at every run; counts the runs of each item."""

    def __init__(self) -> None:
        self.runs: dict[int, int] = {}
        self.lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs[ctx.item] = self.runs.get(ctx.item, 0) + 1
        if ctx.item == 1:
            raise KeyError("order 42")

    def count(self, item: int) -> int:
        with self.lock:
            return self.runs.get(item, 0)


def alerting(name: str, url: str) -> JobConfig:
    return JobConfig.parse(
        name=name,
        interval=0.3,
        sharding_total_count=2,
        error_handler="webhook",
        alert_webhook_url=url,
    )


def test_an_env_reference_is_resolved_by_the_instance(
    registry_url: str,
    store: CoordinationStore,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tag = uuid.uuid4().hex[:8].upper()
    found, missing = f"SK_TEST_HOOK_{tag}", f"SK_TEST_NO_HOOK_{tag}"
    path = f"/services/T0/B0/{TOKEN}-{tag}"
    monkeypatch.setenv(found, f"http://127.0.0.1:{receiver.server.server_port}{path}")
    monkeypatch.delenv(missing, raising=False)
    good, bad = FailsOne(), FailsOne()
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(good, alerting("ref-found", f"env:{found}"))
    rt.add_job(bad, alerting("ref-missing", f"env:{missing}"))
    unsent = resolve_error_handler("webhook", alerting("ref-missing", f"env:{missing}"))
    with caplog.at_level(logging.ERROR, logger="shardkeeper.alerts.sender"), rt:
        wait_until(lambda: receiver.received(), 30, 0.05, "no alert reached the webhook")
        # the reference that cannot be read: the alert is dropped and counted...
        sender = getattr(unsent, "sender", None)
        assert sender is not None
        wait_until(lambda: sender.failed >= 1, 30, 0.05, "the unsendable alert was not counted")
        # ...and the instance goes on running that job's items
        runs = bad.count(0)
        wait_until(lambda: bad.count(0) >= runs + 2, 30, 0.05, "the job stopped running")
    assert set(receiver.received()) == {path}  # the resolved URL, nothing else
    assert sender.sent == 0
    # stored as written, and shown as written (a reference is not a secret)
    assert stored_hook(store, "ref-found") == f"env:{found}"
    assert Operations(store).job("ref-missing").config["alert_webhook_url"] == f"env:{missing}"
    logged = [r.getMessage() for r in caplog.records if "ref-missing" in r.getMessage()]
    assert any(f"alert_webhook_url: secret reference 'env:{missing}'" in m for m in logged)
    assert any(f"the environment variable {missing} is not set" in m for m in logged)
