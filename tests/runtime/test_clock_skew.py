"""max_time_diff_seconds: the offset arithmetic, the verdict, the paths and the leader's
rule (no store server needed; the runtime behaviour on real stores is in
test_clock_skew_stores.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardkeeper.coordination.paths import JobNode, JobPaths, clock_path, is_high_churn, parse
from shardkeeper.errors import ClockSkewError
from shardkeeper.registry.clock import ClockSample, offset_sample

ROOT = Path(__file__).resolve().parents[2]


# -- the arithmetic ----------------------------------------------------------------------


def test_offset_is_server_time_minus_the_midpoint() -> None:
    """A server time read between send (100.0) and receive (100.2): its midpoint is
    100.1, so a server stamp of 103.1 is an offset of +3.0 within half the trip."""
    s = offset_sample(103.1, 100.0, 0.2)
    assert s.offset == pytest.approx(3.0)
    assert s.error == pytest.approx(0.1)
    assert s.at == pytest.approx(100.1)


def test_a_clock_ahead_of_the_store_is_a_negative_offset() -> None:
    s = offset_sample(95.0, 100.0, 0.0)
    assert s.offset == pytest.approx(-5.0)
    assert s.error == 0.0


def test_truncated_server_time_is_centred_and_widens_the_bound() -> None:
    """An HTTP Date (whole seconds) of 1000 means a server time in [1000, 1001): the
    estimate is 1000.5 and the bound grows by half a second."""
    s = offset_sample(1000.0, 1000.3, 0.1, resolution=1.0)
    assert s.offset == pytest.approx(1000.5 - 1000.35)
    assert s.error == pytest.approx(0.05 + 0.5)


def test_millisecond_mtime_adds_half_a_millisecond() -> None:
    s = offset_sample(10.0, 10.0, 0.004, resolution=0.001)
    assert s.error == pytest.approx(0.0025)
    assert s.offset == pytest.approx(10.0005 - 10.002)


@pytest.mark.parametrize(("trip", "res"), [(-0.1, 0.0), (0.1, -1.0)])
def test_bad_measurements_are_refused_by_name(trip: float, res: float) -> None:
    with pytest.raises(ValueError, match="negative"):
        offset_sample(1.0, 1.0, trip, resolution=res)


def test_the_sample_document() -> None:
    s = ClockSample(offset=1.23456, error=0.0021, at=1700000000.12345, source="zookeeper mtime")
    assert s.to_dict() == {
        "offset": 1.2346,
        "error": 0.0021,
        "at": 1700000000.123,
        "source": "zookeeper mtime",
    }


# -- the verdict ---------------------------------------------------------------------------


def _s(offset: float, error: float) -> ClockSample:
    return ClockSample(offset=offset, error=error, at=0.0, source="test")


@pytest.mark.parametrize(
    ("offset", "error", "before", "after"),
    [
        (5.0, 0.1, False, True),  # certainly past 3 s
        (-5.0, 0.1, False, True),  # ahead counts the same
        (3.05, 0.1, False, False),  # maybe past: not refused on an uncertain sample
        (3.05, 0.1, True, True),  # ... nor restored on one
        (2.8, 0.1, True, False),  # certainly within: back
        (2.95, 0.1, True, True),  # maybe past still: stays out
        (0.0, 0.0, False, False),
    ],
)
def test_verdict_enters_and_leaves_only_on_certainty(
    offset: float, error: float, before: bool, after: bool
) -> None:
    from shardkeeper.runtime.clockskew import skew_verdict

    assert skew_verdict(_s(offset, error), 3, before) is after


def test_minus_one_is_off_as_in_elasticjob() -> None:
    """ElasticJob returns at once for a negative maxTimeDiffSeconds; -1 is our default."""
    from shardkeeper.config import JobConfig
    from shardkeeper.runtime.clockskew import skew_verdict

    assert JobConfig.parse(name="j", interval=1, sharding_total_count=1).max_time_diff_seconds == -1
    assert skew_verdict(_s(3600.0, 0.0), -1, False) is False
    assert skew_verdict(_s(3600.0, 0.0), -1, True) is False


def test_the_error_names_offset_limit_and_source() -> None:
    err = ClockSkewError("order-sync", 12.3456, 0.002, 5, "zookeeper mtime")
    text = str(err)
    assert "'order-sync'" in text
    assert "+12.346 s" in text
    assert "max_time_diff_seconds=5" in text
    assert "zookeeper mtime" in text
    assert (err.offset, err.limit) == (12.3456, 5)


# -- the layout ----------------------------------------------------------------------------


def test_paths_and_parse() -> None:
    p = JobPaths("order-sync")
    assert clock_path("h@1@a") == "/control/clock/h@1@a"
    assert p.skewed_root == "/jobs/order-sync/skewed"
    assert p.skewed("h@1@a") == "/jobs/order-sync/skewed/h@1@a"
    assert parse(p.skewed("h@1@a")) == JobNode("order-sync", "skewed", instance="h@1@a")
    assert parse(p.skewed_root) == JobNode("order-sync", "subtree", name="skewed")
    # rewritten at every sample: out of the runtime's namespace watch
    assert is_high_churn("/control/clock")
    assert not is_high_churn(p.skewed_root)  # rare, and the leader may want it
    layout = (ROOT / "docs" / "registry-layout.md").read_text()
    assert "| `/control/clock/{instance}` | E |" in layout
    assert "| `/jobs/{job}/skewed/{instance}` | E |" in layout


def test_sharding_leaves_skewed_instances_out() -> None:
    """The leader's instance list drops an instance with a skew mark, as a disabled one."""
    from shardkeeper.coordination.sharding import ShardingService
    from shardkeeper.registry.memory import MemoryServer, MemoryStore

    with MemoryStore(MemoryServer(), "skew") as store:
        p = JobPaths("j")
        for inst in ("a", "b", "c"):
            store.put(p.instance(inst), b"{}", ephemeral=True)
        store.put(p.disabled_instance("c"), b"")
        store.put(p.skewed("b"), b"{}", ephemeral=True)
        svc = ShardingService(store, p, "a")
        assert svc.unavailable() == {"b", "c"}
        assert svc.enabled_instances() == ["a"]
        assert set(svc.enabled_members()) == {"a"}
        store.delete(p.skewed("b"))
        assert svc.enabled_instances() == ["a", "b"]


