"""Start-up pauses automatic garbage collection and always turns it back on."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.errors import StoreError
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.gcpause import collection_paused
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()


def test_paused_inside_and_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_switched_off_by_the_application_stays_off() -> None:
    gc.disable()
    with collection_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_start_pauses_collection_while_registering_and_restores_it(
    memory_server: MemoryServer,
) -> None:
    """The registration runs with the collector paused; start() returns with it on,
    and a start that fails (an unreachable store here: a closed one) as well."""
    seen: list[bool] = []
    store = memory_server.store()
    commit = store.commit

    def spying_commit(ops):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return commit(ops)

    store.commit = spying_commit  # type: ignore[method-assign]
    rt = Runtime(store)
    rt.add_job(RecordingJob(), JobConfig(name="gcp", cron="0 0 1 1 *", sharding_total_count=1))
    rt.start()
    try:
        assert gc.isenabled()
        assert seen and not any(seen), seen
    finally:
        rt.stop()

    closed = memory_server.store()
    closed.close()
    failing = Runtime(closed)
    failing.add_job(RecordingJob(), JobConfig(name="gcp", cron="0 0 1 1 *", sharding_total_count=1))
    with pytest.raises(StoreError):
        failing.start()  # fails inside the paused part: torn down, collector back on
    assert gc.isenabled()
