"""The reading half of the operations API (:class:`Reads`): jobs, the status
overview, one job's detail, live instances, stored configs and raw dumps, each built
from one snapshot read (:mod:`shardkeeper.coordination.snapshot`)."""

from __future__ import annotations

import base64
import time
from dataclasses import replace
from datetime import UTC, datetime

from shardkeeper.config import JobConfig
from shardkeeper.config.secrets import mask_config_data, mask_config_text, mask_edits
from shardkeeper.coordination.config_service import ConfigService, StoredConfig
from shardkeeper.coordination.paths import JobNode, parse
from shardkeeper.coordination.snapshot import (
    JobSnapshot,
    read_clocks,
    read_instances,
    read_snapshots,
)
from shardkeeper.errors import JobLookupError, ShardkeeperError
from shardkeeper.ops.base import OperationsBase
from shardkeeper.ops.health import JobHealth, assess
from shardkeeper.ops.views import (
    DumpEntry,
    InstanceView,
    ItemView,
    JobDetail,
    JobStatus,
    JobSummary,
    Overview,
)
from shardkeeper.registry.base import check_path
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.scheduling.triggers import build_trigger
from shardkeeper.secretref import mask_urls_in_text

__all__ = ["Reads", "finished_in_batch", "next_fire"]


def next_fire(config: JobConfig | None, now: datetime | None = None) -> datetime | None:
    """When ``config``'s trigger fires next after ``now`` (UTC), or None."""
    if config is None:
        return None
    try:
        trigger = build_trigger(config)
        nxt = trigger.get_next_fire_time(None, now or datetime.now(UTC))
    except (ShardkeeperError, ValueError):
        return None
    return nxt.astimezone(UTC) if isinstance(nxt, datetime) else None


def finished_in_batch(state: JobSnapshot, item: int) -> bool:
    """Whether ``item`` still carries its running mark but its run of that fire has
    ended: its result (written as it ended, runtime/fire/batches.py) is of the mark's fire,
    instance and run. The mark stays until the slowest item of the instance's batch
    ends (one completion commit per batch), so without this a finished item, a failed
    one too, read as running (newcomer review N15)."""
    mark = state.running.get(item)
    result = state.results.get(item)
    return (
        mark is not None
        and result is not None
        and abs(result.fire_time - mark.fire_time) < 1e-3
        and result.instance == mark.instance_id
        and result.ended >= mark.started_at
    )


def _item_view(state: JobSnapshot, item: int, health: JobHealth) -> ItemView:
    owners = state.assignment.owners if state.assignment else {}
    params = state.config.sharding_item_parameters if state.config else {}
    mark = state.running.get(item)
    entry = state.failover.get(item)
    result = state.results.get(item)
    report = state.progress.get(item)
    # a report counts while its execution runs (a re-run of the same fire shows its
    # predecessor's until it reports: it resumes from there)
    progress = (
        report.to_dict()
        if report is not None and mark is not None and report.execution_id == mark.execution_id
        else None
    )
    return ItemView(
        item=item,
        parameter=params.get(item, ""),
        owner=owners.get(item),
        running_on=(mark.instance_id if mark else "?") if item in state.running else None,
        execution_id=mark.execution_id if mark else None,
        fire_time=mark.fire_time if mark else None,
        running_as_failover=bool(mark and mark.failover),
        failover_queued=item in state.failover,
        failover_from=entry.from_instance if entry else None,
        misfire=item in state.misfire,
        misfire_fire_time=state.misfire.get(item),
        disabled=item in state.disabled_items,
        last_run=result.ended if result else None,
        last_duration=round(result.duration, 3) if result else None,
        last_outcome=result.outcome if result else None,
        last_ok=(result.last_ok or None) if result else None,
        last_error=(f"{result.error_type}: {result.error}" if result and result.failed else None),
        last_instance=result.instance if result else None,
        failures=result.failures if result else 0,
        health=health.items.get(item, "ok"),
        progress=None if finished_in_batch(state, item) else progress,
        finished=finished_in_batch(state, item),
    )


