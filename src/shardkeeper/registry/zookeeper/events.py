"""Connection states of a ZooKeeper store, and what its event thread does for them.

The event thread itself (queue, thread, state, ordered delivery) is the registry's
shared :class:`~shardkeeper.registry._events.EventLoop`; this module maps kazoo's
states onto the contract's and decides what the thread re-reads.

Connection states
    kazoo CONNECTED on the first session -> CONNECTED; SUSPENDED -> SUSPENDED;
    CONNECTED with the same session id -> RECONNECTED; LOST -> LOST, and kazoo's next
    session -> CONNECTED. kazoo's listener only posts to the event thread; the states
    are delivered there, followed, after a reconnect or a new session, by the re-sync
    of every watch (its changes reported after the state). Threads per store: kazoo's
    three (connection, completion, callback) plus the one event thread, whatever the
    number of watches.
"""

from __future__ import annotations

import functools
import logging
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from kazoo.protocol.states import KazooState

from shardkeeper.registry.base import (
    ConnectionState,
    StateListener,
    Subscription,
    is_excluded,
)
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.nodes import _parent
from shardkeeper.registry.zookeeper.session import _Session

if TYPE_CHECKING:
    from shardkeeper.registry.zookeeper.watch import _TreeWatch

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")

#: the notifications of a persistent recursive watch (no child events in that mode)
_CHANGES = frozenset(
    {kazoo_private.NODE_CREATED, kazoo_private.NODE_DATA_CHANGED, kazoo_private.NODE_DELETED}
)


