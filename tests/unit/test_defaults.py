"""Review 2026-12 finding 11: the default timeouts obey the documented rules, and a
configuration that breaks them is refused with the values named.

The rules (docs/failover.md, docs/configuration.md):

* a request may take at most the session timeout (``operation_timeout <=
  session_timeout``) on ZooKeeper and etcd;
* a job's fire deadline (``sharding_wait_timeout``) holds two requests: a start
  commit that timed out, and the retry that adopts its late-applied marks.

No server: the registry settings are parsed, and the runtime runs on a MemoryStore
that reports an operation timeout as a ZooKeeper or etcd store does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from shardkeeper.config import JobConfig
from shardkeeper.errors import InvalidRegistryURLError, JobConfigError
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.registry.url import RegistrySettings, parse_registry_url
from shardkeeper.runtime import Runtime
from shardkeeper.testing.jobs import RecordingJob

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_default_timeouts_obey_the_rules() -> None:
    """Defaults: the operation timeout is below the session timeout, and two of it
    fit in the default fire deadline (3005b15: 5 s > 4 s, and 5 s = the deadline)."""
    settings = parse_registry_url("zk://h:2181/ns")
    deadline = JobConfig.model_fields["sharding_wait_timeout"].default
    assert settings.operation_timeout < settings.session_timeout
    assert 2 * settings.operation_timeout <= deadline
    built = RegistrySettings(backend="etcd", hosts=(("h", 2379),), namespace="ns")
    assert built.operation_timeout == settings.operation_timeout
    assert built.session_timeout == settings.session_timeout


@pytest.mark.parametrize("scheme", ["zk", "etcd"])
def test_a_url_with_an_operation_timeout_above_the_session_timeout_is_refused(
    scheme: str,
) -> None:
    """The error names both values and the most that would do."""
    url = f"{scheme}://h:1/ns?session_timeout=2&operation_timeout=5"
    with pytest.raises(InvalidRegistryURLError) as caught:
        parse_registry_url(url)
    text = str(caught.value)
    assert "operation_timeout=5" in text
    assert "session_timeout=2" in text
    assert "at most 2 seconds" in text


def test_settings_built_directly_are_refused_too() -> None:
    with pytest.raises(ValidationError, match=r"operation_timeout=3 .*session_timeout=2"):
        RegistrySettings(
            backend="zookeeper",
            hosts=(("h", 2181),),
            namespace="ns",
            session_timeout=2,
            operation_timeout=3,
        )


def test_the_operation_timeout_may_equal_the_session_timeout() -> None:
    """At or below, as docs/failover.md says (the chaos runs use 2 s and 2 s)."""
    settings = parse_registry_url("etcd://h:1/ns?session_timeout=2&operation_timeout=2")
    assert settings.operation_timeout == settings.session_timeout == 2.0


def test_a_short_session_alone_brings_the_default_operation_timeout_down() -> None:
    """Asking only for a 1 s session (fast failover) is not refused for the default."""
    settings = parse_registry_url("zk://h:1/ns?session_timeout=1")
    assert settings.operation_timeout == 1.0
    assert parse_registry_url(settings.url()).operation_timeout == 1.0


def test_the_memory_store_takes_any_operation_timeout() -> None:
    """memory:// sends no request anywhere: only session_timeout means anything."""
    settings = parse_registry_url("memory://x/ns?session_timeout=1&operation_timeout=9")
    assert settings.operation_timeout == 9.0


class _TimedMemoryStore(MemoryStore):
    """A MemoryStore whose requests are bounded like a real store's."""

    def __init__(self, server: MemoryServer, operation_timeout: float) -> None:
        super().__init__(server, "defaults", session_timeout=4.0)
        self._operation_timeout = operation_timeout

    @property
    def operation_timeout(self) -> float:
        return self._operation_timeout


def _config(wait: float) -> JobConfig:
    return JobConfig(name="tight", interval=60, sharding_total_count=1, sharding_wait_timeout=wait)


def test_a_job_whose_fire_deadline_cannot_hold_a_retry_is_refused(
    memory_server: MemoryServer,
) -> None:
    """sharding_wait_timeout 3 s against an operation timeout of 2 s: a start commit
    that timed out would be skipped with no second attempt (3005b15 started it)."""
    rt = Runtime(_TimedMemoryStore(memory_server, 2.0))
    rt.add_job(RecordingJob(), _config(3.0))
    try:
        with pytest.raises(JobConfigError) as caught:
            rt.start()
    finally:
        rt.stop()
    text = str(caught.value)
    assert "'tight'" in text
    assert "sharding_wait_timeout=3" in text
    assert "operation_timeout=2" in text
    assert "sharding_wait_timeout >= 4" in text
    assert "operation_timeout <= 1.5" in text


