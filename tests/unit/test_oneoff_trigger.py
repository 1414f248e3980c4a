"""The one-off trigger field ``at``: validation, its forms in job files and JSON, and
how the scheduler fires it (once, only while its time is ahead).

Absence of a fire is shown by waiting for a sentinel interval job to fire, never by
sleeping (as in test_scheduler.py).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig, load_job_configs
from shardkeeper.errors import JobConfigError
from shardkeeper.scheduling import TriggerScheduler, build_trigger
from shardkeeper.scheduling.triggers import OnceTrigger

AT = "2026-12-01T12:00:00Z"
TOML_JOB = '[[jobs]]\nname = "{name}"\nat = {at}\nsharding_total_count = 1\n'


def parse(**fields: Any) -> JobConfig:
    return JobConfig.parse(name="once", sharding_total_count=2, **fields)


def refused(**fields: Any) -> str:
    with pytest.raises(JobConfigError) as info:
        parse(**fields)
    return str(info.value)


def test_at_is_kept_as_utc_and_round_trips() -> None:
    """An offset is converted to UTC; the JSON form is canonical and reads back equal."""
    cfg = parse(at="2026-12-01T13:00:00+01:00")
    assert cfg.at == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert cfg.one_off
    assert cfg.describe_trigger() == "once at 2026-12-01T12:00:00Z"
    assert b'"at":"2026-12-01T12:00:00Z"' in cfg.to_json()
    assert JobConfig.from_json(cfg.to_json()) == cfg
    aware = datetime(2026, 12, 1, 7, 0, tzinfo=timezone(timedelta(hours=-5)))
    assert parse(at=aware).at == cfg.at
    assert not parse(interval=5).one_off


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("2026-12-01T12:00:00", "has no time zone"),
        (datetime(2026, 12, 1, 12, 0), "has no time zone"),
        ("tomorrow noon", "is not an ISO 8601 date and time"),
        (1764590400, "is not a date and time"),
        (True, "is not a date and time"),
    ],
)
def test_bad_at_is_refused_naming_the_value(value: Any, fragment: str) -> None:
    """A time without a zone is refused, not guessed; other values name what is valid."""
    message = refused(at=value)
    assert fragment in message
    assert repr(value) in message
    assert "2026-12-01T12:00:00Z" in message  # an example of what would be valid


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ({"at": AT, "interval": 5}, "both interval and at"),
        ({"at": AT, "cron": "* * * * *"}, "both cron and at"),
        ({"at": AT, "cron": "* * * * *", "interval": 5}, "all three"),
        ({}, "neither"),
    ],
)
def test_exactly_one_trigger(fields: dict[str, Any], word: str) -> None:
    """at excludes cron and interval; one of the three is required."""
    message = refused(**fields)
    assert "exactly one of cron, interval and at" in message
    assert word in message


def test_at_needs_monitored_items() -> None:
    """Done is recorded from the items' completions: monitor_execution must be on."""
    assert "needs monitor_execution=True" in refused(at=AT, monitor_execution=False)


def test_at_in_job_files(tmp_path: Path) -> None:
    """YAML (an unquoted timestamp or text) and TOML (an offset date-time) give the
    same config; a TOML local date-time (no zone) is refused naming the job."""
    yaml_file = tmp_path / "jobs.yaml"
    yaml_file.write_text(
        "jobs:\n"
        "  - {name: a, at: 2026-12-01T12:00:00Z, sharding_total_count: 1}\n"
        "  - {name: b, at: '2026-12-01T13:00:00+01:00', sharding_total_count: 1}\n"
    )
    a, b = load_job_configs(yaml_file)
    assert a.at == b.at == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    toml_file = tmp_path / "jobs.toml"
    toml_file.write_text(
        '[[jobs]]\nname = "c"\nat = 2026-12-01T12:00:00Z\nsharding_total_count = 1\n'
    )
    (c,) = load_job_configs(toml_file)
    assert c.at == a.at
    toml_file.write_text(
        '[[jobs]]\nname = "d"\nat = 2026-12-01T12:00:00\nsharding_total_count = 1\n'
    )
    with pytest.raises(JobConfigError, match=r"job 'd' \(#1\).*has no time zone"):
        load_job_configs(toml_file)


def test_once_trigger_reports_its_time_only_while_ahead() -> None:
    """The time before it has come; nothing after it passed or after its one fire."""
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    trigger = build_trigger(parse(at=AT))
    assert isinstance(trigger, OnceTrigger)
    assert trigger.get_next_fire_time(None, at - timedelta(hours=1)) == at
    assert trigger.get_next_fire_time(None, at) == at
    assert trigger.get_next_fire_time(None, at + timedelta(seconds=1)) is None
    assert trigger.get_next_fire_time(at, at - timedelta(hours=1)) is None


def test_scheduler_fires_a_one_off_job_once_at_its_time() -> None:
    """Fired once at ``at`` (the scheduled time delivered); afterwards the job is known
    without a next fire (removing it is no error); a passed time is never delivered."""
    calls: list[tuple[str, datetime]] = []
    cond = threading.Condition()

    def on_fire(name: str, when: datetime) -> None:
        with cond:
            calls.append((name, when))
            cond.notify_all()

    def fired(name: str, n: int) -> bool:
        with cond:
            return cond.wait_for(lambda: sum(1 for c in calls if c[0] == name) >= n, 10)

    now = datetime.now(UTC)
    at = (now + timedelta(seconds=2)).replace(microsecond=(now.microsecond // 1000) * 1000)
    sched = TriggerScheduler(on_fire, threads=1)
    sched.add_job("soon", parse(at=at.isoformat()))
    sched.add_job("past", parse(at=(now - timedelta(hours=1)).isoformat()))
    assert sched.next_fire_time("past") is None
    assert sched.next_fire_time("soon") == at
    sched.start()
    try:
        assert fired("soon", 1)
        sched.add_job("sentinel", JobConfig(name="sentinel", interval=0.1, sharding_total_count=1))
        assert fired("sentinel", 5)  # time for a second fire of "soon" to show
        assert [c for c in calls if c[0] == "soon"] == [("soon", at)]
        assert not [c for c in calls if c[0] == "past"]
        assert sched.has_job("soon")
        assert sched.next_fire_time("soon") is None
        sched.remove_job("soon")
        sched.remove_job("past")
        assert not sched.has_job("soon")
    finally:
        sched.shutdown()