class _Events(_Session):
    """What the event thread does: kazoo's callbacks only post, the thread delivers
    connection states and runs the watches' re-reads."""

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        return self._loop.add_state_listener(listener)

    # -- handed over by kazoo's threads -----------------------------------------------

    def _on_kazoo_state(self, kstate: str) -> None:
        # runs on kazoo's connection thread: record the session id, hand over, return
        # (known incarnations hold for one connection only: see owned.py)
        self._owned.reset()
        sid = None
        if kstate == KazooState.CONNECTED and self._client is not None:
            cid = self._client.client_id
            sid = cid[0] if cid else None
        self._loop.post(functools.partial(self._handle_state, kstate, sid))

    def _on_watch_tap(self, etype: int, path: str) -> None:
        # runs on kazoo's connection thread: never read here, only note the path and
        # its latest change, and hand over (one drain task per burst: the paths pile
        # up until it runs)
        if etype == kazoo_private.NODE_DELETED:
            self._owned.deleted(path)
        if etype not in _CHANGES:
            return
        for w in list(self._watches):
            # an excluded subtree's notification is dropped here, before the lock and
            # the drain: the runtime's watch excludes the running marks, which change
            # by the thousand at every fire of a big job
            if not w.notes(path):
                continue
            with self._lock:
                first = not w.pending
                w.pending[path] = etype
            if first:
                self._loop.post(functools.partial(self._drain, w))

    def _own_multi(self, made: dict[str, bytes], ops: list[Any], zxid: int) -> None:
        # runs on kazoo's connection thread as the reply of a multi of ours is read:
        # its notifications came just before, and no later one yet. A node it created
        # whose latest notification is that CREATED (pending, or held by a drain that
        # ran meanwhile) is known without a read: its value, and the multi's zxid as
        # its czxid and mzxid (see _TreeWatch.known). A registration of 5,000 jobs
        # creates 30,000 nodes: none is re-read.
        # an empty node created with a child in one multi is an implicit parent
        parents = {_parent(p) for p in made if p != "/"}
        created = kazoo_private.NODE_CREATED
        for w in list(self._watches):
            if w.cancelled or w.void:
                continue
            with self._lock:
                pending, held = w.pending, w.held
                moved = False
                for path, value in made.items():
                    if pending.get(path) == created:
                        # a drain is queued: it was posted when the entry was noted
                        del pending[path]
                    elif held.get(path) == created:
                        del held[path]
                        moved = True
                    else:
                        continue
                    w.known[path] = (value, zxid, value == b"" and path in parents)
            if moved:
                self._loop.post(functools.partial(self._drain, w))

    def _release_held(self) -> None:
        # a multi of ours was answered: what drains held for it and it did not
        # create (it failed, or another multi did) is noted again, to be read
        for w in list(self._watches):
            with self._lock:
                back = [p for p in w.held if p not in self._inflight]
                if not back:
                    continue
                first = not w.pending
                for path in back:
                    w.pending.setdefault(path, w.held.pop(path))
            if first:
                self._loop.post(functools.partial(self._drain, w))

    # -- on the event thread ------------------------------------------------------------

    def _drain(self, w: _TreeWatch) -> None:
        with self._lock:
            noted, w.pending = w.pending, {}
            known, w.known = w.known, {}
            # a node a multi of ours in flight creates: its reply will tell the node
            # as it made it (_own_multi), so it is held rather than read now
            inflight = self._inflight
            if inflight:
                for path in [p for p, e in noted.items() if p in inflight]:
                    if noted[path] == kazoo_private.NODE_CREATED:
                        w.held[path] = noted.pop(path)
            # a CREATED held earlier is outdated by any later notification of its
            # path (a delete or change drained now): the multi's reply must not
            # adopt it, and the later one is handled below as usual
            if w.held:
                for path in [p for p in noted if p in w.held]:
                    del w.held[path]
        if w.cancelled or w.void:
            return
        if known:
            # before the paths noted since: their notifications are later
            self._adopt(w, known)
        reread: list[str] = []
        for path, etype in noted.items():
            if is_excluded(path, w.exclude):
                continue
            if etype == kazoo_private.NODE_DELETED:
                # Notifications arrive in store order, so a node whose latest one is a
                # delete is gone now (a re-creation would have come after it): no read.
                self._drop(w, path, 0, True)
            else:
                reread.append(path)
        if reread:
            self._sync(w, sorted(reread), full=False)

    def _handle_state(self, kstate: str, sid: int | None) -> None:
        if self._closed:
            return
        loop = self._loop
        if kstate == KazooState.SUSPENDED:
            loop.deliver_state(ConnectionState.SUSPENDED)
        elif kstate == KazooState.LOST:
            loop.deliver_state(ConnectionState.LOST)
        elif kstate == KazooState.CONNECTED:
            first = self._sid is None
            if not first and sid == self._sid and loop.state != ConnectionState.LOST:
                loop.deliver_state(ConnectionState.RECONNECTED)
            else:
                if not first and loop.state != ConnectionState.LOST:
                    # a new session without a LOST seen: its ephemerals are gone all the same
                    loop.deliver_state(ConnectionState.LOST)
                self._sid = sid
                loop.deliver_state(ConnectionState.CONNECTED)
            self._first_session.set()
            if not first:
                for w in list(self._watches):
                    if not w.cancelled:
                        self._sync(w, [w.prefix], full=True, emit=True)

    def _watches_dirty(self) -> bool:
        return any(w.dirty for w in list(self._watches))

    def _resync_dirty(self) -> None:
        if self._client is None or not self._client.connected:
            return  # the state event of the reconnect re-syncs every watcher
        for w in list(self._watches):
            if w.dirty and not w.cancelled:
                self._sync(w, [w.prefix], full=True, emit=True)

    @abstractmethod
    def _sync(
        self,
        w: _TreeWatch,
        paths: list[str],
        *,
        full: bool,
        emit: bool = True,
        strict: bool = False,
    ) -> None:
        """Re-read ``paths`` of ``w`` (watch.py)."""

    @abstractmethod
    def _adopt(self, w: _TreeWatch, known: dict[str, tuple[bytes, int, bool]]) -> None:
        """Cache and report nodes our own multis created, without reading (watch.py)."""

    @abstractmethod
    def _drop(self, w: _TreeWatch, path: str, revision: int, emit: bool) -> None:
        """Forget ``path`` and its cached subtree, emitting DELETED (watch.py)."""