def test_a_job_whose_deadline_holds_two_requests_starts(memory_server: MemoryServer) -> None:
    rt = Runtime(_TimedMemoryStore(memory_server, 2.0))
    rt.add_job(RecordingJob(), _config(4.0))
    try:
        rt.start()
        assert rt.runners.keys() == {"tight"}
    finally:
        rt.stop()


def test_the_memory_store_bounds_no_fire_deadline(memory_server: MemoryServer) -> None:
    """The plain MemoryStore has no operation timeout: a short deadline is fine."""
    rt = Runtime(memory_server.store("plain"))
    assert not hasattr(rt.store, "operation_timeout")
    rt.add_job(RecordingJob(), _config(0.2))
    try:
        rt.start()
    finally:
        rt.stop()


@pytest.mark.parametrize("backend", ["zk", "etcd"])
def test_the_real_stores_report_their_operation_timeout(backend: str) -> None:
    """What the runtime checks a job against (read without connecting)."""
    from shardkeeper.config.timing import request_bound
    from shardkeeper.registry import open_store

    pytest.importorskip("etcd3") if backend == "etcd" else None
    store = open_store(f"{backend}://127.0.0.1:1/ns?session_timeout=6&operation_timeout=3")
    assert request_bound(store) == 3.0


@pytest.mark.parametrize("doc", ["configuration.md", "registry-backends.md"])
def test_the_docs_tables_give_the_defaults_in_force(doc: str) -> None:
    """The option tables state the defaults the code uses."""
    text = (DOCS / doc).read_text()
    defaults = parse_registry_url("zk://h:1/ns")
    for name in ("session_timeout", "connection_timeout", "operation_timeout"):
        row = re.search(rf"^\| `{name}` \| ([0-9.]+)", text, re.MULTILINE)
        assert row is not None, f"{doc} has no row for {name}"
        assert float(row.group(1)) == getattr(defaults, name), f"{doc}: {name}"


# -- the local registry and the test servers are sized for real jobs ---------------


def test_the_test_zookeeper_heap_holds_a_large_jobs_commit_log(tmp_path: Path) -> None:
    """96 MB died of OutOfMemoryError under 6,000 items every 3 s on 2 instances, whose
    live heap measured 430-490 MB (bench/zk_heap.py); the cap is well above that."""
    from shardkeeper.testing.servers import ZooKeeperCluster

    zk = ZooKeeperCluster(size=1, base_dir=tmp_path)
    zk._prepare_members()
    command = zk._command(zk.members[0])
    assert "-Xmx1024m" in command
    assert "-Xms16m" in command  # grows only as used: small tests cost no more


def test_registry_up_sizes_zookeeper_for_any_accepted_job_and_keeps_it(tmp_path: Path) -> None:
    """The local registry's heap (2 GB) holds ZooKeeper's last 700 commits at its
    1 MB request limit; an attached copy (``registry status``/restarts) keeps it."""
    from shardkeeper.localregistry import local_cluster
    from shardkeeper.testing.servers import ServerCluster, ZooKeeperCluster

    zk = local_cluster("zookeeper", tmp_path)
    zk._prepare_members()
    assert "-Xmx2048m" in zk._command(zk.members[0])
    again = ServerCluster.from_state(zk.to_state())
    assert isinstance(again, ZooKeeperCluster)
    assert again.heap_mb == 2048


def test_registry_up_sizes_etcd_and_compacts_its_history(tmp_path: Path) -> None:
    """etcd's own 2 GiB quota, and history compacted after 5 minutes: without it
    every revision stays until the quota stops all writes."""
    from shardkeeper.localregistry import local_cluster
    from shardkeeper.testing.servers import EtcdCluster, ServerCluster

    etcd = local_cluster("etcd", tmp_path)
    etcd._prepare_members()
    command = etcd._command(etcd.members[0])
    assert f"--quota-backend-bytes={2 * 2**30}" in command
    assert "--auto-compaction-mode=periodic" in command
    assert "--auto-compaction-retention=5m" in command
    again = ServerCluster.from_state(etcd.to_state())
    assert isinstance(again, EtcdCluster)
    assert again.quota_bytes == 2 * 2**30


def test_registry_up_says_what_it_is_sized_for(tmp_path: Path) -> None:
    """The line ``registry up`` prints besides the URL (stderr) names the limit."""
    from shardkeeper.cli.registry import sizing
    from shardkeeper.localregistry import local_cluster

    zk = local_cluster("zookeeper", tmp_path / "zk")
    etcd = local_cluster("etcd", tmp_path / "etcd")
    zk_line = sizing({"backend": "zookeeper", "cluster": zk.to_state()})
    etcd_line = sizing({"backend": "etcd", "cluster": etcd.to_state()})
    assert "2048 MB" in zk_line and "registry-backends.md" in zk_line
    assert "2048 MB" in etcd_line and "refuses every write" in etcd_line
