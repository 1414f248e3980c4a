"""Secret-valued settings without a server: ``env:``/``file:`` references (checked,
resolved, refused with a message naming the setting, the reference and what is
missing), the masks, the job config's secret field (stored as written, masked in
every view, a masked value written back keeping the secret), and the settings of
the alert transports, the history database and the registry."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.alerts import Alert, AlertSender, SmtpSettings
from shardkeeper.alerts.sender import SendError
from shardkeeper.alerts.smtp import EmailTransport
from shardkeeper.alerts.webhook import WebhookTransport
from shardkeeper.config import JobConfig
from shardkeeper.config.secrets import (
    mask_config_data,
    mask_config_text,
    mask_value,
    restore_masked,
)
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import JobConfigError, SecretReferenceError
from shardkeeper.history.url import display_url, resolve_url
from shardkeeper.ops import Operations, config_to_dict
from shardkeeper.registry import CoordinationStore, open_store
from shardkeeper.registry.url import parse_registry_url
from shardkeeper.secretref import (
    check_reference,
    is_masked,
    is_reference,
    mask_url_password,
    mask_urls_in_text,
    mask_webhook_url,
    resolve_secret,
)
from shardkeeper.testing.faults import wait_until

HOOK = "https://hooks.example.com/services/T0SECRET/B0SECRET/tok3nSecret"
TOKEN = "tok3nSecret"
SHOWN = "https://hooks.example.com/***"


def failure() -> KeyError:
    try:
        raise KeyError("order 42")
    except KeyError as exc:
        return exc


# ---- references ------------------------------------------------------------------------


def test_a_literal_is_its_own_secret() -> None:
    assert resolve_secret("s", HOOK, env={}) == HOOK
    assert not is_reference(HOOK) and is_reference("env:X") and is_reference("file:/x")


def test_an_env_reference_reads_the_variable() -> None:
    assert resolve_secret("s", "env:HOOK_URL", env={"HOOK_URL": HOOK}) == HOOK


@pytest.mark.parametrize(
    ("env", "missing"),
    [({}, "HOOK_URL is not set on this instance"), ({"HOOK_URL": " "}, "HOOK_URL is empty")],
)
def test_an_env_reference_that_cannot_be_read_names_all(env: dict[str, str], missing: str) -> None:
    with pytest.raises(SecretReferenceError) as caught:
        resolve_secret("alert_webhook_url", "env:HOOK_URL", env=env)
    err = caught.value
    assert (err.setting, err.reference) == ("alert_webhook_url", "env:HOOK_URL")
    assert missing in err.missing
    assert str(err).startswith("alert_webhook_url: secret reference 'env:HOOK_URL'")


def test_a_file_reference_reads_the_file_without_its_line_break(tmp_path: Path) -> None:
    secret = tmp_path / "hook"
    secret.write_text(HOOK + "\n")
    assert resolve_secret("s", f"file:{secret}") == HOOK
    secret.write_text("rotated\r\n")  # read each time: a rotated file is picked up
    assert resolve_secret("s", f"file:{secret}") == "rotated"


@pytest.mark.parametrize(
    ("content", "missing"),
    [
        (None, "does not exist on this instance"),
        ("\n", "is empty"),
        (b"\xff\xfe", "is not UTF-8 text"),
        ("x" * 70_000, "is larger than"),
    ],
)
def test_a_file_reference_that_cannot_be_read_names_all(
    tmp_path: Path, content: str | bytes | None, missing: str
) -> None:
    path = tmp_path / "secret"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(SecretReferenceError) as caught:
        resolve_secret("SHARDKEEPER_SMTP_PASSWORD", f"file:{path}")
    assert caught.value.setting == "SHARDKEEPER_SMTP_PASSWORD"
    assert caught.value.reference == f"file:{path}" and str(path) in caught.value.missing
    assert missing in caught.value.missing


def test_an_unreadable_file_says_why(tmp_path: Path) -> None:
    """A path that exists but cannot be read as a file (a directory: unreadable for
    root too, where a chmod 0 file is not) names the file and the OS's reason."""
    path = tmp_path / "secret"
    path.mkdir()
    with pytest.raises(SecretReferenceError, match="cannot be read") as caught:
        resolve_secret("s", f"file:{path}")
    assert str(path) in caught.value.missing
    assert "Is a directory" in caught.value.missing


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("env:", "'' is not an environment variable name"),
        ("env:9LIVES", "'9LIVES' is not an environment variable name"),
        ("env:A-B", "is not an environment variable name"),
        ("file:", "'' is not an absolute path"),
        ("file:secrets/hook", "'secrets/hook' is not an absolute path"),
    ],
)
def test_a_malformed_reference_is_refused(value: str, fragment: str) -> None:
    with pytest.raises(SecretReferenceError, match=fragment):
        check_reference("alert_webhook_url", value)
    with pytest.raises(SecretReferenceError, match=fragment):
        resolve_secret("alert_webhook_url", value, env={})


