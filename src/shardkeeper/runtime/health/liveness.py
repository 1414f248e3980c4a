"""Whether this process may still own what its session owns: the freshness clock.

A session can expire without the client knowing yet (the process was frozen, a
long GC pause, a cut link). An execution is valid only while the latest request known
to have renewed the session was sent less than ``FRESH_FRACTION * T`` ago (T = the
session timeout): the server cannot have ended the session before ``sent + T``, and a
taker can only start after the end (its requeue is conditional on our membership
node being gone), so our items turn invalid before anyone else can start them.

What renews a session depends on the store (``CoordinationStore.last_renewal``):

* ZooKeeper (and the MemoryStore): any request the server answers. The housekeeping
  thread probes the store every T/3 and records when a probe that went out under the
  current session was answered (:meth:`Liveness.contact`). A (re)connection is not
  contact by itself: it only asks for a probe at once (its send time is after the
  reconnection was seen, whenever the event thread gets to deliver it).
* etcd: only the lease's own keep-alives. The store reports when it sent the latest
  one that was answered, and the clock counts from that alone: an answered read or
  commit proves nothing about the lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry.base import ConnectionState, CoordinationStore

__all__ = ["FRESH_FRACTION", "MIN_SESSION_TIMEOUT", "Liveness", "check_session_timeout"]

#: an execution is valid while the last answered probe is younger than this share of T
FRESH_FRACTION = 0.9
#: below this the T/3 probe cadence leaves no room for a loaded machine's scheduling
MIN_SESSION_TIMEOUT = 0.6

_LIVE = (ConnectionState.CONNECTED, ConnectionState.RECONNECTED)


def check_session_timeout(seconds: float) -> None:
    """Refuse a session timeout too short for the housekeeping cadence (T/3)."""
    if seconds < MIN_SESSION_TIMEOUT:
        raise ConfigError(
            f"session_timeout={seconds!r}s is too short: housekeeping probes the store every "
            f"T/3 and executions must stay valid between probes; use at least "
            f"{MIN_SESSION_TIMEOUT}s (2-10 s is typical)"
        )


class Liveness:
    """The freshness clock of one store session (module docstring)."""

    def __init__(
        self, store: CoordinationStore, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._last_contact = clock()

    @property
    def cadence(self) -> float:
        """Seconds between housekeeping passes: a third of the session timeout."""
        return self._store.session_timeout / 3

    def now(self) -> float:
        """The clock's reading: the send time to give :meth:`contact` for a request
        about to go out."""
        return self._clock()

    def fresh(self) -> bool:
        """Whether the session is certainly still ours (see module docstring)."""
        return self.age() < FRESH_FRACTION * self._store.session_timeout

    def age(self) -> float:
        """Seconds since the latest request known to have renewed the session was
        sent (``inf`` when the store knows of no renewal of its current session)."""
        renewed = self._store.last_renewal()
        if renewed is not None:
            return self._clock() - renewed
        with self._lock:
            return self._clock() - self._last_contact

    def contact(self, sent_at: float | None = None) -> None:
        """Record that the server answered a request sent at ``sent_at`` (default now)
        under the current session. Counted only for a store whose session every
        answered request renews (``last_renewal()`` None); the others report their
        renewals themselves."""
        at = self._clock() if sent_at is None else sent_at
        with self._lock:
            self._last_contact = max(self._last_contact, at)

    def probe(self, path: str) -> bool:
        """One cheap read; records contact when it was answered under the session it
        was sent in. Returns whether it was."""
        sent = self._clock()
        if self._store.state not in _LIVE:
            return False
        try:
            session = self._store.session_id
            self._store.exists(path)
            same = self._store.session_id == session
        except StoreError:
            return False
        if same:
            self.contact(sent)
        return same
