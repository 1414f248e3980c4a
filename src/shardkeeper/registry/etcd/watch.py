"""Watches: every watch of a store on ONE shared etcd watch stream, resumed from its
last revision after the stream breaks, with RESYNC when that revision is compacted.

Threads
-------
Fixed per store, whatever the number of watches: the event thread (the registry's
shared :class:`~shardkeeper.registry._events.EventLoop`: delivers watch and state
events in order), the session thread (the lease keep-alive, and nothing else: see
``session.py``), this part's watch-recovery thread (re-creates the watches whose
stream broke; one attempt can wait up to the operation timeout) and, while any watch
exists, the ``etcd3`` watch-stream thread (``transport.WatchStream``), whose callbacks
only enqueue. Each watch remembers the last revision it received; after the stream
breaks (or after a reconnect) it is re-created from ``last revision + 1``. If that
revision was compacted, the listener gets RESYNC and CREATED for the current state.
A watch's ``exclude`` filter is applied on the event thread to every event, the
RESYNC replay included: the server still streams the excluded changes on the same
stream (no request is added, and the watch's resume revision keeps moving with them).

Parts
-----
:class:`TreeWatch` owns every watch, the stream and the recovery thread. It sends
through the transport (which alone touches the client), maps keys with the store's
:class:`~shardkeeper.registry.etcd.keys.Keyspace`, and asks the session through
:class:`SessionCheck` to check the lease when a stream broke. The transport tells it
of a member left (``member_left``), the session of a reconnect (``restart_stream``).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardkeeper.errors import OperationTimeoutError, StoreError, StoreUnavailableError
from shardkeeper.registry._events import EventLoop, WatchDelivery
from shardkeeper.registry.base import (
    EventKind,
    PathFilter,
    Subscription,
    WatchEvent,
    WatchListener,
)
from shardkeeper.registry.etcd.core import RETRY_DELAY
from shardkeeper.registry.etcd.keys import (
    Keyspace,
    below_op,
    in_subtree,
    own_range,
    range_op,
    subtree,
)
from shardkeeper.registry.etcd.transport import Change, StreamEnd, Transport, WatchStream
from shardkeeper.registry.logthrottle import LogThrottle
from shardkeeper.registry.url import RegistrySettings

__all__ = ["SessionCheck", "TreeWatch", "Watch"]

_log = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class Watch(WatchDelivery):
    """One subscription: an etcd watch on ``[key, end)``, filtered to the subtree (and,
    on delivery, by its ``exclude``: :meth:`WatchDelivery.admits`)."""

    key: bytes
    end: bytes
    #: highest revision received (events up to it are enqueued); resume from +1
    last_rev: int = 0
    #: bumped on every (re)creation: responses of an older generation are ignored
    gen: int = 0
    watch_id: int | None = None
    stream: WatchStream | None = None
    #: the server reported our start revision compacted: resume needs a RESYNC
    compacted: bool = False
    subscription: Subscription | None = field(default=None, repr=False)

    def covers(self, key: bytes) -> bool:
        # the etcd range [K, K0) also holds siblings such as K-x and K.x
        return in_subtree(self.key, key, own=True)


class SessionCheck(Protocol):
    """What the watch part asks of the session: a broken stream usually means a lost
    connection, so check the lease now."""

    def check_soon(self) -> None: ...


#: how often the watch-recovery thread looks for work while it has none (it is
#: woken as soon as a stream breaks; this only bounds how long it outlives close)
_IDLE_WAKE = 1.0


class TreeWatch:
    """The watches of :class:`EtcdStore` on one shared stream, and their recovery
    thread (see the module docstring)."""

    def __init__(
        self,
        settings: RegistrySettings,
        transport: Transport,
        keys: Keyspace,
        loop: EventLoop,
        session: SessionCheck,
    ) -> None:
        self.settings = settings
        self._transport = transport
        self._keys = keys
        self._loop = loop
        self._session = session
        # guards the watch bookkeeping; never held while waiting on the server
        self._wlock = threading.Lock()
        self._watches: set[Watch] = set()
        self._pending: set[Watch] = set()
        self._stream: WatchStream | None = None
        self._stream_broken = False
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # wakes the watch-recovery thread: a stream broke, or the store is closing
        self._restore_wake = threading.Event()
        #: paces the "not resumed yet" line of the watch recovery (per store)
        self._watch_retry_log = LogThrottle()

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """:meth:`EtcdStore.watch`: the key of ``prefix`` and its subtree on the shared
        stream, from the revision current now."""
        key = self._keys.key(prefix)
        rev = int(self._transport.read(f"watch {prefix}", own_range(key)).header.revision)
        w = Watch(
            prefix=prefix,
            key=key,
            end=subtree(key)[1],  # [K, K0): the node and its subtree (and siblings)
            listener=listener,
            last_rev=rev,
            exclude=exclude,
        )
        with self._wlock:
            self._watches.add(w)
        try:
            if not self._establish(w, counted=True):
                # compacted between our read and the watch: start from the current state
                self._resync(w)
        except BaseException:
            with self._wlock:
                self._watches.discard(w)
            raise
        w.subscription = Subscription(functools.partial(self._cancel_watch, w))
        return w.subscription

    # -- lifecycle --------------------------------------------------------------------

    def start(self, name: str) -> None:
        """Start the watch-recovery thread ``name``."""
        self._thread = threading.Thread(target=self.run_recovery, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the recovery thread (waiting up to ``timeout``)."""
        self._stopping.set()
        self._restore_wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self) -> WatchStream | None:
        """Cancel every watch and end the stream; return it (its thread ends once the
        client's channel is closed)."""
        with self._wlock:
            stream, self._stream = self._stream, None
            for w in self._watches:
                w.cancelled = True
            self._watches.clear()
            self._pending.clear()
        if stream is not None:
            stream.close()
        return stream

    # -- what the other parts tell it -------------------------------------------------

    def member_left(self, endpoint: Any) -> None:
        """The transport left ``endpoint``'s member: a stream there is re-created on
        the next one (by the recovery thread)."""
        with self._wlock:
            stale = self._stream is not None and self._stream.endpoint is endpoint
        if stale:
            self.restart_stream()

    def restart_stream(self) -> None:
        """Re-create every watch on a new stream from its last revision."""
        with self._wlock:
            old, self._stream = self._stream, None
            self._stream_broken = False
            for w in self._watches:
                w.gen += 1
                w.watch_id = None
                self._pending.add(w)
        if old is not None:
            old.close()
        self._restore_wake.set()

    # -- internals --------------------------------------------------------------------

    def _current_stream(self) -> WatchStream:
        with self._wlock:
            if self._stream is not None and not self._stream_broken:
                return self._stream
            old, self._stream = self._stream, None
        if old is not None:
            old.close()
        new = self._transport.open_watch_stream()
        with self._wlock:
            if self._stream is None:
                self._stream, self._stream_broken = new, False
            return self._stream

    def _establish(self, w: Watch, *, counted: bool = False) -> bool:
        """(Re)create ``w`` on the shared stream from ``w.last_rev + 1``.

        Returns False (and creates nothing) when that revision is compacted.
        """
        stream = self._current_stream()
        with self._wlock:
            w.gen += 1
            gen, start = w.gen, w.last_rev + 1
        on_changes = functools.partial(self._on_changes, w, gen)
        on_end = functools.partial(self._on_end, w, gen)
        if counted:
            self._transport.count()
        try:
            with self._transport.translated(f"watch {w.prefix}"):
                wid = stream.add(w.key, w.end, start, on_changes, on_end)
            if wid is None:
                return False
        except StoreError as exc:
            # a stream that failed or hangs is replaced at the next attempt (its other
            # watches resume from their last revisions), on another member when this
            # one could not serve it
            with self._wlock:
                endpoint = stream.endpoint if self._stream is stream else None
                if endpoint is not None:
                    self._stream_broken = True
            if endpoint is not None and isinstance(
                exc, (StoreUnavailableError, OperationTimeoutError)
            ):
                self._transport.move_on(endpoint, f"watch {w.prefix}: {exc}")
            raise
        with self._wlock:
            current = w.gen == gen and not w.cancelled
            if current:
                w.watch_id, w.stream = wid, stream
                self._pending.discard(w)
        if not current:
            stream.cancel(wid)
        return True

    def _on_changes(self, w: Watch, gen: int, changes: list[Change]) -> None:
        # Runs on the stream thread: only record and enqueue, never block.
        with self._wlock:
            if w.gen != gen or w.cancelled:
                return
            for c in changes:
                w.last_rev = max(w.last_rev, c.mod_revision)
                if not w.covers(c.key):
                    continue
                path = self._keys.path(c.key)
                if c.deleted:
                    event = WatchEvent(EventKind.DELETED, path, None, c.mod_revision)
                else:
                    kind = (
                        EventKind.CREATED
                        if c.create_revision == c.mod_revision
                        else EventKind.CHANGED
                    )
                    event = WatchEvent(kind, path, c.value, c.mod_revision)
                self._loop.post_watch(w, event)

    def _on_end(self, w: Watch, gen: int, end: StreamEnd) -> None:
        # Runs on the stream thread: only record and enqueue, never block.
        leave = None
        with self._wlock:
            if w.gen != gen or w.cancelled:
                return
            w.watch_id = None
            self._pending.add(w)
            if end.compacted:
                # etcd confirms the watch first and reports the compaction after it
                w.compacted = True
            else:
                # the whole stream ended (error, server shutdown, or a member without
                # a leader cancelling it)
                if w.stream is not None and w.stream is self._stream:
                    self._stream_broken = True
                    if end.leave:
                        leave = self._stream.endpoint
        if leave is not None:
            self._transport.move_on(leave, f"watch stream ended: {end.reason}")
        if not end.compacted:
            # a broken stream usually means a lost connection: check the session now
            self._session.check_soon()
        self._restore_wake.set()

    def run_recovery(self) -> None:
        """The watch-recovery thread: re-create the watches whose stream broke, every
        ``RETRY_DELAY`` while any is pending. Apart from the session thread, so that a
        watch request a member holds never delays a keep-alive."""
        failed = False
        last_pass = -math.inf
        while not self._stopping.is_set():
            with self._wlock:
                pending = bool(self._pending)
            # A watch re-created on a member without a leader fails or breaks at
            # once, and that break wakes this loop again: without a pause between
            # passes it spun (a member switch and two log lines every few ms) for as
            # long as the store had no leader, on a machine already loaded. The first
            # pass after a quiet time still runs at once.
            spacing = RETRY_DELAY - (time.monotonic() - last_pass)
            if failed or spacing > 0:
                self._stopping.wait(max(spacing, RETRY_DELAY if failed else 0.0))
            else:
                self._restore_wake.wait(RETRY_DELAY if pending else _IDLE_WAKE)
            # cleared before reading what is pending: a break noted from now on wakes
            # the next wait
            self._restore_wake.clear()
            if self._stopping.is_set():
                return
            last_pass = time.monotonic()
            try:
                failed = not self._restore_watches()
            except Exception:
                failed = True
                _log.exception("etcd watch recovery failed unexpectedly")

    def _restore_watches(self) -> bool:
        """Re-create the pending watches; False when one could not be (tried again
        after a pause)."""
        with self._wlock:
            pending = sorted(self._pending, key=lambda x: x.prefix)
        ok = True
        for w in pending:
            if self._stopping.is_set():
                return ok
            try:
                if w.compacted or not self._establish(w):
                    self._resync(w)
            except StoreError as exc:
                # tried every RETRY_DELAY (0.2 s) while the store is down: INFO once
                # per 30 s with the count since (the skip summary's cadence), DEBUG
                # for the others, so one line per attempt is still there to debug
                held = self._watch_retry_log.admit("not resumed")
                _log.log(
                    logging.DEBUG if held is None else logging.INFO,
                    "etcd watch %s not resumed yet: %s%s",
                    w.prefix,
                    exc,
                    self._watch_retry_log.suffix(held or 0),
                )
                return False
        return ok

    def _resync(self, w: Watch) -> None:
        """The history since ``w.last_rev`` is compacted: RESYNC, then the current state."""
        resp = self._transport.txn(
            f"resync watch {w.prefix}",
            success=[range_op(w.key), below_op(w.key)],
        )
        rev = int(resp.header.revision)
        with self._wlock:
            if w.cancelled:
                return
            w.gen += 1  # drop anything still in flight for the old watch
            w.last_rev = rev
            w.compacted = False
            self._loop.post_watch(w, WatchEvent(EventKind.RESYNC, w.prefix, None, rev))
            for r in resp.responses:
                for kv in r.response_range.kvs:
                    event = WatchEvent(
                        EventKind.CREATED,
                        self._keys.path(kv.key),
                        bytes(kv.value),
                        int(kv.mod_revision),
                    )
                    self._loop.post_watch(w, event)
        if not self._establish(w):
            raise StoreError(f"watch {w.prefix}: revision {rev + 1} compacted at once")

    def _cancel_watch(self, w: Watch) -> None:
        with self._wlock:
            w.cancelled = True
            self._watches.discard(w)
            self._pending.discard(w)
            stream, wid = w.stream, w.watch_id
        if stream is not None and wid is not None:
            stream.cancel(wid)
