"""Alerts: the webhook and email error handlers against servers the tests start, and
skipped triggers delivered to listeners."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from shardkeeper.alerts import Alert, AlertSender, SmtpSettings, email_handler
from shardkeeper.alerts.webhook import WebhookTransport
from shardkeeper.config import JobConfig
from shardkeeper.errorhandlers import resolve_error_handler
from shardkeeper.errors import ConfigError, JobConfigError
from shardkeeper.job import JobListener, ShardedJob, ShardingContext
from shardkeeper.observe import SkipRecord
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import free_ports

pytestmark = pytest.mark.timeout(120)


class Hook:
    """A local HTTP endpoint: records POSTed JSON bodies; answers with the statuses in
    ``replies`` (then 200), or holds each request until ``release`` is set."""

    def __init__(self, replies: list[int] | None = None, *, hang: bool = False) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.requests = 0
        self.replies = list(replies or [])
        self.hang = hang
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(size))
                with lock:
                    hook.requests += 1
                    status = hook.replies.pop(0) if hook.replies else 200
                if hook.hang:
                    hook.release.wait(30)
                    return
                if status == 200:
                    with lock:
                        hook.bodies.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def failure() -> KeyError:
    try:
        raise KeyError("order 42")
    except KeyError as exc:
        return exc


class Broken(ShardedJob):
    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise KeyError("order 42")


def test_a_failed_item_is_posted_to_the_webhook(registry_url: str, hook: Hook) -> None:
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(
        Broken(),
        JobConfig(
            name="hooked",
            interval=0.3,
            sharding_total_count=2,
            error_handler="webhook",
            alert_webhook_url=hook.url,
        ),
    )
    with rt:
        wait_until(lambda: hook.bodies, 20, 0.05, "no alert posted")
    body = hook.bodies[0]
    assert "'hooked' item 1 failed" in body["text"] and "KeyError" in body["text"]
    fields = body["shardkeeper"]
    assert fields["job"] == "hooked" and fields["item"] == 1
    assert fields["error_type"] == "KeyError" and "order 42" in fields["error"]
    assert "Traceback" in fields["traceback"] and "raise KeyError" in fields["traceback"]
    assert all(b["shardkeeper"]["item"] == 1 for b in hook.bodies)  # item 0 never alerts


def test_a_failing_endpoint_is_retried_with_backoff() -> None:
    hook = Hook([500, 503])
    try:
        sender = AlertSender(WebhookTransport(hook.url, timeout=2), name="t", backoff=0.05)
        assert sender.submit(Alert.of("j", 3, failure()))
        wait_until(lambda: sender.sent == 1, 10, 0.02, "not delivered after the retries")
        assert hook.requests == 3 and len(hook.bodies) == 1 and sender.failed == 0
        sender.close()
    finally:
        hook.close()


def test_a_refused_request_is_not_retried() -> None:
    hook = Hook([400])
    try:
        sender = AlertSender(WebhookTransport(hook.url, timeout=2), name="t", backoff=0.05)
        sender.submit(Alert.of("j", 3, failure()))
        wait_until(lambda: sender.failed == 1, 10, 0.02, "not given up")
        assert hook.requests == 1 and sender.sent == 0
        sender.close()
    finally:
        hook.close()


def test_a_hanging_endpoint_never_blocks_the_worker() -> None:
    hook = Hook(hang=True)
    try:
        sender = AlertSender(
            WebhookTransport(hook.url, timeout=0.5), name="t", backoff=0.05, queue_size=3
        )
        from shardkeeper.alerts import AlertHandler

        handler = AlertHandler(sender)
        began = time.monotonic()
        for item in range(20):
            handler("j", item, failure())
        elapsed = time.monotonic() - began
        # twenty failures reported while the endpoint hangs: no call waited for it
        assert elapsed < 0.5, elapsed
        wait_until(lambda: hook.requests >= 1, 10, 0.02, "nothing sent")
        # one in flight, three queued, the rest dropped (counted, never blocking)
        assert sender.dropped >= 20 - 1 - 3 and sender.pending() <= 3
    finally:
        hook.close()


class Mailbox:
    """aiosmtpd handler keeping every message."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], str]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(
            (envelope.mail_from, list(envelope.rcpt_tos), envelope.content.decode())
        )
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp() -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox()
    (port,) = free_ports(1)  # aiosmtpd cannot bind port 0 (it probes the port it got)
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


def test_a_failed_item_is_mailed(smtp: tuple[Mailbox, int]) -> None:
    box, port = smtp
    settings = SmtpSettings(host="127.0.0.1", port=port, sender="jobs@example.org")
    handler = email_handler(["ops@example.org", "dev@example.org"], settings)
    handler("mailed", 4, failure())
    wait_until(lambda: box.messages, 10, 0.02, "no mail")
    mail_from, to, content = box.messages[0]
    assert mail_from == "jobs@example.org"
    assert to == ["ops@example.org", "dev@example.org"]
    assert "Subject: [shardkeeper] job mailed item 4 failed: KeyError" in content
    assert "order 42" in content and "Traceback" in content


