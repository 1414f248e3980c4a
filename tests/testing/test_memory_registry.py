"""shardkeeper.testing offers the reference in-memory store to users' tests."""

from __future__ import annotations

import pytest

from shardkeeper import JobConfig, Runtime
from shardkeeper.errors import StoreUnavailableError
from shardkeeper.registry import RegistrySettings, open_store
from shardkeeper.testing import RecordingJob, memory_registry

pytestmark = pytest.mark.timeout(60)


def test_a_runtime_on_a_memory_registry_runs_every_item() -> None:
    """A job's test needs no server: a runtime on ``memory_registry()`` runs each
    item of its job, and the server is gone after the block."""
    job = RecordingJob()
    with memory_registry(session_timeout=2) as url:
        assert url.startswith("memory://test-")
        rt = Runtime(url)
        rt.add_job(job, JobConfig(name="sync", interval=0.5, sharding_total_count=4))
        with rt:
            job.wait_for(lambda runs: {r.item for r in runs} == {0, 1, 2, 3}, timeout=20)
        store = open_store(RegistrySettings.from_url(url))
    with pytest.raises(StoreUnavailableError):
        store.start()


def test_each_memory_registry_is_its_own() -> None:
    """Two blocks never share a server, so tests never see each other's nodes."""
    with memory_registry() as first, memory_registry() as second:
        assert first.split("/")[2] != second.split("/")[2]