# ---- masks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (HOOK, SHOWN),
        ("https://hooks.example.com/x?token=abc", SHOWN),
        ("https://hooks.example.com?token=abc", SHOWN),
        ("http://user:pw@10.0.0.1:8080/hook", "http://***@10.0.0.1:8080/***"),
        ("http://[::1]:9000/t/s", "http://[::1]:9000/***"),
        ("https://hooks.example.com", "https://hooks.example.com"),
        ("https://hooks.example.com/", "https://hooks.example.com"),
        ("env:HOOK_URL", "env:HOOK_URL"),
        ("file:/run/secrets/hook", "file:/run/secrets/hook"),
        ("not a url at all", "***"),
    ],
)
def test_a_webhook_url_keeps_its_host_only(url: str, shown: str) -> None:
    assert mask_webhook_url(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://jobs:s3cret@db/jobs", "postgresql://jobs:***@db/jobs"),
        (
            "zk://u@h:2181/ns?password=s3cret&session_timeout=2",
            "zk://u@h:2181/ns?password=***&session_timeout=2",
        ),
        ("etcd://h/ns?token=abc", "etcd://h/ns?token=***"),
        ("zk://h:2181/ns", "zk://h:2181/ns"),
        ("file:/run/secrets/registry", "file:/run/secrets/registry"),
    ],
)
def test_a_url_password_is_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert mask_url_password(url) == shown


def test_urls_in_free_text_are_masked() -> None:
    text = f"alert_webhook_url {HOOK!r} failed; see http://docs.example.org/a/b"
    masked = mask_urls_in_text(text)
    assert TOKEN not in masked and SHOWN in masked
    assert "http://docs.example.org/***" in masked
    assert is_masked(masked) and not is_masked(HOOK)


# ---- the job config --------------------------------------------------------------------


def hooked(url: str = HOOK, **changes: Any) -> JobConfig:
    base: dict[str, Any] = {
        "name": "hooked",
        "interval": 60,
        "sharding_total_count": 2,
        "error_handler": "webhook",
        "alert_webhook_url": url,
    }
    return JobConfig.parse(**{**base, **changes})


@pytest.mark.parametrize("ref", ["env:ALERT_HOOK", "file:/run/secrets/alert-hook"])
def test_a_reference_is_stored_as_written(ref: str) -> None:
    config = hooked(ref)
    assert config.alert_webhook_url == ref
    assert json.loads(config.to_json())["alert_webhook_url"] == ref
    assert config_to_dict(config)["alert_webhook_url"] == ref  # a reference is shown


def test_a_malformed_reference_in_a_config_names_the_field() -> None:
    with pytest.raises(JobConfigError, match="alert_webhook_url: secret reference 'env:9x'"):
        hooked("env:9x")


