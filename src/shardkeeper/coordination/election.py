"""Leader election for one job: an atomic create of an ephemeral node.

Connection-state policy (Curator's LeaderLatch): on SUSPENDED stop acting as leader
until the connection is back; on RECONNECTED the session (and so our ephemeral node)
survived, and the repair pass that follows re-reads the leader node (``sync``); on
LOST (or a new session) leadership is gone.
"""

from __future__ import annotations

import logging
import threading

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import StoreError
from shardkeeper.registry.base import Check, ConnectionState, CoordinationStore, Delete

__all__ = ["LeaderElection"]

log = logging.getLogger(__name__)


class LeaderElection:
    """Elects one leader per job among the instances running it."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id
        self._lock = threading.Lock()
        self._leading = False
        self._suspended = False

    @property
    def is_leader(self) -> bool:
        """True while this instance holds leadership and its connection is healthy."""
        return self._leading and not self._suspended

    def try_acquire(self) -> bool:
        """Try to become leader; returns whether this instance just became leader
        (False if it already was, or someone else is)."""
        with self._lock:
            was = self._leading
            node = self._store.create(self._paths.leader, self._me.encode(), ephemeral=True)
            if node is None:
                # After a reconnect our own node may still be there: re-read it.
                current = self._store.get(self._paths.leader)
                self._leading = current is not None and current.value == self._me.encode()
            else:
                self._leading = True
            if self._leading and not was:
                log.info("%s: %s is now the leader", self._paths.job, self._me)
            return self._leading and not was

    def created(self) -> None:
        """This instance's own commit just created the leader node naming it (the
        batched registration of new jobs): lead."""
        with self._lock:
            self._leading = True
        log.debug("%s: %s is the leader (created with the job)", self._paths.job, self._me)

    def sync(self, holder: str | None) -> bool:
        """Align the belief with the leader node as just read (``holder``: its value,
        None when absent): lead iff it names this instance. Returns whether this
        instance leads now. The housekeeping pass calls it so that a failed read on
        RECONNECTED never leaves a job without a leader acting."""
        with self._lock:
            was = self._leading
            self._leading = holder == self._me
            if self._leading and not was:
                log.info("%s: %s leads again (the leader node names it)", self._paths.job, self._me)
            elif was and not self._leading:
                log.warning("%s: %s is no longer the leader", self._paths.job, self._me)
            return self._leading

    def current_leader(self) -> str | None:
        """The id of the current leader as stored, or None."""
        node = self._store.get(self._paths.leader)
        return node.value.decode() if node else None

    def on_state(self, state: ConnectionState) -> None:
        """Apply the connection-state policy (see module docstring)."""
        if state is ConnectionState.SUSPENDED:
            self._suspended = True
        elif state is ConnectionState.RECONNECTED:
            # The same session survived, so our ephemeral leader node (if we had one)
            # did too: the belief still holds. No read here: this runs on the store's
            # event thread, and a read over a slow link would hold every event (a
            # fire meanwhile still saw "suspended"). The job's next repair pass
            # re-reads the node and aligns the belief (LeaderElection.sync).
            self._suspended = False
        else:  # LOST, or CONNECTED with a brand-new session
            self._suspended = False
            self._leading = False

    def leader_check(self) -> Check:
        """A commit condition that holds only while this instance is the leader."""
        return Check(self._paths.leader, value=self._me.encode())

    def resign(self) -> None:
        """Give up leadership (graceful stop): delete our leader node if it is ours."""
        with self._lock:
            if not self._leading:
                return
            self._leading = False
            try:
                self._store.commit([self.leader_check(), Delete(self._paths.leader)])
            except StoreError as exc:
                log.warning("%s: could not resign leadership: %s", self._paths.job, exc)
