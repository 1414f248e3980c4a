"""Ephemeral nodes of our own session whose incarnation is known: checked in a multi
without a pre-read.

A ZooKeeper multi can check a node's data version but not its czxid, so a commit
condition "this node is still the incarnation created at revision R"
(``Check(created_revision=R)``) normally costs a pre-read (``planner.py``). For an
ephemeral node that this client created itself (or read as its own) the answer is
already known, as long as nobody deleted the node since: then an existence check inside
the multi says the same as the pre-read would have.

How "nobody deleted it since" is known: the store's persistent recursive watches
(``watch.py``) deliver every delete at or below their prefix, excluded subtrees
included, in store order on the connection that carries our requests. So a record is
made and used only for a path covered by a watch armed on the *current* connection;
every connection-state change (suspended, reconnected, lost) drops all records and
starts a new epoch; and a delete notification for a recorded path, or for a path whose
record is being made (``begin``/``end`` around the request that learns it), drops or
voids it. A node can only be re-created after a delete, and that delete reaches us
before any reply that follows it, so a record never outlives its incarnation by more
than the time between the server's delete and our next notification: the same window a
pre-read leaves between its answer and the multi.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["OwnedEphemerals", "Ticket"]


@dataclass
class Ticket:
    """Paths whose record a request may make: the epoch and each path's delete count
    when the request was sent (see :meth:`OwnedEphemerals.begin`)."""

    epoch: int
    deletes: dict[str, int] = field(default_factory=dict)


class OwnedEphemerals:
    """path -> czxid of the ephemeral nodes this client owns and has seen no delete of,
    for the current connection epoch. Thread-safe: kazoo's connection thread reports
    deletes and state changes, request threads make and use records."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: bumped by every connection-state change; a record of an older epoch is void
        self.epoch = 0
        self._known: dict[str, int] = {}
        #: path -> [requests learning it now, deletes seen while they run]
        self._flight: dict[str, list[int]] = {}

    def knows(self, path: str, czxid: int) -> bool:
        """Whether ``path`` is our ephemeral node created at ``czxid``, not deleted since."""
        with self._lock:
            return self._known.get(path) == czxid

    def begin(self, paths: Iterable[str]) -> Ticket:
        """Call before sending a request that may learn ``paths`` (a create or a read);
        hand the ticket to :meth:`end` whatever happens."""
        with self._lock:
            ticket = Ticket(self.epoch)
            for p in paths:
                entry = self._flight.setdefault(p, [0, 0])
                entry[0] += 1
                ticket.deletes[p] = entry[1]
            return ticket

    def end(self, ticket: Ticket, learned: Mapping[str, int] | None = None) -> None:
        """Record ``learned`` (path -> czxid, paths of the ticket only) unless the epoch
        changed or a delete of the path was seen since :meth:`begin`."""
        with self._lock:
            for p, seen in ticket.deletes.items():
                entry = self._flight[p]
                if (
                    learned is not None
                    and p in learned
                    and ticket.epoch == self.epoch
                    and entry[1] == seen
                ):
                    self._known[p] = learned[p]
                entry[0] -= 1
                if entry[0] == 0:
                    del self._flight[p]

    def deleted(self, path: str) -> None:
        """A delete notification for ``path`` (kazoo's connection thread)."""
        with self._lock:
            self._known.pop(path, None)
            entry = self._flight.get(path)
            if entry is not None:
                entry[1] += 1

    def forget(self, paths: Iterable[str]) -> None:
        """Drop the records of ``paths`` (we deleted them, or a check found them gone)."""
        with self._lock:
            for p in paths:
                self._known.pop(p, None)

    def reset(self) -> None:
        """A connection-state change: every record is void, a new epoch starts."""
        with self._lock:
            self.epoch += 1
            self._known.clear()
