"""TriggerScheduler: fires at scheduled times on a fixed pool of threads, bounded shutdown.

Every wait is on a condition with a deadline; absence of fires is shown by waiting for a
sentinel job to fire several times, never by sleeping.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.errors import JobConfigError, JobLookupError
from shardkeeper.scheduling import (
    MISFIRE_GRACE_SECONDS,
    TriggerScheduler,
    build_trigger,
    parse_cron,
)
from shardkeeper.scheduling.scheduler import _Fire

DEADLINE = 10.0


class Recorder:
    """Collects on_fire calls; lets a test wait for a number of calls of one job."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, datetime, datetime, str]] = []
        self._cond = threading.Condition()

    def __call__(self, job_name: str, scheduled: datetime) -> None:
        with self._cond:
            self.calls.append(
                (job_name, scheduled, datetime.now(UTC), threading.current_thread().name)
            )
            self._cond.notify_all()

    def times(self, job_name: str) -> list[datetime]:
        """Scheduled times delivered for ``job_name``, in call order."""
        with self._cond:
            return [c[1] for c in self.calls if c[0] == job_name]

    def count(self, job_name: str) -> int:
        """Number of calls for ``job_name`` so far."""
        return len(self.times(job_name))

    def wait_for(self, job_name: str, n: int, timeout: float = DEADLINE) -> list[datetime]:
        """Wait until ``job_name`` fired at least ``n`` times; fail after ``timeout``."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: sum(1 for c in self.calls if c[0] == job_name) >= n, timeout
            )
        assert ok, f"{job_name!r} fired {self.count(job_name)} times, expected {n}"
        return self.times(job_name)


def interval_job(name: str, seconds: float, **kw: Any) -> JobConfig:
    """An interval job config."""
    return JobConfig.parse(name=name, interval=seconds, sharding_total_count=1, **kw)


def cron_job(name: str, cron: str, **kw: Any) -> JobConfig:
    """A cron job config."""
    return JobConfig.parse(name=name, cron=cron, sharding_total_count=1, **kw)


@pytest.fixture
def make_scheduler() -> Iterator[Callable[..., TriggerScheduler]]:
    """Build schedulers that are always shut down at the end of the test."""
    made: list[TriggerScheduler] = []

    def make(on_fire: Callable[[str, datetime], None], **kw: Any) -> TriggerScheduler:
        s = TriggerScheduler(on_fire, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.shutdown(timeout=2.0)


@pytest.fixture
def recorder() -> Recorder:
    """A fresh on_fire recorder."""
    return Recorder()


def test_interval_fires_repeatedly_with_scheduled_times(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """An interval job fires again and again, each time with its scheduled (aware) time."""
    s = make_scheduler(recorder)
    s.add_job("tick", interval_job("tick", 0.2))
    s.start()
    times = recorder.wait_for("tick", 4)
    for t in times:
        assert t.tzinfo is not None
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    # Scheduled times are exact multiples of the interval, whatever the delivery delay
    # (a multiple above 1 only if a loaded machine made the scheduler coalesce fires).
    assert all(round(gap / 0.2) >= 1 and abs(gap - 0.2 * round(gap / 0.2)) < 0.002 for gap in gaps)
    assert any(abs(gap - 0.2) < 0.002 for gap in gaps), gaps
    for _, scheduled, called, _ in recorder.calls:
        assert scheduled <= called


def test_cron_with_seconds_in_time_zone(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """A 6-field cron fires every second, on the second, in the job's time zone."""
    s = make_scheduler(recorder)
    s.add_job("sec", cron_job("sec", "* * * * * *", time_zone="Asia/Tokyo"))
    s.start()
    first, second = recorder.wait_for("sec", 2)[:2]
    assert first.microsecond == 0
    gap = second - first
    assert gap.microseconds == 0
    assert gap >= timedelta(seconds=1)
    assert first.utcoffset() == timedelta(hours=9)


