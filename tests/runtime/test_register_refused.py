"""``register()`` stops when its move into REGISTERING is refused (core review 2026-12,
finding 16): a repair pass that raced a graceful stop must not join the stopping job
again (membership node, reshard flag, LEAVING -> STOPPING)."""

from __future__ import annotations

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.job.phase import JobPhase
from shardkeeper.runtime.runner.runner import JobRunner
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)


def _phase(runner: JobRunner) -> JobPhase:
    """The job's phase now (a call: each read is fresh for the type checker too)."""
    return runner.state.phase.current


def test_a_repair_pass_racing_a_stop_does_not_rejoin_the_job() -> None:
    """The interleaving of the review, made deterministic: the repair pass has passed
    its ``stopping`` check when the graceful stop begins (UNREGISTERED -> LEAVING),
    and only then registers. The job stays LEAVING, no membership node is written and
    no reshard is asked for."""
    server = MemoryServer()
    rt = Runtime(server.store(), instance_id="A", shutdown_grace=0)
    rt.add_job(RecordingJob(), JobConfig(name="j", interval=3600, sharding_total_count=2))
    try:
        rt.start()
        runner = rt.runners["j"]
        paths = runner.paths
        assert _phase(runner) is JobPhase.REGISTERED
        runner.unregister()  # a lost membership: the repair pass registers it again
        assert _phase(runner) is JobPhase.UNREGISTERED
        assert not rt.store.exists(paths.instance("A"))
        rt.store.delete(paths.necessary)
        register = runner.register_logged

        def stop_then_register() -> None:
            # the stop begins between the pass's check and its registration
            runner.begin_stop()
            assert _phase(runner) is JobPhase.LEAVING
            register()

        runner.register_logged = stop_then_register  # type: ignore[method-assign]
        runner.repairs.run()
        assert _phase(runner) is JobPhase.LEAVING
        assert not rt.store.exists(paths.instance("A"))
        assert not rt.store.exists(paths.necessary)
    finally:
        rt.stop()
        server.shutdown()


def test_a_registration_begun_by_the_registrar_still_goes_on() -> None:
    """The start-up registrar moves a job to REGISTERING before it registers it (so a
    fire waits): that registration is not refused."""
    server = MemoryServer()
    rt = Runtime(server.store(), instance_id="A", shutdown_grace=0)
    rt.add_job(RecordingJob(), JobConfig(name="j", interval=3600, sharding_total_count=2))
    try:
        rt.start()
        runner = rt.runners["j"]
        runner.unregister()
        runner.registration_pending()
        assert _phase(runner) is JobPhase.REGISTERING
        runner.register()
        assert _phase(runner) is JobPhase.REGISTERED
        assert rt.store.exists(runner.paths.instance("A"))
    finally:
        rt.stop()
        server.shutdown()
