"""The event thread of a ZooKeeper store, and connection states.

Connection states
    kazoo CONNECTED on the first session -> CONNECTED; SUSPENDED -> SUSPENDED;
    CONNECTED with the same session id -> RECONNECTED; LOST -> LOST, and kazoo's next
    session -> CONNECTED. kazoo's listener only enqueues; listeners run on the event
    thread. Threads per store: kazoo's three (connection, completion, callback) plus
    the one event thread, whatever the number of watches.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kazoo.protocol.states import EventType, KazooState

from shardkeeper.registry.base import (
    ConnectionState,
    StateListener,
    Subscription,
)
from shardkeeper.registry.zookeeper.session import _STOP, _Session

if TYPE_CHECKING:
    from shardkeeper.registry.zookeeper.watch import _TreeWatch

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")

#: how often a dirty watcher is retried while its re-sync keeps failing
_DIRTY_RETRY = 0.25


@dataclass
class _Pending:
    """A request handed to the event thread by a caller that waits for it."""

    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class _Events(_Session):
    """The event thread: kazoo's callbacks only enqueue, this thread delivers connection
    states and runs the watches' re-reads."""

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        entry: list[tuple[Subscription, StateListener]] = []

        def cancel() -> None:
            with self._lock:
                if entry[0] in self._state_listeners:
                    self._state_listeners.remove(entry[0])

        sub = Subscription(cancel_fn=cancel)
        entry.append((sub, listener))
        with self._lock:
            self._state_listeners.append(entry[0])
        return sub

    # -- the event thread ---------------------------------------------------------------

    def _on_kazoo_state(self, kstate: str) -> None:
        # runs on kazoo's connection thread: record the session id, hand over, return
        sid = None
        if kstate == KazooState.CONNECTED and self._client is not None:
            cid = self._client.client_id
            sid = cid[0] if cid else None
        self._events.put(("state", kstate, sid))

    def _run(self) -> None:
        while True:
            dirty = any(w.dirty for w in list(self._watches))
            try:
                item = self._events.get(timeout=_DIRTY_RETRY if dirty else None)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if item is not None:
                    self._handle(item)
                if dirty and self._client is not None and self._client.connected:
                    for w in list(self._watches):
                        if w.dirty and not w.cancelled:
                            self._sync(w, [w.prefix], full=True, emit=True)
            except Exception:
                _log.exception("shardkeeper ZooKeeper event thread: unexpected error")

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "watch":
            w, event = item[1], item[2]
            if w.cancelled or event.type == EventType.NONE:
                # NONE: kazoo dropped its watches with the connection; the state
                # event that follows triggers the re-sync
                return
            self._sync(w, [event.path], full=False, data_only=event.type == EventType.CHANGED)
        elif kind == "state":
            self._handle_state(item[1], item[2])
        elif kind == "add_watch":
            w, pending = item[1], item[2]
            try:
                self._add_watch(w)
            except BaseException as e:
                pending.error = e
            pending.done.set()

    def _handle_state(self, kstate: str, sid: int | None) -> None:
        if self._closed:
            return
        if kstate == KazooState.SUSPENDED:
            self._deliver_state(ConnectionState.SUSPENDED)
        elif kstate == KazooState.LOST:
            self._deliver_state(ConnectionState.LOST)
        elif kstate == KazooState.CONNECTED:
            first = self._sid is None
            if not first and sid == self._sid and self._state != ConnectionState.LOST:
                self._deliver_state(ConnectionState.RECONNECTED)
            else:
                if not first and self._state != ConnectionState.LOST:
                    # a new session without a LOST seen: its ephemerals are gone all the same
                    self._deliver_state(ConnectionState.LOST)
                self._sid = sid
                self._deliver_state(ConnectionState.CONNECTED)
            self._first_session.set()
            if not first:
                for w in list(self._watches):
                    if not w.cancelled:
                        self._sync(w, [w.prefix], full=True, emit=True)

    def _deliver_state(self, state: ConnectionState) -> None:
        self._state = state
        with self._lock:
            listeners = list(self._state_listeners)
        for sub, listener in listeners:
            if sub.cancelled:
                continue
            try:
                listener(state)
            except Exception:
                _log.exception("state listener %r failed on %s", listener, state.value)

    @abstractmethod
    def _add_watch(self, w: _TreeWatch) -> None:
        """Establish ``w`` (on the event thread)."""

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