class Reads(OperationsBase):
    """Inspection: every method reads, none writes."""

    @staticmethod
    def _summary(state: JobSnapshot) -> JobSummary:
        reason = None if state.enabled else "disabled"
        if reason is None and state.one_off_done is not None:
            reason = "done"  # a one-off job that ran: it never fires again
        if reason is None and not state.instances:
            reason = "no instance"  # nothing would fire at the trigger's next time
        return JobSummary(
            name=state.name,
            trigger=state.trigger,
            sharding_total_count=state.total,
            instances=list(state.instances),
            leader=state.leader,
            enabled=state.enabled,
            failover=bool(state.config and state.config.failover),
            next_fire=next_fire(state.config) if reason is None else None,
            config_error=_masked_error(state.config_error),
            next_fire_reason=reason if state.config is not None else None,
        )

    def _health(self, state: JobSnapshot) -> tuple[str, JobHealth]:
        """The job's health word and its items' health (see :class:`JobStatus`)."""
        items = assess(state, now=time.time(), grace=self.store.session_timeout + 1.0)
        if state.config_error:
            return "config-error", items
        if state.one_off_done is not None and not state.running and not state.failover:
            return "done", items  # a one-off job that ran: no instance need run it
        if not state.instances:
            # not "stale": that word is an item's that has not run for too long, and
            # a job nobody runs deserves a name an operator cannot misread
            return "no-instance", items
        if not state.enabled:
            return "disabled", items
        if items.failing:
            return "failing", items
        if items.stale:
            return "stale", items
        if state.failover:
            return "failover-pending", items
        if state.necessary is not None:
            return "reshard-pending", items
        return "ok", items

    def jobs(self) -> list[JobSummary]:
        """Every registered job (one with a stored config), sorted by name."""
        return [self._summary(s) for s in read_snapshots(self.store).values()]

    def status(self) -> Overview:
        """Live instances and every job with its health (see :class:`JobStatus`)."""
        jobs = []
        for state in read_snapshots(self.store).values():
            in_range = set(range(state.total))
            health, items = self._health(state)
            jobs.append(
                JobStatus(
                    summary=self._summary(state),
                    reshard_pending=state.necessary is not None,
                    running_items=sum(not finished_in_batch(state, i) for i in state.running),
                    failover_queued=len(state.failover),
                    misfired_items=len(state.misfire),
                    disabled_items=len(state.disabled_items & in_range),
                    disabled_instances=len(state.disabled_instances & set(state.instances)),
                    health=health,
                    failing_items=items.failing,
                    stale_items=items.stale,
                )
            )
        settings: RegistrySettings | None = getattr(self.store, "settings", None)
        if not isinstance(settings, RegistrySettings):
            settings = getattr(self.store, "_settings", None)
        backend = settings.backend if isinstance(settings, RegistrySettings) else "?"
        return Overview(
            backend=backend,
            namespace=self.store.namespace,
            instances=self._live_instances(),
            jobs=jobs,
        )

    def job(self, name: str) -> JobDetail:
        """Everything about job ``name``; JobLookupError when it is not registered."""
        state = self._job_state(name)
        health, item_health = self._health(state)
        items = [_item_view(state, item, item_health) for item in range(state.total)]
        assignment = state.assignment
        summary = self._summary(state)
        return JobDetail(
            name=state.name,
            # every view of a job reads it here: a literal secret leaves masked
            config=mask_config_data(state.config_data),
            config_error=_masked_error(state.config_error),
            trigger=state.trigger,
            enabled=state.enabled,
            disabled_by_operator=state.disabled_job,
            leader=state.leader,
            instances=list(state.instances),
            disabled_instances=sorted(state.disabled_instances),
            reshard_pending=state.necessary is not None,
            reshard_reason=state.necessary,
            assignment_generation=assignment.generation if assignment else None,
            assigned_at=assignment.at if assignment else None,
            next_fire=summary.next_fire,
            items=items,
            next_fire_reason=summary.next_fire_reason,
            health=health,
        )

    def instances(self, job: str | None = None) -> list[InstanceView]:
        """Live instances (of ``job`` only, when given), sorted by id."""
        states = read_snapshots(self.store)
        if job is not None and job not in states:
            raise JobLookupError(job)
        views: list[InstanceView] = []
        clocks = read_clocks(self.store)
        for instance_id, info in read_instances(self.store).items():
            clock = clocks.get(instance_id, {})
            member_of = [s for s in states.values() if instance_id in s.instances]
            if job is not None and all(s.name != job for s in member_of):
                continue
            views.append(
                InstanceView(
                    instance_id=instance_id,
                    host=info.host,
                    pid=info.pid or None,
                    version=info.version,
                    started_at=info.started_at or None,
                    labels=dict(info.labels),
                    jobs=[s.name for s in member_of],
                    items={
                        s.name: s.assignment.items_of(instance_id) if s.assignment else []
                        for s in member_of
                    },
                    running={
                        s.name: sorted(
                            i for i, m in s.running.items() if m and m.instance_id == instance_id
                        )
                        for s in member_of
                    },
                    disabled={s.name: instance_id in s.disabled_instances for s in member_of},
                    leader_of=[s.name for s in member_of if s.leader == instance_id],
                    clock_offset=_number(clock.get("offset")),
                    clock_error=_number(clock.get("error")),
                    clock_at=_number(clock.get("at")),
                    clock_skewed=sorted(
                        s.name for s in states.values() if instance_id in s.skewed_instances
                    ),
                )
            )
        return views

    def get_config(self, job: str) -> JobConfig:
        """The stored configuration of ``job`` (JobConfigError when it is invalid,
        saying how to repair it; :meth:`stored_config` reads it without raising).
        Its secret fields are as stored (a literal or a reference): show it through
        :func:`~shardkeeper.ops.config_to_dict`, which masks them."""
        config = ConfigService(self.store, self._require_job(job)).load()
        if config is None:
            raise JobLookupError(job)
        return config

    def stored_config(self, job: str) -> StoredConfig:
        """The stored config document of ``job`` as it is, valid or not: the raw text,
        the config or the reason it is invalid, and who wrote it last. Made to be
        shown: the raw text, the error and the edits have their secrets masked (the
        ``config`` is the real one: show it with ``config_to_dict``)."""
        stored = ConfigService(self.store, self._require_job(job)).read()
        if stored is None:
            raise JobLookupError(job)
        shown = mask_config_text(stored.text)
        return replace(
            stored,
            # the bytes as stored unless a secret had to be masked in them
            raw=stored.raw if shown == stored.text else shown.encode("utf-8"),
            error=_masked_error(stored.error),
            edits=mask_edits(stored.edits),
        )

    def dump(self, path: str = "/") -> dict[str, DumpEntry]:
        """Every node at or below ``path`` (path -> entry), sorted by path. Values are
        UTF-8 text, or base64 when they are not UTF-8. ConfigError for a bad path."""
        check_path(path)
        out: dict[str, DumpEntry] = {}
        tree = self.store.get_tree(path)
        for node_path in sorted(tree):
            node = tree[node_path]
            try:
                value, encoding = node.value.decode("utf-8"), "utf-8"
                parsed = parse(node_path)
                if isinstance(parsed, JobNode) and parsed.kind == "config":
                    value = mask_config_text(value)  # the stored config's secrets
            except UnicodeDecodeError:
                value, encoding = base64.b64encode(node.value).decode("ascii"), "base64"
            out[node_path] = DumpEntry(
                path=node_path,
                value=value,
                encoding=encoding,
                kind="ephemeral" if node.ephemeral else "persistent",
                version=node.version,
                revision=node.revision,
                created_revision=node.created_revision,
            )
        return out


def _masked_error(error: str | None) -> str | None:
    """A config error as shown: an invalid document's message may quote a URL."""
    return None if error is None else mask_urls_in_text(error)


def _number(value: object) -> float | None:
    """A number of a stored document, or None (absent or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