# -- the runtime on the MemoryStore (fast tier) --------------------------------------------


@pytest.mark.timeout(60)
def test_minus_one_keeps_todays_behaviour_whatever_the_clock() -> None:
    """With the default -1 nothing is measured nor written, and an instance whose clock
    is an hour off runs its items as before."""
    from shardkeeper.config import JobConfig
    from shardkeeper.registry.memory import MemoryServer
    from shardkeeper.runtime import Runtime
    from shardkeeper.testing.jobs import RecordingJob

    server = MemoryServer()
    try:
        job = RecordingJob()
        rt = Runtime(server.store(), shutdown_grace=1.0, wall_clock=lambda: time.time() + 3600)
        rt.add_job(job, JobConfig(name="j", interval=0.5, sharding_total_count=2))
        with rt:
            job.wait_for(lambda runs: {r.item for r in runs} == {0, 1}, 30)
            assert rt.clock is not None
            rt.clock.tick(force=True)
            assert rt.clock.sample is None and rt.clock.skewed == {}
            assert not rt.store.exists(clock_path(rt.instance_id))
            assert not rt.store.children(JobPaths("j").skewed_root)
    finally:
        server.shutdown()


@pytest.mark.timeout(60)
def test_memory_store_runtime_refuses_and_comes_back() -> None:
    """The MemoryStore's server clock is this host's: a shifted runtime clock is seen,
    the runtime refuses the job's items, and runs them again once the shift goes."""
    from shardkeeper.config import JobConfig
    from shardkeeper.registry.memory import MemoryServer
    from shardkeeper.runtime import Runtime
    from shardkeeper.runtime.job.jobstate import SkipReason
    from shardkeeper.testing.faults import wait_until
    from shardkeeper.testing.jobs import RecordingJob

    shift = [0.0]
    server = MemoryServer()
    try:
        job = RecordingJob()
        rt = Runtime(server.store(), shutdown_grace=1.0, wall_clock=lambda: time.time() + shift[0])
        rt.add_job(
            job,
            JobConfig(name="j", interval=0.5, sharding_total_count=2, max_time_diff_seconds=1),
        )
        with rt:
            assert rt.clock is not None
            job.wait_for(lambda runs: len(runs) >= 2, 30)
            assert rt.clock.sample is not None and abs(rt.clock.sample.offset) < 0.5
            shift[0] = 10.0
            rt.clock.tick(force=True)
            assert "j" in rt.clock.skewed
            assert rt.runners["j"].state.skip_reason() is SkipReason.CLOCK_SKEW
            assert rt.store.exists(JobPaths("j").skewed(rt.instance_id))
            shift[0] = 0.0
            rt.clock.tick(force=True)
            assert rt.clock.skewed == {}
            back = time.time()
            job.wait_for(lambda runs: any(r.fire_time >= back for r in runs), 30)
            wait_until(lambda: not rt.store.children(JobPaths("j").skewed_root), 5)
    finally:
        server.shutdown()


def test_fmt_clock_in_the_instances_table() -> None:
    from shardkeeper.cli.inspect import fmt_clock
    from shardkeeper.ops import InstanceView

    base = {
        "instance_id": "h@1@a",
        "host": "h",
        "pid": 1,
        "version": "1",
        "started_at": None,
        "labels": {},
        "jobs": ["j"],
        "items": {"j": []},
        "running": {"j": []},
        "disabled": {"j": False},
        "leader_of": [],
    }
    assert fmt_clock(InstanceView(**base)) == "-"  # type: ignore[arg-type]
    view = InstanceView(**base, clock_offset=-30.1234, clock_error=0.5, clock_skewed=["j"])  # type: ignore[arg-type]
    assert fmt_clock(view) == "-30.123s ±0.500 SKEWED (j)"
    assert view.health == "clock_skew"
