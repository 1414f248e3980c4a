"""The event thread of a store: one queue, one thread, the connection state and the
ordered delivery of state and watch events. Both real backends (and the in-memory
reference store) run theirs on an :class:`EventLoop`; what differs between them (how a
client library reports a change) stays in the backend, which only hands the loop what
to deliver.

What the contract (``base.py``, Threads and events) asks, and how the loop gives it:

* **One event thread per store**, whatever the number of watches and listeners: the
  loop's thread, started by :meth:`EventLoop.start` and ended by :meth:`EventLoop.stop`.
* **Ordered delivery.** Everything handed over with :meth:`~EventLoop.post`,
  :meth:`~EventLoop.post_state` or :meth:`~EventLoop.post_watch` runs on the thread
  in the order it was handed over (one FIFO queue). Code already running on the
  thread (ZooKeeper's re-reads, which report what they find as they go) delivers at
  once with :meth:`~EventLoop.deliver_state` and :meth:`~EventLoop.deliver_watch`:
  that is the position it holds in the order.
* **Connection states.** :attr:`EventLoop.state` is the store's latest state.
  ``post_state`` records it at once (the store answers it before the listeners hear
  of it) and queues its delivery, only when it changed; ``deliver_state`` records
  and delivers it on the thread. Which transitions happen (connected, suspended,
  lost, reconnected, and the resync of every watch after a reconnect) is the
  backend's state machine: the loop never invents or drops one it is given.
* **Listeners cannot break the thread.** A listener (or a task) that raises is
  logged and the others still run. A watch cancelled before its event is delivered
  gets nothing; a watch's ``exclude`` filter is asked on the thread
  (:meth:`WatchDelivery.admits`).
* **Bounded waits.** :meth:`~EventLoop.call` runs a function on the thread (ordered
  with the deliveries) and waits for it at most the given time; :meth:`~EventLoop.stop`
  joins the thread at most the given time, and never joins from the thread itself
  (a listener may close its store).
* **Retry while idle.** A backend whose work on the thread can fail (a re-read while
  the connection is down) gives a :class:`Retry`: while ``pending()`` is true the
  thread wakes every ``interval`` seconds even when nothing was posted and calls
  ``run()`` after the item it handled, if any.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shardkeeper.registry.base import (
    ConnectionState,
    PathFilter,
    StateListener,
    Subscription,
    WatchEvent,
    WatchListener,
    is_excluded,
)

__all__ = ["CallTimeout", "EventLoop", "Retry", "WatchDelivery"]

_T = TypeVar("_T")

#: the item that ends the thread
_STOP = object()


class CallTimeout(TimeoutError):
    """:meth:`EventLoop.call`: the function did not run on the thread in time (distinct
    from any timeout the function itself raises)."""


@dataclass(eq=False, kw_only=True)
class WatchDelivery:
    """What the loop needs of a watch to deliver to it: its listener, whether it was
    cancelled, and its ``exclude`` filter. Backends subclass it with their own state."""

    prefix: str
    listener: WatchListener
    #: subtrees whose events are not delivered (the watch's ``exclude``)
    exclude: PathFilter | None = None
    cancelled: bool = False

    def admits(self, event: WatchEvent) -> bool:
        """Whether ``event`` may be delivered: its path is not excluded. (When the
        filter raises, the loop logs it and delivers: a broken filter excludes
        nothing, and must not take the event thread down.)"""
        return self.exclude is None or not is_excluded(event.path, self.exclude)


@dataclass(frozen=True)
class Retry:
    """Work the thread retries while idle (see the module docstring)."""

    #: whether there is work to retry (asked on the thread before each wait)
    pending: Callable[[], bool]
    #: the retry itself (on the thread)
    run: Callable[[], None]
    #: seconds between retries while nothing is posted
    interval: float = 0.25


@dataclass
class _Call:
    """A function run on the thread for a caller that waits for its outcome."""

    fn: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None

    def __call__(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the waiting caller, who raises it
            self.error = exc
        finally:
            self.done.set()


class EventLoop:
    """The event thread of one store (see the module docstring).

    ``name`` names the thread; ``state`` is the state before the first session (the
    store's answer to ``state`` until it has one); ``log`` gets the failures of
    listeners and tasks (the backend's logger); ``retry``: see :class:`Retry`.
    """

    def __init__(
        self,
        name: str,
        state: ConnectionState,
        *,
        log: logging.Logger,
        retry: Retry | None = None,
    ) -> None:
        self._name = name
        self._log = log
        self._state = state
        self._retry = retry
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # guards the listeners and the compare-and-set of post_state; never held while
        # a listener runs
        self._lock = threading.Lock()
        self._listeners: list[tuple[Subscription, StateListener]] = []

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the thread once what was posted before has run; wait for it at most
        ``timeout`` seconds (not at all from the thread itself). Idempotent."""
        self._queue.put(_STOP)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def on_thread(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and self._thread is threading.current_thread()

    # -- connection state ---------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        """The latest connection state (recorded when posted or delivered)."""
        return self._state

    def record(self, state: ConnectionState) -> None:
        """Set the state without telling the listeners (a store's own bookkeeping,
        e.g. LOST once it is closed)."""
        self._state = state

    def post_state(self, state: ConnectionState) -> bool:
        """Record ``state`` now and queue its delivery, unless it is the state already
        recorded; returns whether it was queued. From any thread."""
        with self._lock:
            if state is self._state:
                return False
            self._state = state
            self._queue.put(lambda: self._notify(state))
        return True

    def deliver_state(self, state: ConnectionState) -> None:
        """On the thread: record ``state`` and tell every listener now."""
        self._state = state
        self._notify(state)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver the states delivered from now on to ``listener``, on the thread."""
        entry: list[tuple[Subscription, StateListener]] = []

        def cancel() -> None:
            with self._lock:
                if entry[0] in self._listeners:
                    self._listeners.remove(entry[0])

        sub = Subscription(cancel_fn=cancel)
        entry.append((sub, listener))
        with self._lock:
            self._listeners.append(entry[0])
        return sub

    def _notify(self, state: ConnectionState) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for sub, listener in listeners:
            if sub.cancelled:
                continue
            try:
                listener(state)
            except Exception:
                self._log.exception("state listener %r failed on %s", listener, state.value)

    # -- watch events and tasks -----------------------------------------------------------

    def post_watch(self, watch: WatchDelivery, event: WatchEvent) -> None:
        """Queue ``event`` for ``watch`` (from any thread)."""
        self._queue.put(lambda: self.deliver_watch(watch, event))

    def deliver_watch(self, watch: WatchDelivery, event: WatchEvent) -> None:
        """On the thread: give ``event`` to ``watch`` now, unless it was cancelled or
        its filter leaves the event out."""
        if watch.cancelled:
            return
        try:
            admitted = watch.admits(event)
        except Exception:
            self._log.exception("watch %s: exclude filter failed on %s", watch.prefix, event.path)
            admitted = True
        if not admitted:
            return
        try:
            watch.listener(event)
        except Exception:
            self._log.exception("watch listener on %s failed on %s", watch.prefix, event)

    def post(self, task: Callable[[], None]) -> None:
        """Queue ``task`` to run on the thread after everything posted before it (from
        any thread: client-library callbacks only post)."""
        self._queue.put(task)

    def call(self, fn: Callable[[], _T], timeout: float) -> _T:
        """Run ``fn`` on the thread, in order with the deliveries, and return its result
        (or raise its exception). Raises :class:`CallTimeout` when it has not run
        within ``timeout`` seconds; it may still run later. On the thread itself, runs it now."""
        if self.on_thread():
            return fn()
        call = _Call(fn)
        self._queue.put(call)
        if not call.done.wait(timeout):
            raise CallTimeout(f"{self._name}: not run within {timeout:g}s")
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]  # what fn returned

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        retry = self._retry
        while True:
            due = retry is not None and self._pending(retry)
            try:
                item = self._queue.get(timeout=retry.interval if due and retry else None)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if callable(item):
                    item()
                if due and retry is not None:
                    retry.run()
            except Exception:
                self._log.exception("%s: unexpected error", self._name)

    def _pending(self, retry: Retry) -> bool:
        try:
            return retry.pending()
        except Exception:
            self._log.exception("%s: retry check failed", self._name)
            return False