def test_an_invalid_literal_is_reported_masked() -> None:
    with pytest.raises(JobConfigError) as caught:
        hooked("ftp://files.example.com/drop/tok3nSecret")
    assert "ftp://files.example.com/***" in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_a_config_never_shows_a_literal_secret() -> None:
    config = hooked()
    for shown in (repr(config), str(config), json.dumps(config_to_dict(config))):
        assert TOKEN not in shown and SHOWN in shown
    assert config.alert_webhook_url == HOOK  # the real value is the instance's
    assert config_to_dict(config, reveal=True)["alert_webhook_url"] == HOOK
    assert mask_value("description", HOOK) == HOOK  # only secret fields are masked


def test_a_stored_document_is_masked_including_the_operator_edits() -> None:
    doc = {
        "alert_webhook_url": HOOK,
        "name": "hooked",
        "_meta": {"edits": {"alert_webhook_url": {"code": HOOK}, "cron": {"code": "* * * * *"}}},
    }
    masked = mask_config_data(doc)
    assert TOKEN not in json.dumps(masked)
    assert masked["_meta"]["edits"]["alert_webhook_url"] == {"code": SHOWN}
    assert masked["_meta"]["edits"]["cron"] == {"code": "* * * * *"}
    assert TOKEN not in mask_config_text(json.dumps(doc))
    # shown as stored where it can be: the layout kept, nothing secret untouched
    laid_out = json.dumps(doc, indent=2)
    assert mask_config_text(laid_out) == laid_out.replace(HOOK, SHOWN)
    plain = '{ "name": "hooked",  "sharding_total_count": "lots" }'
    assert mask_config_text(plain) == plain
    corrupt = '{"alert_webhook_url": "' + HOOK + '", '  # no JSON: its URLs masked
    assert TOKEN not in mask_config_text(corrupt) and SHOWN in mask_config_text(corrupt)


def test_a_masked_value_written_back_keeps_the_secret() -> None:
    current = {"alert_webhook_url": HOOK, "description": ""}
    kept = restore_masked(current, {"alert_webhook_url": SHOWN, "description": "x"})
    assert kept == {"alert_webhook_url": HOOK, "description": "x"}
    fresh = restore_masked(current, {"alert_webhook_url": "env:NEW_HOOK"})
    assert fresh["alert_webhook_url"] == "env:NEW_HOOK"


@pytest.mark.parametrize(
    "current", [{"alert_webhook_url": "https://other.example.com/a"}, {"alert_webhook_url": None}]
)
def test_a_mask_of_another_secret_is_refused(current: dict[str, Any]) -> None:
    with pytest.raises(JobConfigError, match=r"alert_webhook_url: .* is a masked value"):
        restore_masked(current, {"alert_webhook_url": SHOWN})


@pytest.fixture
def memory_store() -> Iterator[CoordinationStore]:
    store = open_store(f"memory://secrets-{os.getpid()}/ns")
    store.start()
    yield store
    store.close()


def test_operator_edits_keep_the_secret_and_views_mask_it(memory_store: CoordinationStore) -> None:
    configs = ConfigService(memory_store, JobPaths("hooked"))
    configs.sync(hooked())
    ops = Operations(memory_store)
    # every view of the ops API
    assert ops.job("hooked").config["alert_webhook_url"] == SHOWN
    stored = ops.stored_config("hooked")
    assert stored.config is not None and TOKEN not in stored.text
    assert config_to_dict(stored.config)["alert_webhook_url"] == SHOWN
    dumped = ops.dump("/")
    assert any(SHOWN in e.value for e in dumped.values())
    assert not any(TOKEN in e.value for e in dumped.values())
    # the masked value sent back (a form saved as shown) keeps the secret
    ops.update_config("hooked", alert_webhook_url=SHOWN, description="edited")
    new = ops.get_config("hooked")
    assert (new.alert_webhook_url, new.description) == (HOOK, "edited")
    ops.replace_config("hooked", hooked(SHOWN, description="replaced"))
    assert ops.get_config("hooked").alert_webhook_url == HOOK
    assert ops.get_config("hooked").description == "replaced"
    # a masked value that is not the stored one's is refused, the secret stays
    with pytest.raises(JobConfigError, match="is a masked value"):
        ops.update_config("hooked", alert_webhook_url="https://evil.example.com/***")
    assert ops.get_config("hooked").alert_webhook_url == HOOK
    # an operator's edits record the code's value: masked in every view too
    ops.update_config("hooked", alert_webhook_url="env:ALERT_HOOK")
    assert ops.get_config("hooked").alert_webhook_url == "env:ALERT_HOOK"
    assert ops.job("hooked").config["alert_webhook_url"] == "env:ALERT_HOOK"
    assert not any(TOKEN in e.value for e in ops.dump("/").values())
    assert TOKEN not in json.dumps(ops.stored_config("hooked").edits)


