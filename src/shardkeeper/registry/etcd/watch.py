"""Watches: every watch of a store on ONE shared etcd watch stream, resumed from its
last revision after the stream breaks, with RESYNC when that revision is compacted.

Threads
-------
Fixed per store, whatever the number of watches: the event thread (the registry's
shared :class:`~shardkeeper.registry._events.EventLoop`: delivers watch and state
events in order), the session thread (the lease keep-alive, and nothing else: see
``session.py``), the watch-recovery thread (re-creates the watches whose stream broke;
one attempt can wait up to the operation timeout) and, while any watch exists, the
``etcd3`` watch-stream thread, whose callbacks only enqueue. Each watch remembers
the last revision it received; after the stream breaks (or after a reconnect) it is
re-created from ``last revision + 1``. If that revision was compacted, the listener
gets RESYNC and CREATED for the current state.
A watch's ``exclude`` filter is applied on the event thread to every event, the
RESYNC replay included: the server still streams the excluded changes on the same
stream (no request is added, and the watch's resume revision keeps moving with them).

"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import etcd3.etcdrpc as rpc
import etcd3.events
import etcd3.exceptions
import etcd3.watch
import grpc

from shardkeeper.errors import OperationTimeoutError, StoreError, StoreUnavailableError
from shardkeeper.registry._events import WatchDelivery
from shardkeeper.registry.base import (
    EventKind,
    PathFilter,
    StateListener,
    Subscription,
    WatchEvent,
    WatchListener,
)
from shardkeeper.registry.etcd.client_private import WatchStub, open_watcher
from shardkeeper.registry.etcd.core import RETRY_DELAY
from shardkeeper.registry.etcd.keys import below_op, in_subtree, range_op, subtree
from shardkeeper.registry.etcd.members import MembersMixin
from shardkeeper.registry.logthrottle import LogThrottle
from shardkeeper.registry.url import RegistrySettings

__all__ = ["Watch", "WatchMixin", "end_watcher"]

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
    watcher: Any = None
    #: the server reported our start revision compacted: resume needs a RESYNC
    compacted: bool = False
    subscription: Subscription | None = field(default=None, repr=False)

    def covers(self, key: bytes) -> bool:
        # the etcd range [K, K0) also holds siblings such as K-x and K.x
        return in_subtree(self.key, key, own=True)


def end_watcher(watcher: Any, stub: WatchStub | None) -> None:
    """Stop a watcher: no more requests, and its stream cancelled (its thread ends)."""
    if watcher is not None:
        with contextlib.suppress(Exception):
            watcher.close()
    if stub is not None:
        stub.cancel()


#: how often the watch-recovery thread looks for work while it has none (it is
#: woken as soon as a stream breaks; this only bounds how long it outlives close)
_IDLE_WAKE = 1.0


class WatchMixin(MembersMixin):
    """Watches and state listeners of :class:`EtcdStore` (see the module docstring)."""

    def __init__(self, settings: RegistrySettings) -> None:
        super().__init__(settings)
        # wakes the watch-recovery thread: a stream broke, or the store is closing
        self._restore_wake = threading.Event()
        #: paces the "not resumed yet" line of the watch recovery (per store)
        self._watch_retry_log = LogThrottle()

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch the key of ``prefix`` and its subtree on the store's shared stream.

        Events are read from the revision current when this is called, so every later
        change is delivered, except those ``exclude`` rejects (dropped on the event
        thread). Raises StoreUnavailableError if the stream cannot be set up now.
        """
        key = self._key(prefix)
        self._require_started()
        req = rpc.RangeRequest(key=key, keys_only=True, limit=1)
        rev = int(self._read(f"watch {prefix}", "Range", req).header.revision)
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

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        return self._loop.add_state_listener(listener)

    # -- internals: watches -----------------------------------------------------------

    def _current_watcher(self) -> Any:
        with self._wlock:
            if self._watcher is not None and not self._watcher_broken:
                return self._watcher
            old, self._watcher = self._watcher, None
            old_stub, self._watcher_stub = self._watcher_stub, None
        end_watcher(old, old_stub)
        with self._translated("open the watch stream"):
            endpoint, channel = self._endpoint()
        # built here rather than by the client, to send our metadata (require a
        # leader, the token) and to keep the stream call (see client_private)
        new, stub = open_watcher(channel, self.settings.operation_timeout, self._metadata())
        with self._wlock:
            if self._watcher is None:
                self._watcher, self._watcher_broken = new, False
                self._watcher_endpoint, self._watcher_stub = endpoint, stub
            return self._watcher

    def _establish(self, w: Watch, *, counted: bool = False) -> bool:
        """(Re)create ``w`` on the shared stream from ``w.last_rev + 1``.

        Returns False (and creates nothing) when that revision is compacted.
        """
        watcher = self._current_watcher()
        with self._wlock:
            w.gen += 1
            gen, start = w.gen, w.last_rev + 1
        callback = functools.partial(self._on_watch_response, w, gen)
        if counted:
            self._count()
        try:
            with self._translated(f"watch {w.prefix}"):
                try:
                    wid = watcher.add_callback(
                        w.key, callback, range_end=w.end, start_revision=start
                    )
                except etcd3.exceptions.RevisionCompactedError:
                    return False
        except StoreError as exc:
            # a stream that failed or hangs is replaced at the next attempt (its other
            # watches resume from their last revisions), on another member when this
            # one could not serve it
            with self._wlock:
                endpoint = self._watcher_endpoint if self._watcher is watcher else None
                if endpoint is not None:
                    self._watcher_broken = True
            if endpoint is not None and isinstance(
                exc, (StoreUnavailableError, OperationTimeoutError)
            ):
                self._move_on(endpoint, f"watch {w.prefix}: {exc}")
            raise
        with self._wlock:
            current = w.gen == gen and not w.cancelled
            if current:
                w.watch_id, w.watcher = wid, watcher
                self._pending.discard(w)
        if not current:
            with contextlib.suppress(Exception):
                watcher.cancel(wid)
        return True

    def _on_watch_response(self, w: Watch, gen: int, resp: Any) -> None:
        # Runs on the etcd3 stream thread: only record and enqueue, never block.
        if isinstance(resp, etcd3.watch.WatchResponse):
            with self._wlock:
                if w.gen != gen or w.cancelled:
                    return
                for kv in resp.events:  # etcd3 events read through to the KeyValue
                    w.last_rev = max(w.last_rev, int(kv.mod_revision))
                    if not w.covers(kv.key):
                        continue
                    path = self._path(kv.key)
                    if isinstance(kv, etcd3.events.DeleteEvent):
                        event = WatchEvent(EventKind.DELETED, path, None, int(kv.mod_revision))
                    else:
                        kind = (
                            EventKind.CREATED
                            if kv.create_revision == kv.mod_revision
                            else EventKind.CHANGED
                        )
                        event = WatchEvent(kind, path, bytes(kv.value), int(kv.mod_revision))
                    self._loop.post_watch(w, event)
            return
        leave = None
        with self._wlock:
            if w.gen != gen or w.cancelled:
                return
            w.watch_id = None
            self._pending.add(w)
            if isinstance(resp, etcd3.exceptions.RevisionCompactedError):
                # etcd confirms the watch first and reports the compaction after it
                w.compacted = True
            else:
                # the whole stream ended (error, server shutdown, or a member without
                # a leader cancelling it)
                if w.watcher is self._watcher:
                    self._watcher_broken = True
                    if isinstance(resp, grpc.RpcError) and resp.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    ):
                        leave = self._watcher_endpoint
                # a broken stream usually means a lost connection: check the session now
                self._check_session_now = True
        if leave is not None:
            self._move_on(leave, f"watch stream ended: {resp}")
        self._wake.set()
        self._restore_wake.set()

    def _run_watch_recovery(self) -> None:
        """The watch-recovery thread (started and ended by the session thread):
        re-create the watches whose stream broke, every ``RETRY_DELAY`` while any is
        pending. Apart from the session thread, so that a watch request a member
        holds never delays a keep-alive."""
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
        resp = self._txn(
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
                        EventKind.CREATED, self._path(kv.key), bytes(kv.value), int(kv.mod_revision)
                    )
                    self._loop.post_watch(w, event)
        if not self._establish(w):
            raise StoreError(f"watch {w.prefix}: revision {rev + 1} compacted at once")

    def _restart_watch_stream(self) -> None:
        with self._wlock:
            old, self._watcher = self._watcher, None
            old_stub, self._watcher_stub = self._watcher_stub, None
            self._watcher_broken = False
            for w in self._watches:
                w.gen += 1
                w.watch_id = None
                self._pending.add(w)
        end_watcher(old, old_stub)
        self._restore_wake.set()

    def _cancel_watch(self, w: Watch) -> None:
        with self._wlock:
            w.cancelled = True
            self._watches.discard(w)
            self._pending.discard(w)
            watcher, wid = w.watcher, w.watch_id
        if watcher is not None and wid is not None:
            with contextlib.suppress(Exception):
                watcher.cancel(wid)
