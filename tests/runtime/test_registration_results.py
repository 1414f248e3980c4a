""" "Register ok" exists once: the registrar hands its results to the runner
(``registration_pending``, ``adopt_batch_registration``, ``registration_left``),
which moves the phase; a one-by-one registration takes the same path. Driven on a
runner over the MemoryStore, without a runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.registry.base import ConnectionState
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime.execute.pool import Lanes, WorkerPool
from shardkeeper.runtime.job.jobstate import SkipReason
from shardkeeper.runtime.job.phase import JobPhase
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.runtime.registration import instance_info
from shardkeeper.runtime.runner.runner import JobRunner
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(30)

JOB = "regresults"
ME = "host@1@me"


@pytest.fixture
def runner() -> Iterator[JobRunner]:
    server = MemoryServer()
    store: MemoryStore = server.store()
    store.start()
    workers = WorkerPool(2, "test")
    lanes = Lanes(WorkerPool(1, "test-lanes"))
    try:
        yield JobRunner(
            services=JobServices.build(store, JOB, ME),
            job=RecordingJob(),
            config=JobConfig(name=JOB, interval=3600, sharding_total_count=2),
            instance=instance_info(ME, {}, [JOB]),
            workers=workers,
            lanes=lanes,
        )
    finally:
        lanes.close()
        workers.shutdown()
        server.shutdown()


def phase_of(runner: JobRunner) -> JobPhase:
    """The runner's phase read afresh (a property read twice is narrowed once by mypy)."""
    return runner.phase


def test_a_batched_registration_is_adopted_by_the_runner(runner: JobRunner) -> None:
    runner.registration_pending()
    assert runner.phase is JobPhase.REGISTERING
    runner.state.suspect_marks()
    runner.state.disabled_job = True  # as a stale switch would be: the commit saw none
    runner.adopt_batch_registration(revision=42, joined_at=1000.0)
    st = runner.state
    assert phase_of(runner) is JobPhase.REGISTERED
    assert (st.member_revision, st.joined_at, st.register_error) == (42, 1000.0, None)
    assert not st.disabled_job and not st.marks_suspect
    assert runner.election.is_leader  # the leader node the batch created is ours
    # the end of register_all leaves a registered job as it is, error-free
    runner.registration_left("start-up registration ended without it")
    assert phase_of(runner) is JobPhase.REGISTERED and st.register_error is None


def test_a_job_left_to_housekeeping_is_unregistered_with_the_reason(runner: JobRunner) -> None:
    runner.registration_pending()
    runner.registration_left("the store did not answer the earlier batches")
    assert runner.phase is JobPhase.UNREGISTERED
    assert runner.state.register_error == "the store did not answer the earlier batches"
    assert runner.state.skip_reason() is SkipReason.NOT_REGISTERED


def test_one_by_one_registration_moves_the_phase_the_same_way(runner: JobRunner) -> None:
    runner.register()
    st = runner.state
    assert runner.phase is JobPhase.REGISTERED and st.member_revision > 0
    assert st.register_error is None and st.skip_reason() is None
    # the session goes: the reactions' commands demote it and fence
    runner.on_state(ConnectionState.LOST)
    assert phase_of(runner) is JobPhase.UNREGISTERED and st.marks_suspect


def test_a_failed_registration_is_unregistered_with_its_error(runner: JobRunner) -> None:
    runner.services.store.close()  # every request fails now
    with pytest.raises(Exception, match=r".+"):
        runner.register()
    assert runner.phase is JobPhase.UNREGISTERED
    assert runner.state.register_error
