"""Resharding: the "necessary" flag, the leader's computation and the one commit.

Resharding is lazy (see docs/concepts.md): membership changes, count changes,
enabling/disabling instances and the reconcile check only set the flag; the
leader recomputes the assignment at the next trigger, once no item runs or, when
items still run after ``execution_wait_timeout``, to apply from the next fire
(running items are never stopped for a reshard), and writes it and clears the flag
in ONE atomic commit that also checks it is still the leader. Followers that find
the flag wait (bounded) until it is gone.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection

from shardkeeper.coordination.model import Assignment, DocumentError, InstanceInfo, next_births
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.strategies import ShardingStrategy
from shardkeeper.errors import JobConfigError
from shardkeeper.registry.base import Check, CoordinationStore, Delete, Op, Put

__all__ = ["ShardingService"]

log = logging.getLogger(__name__)


#: how the flag's value ends: " @<epoch seconds>", the wall time it was set
_SET_AT = re.compile(rb" @(\d+(?:\.\d+)?)$")


def necessary_value(reason: str, at: float | None = None) -> bytes:
    """The value of the reshard flag: the reason, and the wall time it was set (the
    leader lets a reshard asked for after a fire apply from the next fire: some
    instances may have decided that fire from the previous assignment already)."""
    return f"{reason} @{time.time() if at is None else at:.3f}".encode()


def necessary_parts(value: bytes) -> tuple[str, float | None]:
    """(reason, wall time it was set or None) of a reshard flag's value."""
    match = _SET_AT.search(value)
    if match is None:
        return value.decode("utf-8", "replace"), None
    return value[: match.start()].decode("utf-8", "replace"), float(match.group(1))