def test_email_alerts_from_a_runtime_use_the_smtp_environment(
    registry_url: str, smtp: tuple[Mailbox, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    box, port = smtp
    monkeypatch.setenv("SHARDKEEPER_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("SHARDKEEPER_SMTP_PORT", str(port))
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(
        Broken(),
        # parse: the recipients as a file or the command line gives them, one string
        JobConfig.parse(
            name="mailing",
            interval=0.3,
            sharding_total_count=2,
            error_handler="email",
            alert_email_to="ops@example.org, dev@example.org",
        ),
    )
    with rt:
        wait_until(lambda: box.messages, 20, 0.05, "no mail from the runtime")
    assert "job mailing item 1 failed" in box.messages[0][2]


def test_alert_settings_are_validated_naming_the_value() -> None:
    with pytest.raises(JobConfigError, match="needs alert_webhook_url"):
        JobConfig.parse(name="a", interval=1, sharding_total_count=1, error_handler="webhook")
    # the value may be a secret: quoted masked (its host only)
    with pytest.raises(JobConfigError, match=r"'ftp://x/\*\*\*' is not an http"):
        JobConfig.parse(name="a", interval=1, sharding_total_count=1, alert_webhook_url="ftp://x/y")
    with pytest.raises(JobConfigError, match="needs alert_email_to"):
        JobConfig.parse(name="a", interval=1, sharding_total_count=1, error_handler="email")
    with pytest.raises(JobConfigError, match="'ops at example' is not an email"):
        JobConfig.parse(
            name="a", interval=1, sharding_total_count=1, alert_email_to=["ops at example"]
        )
    cfg = JobConfig.parse(
        name="a", interval=1, sharding_total_count=1, alert_email_to="a@x.org, b@y.org"
    )
    assert cfg.alert_email_to == ("a@x.org", "b@y.org")
    assert JobConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(JobConfigError, match="alert_webhook_url"):
        resolve_error_handler("webhook")
    with pytest.raises(ConfigError, match="SHARDKEEPER_SMTP_PORT='smtp'"):
        SmtpSettings.from_env({"SHARDKEEPER_SMTP_PORT": "smtp"})
    with pytest.raises(ConfigError, match="70000"):
        SmtpSettings.from_env({"SHARDKEEPER_SMTP_PORT": "70000"})
    with pytest.raises(ConfigError, match="STARTTLS='maybe'"):
        SmtpSettings.from_env({"SHARDKEEPER_SMTP_STARTTLS": "maybe"})
    secret = SmtpSettings(user="u", password="hunter2")
    assert "hunter2" not in repr(secret)


class Skips(JobListener):
    def __init__(self) -> None:
        self.events: list[SkipRecord] = []

    def on_skipped(self, event: SkipRecord) -> None:
        self.events.append(event)


def test_listeners_get_an_event_when_a_trigger_does_not_run(registry_url: str) -> None:
    listener = Skips()
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(
        Broken(),
        JobConfig(name="off", interval=0.2, sharding_total_count=2, disabled=True),
        listeners=[listener],
    )
    with rt:
        wait_until(lambda: len(listener.events) >= 2, 20, 0.05, "no skipped event")
    event = listener.events[0]
    assert event.job == "off" and event.reason == "job disabled"
    assert event.fire_time > 0 and event.instance == rt.instance_id


def test_a_fire_the_scheduler_missed_reaches_listeners_and_metrics(registry_url: str) -> None:
    """With misfire off, a fire delivered later than the grace time is dropped by the
    scheduler (APScheduler's EVENT_JOB_MISSED): listeners and metrics hear of it."""
    from datetime import UTC, datetime, timedelta

    from shardkeeper.scheduling.scheduler import MISFIRE_GRACE_SECONDS, _Fire

    listener = Skips()
    rt = Runtime(registry_url, shutdown_grace=2, metrics_port=0)
    rt.add_job(
        Broken(),
        JobConfig(name="late", cron="0 0 1 1 *", sharding_total_count=1, misfire=False),
        listeners=[listener],
    )
    with rt:
        late = datetime.now(UTC) - timedelta(seconds=MISFIRE_GRACE_SECONDS + 5)
        # the scheduler's delivery step, as its thread runs it for a late fire
        assert rt._scheduler is not None
        rt._scheduler._deliver(_Fire("late", [late], MISFIRE_GRACE_SECONDS, False))
        assert [e.reason for e in listener.events] == [
            "missed by the scheduler (later than the grace time, misfire off)"
        ]
        assert listener.events[0].fire_time == pytest.approx(late.timestamp())
        assert rt.runners["late"].stats["skipped"] == 1
        assert rt.metrics is not None
        sample = rt.metrics.registry.get_sample_value(
            "shardkeeper_skipped_triggers_total", {"job": "late", "reason": "missed"}
        )
        assert sample == 1.0
