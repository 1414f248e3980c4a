"""What the registry says about one job, adopted here: its stored config and its
switches (the job's and each item's). The one writer of ``JobState``'s switches
and the one caller of ``JobState.set_config``.

Re-reads run on the job's lane; watch events (through the reactions' commands)
and a batched registration set the switches without a read.
"""

from __future__ import annotations

import logging

from shardkeeper.config import JobConfig
from shardkeeper.errors import ShardkeeperError
from shardkeeper.runtime.job.jobstate import JobState, switch_time
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.ports import JobLifecycle
from shardkeeper.runtime.job.services import JobServices

__all__ = ["JobSettings"]

log = logging.getLogger("shardkeeper.runtime.runner.runner")


class JobSettings:
    """The stored config and switches of one job (module docstring)."""

    def __init__(
        self, services: JobServices, state: JobState, leader: LeaderDuties, port: JobLifecycle
    ) -> None:
        self._s = services
        self._state = state
        self._leader = leader
        self._port = port

    # -- config -------------------------------------------------------------------

    def adopt(self, config: JobConfig) -> None:
        """Take ``config`` as the job's (strategy and error handler follow it)."""
        self._state.set_config(config)

    def reload_config(self) -> None:
        """Re-read the stored config and adopt it when it changed (lane task). A job
        whose whole subtree is gone was removed by an operator: it is retired here."""
        st = self._state
        try:
            stored = self._s.configs.load()
        except ShardkeeperError as exc:
            log.warning(
                "%s: stored config unreadable; keeping the current one: %s", st.config.name, exc
            )
            return
        if stored is None:
            if st.registered:
                # The config of a job this instance registered is gone: an operator
                # removed the job (``remove --force`` deletes the config first, then
                # the rest). Registering again, or electing a leader, would undo
                # that and race the removal; stop running it here instead.
                self._port.retire("the job was removed from the registry")
            return
        if stored == st.config:
            return
        old = st.config
        self.adopt(stored)
        log.info("%s: configuration changed in the registry", stored.name)
        if old.sharding_total_count != stored.sharding_total_count and self._leader.is_leader:
            self._s.sharding.set_necessary("count changed")
            # said once, by the leader: a raise whose new items got no parameter
            # runs them with ctx.item_parameter "" (newcomer review N5)
            gap = stored.parameters_gap()
            if gap and stored.sharding_total_count > old.sharding_total_count:
                log.warning("%s", gap)
        self._port.config_changed(old)

    # -- switches -----------------------------------------------------------------

    def reload_switches(self) -> None:
        """Re-read the job's and the items' switches, with the time each was set
        (lane task)."""
        store, paths = self._s.store, self._s.paths
        job = store.get(paths.disabled_job)
        items: dict[int, float] = {}
        for n in store.children(paths.disabled_items):
            if n.isdigit():
                node = store.get(paths.disabled_item(int(n)))
                if node is not None:  # gone meanwhile: enabled
                    items[int(n)] = switch_time(node.value)
        self._state.disabled_job = job is not None
        self._state.disabled_job_at = switch_time(job.value) if job is not None else 0.0
        self._state.disabled_items = set(items)
        self._state.disabled_items_at = items

    def reload(self) -> None:
        """Re-read the switches, then the config (lane task)."""
        self.reload_switches()
        self.reload_config()

    def switch_job(self, on: bool, at: float = 0.0) -> None:
        """The job's switch changed (a watch event; ``at``: the time stored with a
        disable, 0.0 when unknown)."""
        self._state.disabled_job = not on
        self._state.disabled_job_at = 0.0 if on else at

    def switch_item(self, item: int, on: bool, at: float = 0.0) -> None:
        """An item's switch changed (a watch event; ``at`` as for :meth:`switch_job`)."""
        if on:
            self._state.disabled_items.discard(item)
            self._state.disabled_items_at.pop(item, None)
        else:
            self._state.disabled_items.add(item)
            self._state.disabled_items_at[item] = at

    def no_switches(self) -> None:
        """Nothing of the job existed when it was registered: no switch is set."""
        self._state.disabled_job = False
        self._state.disabled_job_at = 0.0
        self._state.disabled_items = set()
        self._state.disabled_items_at = {}
