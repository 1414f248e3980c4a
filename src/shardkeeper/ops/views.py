"""Typed results of the operations API, each with a JSON-friendly ``to_dict()``.

The dictionaries are the ``--json`` output of the CLI, so their field names are a
stable interface (documented in ``docs/cli.md``): fields may be added, never renamed
or removed. Times are ISO 8601 strings in UTC (``2024-05-01T12:00:00+00:00``) or
null; item numbers are integers; instance ids are strings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "DumpEntry",
    "InstanceView",
    "ItemView",
    "JobDetail",
    "JobStatus",
    "JobSummary",
    "Overview",
    "iso",
    "item_ranges",
]


def item_ranges(items: Iterable[int]) -> str:
    """Item numbers as sorted ranges: ``0-999,1500,1502-1503`` (``""`` for none). A
    job of 2,000 items lists an instance's share in a few characters, not 5,000."""
    parts: list[str] = []
    ordered = sorted(set(items))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def iso(value: float | datetime | None) -> str | None:
    """An epoch timestamp or datetime as an ISO 8601 UTC string (None stays None;
    0, which the documents use for "unknown", also becomes None)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        return dt.astimezone(UTC).isoformat(timespec="seconds")
    if value <= 0:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class JobSummary:
    """One line of the job list.

    ``enabled`` is false when an operator disabled the job (``disabled/job`` node) or
    its config says ``disabled``. ``next_fire`` is computed from the stored trigger
    (interval triggers are anchored at the Unix epoch, so it is exact for them too);
    it is None for a disabled job or an unreadable config, and when no live instance
    runs the job (nothing would fire): ``next_fire_reason`` then says why
    (``disabled``, ``no instance``). ``config_error`` explains a stored config that
    could not be read.
    """

    name: str
    trigger: str
    sharding_total_count: int
    instances: list[str]
    leader: str | None
    enabled: bool
    failover: bool
    next_fire: datetime | None
    config_error: str | None = None
    next_fire_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema ``JobSummary`` in docs/cli.md)."""
        return {
            "name": self.name,
            "trigger": self.trigger,
            "sharding_total_count": self.sharding_total_count,
            "instances": list(self.instances),
            "leader": self.leader,
            "enabled": self.enabled,
            "failover": self.failover,
            "next_fire": iso(self.next_fire),
            "next_fire_reason": self.next_fire_reason,
            "config_error": self.config_error,
        }


@dataclass(frozen=True)
class JobStatus:
    """A job's summary plus its health, for the ``status`` overview.

    ``health`` is the first that applies of: ``config-error`` (the stored config is
    unreadable), ``done`` (a one-off job that ran, nothing of it left running),
    ``no-instance`` (no live instance runs the job), ``disabled``, ``failing`` (an item's
    last execution failed: ``failing_items``), ``stale`` (an item has not run for
    longer than its schedule allows: ``stale_items``; see ops/health.py),
    ``failover-pending``, ``reshard-pending``, ``ok``. ``running_items``: items
    whose code runs now (an item that ended while its batch's slower items run is
    not counted: :attr:`ItemView.finished`).
    """

    summary: JobSummary
    reshard_pending: bool
    running_items: int
    failover_queued: int
    misfired_items: int
    disabled_items: int
    disabled_instances: int
    health: str
    failing_items: list[int] = field(default_factory=list)
    stale_items: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON view: the JobSummary fields plus the health fields."""
        return {
            **self.summary.to_dict(),
            "reshard_pending": self.reshard_pending,
            "running_items": self.running_items,
            "failover_queued": self.failover_queued,
            "misfired_items": self.misfired_items,
            "disabled_items": self.disabled_items,
            "disabled_instances": self.disabled_instances,
            "health": self.health,
            "failing_items": list(self.failing_items),
            "stale_items": list(self.stale_items),
        }


@dataclass(frozen=True)
class Overview:
    """Everything in a namespace at a glance: its live instances and every job."""

    backend: str
    namespace: str
    instances: list[str]
    jobs: list[JobStatus]

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema ``status`` in docs/cli.md)."""
        return {
            "backend": self.backend,
            "namespace": self.namespace,
            "instances": list(self.instances),
            "jobs": [j.to_dict() for j in self.jobs],
        }


