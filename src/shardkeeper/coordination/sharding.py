"""Resharding: the "necessary" flag, the leader's computation and the one commit.

Resharding is lazy (see docs/concepts.md): membership changes, count changes,
enabling/disabling instances and the reconcile check only set the flag; the
leader recomputes the assignment at the next trigger, once no item runs, and
writes it and clears the flag in ONE atomic commit that also checks it is still
the leader. Followers that find the flag wait (bounded) until it is gone.
"""

from __future__ import annotations

import logging
import time

from shardkeeper.coordination.model import Assignment, DocumentError
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.strategies import ShardingStrategy
from shardkeeper.registry.base import Check, CoordinationStore, Delete, Put

__all__ = ["ShardingService"]

log = logging.getLogger(__name__)


class ShardingService:
    """Reads and (as leader) rewrites one job's assignment."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id

    def set_necessary(self, reason: str) -> None:
        """Ask for a reshard at the next trigger (idempotent)."""
        self._store.put(self._paths.necessary, reason.encode())

    def is_necessary(self) -> bool:
        """Whether a reshard is pending."""
        return self._store.exists(self._paths.necessary)

    def live_instances(self) -> list[str]:
        """Sorted ids of the live instances of the job (membership nodes)."""
        return self._store.children(self._paths.instances)

    def enabled_instances(self) -> list[str]:
        """Sorted ids of the live instances that an operator has not disabled."""
        disabled = set(self._store.children(self._paths.disabled_instances))
        return [i for i in self.live_instances() if i not in disabled]

    def read(self) -> tuple[Assignment | None, int]:
        """The stored assignment and its node version (None, -1 when absent/bad)."""
        node = self._store.get(self._paths.sharding)
        if node is None or not node.value:
            return None, -1
        try:
            return Assignment.from_bytes(node.value, node.path), node.version
        except DocumentError as exc:
            log.warning("%s: ignoring a malformed assignment: %s", self._paths.job, exc)
            return None, node.version

    @staticmethod
    def is_consistent(assignment: Assignment | None, enabled: list[str], total: int) -> bool:
        """Whether the assignment fits the live enabled instances and the item count:
        every item has an owner among them, and no enabled instance is left without
        items while there are at least as many items as instances."""
        if assignment is None or assignment.total != total:
            return False
        if set(assignment.owners) != set(range(total)):
            return False
        live = set(enabled)
        owners = set(assignment.owners.values())
        if not owners <= live:
            return False
        # an enabled instance without items while there are enough items for all
        return total < len(live) or owners == live

    def reshard(
        self, strategy: ShardingStrategy, total: int, leader_check: Check, generation: int
    ) -> Assignment | None:
        """Compute the assignment over the enabled instances and commit it with the
        flag's removal, only while still leader. None when nothing was committed
        (no enabled instance, or leadership lost)."""
        enabled = self.enabled_instances()
        if not enabled:
            log.warning("%s: no enabled instance to assign items to", self._paths.job)
            return None
        by_instance = strategy(enabled, self._paths.job, total)
        owners = {item: inst for inst, items in by_instance.items() for item in items}
        missing = set(range(total)) - set(owners)
        if missing:
            raise RuntimeError(
                f"sharding strategy left items {sorted(missing)} of {self._paths.job} unassigned"
            )
        assignment = Assignment(
            total=total, owners=owners, generation=generation, leader=self._me, at=time.time()
        )
        result = self._store.commit(
            [
                leader_check,
                Put(self._paths.sharding, assignment.to_bytes()),
                Delete(self._paths.necessary),
            ]
        )
        if not result:
            log.info("%s: reshard not committed (leadership changed)", self._paths.job)
            return None
        log.info(
            "%s: resharded %d items over %d instances (generation %d)",
            self._paths.job,
            total,
            len(enabled),
            generation,
        )
        return assignment
