"""The audit trail on the MemoryStore: entries, the bounded list, the order of action
and entry, outcomes, secrets, and ``--since`` parsing.

The same behaviour on ZooKeeper and etcd, through the real CLI and console, is in
tests/cli/test_audit_cli.py and tests/console/test_audit_console.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import encode_document
from shardkeeper.coordination.paths import (
    AUDIT,
    JobPaths,
    Unknown,
    audit_job_root,
    audit_namespace_root,
    is_high_churn,
    parse,
)
from shardkeeper.errors import (
    ConfigError,
    JobLookupError,
    OperationRefusedError,
    StoreUnavailableError,
)
from shardkeeper.ops import Operations
from shardkeeper.ops.audit import (
    Actor,
    AuditEntry,
    config_changes,
    new_entry_id,
    parse_since,
)
from shardkeeper.ops.auditlog import RegistryAuditLog
from shardkeeper.registry.memory import MemoryServer, MemoryStore

JOB = "audited"
ALICE = Actor("alice", "console", "10.0.0.7")


def _config(**changes: object) -> JobConfig:
    base: dict[str, object] = {"name": JOB, "cron": "0 0 1 1 *", "sharding_total_count": 4}
    return JobConfig.parse(**{**base, **changes})


@pytest.fixture
def store(memory_server: MemoryServer) -> Iterator[MemoryStore]:
    s = MemoryStore(memory_server, namespace="audit-unit")
    s.start()
    s.put(JobPaths(JOB).config, encode_document(_config(), writer="instance", by="t", revision=1))
    yield s
    s.close()


@pytest.fixture
def ops(store: MemoryStore) -> Operations:
    return Operations(store)


class FailingSink:
    """A sink whose every write fails, as a database that is down."""

    def __init__(self) -> None:
        self.calls = 0

    def write(self, entry: AuditEntry) -> None:
        self.calls += 1
        raise StoreUnavailableError("the audit database is down")


class ListSink:
    """A sink keeping what it is given."""

    def __init__(self) -> None:
        self.entries: list[AuditEntry] = []

    def write(self, entry: AuditEntry) -> None:
        self.entries.append(entry)


def test_an_action_is_recorded_with_who_what_target_and_outcome(ops: Operations) -> None:
    before = datetime.now(UTC).timestamp()
    ops.audited(ALICE).disable_item(JOB, 2)
    (entry,) = ops.audit(JOB)
    assert (entry.who, entry.via, entry.host) == ("alice", "console", "10.0.0.7")
    assert (entry.action, entry.job, entry.item, entry.outcome) == ("disable-item", JOB, 2, "ok")
    assert entry.namespace == "audit-unit" and entry.target == f"item 2 of {JOB}"
    assert before <= entry.at <= datetime.now(UTC).timestamp()
    assert ops.job(JOB).items[2].disabled


def test_config_edits_record_before_and_after_with_secrets_masked(ops: Operations) -> None:
    writer = ops.audited(ALICE)
    writer.update_config(JOB, sharding_total_count=6, alert_webhook_url="https://hooks/T0/SECRET")
    (entry,) = ops.audit(JOB)
    assert entry.action == "config-set" and entry.outcome == "ok"
    changes = entry.details["changes"]
    assert changes["sharding_total_count"] == {"before": 4, "after": 6}
    assert changes["alert_webhook_url"] == {"before": None, "after": "https://hooks/***"}
    assert "SECRET" not in json.dumps(entry.to_dict())
    assert set(changes) == {"sharding_total_count", "alert_webhook_url"}
    # the stored document names the console user as the editor
    assert ops.stored_config(JOB).by == "alice (console)"

    new, old = writer.replace_config(JOB, _config(sharding_total_count=2, description="d"))
    assert old is not None and old.sharding_total_count == 6 and new.sharding_total_count == 2
    latest = ops.audit(JOB)[0]
    assert latest.action == "config-replace"
    assert latest.details["changes"]["sharding_total_count"] == {"before": 6, "after": 2}
    assert latest.details["changes"]["description"] == {"before": "", "after": "d"}


def test_a_changed_secret_is_recorded_although_both_values_mask_alike() -> None:
    changes = config_changes(
        {"alert_webhook_url": "https://h/a"}, {"alert_webhook_url": "https://h/b"}
    )
    assert changes == {"alert_webhook_url": {"before": "https://h/***", "after": "https://h/***"}}
    # a reference names no secret: kept as it is
    ref = config_changes({"alert_webhook_url": None}, {"alert_webhook_url": "env:HOOK"})
    assert ref == {"alert_webhook_url": {"before": None, "after": "env:HOOK"}}


def test_long_values_are_cut() -> None:
    changes = config_changes({"job_parameter": ""}, {"job_parameter": "x" * 5000})
    after = changes["job_parameter"]["after"]
    assert isinstance(after, str) and len(after) < 1100 and after.endswith("(5002 characters)")


def test_refused_actions_are_recorded_and_bad_input_is_not(ops: Operations) -> None:
    writer = ops.audited(ALICE)
    with pytest.raises(OperationRefusedError):
        writer.trigger(JOB)  # no live instance
    (entry,) = ops.audit(JOB)
    assert entry.outcome == "refused" and "no live instance" in entry.error
    with pytest.raises(JobLookupError):
        writer.disable_job("no-such-job")
    with pytest.raises(ConfigError):
        writer.disable_item(JOB, 99)  # out of range: nothing touched
    assert len(ops.audit()) == 1


def test_the_action_stands_when_its_entry_cannot_be_written(ops: Operations) -> None:
    failing = FailingSink()
    kept = ListSink()
    writer = ops.audited(ALICE, [failing, kept])
    writer.disable_job(JOB)
    assert not ops.job(JOB).enabled  # the action is done
    assert failing.calls == 1 and [e.action for e in kept.entries] == ["disable-job"]
    (warning,) = writer.warnings
    assert "disable-job on job audited" in warning and "the audit database is down" in warning


def test_the_list_is_bounded_oldest_pruned(store: MemoryStore) -> None:
    log = RegistryAuditLog(store, keep=5)
    ids = []
    for i in range(8):
        at = 1_700_000_000.0 + i
        entry = AuditEntry(new_entry_id(at), at, "bob", "cli", "h", "enable-job", "ok", job=JOB)
        log.write(entry)
        ids.append(entry.id)
    assert store.children(audit_job_root(JOB)) == sorted(ids[-5:])
    assert [e.id for e in log.read(JOB)] == list(reversed(ids[-5:]))
    assert [e.id for e in log.read(JOB, limit=2)] == [ids[-1], ids[-2]]
    assert [e.id for e in log.read(JOB, since=1_700_000_006.0)] == [ids[-1], ids[-2]]


def test_the_trail_outlives_the_job_and_namespace_actions_have_their_own(
    ops: Operations, store: MemoryStore
) -> None:
    writer = ops.audited(ALICE)
    writer.remove_job(JOB)
    assert not store.exists(JobPaths(JOB).root)
    (removal,) = ops.audit(JOB)
    assert removal.action == "remove-job" and removal.details == {"force": False, "members": []}
    writer.record("fix-acl", details={"nodes": 3})
    assert store.children(audit_namespace_root())
    assert [e.action for e in ops.audit()] == ["fix-acl", "remove-job"]
    assert ops.audit()[0].target == "namespace audit-unit"


def test_the_paths_and_their_documentation() -> None:
    assert audit_job_root(JOB) == f"/audit/jobs/{JOB}"
    assert audit_namespace_root() == "/audit/namespace"
    assert parse(f"{audit_job_root(JOB)}/1-a") == Unknown(f"/audit/jobs/{JOB}/1-a")
    # the runtime's namespace watch leaves the trail out: no instance reads it
    assert is_high_churn(AUDIT)
    assert not is_high_churn(JobPaths(JOB).config)
    layout = (Path(__file__).resolve().parents[2] / "docs" / "registry-layout.md").read_text()
    assert "| `/audit/jobs/{job}/{entry}` | P |" in layout
    assert "| `/audit/namespace/{entry}` | P |" in layout


def test_stray_nodes_are_skipped(ops: Operations, store: MemoryStore) -> None:
    store.put(f"{audit_job_root(JOB)}/stray", b"not json")
    ops.audited(ALICE).enable_job(JOB)
    assert [e.action for e in ops.audit(JOB)] == ["enable-job"]


def test_a_name_no_job_can_have_is_refused(ops: Operations) -> None:
    with pytest.raises(ConfigError, match="is not a job name"):
        ops.audit("a/b")
    with pytest.raises(ConfigError, match="must be >= 1"):
        ops.audit(JOB, limit=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 1000.0 - 90),
        ("15m", 1000.0 - 900),
        ("1.5h", 1000.0 - 5400),
        ("2026-01-05", datetime(2026, 1, 5, tzinfo=UTC).timestamp()),
        ("2026-01-05T12:00:00Z", datetime(2026, 1, 5, 12, tzinfo=UTC).timestamp()),
        ("2026-01-05T13:00:00+01:00", datetime(2026, 1, 5, 12, tzinfo=UTC).timestamp()),
    ],
)
def test_since_takes_a_duration_or_a_time(text: str, expected: float) -> None:
    assert parse_since(text, now=1000.0) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "0s", "-5m", "10 parsecs", "2026-13-01"])
def test_a_bad_since_names_the_value_and_what_is_valid(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_since(text)
    message = str(info.value)
    assert repr(text) in message and "30s" in message and "ISO 8601" in message


def test_an_entry_round_trips_and_junk_is_refused() -> None:
    entry = AuditEntry("1-a", 1.0, "w", "cli", "h", "trigger", "ok", job=JOB, details={"a": [1]})
    assert AuditEntry.decode(entry.encode()) == entry
    for raw in (b"[]", b"{}", b"{", b'{"id": 1}'):
        with pytest.raises(ConfigError, match="not an audit entry"):
            AuditEntry.decode(raw)