@dataclass(frozen=True)
class ItemView:
    """The state of one item of a job.

    ``owner``: the instance the current assignment gives it to (None before the
    first reshard). ``running_on``: the instance whose running mark it carries now.
    ``failover_queued``/``failover_from``: the item is orphaned and waits for a
    taker. ``misfire``: a trigger was missed while it ran (``misfire_fire_time``).
    ``last_*``: how its last execution ended (none yet, or monitor_execution off:
    None): ``last_run`` (end), ``last_duration`` (seconds), ``last_outcome`` (``ok``
    or ``failed``), ``last_ok`` (end of the last success), ``last_error`` (type:
    message, cut to 200 characters), ``last_instance``, ``failures`` (in a row).
    ``health`` is ``ok``, ``failing`` or ``stale`` (see ops/health.py).
    ``progress``: the running execution's last ``ctx.progress`` report (``done``,
    ``total``, ``note``, ``at``, ``percent``, ``rate`` per second, ``eta`` seconds),
    None when it gave none. ``finished``: the item still carries the mark of
    ``running_on`` but its run has ended (``last_outcome``): one fire's items on an
    instance are one batch, whose marks are cleared when its slowest item ends.
    """

    item: int
    parameter: str
    owner: str | None
    running_on: str | None
    execution_id: str | None
    fire_time: float | None
    running_as_failover: bool
    failover_queued: bool
    failover_from: str | None
    misfire: bool
    misfire_fire_time: float | None
    disabled: bool
    last_run: float | None = None
    last_duration: float | None = None
    last_outcome: str | None = None
    last_ok: float | None = None
    last_error: str | None = None
    last_instance: str | None = None
    failures: int = 0
    health: str = "ok"
    progress: dict[str, Any] | None = None
    #: its run of the fire in ``fire_time`` has ended (``last_outcome`` says how) but
    #: its mark stays until the slowest item of its batch on ``running_on`` ends
    finished: bool = False

    @property
    def running(self) -> bool:
        """Whether the item's code runs now (it carries a mark and has not ended)."""
        return self.running_on is not None and not self.finished

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema ``ItemView`` in docs/cli.md)."""
        return {
            "item": self.item,
            "parameter": self.parameter,
            "owner": self.owner,
            "running_on": self.running_on,
            "execution_id": self.execution_id,
            "fire_time": iso(self.fire_time),
            "running_as_failover": self.running_as_failover,
            "failover_queued": self.failover_queued,
            "failover_from": self.failover_from,
            "misfire": self.misfire,
            "misfire_fire_time": iso(self.misfire_fire_time),
            "disabled": self.disabled,
            "last_run": iso(self.last_run),
            "last_duration": self.last_duration,
            "last_outcome": self.last_outcome,
            "last_ok": iso(self.last_ok),
            "last_error": self.last_error,
            "last_instance": self.last_instance,
            "failures": self.failures,
            "health": self.health,
            "progress": dict(self.progress) if self.progress is not None else None,
            "finished": self.finished,
        }


@dataclass(frozen=True)
class JobDetail:
    """Everything about one job: stored config, members, leader, items.

    ``config`` is the stored configuration as JSON data (``{}`` when unreadable,
    then ``config_error`` says why), its literal secrets masked (``alert_webhook_url``
    as ``https://host/***``; an ``env:``/``file:`` reference as it is).
    ``reshard_pending`` is true while the ``necessary`` flag is set
    (``reshard_reason`` is its text); the leader reshards at the next trigger.
    ``disabled_by_operator`` is the ``disabled/job`` switch. ``health`` and
    ``next_fire_reason`` are those of :class:`JobStatus` and
    :class:`JobSummary`.
    """

    name: str
    config: dict[str, Any]
    config_error: str | None
    trigger: str
    enabled: bool
    disabled_by_operator: bool
    leader: str | None
    instances: list[str]
    disabled_instances: list[str]
    reshard_pending: bool
    reshard_reason: str | None
    assignment_generation: int | None
    assigned_at: float | None
    next_fire: datetime | None
    items: list[ItemView] = field(default_factory=list)
    next_fire_reason: str | None = None
    health: str = "ok"

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema ``JobDetail`` in docs/cli.md)."""
        return {
            "name": self.name,
            "config": dict(self.config),
            "config_error": self.config_error,
            "trigger": self.trigger,
            "enabled": self.enabled,
            "disabled_by_operator": self.disabled_by_operator,
            "leader": self.leader,
            "instances": list(self.instances),
            "disabled_instances": list(self.disabled_instances),
            "reshard_pending": self.reshard_pending,
            "reshard_reason": self.reshard_reason,
            "assignment_generation": self.assignment_generation,
            "assigned_at": iso(self.assigned_at),
            "next_fire": iso(self.next_fire),
            "next_fire_reason": self.next_fire_reason,
            "health": self.health,
            "items": [i.to_dict() for i in self.items],
        }


@dataclass(frozen=True)
class InstanceView:
    """A live instance: its metadata and what it does in each of its jobs.

    ``jobs`` are the jobs it is a member of now; ``items``/``running`` map each of
    them to the items the assignment gives it and the items it runs right now;
    ``disabled`` maps each to whether an operator switched it off there;
    ``leader_of`` lists the jobs it leads. ``state`` is ``live`` (only instances
    with a session in the store are listed).

    ``clock_offset`` (store time - its clock, seconds) and ``clock_error`` (the
    bound) are its latest clock sample, ``clock_at`` when it was taken (None: none
    published: no job of it has ``max_time_diff_seconds`` on); ``clock_skewed``
    lists the jobs whose limit its clock is past (it runs none of their items).
    ``health`` is ``ok``, or ``clock_skew`` while ``clock_skewed`` is not empty.
    """

    instance_id: str
    host: str
    pid: int | None
    version: str
    started_at: float | None
    labels: dict[str, str]
    jobs: list[str]
    items: dict[str, list[int]]
    running: dict[str, list[int]]
    disabled: dict[str, bool]
    leader_of: list[str]
    state: str = "live"
    clock_offset: float | None = None
    clock_error: float | None = None
    clock_at: float | None = None
    clock_skewed: list[str] = field(default_factory=list)

    @property
    def health(self) -> str:
        """``clock_skew`` while some job's clock limit keeps it idle, else ``ok``."""
        return "clock_skew" if self.clock_skewed else "ok"

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema ``InstanceView`` in docs/cli.md)."""
        return {
            "instance_id": self.instance_id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started_at": iso(self.started_at),
            "labels": dict(self.labels),
            "jobs": list(self.jobs),
            "items": {k: list(v) for k, v in self.items.items()},
            "running": {k: list(v) for k, v in self.running.items()},
            "disabled": dict(self.disabled),
            "leader_of": list(self.leader_of),
            "state": self.state,
            "health": self.health,
            "clock_offset": self.clock_offset,
            "clock_error": self.clock_error,
            "clock_at": iso(self.clock_at),
            "clock_skewed": list(self.clock_skewed),
        }


@dataclass(frozen=True)
class DumpEntry:
    """One stored node: its value (UTF-8 text, or base64 when the bytes are not
    UTF-8; ``encoding`` says which), its kind and its store versions."""

    path: str
    value: str
    encoding: str
    kind: str
    version: int
    revision: int
    created_revision: int

    def to_dict(self) -> dict[str, Any]:
        """JSON view (schema ``DumpEntry`` in docs/cli.md; the path is the key)."""
        return {
            "value": self.value,
            "encoding": self.encoding,
            "kind": self.kind,
            "version": self.version,
            "revision": self.revision,
            "created_revision": self.created_revision,
        }
