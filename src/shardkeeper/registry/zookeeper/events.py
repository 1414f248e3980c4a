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
from typing import TYPE_CHECKING

from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from shardkeeper.registry.base import ConnectionState, StateListener, Subscription
from shardkeeper.registry.zookeeper.session import _Session

if TYPE_CHECKING:
    from shardkeeper.registry.zookeeper.watch import _TreeWatch

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")


class _Events(_Session):
    """What the event thread does: kazoo's callbacks only post, the thread delivers
    connection states and runs the watches' re-reads."""

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        return self._loop.add_state_listener(listener)

    # -- handed over by kazoo's threads -----------------------------------------------

    def _on_kazoo_state(self, kstate: str) -> None:
        # runs on kazoo's connection thread: record the session id, hand over, return
        sid = None
        if kstate == KazooState.CONNECTED and self._client is not None:
            cid = self._client.client_id
            sid = cid[0] if cid else None
        self._loop.post(functools.partial(self._handle_state, kstate, sid))

    def _on_watch_fired(self, w: _TreeWatch, event: WatchedEvent) -> None:
        # runs on kazoo's callback thread: never read here, only hand over
        self._loop.post(functools.partial(self._handle_watch, w, event))

    # -- on the event thread ------------------------------------------------------------

    def _handle_watch(self, w: _TreeWatch, event: WatchedEvent) -> None:
        if w.cancelled or event.type == EventType.NONE:
            # NONE: kazoo dropped its watches with the connection; the state
            # event that follows triggers the re-sync
            return
        self._sync(w, [event.path], full=False, data_only=event.type == EventType.CHANGED)

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
        data_only: bool = False,
        strict: bool = False,
    ) -> None:
        """Re-read ``paths`` of ``w`` (watch.py)."""
