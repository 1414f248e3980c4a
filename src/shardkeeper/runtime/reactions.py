"""How one job reacts to its registry: connection states and watch events.

Both arrive on the store's event thread, so nothing here calls the store: a change
becomes a state flag, a forgotten cache, or a task queued on the job's lane. Events
are hints (``events.classify``); every decision they lead to reads the store again on
the lane. A mixin of :class:`~shardkeeper.runtime.runner.JobRunner`, which owns the
state it uses (declared below).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import ShardkeeperError
from shardkeeper.registry.base import ConnectionState, CoordinationStore, EventKind, WatchEvent
from shardkeeper.runtime import events as ev
from shardkeeper.runtime.jobstate import JobState
from shardkeeper.runtime.leader import LeaderDuties
from shardkeeper.runtime.services import JobServices
from shardkeeper.runtime.trigger import TriggerFlow

__all__ = ["Reactions"]

log = logging.getLogger("shardkeeper.runtime.runner")


class Reactions:
    """Connection states and registry events of one job (module docstring)."""

    # owned and set up by JobRunner.__init__
    state: JobState
    trigger: TriggerFlow
    leader: LeaderDuties
    services: JobServices
    paths: JobPaths
    _store: CoordinationStore
    _me: str
    on_config_change: Callable[..., None] | None

    @property
    def _s(self) -> JobServices:
        return self.services

    @property
    def name(self) -> str:
        """The job's name."""
        return self.state.config.name

    # provided by JobRunner
    def submit(self, key: str | None, fn: Callable[[], object]) -> None:
        """Run ``fn`` on this job's lane (JobRunner)."""
        raise NotImplementedError

    def request_repair(self) -> None:
        """Run a housekeeping pass soon (JobRunner)."""
        raise NotImplementedError

    def fence_all(self) -> None:
        """Fence every execution in progress (JobRunner)."""
        raise NotImplementedError

    def try_claim(self) -> None:
        """Claim orphaned items (JobRunner)."""
        raise NotImplementedError

    def retire(self, why: str) -> None:
        """Stop running the job here (JobRunner)."""
        raise NotImplementedError

    def _run_now(self) -> None:
        """An operator's run-now request (FireQueue)."""
        raise NotImplementedError

    # -- connection states ----------------------------------------------------------

    def on_state(self, state: ConnectionState) -> None:
        """Apply a connection-state change (store event thread: no store call here)."""
        self._s.election.on_state(state)
        if state is not ConnectionState.SUSPENDED:
            # events may have been missed meanwhile: the next fire reads the assignment
            # (and the reshard flag)
            self.trigger.forget_assignment()
        if state is ConnectionState.SUSPENDED:
            self.state.suspended = True
        elif state is ConnectionState.RECONNECTED:
            self.state.suspended = False
            self.request_repair()
        elif state is ConnectionState.LOST:
            # Our ephemeral nodes are gone; others may take our items: fence them off.
            self.state.registered = False
            self.state.marks_suspect = True
            self.state.suspended = False
            self.fence_all()
            log.warning("%s: session lost; running executions are fenced off", self.name)
        elif state is ConnectionState.CONNECTED:
            self.state.suspended = False

    # -- events ---------------------------------------------------------------------

    def on_event(self, event: WatchEvent) -> None:
        """A change of one of this job's nodes (store event thread): a hint."""
        if event.path == self.paths.sharding:
            self.trigger.forget_assignment()
        elif event.path == self.paths.necessary:
            self._s.sharding.note_flag_event(event.kind is EventKind.DELETED)
        hint = ev.classify(event, self._me)
        st = self.state
        match hint:
            case ev.Resync():
                self.trigger.forget_assignment()
                self.request_repair()
            case ev.MemberLeft(instance=inst):
                if self.leader.is_leader:
                    self.submit(f"left:{inst}", lambda: self.leader.member_left(inst))
            case ev.LeaderGone():
                if st.registered:
                    self.submit("elect", self.leader.elect)
            case ev.FailoverQueued(item=item):
                st.queue_hint.add(item)
                if st.config.failover:
                    self.submit("claim", self.try_claim)
            case ev.FailoverTaken(item=item):
                st.queue_hint.discard(item)
            case ev.JobSwitched(on=on):
                st.disabled_job = not on
            case ev.ItemSwitched(item=item, on=on):
                if on:
                    st.disabled_items.discard(item)
                else:
                    st.disabled_items.add(item)
            case ev.InstanceSwitched():
                if self.leader.is_leader:
                    self.submit(
                        "switched", lambda: self._s.sharding.set_necessary("instance switched")
                    )
            case ev.RunNow():
                self.submit("run-now", self._run_now)
            case ev.ConfigChanged():
                self.submit("config", self._reload_config)
            case _:
                pass

    def _reload(self) -> None:
        self._reload_switches()
        self._reload_config()

    def _reload_switches(self) -> None:
        self.state.disabled_job = self._store.exists(self.paths.disabled_job)
        self.state.disabled_items = {
            int(n) for n in self._store.children(self.paths.disabled_items) if n.isdigit()
        }

    def _reload_config(self) -> None:
        try:
            stored = self._s.configs.load()
        except ShardkeeperError as exc:
            log.warning("%s: stored config unreadable; keeping the current one: %s", self.name, exc)
            return
        if stored is None:
            if self.state.registered and not self._store.exists(self.paths.instance(self._me)):
                # The job's whole subtree is gone, config included: an operator
                # removed the job (``remove --force``). Registering again would undo
                # that; stop running it here instead.
                self.retire("the job was removed from the registry")
            return
        if stored == self.state.config:
            return
        old = self.state.config
        self.state.set_config(stored)
        log.info("%s: configuration changed in the registry", stored.name)
        if old.sharding_total_count != stored.sharding_total_count and self.leader.is_leader:
            self._s.sharding.set_necessary("count changed")
        if self.on_config_change is not None:
            self.on_config_change(self, old)