class ShardingService:
    """Reads and (as leader) rewrites one job's assignment."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id
        # A hint, from the watch, that the reshard flag is absent: the leader checks
        # the flag at every trigger, and this saves that read. Only "absent" is
        # cached; every event on the flag bumps the generation, so a read that raced
        # with an event does not store its (older) answer. Deciding on a stale hint is
        # safe: the start commit checks the flag's absence itself, and a refused
        # commit forgets the hint (forget_flag) before the fire is decided again.
        self._hint_lock = threading.Lock()
        self._flag_absent = False
        self._flag_generation = 0

    def note_flag_event(self, deleted: bool) -> None:
        """The watch saw the flag created/changed (False) or deleted (True)."""
        with self._hint_lock:
            self._flag_generation += 1
            self._flag_absent = deleted

    def forget_flag(self) -> None:
        """Events may have been missed (a reconnect, a resync, a refused commit):
        the next check reads the store."""
        with self._hint_lock:
            self._flag_generation += 1
            self._flag_absent = False

    def set_necessary(self, reason: str) -> None:
        """Ask for a reshard at the next trigger (idempotent). Only while the job's
        config exists: a leader reacting to the members a forced ``remove`` deleted
        must not write the removed job's root again."""
        self.forget_flag()
        done = self._store.commit(
            [
                Check(self._paths.config, exists=True),
                Put(self._paths.necessary, necessary_value(reason)),
            ]
        )
        if not done:
            log.info(
                "%s: no reshard flag set (%s): the job's config is gone", self._paths.job, reason
            )

    def is_necessary(self, *, fresh: bool = False) -> bool:
        """Whether a reshard is pending: from the watch's hint when it says the flag is
        absent, else (or when ``fresh``) read from the store."""
        with self._hint_lock:
            if self._flag_absent and not fresh:
                return False
            generation = self._flag_generation
        present = self._store.exists(self._paths.necessary)
        if not present:
            with self._hint_lock:
                if generation == self._flag_generation:
                    self._flag_absent = True
        return present

    def live_instances(self) -> list[str]:
        """Sorted ids of the live instances of the job (membership nodes)."""
        return self._store.children(self._paths.instances)

    def unavailable(self) -> set[str]:
        """Instances that get no items: disabled by an operator, or marked skewed by
        their own clock check (runtime/clockskew.py; the mark is ephemeral)."""
        disabled = set(self._store.children(self._paths.disabled_instances))
        return disabled | set(self._store.children(self._paths.skewed_root))

    def enabled_instances(self) -> list[str]:
        """Sorted ids of the live instances that are not :meth:`unavailable`."""
        unavailable = self.unavailable()
        return [i for i in self.live_instances() if i not in unavailable]

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

    def enabled_members(self, disabled: Collection[str] | None = None) -> dict[str, float]:
        """Live, enabled instances with the time they (re-)joined the job.

        This reads every membership node (on ZooKeeper two requests per member: the
        store reads a subtree node by node); ``disabled`` saves the listing of the
        :meth:`unavailable` instances when the caller has it already."""
        if disabled is None:
            disabled = self.unavailable()
        tree = self._store.get_tree(self._paths.instances)
        out: dict[str, float] = {}
        for path, node in tree.items():
            inst = path.rsplit("/", 1)[-1]
            if path == self._paths.instances or inst in disabled:
                continue
            try:
                out[inst] = InstanceInfo.from_bytes(node.value, path).started_at
            except DocumentError:
                out[inst] = 0.0
        return out

    def last_started_fire(self, live: Collection[str]) -> float:
        """The latest fire time any instance started items for (0 when none), and
        forget the markers of instances that are gone."""
        latest = 0.0
        for path, node in self._store.get_tree(self._paths.fired_root).items():
            inst = path.rsplit("/", 1)[-1]
            if path == self._paths.fired_root:
                continue
            if inst not in live:
                self._store.delete(path, recursive=False)
                continue
            try:
                latest = max(latest, float(node.value.decode() or 0))
            except (UnicodeDecodeError, ValueError):
                continue
        return latest

    def reshard(
        self,
        strategy: ShardingStrategy,
        total: int,
        leader_check: Check,
        generation: int,
        *,
        fire: float,
        previous: Assignment | None = None,
        flag_version: int | None = None,
        on_late: Callable[[list[str]], None] | None = None,
        from_next_fire: bool = False,
        extra: Callable[[Assignment | None, Assignment], list[Op]] | None = None,
    ) -> Assignment | None:
        """Compute the assignment for the trigger at ``fire`` and commit it with the
        flag's removal, only while still leader and while the flag is the one read.

        A fire can only use one assignment cluster-wide: if some instance already
        started items for ``fire`` under the previous assignment, the new one takes
        effect from the next fire (the previous owners stay in the document for the
        instances still to run ``fire``). An instance that joined after ``fire`` gets
        no items for it: it will not fire it; the flag is set again so that the next
        trigger includes it. ``extra(previous, new)`` gives more ops for the same
        commit (the fires a cut of the count leaves owed: coordination/cuts.py).
        None when nothing was committed."""
        # The membership listing first (one request): whether some instance started
        # this fire decides whether join times matter at all. When it did, every
        # member gets items from the next fire on, which all of them fire, so the
        # membership nodes (one read each) are not read.
        disabled = self.unavailable()
        live = self.live_instances()
        enabled = [i for i in live if i not in disabled]
        if not enabled:
            log.warning("%s: no enabled instance to assign items to", self._paths.job)
            return None
        # from_next_fire: the flag was set while this fire was being decided, so some
        # instance may have decided it already from the previous assignment (with no
        # items, leaving no trace): the new one must not apply to it. Every live
        # instance's start counts, a disabled one's too: the switch reaches it by a
        # watch, and a fire it started meanwhile under the previous assignment was
        # given to another instance as well (600 s etcd run, an unexplained duplicate)
        latest = self.last_started_fire(live)
        started = from_next_fire or latest >= fire - 1e-6
        members: dict[str, float]
        if started:
            members = dict.fromkeys(enabled, 0.0)  # join times do not matter
        else:
            members = self.enabled_members(disabled)
            if not members:
                log.warning("%s: no enabled instance to assign items to", self._paths.job)
                return None
        effective = fire + 1e-3 if started and previous is not None else fire
        if previous is not None:
            # Never in effect for a fire some instance started already, nor before the
            # assignment it replaces: a leader deciding an older fire late (a run-now
            # behind its lane's backlog) dated the new owners at that fire, under the
            # fires others had started since, and two instances ran one item for one
            # fire (600 s chaos on etcd, an unexplained duplicate).
            # A level dated after this fire may be in use for a fire at its very time.
            floor = previous.effective_fire
            if floor > fire:
                floor += 1e-3
            effective = max(effective, latest + 1e-3 if started else 0.0, floor)
        eligible = sorted(i for i, joined in members.items() if started or joined <= fire)
        late = sorted(set(members) - set(eligible))
        if not eligible:
            eligible, late = sorted(members), []
        by_instance = strategy(eligible, self._paths.job, total)
        owners = {item: inst for inst, items in by_instance.items() for item in items}
        missing = set(range(total)) - set(owners)
        if missing:
            raise RuntimeError(
                f"sharding strategy left items {sorted(missing)} of {self._paths.job} unassigned"
            )
        assignment = Assignment(
            total=total,
            owners=owners,
            generation=generation,
            leader=self._me,
            at=time.time(),
            effective_fire=effective,
            # Fires before ``effective`` keep the owners that were in effect for them,
            # even when nobody has started them yet: a fire still waiting somewhere
            # (for this very reshard, say) must not switch to the new owners, or an
            # item runs twice or never for it.
            previous=dict(previous.owners) if previous is not None else {},
            previous_effective=previous.effective_fire if previous is not None else 0.0,
            older=_older_levels(previous, fire),
            births=next_births(previous, total, effective),
        )
        ops: list[Op] = [leader_check]
        if flag_version is not None:
            ops.append(Check(self._paths.necessary, version=flag_version))
        try:
            value = assignment.to_bytes()
        except JobConfigError as exc:
            # Too large for one store value (only with extreme instance counts: the
            # config's item limit is sized for the packed form). Nothing is written;
            # the flag stays, so the error is repeated until the operator acts.
            log.error("%s: cannot store the assignment: %s", self._paths.job, exc)
            return None
        ops += [Put(self._paths.sharding, value), Delete(self._paths.necessary)]
        if extra is not None:
            ops += extra(previous, assignment)
        if not self._store.commit(ops):
            log.info("%s: reshard not committed (leadership or flag changed)", self._paths.job)
            return None
        log.info(
            "%s: resharded %d items over %d instances (generation %d, from fire %s)",
            self._paths.job,
            total,
            len(eligible),
            generation,
            "next" if effective > fire else "this",
        )
        if late:
            if on_late is not None:
                # the caller sets the flag at its next fire: set now, it would block
                # every start commit of this fire (they check the flag is absent)
                on_late(late)
            else:
                self.set_necessary(f"joined after the fire: {', '.join(late)}")
        return assignment


#: how long an older generation is kept in the assignment for fires still in flight
HISTORY_SECONDS = 120.0
#: at most this many older generations are kept
HISTORY_LEVELS = 6


def _older_levels(
    previous: Assignment | None, fire: float
) -> tuple[tuple[float, dict[int, str]], ...]:
    """The generations before ``previous`` still recent enough for a waiting fire."""
    if previous is None:
        return ()
    levels = [(previous.previous_effective, previous.previous), *previous.older]
    kept = [(eff, own) for eff, own in levels if own and eff >= fire - HISTORY_SECONDS]
    return tuple(kept[:HISTORY_LEVELS])