def test_fire_now_runs_on_a_scheduler_thread(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """fire_now delivers once, soon, with the current time, off the caller's thread."""
    s = make_scheduler(recorder)
    s.add_job("hourly", interval_job("hourly", 3600))
    s.start()
    planned = s.next_fire_time("hourly")
    before = datetime.now(UTC)
    s.fire_now("hourly")
    (fired,) = recorder.wait_for("hourly", 1)
    assert before <= fired <= datetime.now(UTC)
    assert recorder.calls[0][3] != threading.current_thread().name
    assert recorder.calls[0][3].startswith("shardkeeper-fire-")
    assert s.next_fire_time("hourly") == planned


def test_remove_stops_firing(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """After remove_job a job does not fire any more (at most one fire was in flight)."""
    s = make_scheduler(recorder)
    s.add_job("gone", interval_job("gone", 0.1))
    s.start()
    recorder.wait_for("gone", 2)
    s.remove_job("gone")
    at_removal = recorder.count("gone")
    assert not s.has_job("gone")
    s.add_job("sentinel", interval_job("sentinel", 0.1))
    recorder.wait_for("sentinel", 5)
    assert recorder.count("gone") <= at_removal + 1
    with pytest.raises(JobLookupError):
        s.next_fire_time("gone")


def test_pause_and_resume(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """A paused job has no next fire and does not fire; resumed, it fires again."""
    s = make_scheduler(recorder)
    s.add_job("p", interval_job("p", 0.1))
    s.start()
    recorder.wait_for("p", 1)
    s.pause_job("p")
    assert s.next_fire_time("p") is None
    at_pause = recorder.count("p")
    s.add_job("sentinel", interval_job("sentinel", 0.1))
    recorder.wait_for("sentinel", 5)
    assert recorder.count("p") <= at_pause + 1
    s.resume_job("p")
    next_fire = s.next_fire_time("p")
    assert next_fire is not None
    assert next_fire > datetime.now(UTC) - timedelta(seconds=1)
    recorder.wait_for("p", recorder.count("p") + 2)


def test_thread_count_does_not_grow_with_jobs(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """500 jobs (and fires of many of them) use the same threads as one job."""
    before = set(threading.enumerate())
    s = make_scheduler(recorder, threads=3)
    s.start()
    ours = set(threading.enumerate()) - before
    # One scheduler thread plus the fixed delivery pool.
    assert len(ours) == 1 + 3
    for n in range(500):
        name = f"job-{n}"
        if n % 2:
            s.add_job(name, interval_job(name, 3600 + n))
        else:
            s.add_job(name, cron_job(name, f"{n % 60} {n % 24} * * *"))
    s.add_job("busy", interval_job("busy", 0.1))
    for n in range(0, 500, 10):
        s.fire_now(f"job-{n}")
    for n in range(0, 500, 10):
        recorder.wait_for(f"job-{n}", 1)
    recorder.wait_for("busy", 5)
    assert len(s.job_names()) == 501
    assert set(threading.enumerate()) - before == ours


def test_shutdown_is_bounded_and_idempotent(
    make_scheduler: Callable[..., TriggerScheduler],
) -> None:
    """shutdown returns within its timeout even while on_fire is stuck, and twice is fine."""
    entered = threading.Event()
    release = threading.Event()

    def stuck(job_name: str, scheduled: datetime) -> None:
        entered.set()
        release.wait(DEADLINE)

    s = make_scheduler(stuck, threads=1)
    s.add_job("j", interval_job("j", 3600))
    s.start()
    s.fire_now("j")
    assert entered.wait(DEADLINE)
    t0 = time.monotonic()
    assert s.shutdown(timeout=0.3) is False
    assert time.monotonic() - t0 < 2.0
    assert not s.running
    release.set()
    assert s.shutdown(timeout=1.0) in (True, False)
    with pytest.raises(RuntimeError, match="shut down"):
        s.start()


def test_clean_shutdown_ends_all_threads(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """With nothing running, shutdown ends every thread it started and returns True."""
    before = set(threading.enumerate())
    s = make_scheduler(recorder, threads=2)
    s.add_job("tick", interval_job("tick", 0.1))
    s.start()
    ours = set(threading.enumerate()) - before
    assert len(ours) == 3
    recorder.wait_for("tick", 1)
    assert s.shutdown(timeout=5.0) is True
    assert not any(t.is_alive() for t in ours)
    assert s.shutdown() is True
    s.remove_job("tick")  # teardown in any order: a no-op now
    with pytest.raises(RuntimeError):
        s.fire_now("tick")
    with pytest.raises(RuntimeError):
        s.add_job("new", interval_job("new", 1))


def test_shutdown_before_start(make_scheduler: Callable[..., TriggerScheduler]) -> None:
    """A scheduler that never started shuts down at once."""
    s = make_scheduler(Recorder())
    assert s.shutdown(timeout=0.1) is True


def test_jobs_added_before_start(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """A job added before start has a next fire time and fires once started."""
    s = make_scheduler(recorder)
    s.add_job("early", interval_job("early", 0.1))
    nxt = s.next_fire_time("early")
    assert nxt is not None
    assert nxt.tzinfo is not None
    with pytest.raises(RuntimeError, match="new"):
        s.fire_now("early")
    s.start()
    recorder.wait_for("early", 2)


def test_add_job_replaces_existing(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """Adding a job under an existing name replaces its trigger."""
    s = make_scheduler(recorder)
    s.add_job("r", interval_job("r", 3600))
    s.start()
    s.add_job("r", interval_job("r", 0.1))
    recorder.wait_for("r", 2)
    assert s.job_names() == ["r"]


def test_on_fire_errors_do_not_stop_fires(
    make_scheduler: Callable[..., TriggerScheduler], caplog: pytest.LogCaptureFixture
) -> None:
    """An exception from on_fire is logged and the job keeps firing."""
    rec = Recorder()

    def failing(job_name: str, scheduled: datetime) -> None:
        rec(job_name, scheduled)
        raise RuntimeError("boom")

    s = make_scheduler(failing)
    s.add_job("f", interval_job("f", 0.1))
    with caplog.at_level(logging.ERROR, logger="shardkeeper.scheduling"):
        s.start()
        rec.wait_for("f", 3)
    assert any("on_fire raised" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("method", ["remove_job", "pause_job", "resume_job", "next_fire_time"])
def test_unknown_job(make_scheduler: Callable[..., TriggerScheduler], method: str) -> None:
    """Operations on an unknown name raise JobLookupError naming it."""
    s = make_scheduler(Recorder())
    s.start()
    with pytest.raises(JobLookupError, match="'ghost'"):
        getattr(s, method)("ghost")
    with pytest.raises(JobLookupError, match="'ghost'"):
        s.fire_now("ghost")


def test_threads_must_be_positive() -> None:
    """A scheduler needs at least one delivery thread."""
    with pytest.raises(ValueError, match="threads=0"):
        TriggerScheduler(Recorder(), threads=0)


def test_a_lead_delivers_fires_early_with_their_due_times(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """With a lead, each regular fire comes that much before it is due, carrying its
    due time: the same multiples of the interval as without a lead, none skipped."""
    s = make_scheduler(recorder, lead=0.1)
    s.add_job("tick", interval_job("tick", 0.3))
    s.start()
    times = recorder.wait_for("tick", 4)
    for a, b in itertools.pairwise(times):
        assert round((b - a).total_seconds() / 0.3) >= 1
    for t in times:
        # due times are multiples of the interval since the epoch (not moved by the lead)
        phase = t.timestamp() / 0.3
        assert abs(phase - round(phase)) < 0.01, t
    early = [(scheduled - called).total_seconds() for _, scheduled, called, _ in recorder.calls]
    # never more than the lead ahead; ahead at all unless the machine delays every fire
    assert max(early) <= 0.1 + 0.01, early
    assert any(e > 0 for e in early), early
    nxt = s.next_fire_time("tick")
    assert nxt is not None and abs(nxt.timestamp() / 0.3 - round(nxt.timestamp() / 0.3)) < 0.01


def test_a_lead_keeps_cron_times_and_one_off_jobs_on_time(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """A cron job's due times stay on the second; a one-off job and fire_now are
    delivered on time, not ahead."""
    s = make_scheduler(recorder, lead=0.2)
    s.add_job("sec", cron_job("sec", "* * * * * *"))
    s.add_job("manual", cron_job("manual", "0 0 1 1 *"))
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    s.add_job("once", JobConfig.parse(name="once", at=at.isoformat(), sharding_total_count=1))
    s.start()
    s.fire_now("manual")
    recorder.wait_for("once", 1)
    recorder.wait_for("manual", 1)
    secs = recorder.wait_for("sec", 3)
    assert all(t.microsecond == 0 for t in secs), secs
    for name in ("once", "manual"):
        call = next(c for c in recorder.calls if c[0] == name)
        assert call[1] <= call[2], name  # delivered at or after its time, not ahead
    later = [c for c in recorder.calls if c[0] == "sec"][1:]
    assert all(scheduled - called <= timedelta(seconds=0.21) for _, scheduled, called, _ in later)
    assert any(scheduled > called for _, scheduled, called, _ in later)  # ahead of time


def test_a_job_due_within_the_lead_fires_at_once_not_a_period_later(
    make_scheduler: Callable[..., TriggerScheduler], recorder: Recorder
) -> None:
    """The first fire of a job added less than the lead before its due time is delivered
    at once (an instance that just joined must not miss the fire it joined before)."""
    s = make_scheduler(recorder, lead=0.5)
    s.start()
    period = 2.0

    # wait on the clock until the next multiple of the period is 0.2-0.3 s away
    def close_to_due() -> bool:
        return 0.2 < period - time.time() % period < 0.3

    deadline = time.monotonic() + 2 * period + 1
    while not close_to_due():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    due = (time.time() // period + 1) * period
    s.add_job("tick", interval_job("tick", period))
    first = recorder.wait_for("tick", 1, timeout=1.0)[0]
    assert abs(first.timestamp() - due) < 1e-3


def test_lead_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="lead=2"):
        TriggerScheduler(lambda _n, _t: None, lead=2)


def test_late_fire_policy(make_scheduler: Callable[..., TriggerScheduler]) -> None:
    """A fire later than the grace time is skipped with a warning; no grace means deliver."""
    rec = Recorder()
    s = make_scheduler(rec)
    old = datetime.now(UTC) - timedelta(seconds=MISFIRE_GRACE_SECONDS + 5)
    recent = datetime.now(UTC) - timedelta(seconds=1)
    s._deliver(_Fire("late", [old], MISFIRE_GRACE_SECONDS, False))
    assert rec.count("late") == 0
    s._deliver(_Fire("late", [recent], MISFIRE_GRACE_SECONDS, False))
    s._deliver(_Fire("late", [old], None, False))
    assert rec.times("late") == [recent, old]


# -- triggers --------------------------------------------------------------------------

START = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday


def next_fires(expr: str, n: int = 3, tz: str = "UTC") -> list[datetime]:
    """The next ``n`` fire times of ``expr`` after START."""
    trigger = parse_cron(expr, tz)
    result: list[datetime] = []
    prev = None
    now = START
    for _ in range(n):
        fire = trigger.get_next_fire_time(prev, now)
        result.append(fire)
        prev, now = fire, fire + timedelta(microseconds=1)
    return result


def test_five_field_cron_fires_at_second_zero() -> None:
    """Five fields are minute..day-of-week, firing at second 0."""
    fires = next_fires("*/15 * * * *")
    assert [f.minute for f in fires] == [0, 15, 30]
    assert all(f.second == 0 for f in fires)


def test_six_field_cron_has_seconds_first() -> None:
    """Six fields put the second first; Quartz's 0/5 and ? are understood."""
    fires = next_fires("0/20 * * * * ?")
    assert [(f.minute, f.second) for f in fires] == [(0, 0), (0, 20), (0, 40)]


@pytest.mark.parametrize(
    ("dow", "weekdays"),
    [
        ("0", {6}),  # Sunday (Python's weekday() 6)
        ("7", {6}),
        ("sun", {6}),
        ("1-5", {0, 1, 2, 3, 4}),
        ("MON-FRI", {0, 1, 2, 3, 4}),
        ("6,0", {5, 6}),
        ("*/2", {6, 1, 3, 5}),
        ("1/2", {0, 2, 4}),
    ],
)
def test_day_of_week_uses_standard_cron_numbers(dow: str, weekdays: set[int]) -> None:
    """Day of week counts 0 (or 7) as Sunday as cron does, not APScheduler 3's Monday."""
    fires = next_fires(f"0 9 * * {dow}", n=14)
    assert {f.weekday() for f in fires} == weekdays


def test_cron_uses_the_time_zone() -> None:
    """A cron expression is evaluated in the given zone."""
    (fire,) = next_fires("0 9 * * *", n=1, tz="America/New_York")
    assert fire.tzinfo == ZoneInfo("America/New_York")
    assert (fire.hour, fire.utcoffset()) == (9, timedelta(hours=-5))


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("* *", "2 fields"),
        ("0 0 * * 1-9", "'9'"),
        ("0 0 * * 5-1", "runs backwards"),
        ("0 0 * * */0", "step '0'"),
        ("0 0 L * *", "'0 0 L * *'"),
    ],
)
def test_parse_cron_errors(expr: str, fragment: str) -> None:
    """parse_cron refuses bad expressions naming the expression and the problem."""
    with pytest.raises(JobConfigError) as info:
        parse_cron(expr)
    assert fragment in str(info.value)
    assert repr(expr) in str(info.value)


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 0 31 11 ?", "0 12 31 2,4 *"])
def test_parse_cron_refuses_a_cron_that_never_fires(expr: str) -> None:
    """A date that never exists is refused when parsed (it would stay pending forever),
    naming the expression and the day and month fields."""
    with pytest.raises(JobConfigError) as info:
        parse_cron(expr, "Europe/Paris")
    message = str(info.value)
    assert repr(expr) in message and "can never fire" in message
    assert "day-of-month" in message


def test_parse_cron_unknown_zone() -> None:
    """An unknown zone is refused naming it."""
    with pytest.raises(JobConfigError, match="'Atlantis/Capital'"):
        parse_cron("* * * * *", "Atlantis/Capital")


def test_build_trigger_interval() -> None:
    """An interval config gives a trigger firing every interval seconds in its zone."""
    trigger = build_trigger(interval_job("i", 90, time_zone="Europe/Paris"))
    first = trigger.get_next_fire_time(None, START)
    second = trigger.get_next_fire_time(first, first + timedelta(microseconds=1))
    assert second - first == timedelta(seconds=90)
    assert first.tzinfo == ZoneInfo("Europe/Paris")