def test_a_corrupt_document_is_shown_masked(memory_store: CoordinationStore) -> None:
    ConfigService(memory_store, JobPaths("hooked")).sync(hooked())
    memory_store.put(JobPaths("hooked").config, f'{{"alert_webhook_url": "{HOOK}"'.encode())
    ops = Operations(memory_store)
    stored = ops.stored_config("hooked")
    assert stored.config is None and stored.error
    assert TOKEN not in stored.text and SHOWN in stored.text
    assert not any(TOKEN in e.value for e in ops.dump("/").values())


# ---- the alert transports --------------------------------------------------------------


class Hook:
    """A local endpoint recording the path of each POST."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                hook.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()
    h.server.server_close()


def test_the_webhook_transport_reads_a_reference_at_each_send(
    hook: Hook, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SK_TEST_HOOK", hook.url("/services/first-tok3nSecret"))
    transport = WebhookTransport("env:SK_TEST_HOOK", timeout=5)
    with caplog.at_level(logging.INFO, logger="httpx"):
        transport(Alert.of("j", 1, failure()))
        monkeypatch.setenv("SK_TEST_HOOK", hook.url("/services/second-tok3nSecret"))
        transport(Alert.of("j", 1, failure()))
    assert hook.paths == ["/services/first-tok3nSecret", "/services/second-tok3nSecret"]
    # httpx logs each request's URL: the token never reaches a record
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)
    assert not any(TOKEN in r.getMessage() for r in caplog.records)


def test_an_unreadable_webhook_reference_drops_the_alert_counted_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SK_TEST_NO_HOOK", raising=False)
    transport = WebhookTransport("env:SK_TEST_NO_HOOK", timeout=5)
    with pytest.raises(SendError) as caught:
        transport(Alert.of("j", 1, failure()))
    assert not caught.value.retry  # reading it again later would not help this alert
    sender = AlertSender(transport, name="t-ref", backoff=0.01)
    with caplog.at_level(logging.ERROR, logger="shardkeeper.alerts.sender"):
        assert sender.submit(Alert.of("j", 1, failure()))
        wait_until(lambda: sender.failed == 1, 10, 0.02, "the failed send was not counted")
    sender.close()
    assert sender.sent == 0
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "alert_webhook_url" in logged and "env:SK_TEST_NO_HOOK" in logged
    assert "SK_TEST_NO_HOOK is not set" in logged


def test_a_webhook_reference_to_no_url_is_refused_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SK_TEST_HOOK", "ftp://files.example.com/tok3nSecret")
    with pytest.raises(SendError) as caught:
        WebhookTransport("env:SK_TEST_HOOK")(Alert.of("j", 1, failure()))
    assert "ftp://files.example.com/***" in str(caught.value) and TOKEN not in str(caught.value)
    assert not caught.value.retry


def test_a_failed_post_names_the_host_not_the_token() -> None:
    with pytest.raises(SendError) as caught:
        WebhookTransport("http://127.0.0.1:1/services/tok3nSecret", timeout=2)(
            Alert.of("j", 1, failure())
        )
    assert "http://127.0.0.1:1/***" in str(caught.value) and TOKEN not in str(caught.value)


def test_the_smtp_password_may_be_a_file_read_when_sending(tmp_path: Path) -> None:
    settings = SmtpSettings.from_env(
        {
            "SHARDKEEPER_SMTP_PORT": "1",
            "SHARDKEEPER_SMTP_USER": "alerts",
            "SHARDKEEPER_SMTP_PASSWORD": f"file:{tmp_path / 'smtp'}",
        }
    )
    assert settings.password == f"file:{tmp_path / 'smtp'}"  # kept as written
    with pytest.raises(SendError) as caught:
        EmailTransport(["ops@example.com"], settings)(Alert.of("j", 1, failure()))
    assert not caught.value.retry
    assert "SHARDKEEPER_SMTP_PASSWORD: secret reference" in str(caught.value)
    assert "does not exist on this instance" in str(caught.value)
    (tmp_path / "smtp").write_text("s3cret\n")
    with pytest.raises(SendError) as caught:  # read now: on to the (absent) server
        EmailTransport(["ops@example.com"], settings)(Alert.of("j", 1, failure()))
    assert "SMTP localhost:1" in str(caught.value) and caught.value.retry


def test_a_malformed_smtp_password_reference_is_refused_at_once() -> None:
    with pytest.raises(SecretReferenceError, match="SHARDKEEPER_SMTP_PASSWORD"):
        SmtpSettings(user="alerts", password="file:relative/path")


# ---- the history database and the registry ---------------------------------------------


def test_history_url_references(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SK_TEST_PG", "pg-s3cret")
    whole = tmp_path / "history-url"
    whole.write_text("postgresql://jobs:pg-s3cret@db.example.com/jobs\n")
    for value in (
        "postgresql://jobs:env:SK_TEST_PG@db.example.com/jobs",
        "postgresql://jobs@db.example.com/jobs?password=env:SK_TEST_PG",
        f"file:{whole}",
    ):
        url = resolve_url(value)
        assert url is not None and url.password == "pg-s3cret" and url.host == "db.example.com"
        assert "password" not in url.query
        assert display_url(url) == "postgresql+psycopg://jobs:***@db.example.com/jobs"
    with pytest.raises(SecretReferenceError) as caught:
        resolve_url("env:SK_TEST_NO_HISTORY")
    assert caught.value.setting == "history_url"
    with pytest.raises(SecretReferenceError) as caught:
        resolve_url("postgresql://jobs:env:SK_TEST_NO_PG@db.example.com/jobs")
    assert caught.value.setting == "history_url password"
    assert "SK_TEST_NO_PG is not set" in str(caught.value)


def test_registry_url_references(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SK_TEST_ZK", "zk-s3cret")
    secret = tmp_path / "zk"
    secret.write_text("zk-s3cret\n")
    for url in (
        "zk://user:env:SK_TEST_ZK@zk1:2181/ns",
        "zk://user@zk1:2181/ns?password=env:SK_TEST_ZK",
        f"zk://user@zk1:2181/ns?password=file:{secret}",
    ):
        settings = parse_registry_url(url)
        assert (settings.username, settings.password) == ("user", "zk-s3cret")
        assert "zk-s3cret" not in repr(settings) and "zk-s3cret" not in settings.url()
    whole = tmp_path / "registry-url"
    whole.write_text("etcd://user:etcd-s3cret@etcd1:2379/shop\n")
    monkeypatch.setenv("SK_TEST_REGISTRY", "zk://zk1:2181/from-env")
    assert parse_registry_url(f"file:{whole}").password == "etcd-s3cret"
    assert parse_registry_url("env:SK_TEST_REGISTRY").namespace == "from-env"
    with pytest.raises(SecretReferenceError) as caught:
        parse_registry_url("zk://user@zk1:2181/ns?password=env:SK_TEST_NO_ZK")
    assert caught.value.setting == "registry URL password"
    assert caught.value.reference == "env:SK_TEST_NO_ZK"
    with pytest.raises(SecretReferenceError, match="registry URL: secret reference 'file:"):
        parse_registry_url(f"file:{tmp_path / 'absent'}")
