"""Commit health: whether this instance's writes still reach the store (the gray link).

A *gray* link keeps the session alive (pings or keep-alives get through, reads are
answered) while commits time out. Nothing else notices: the membership node stays, so
no other instance may take this instance's items (a requeue needs the owner's
membership gone), and a gray *leader* stops orphan requeue and resharding for the
whole job (reliability review, finding 2).

:class:`CommitHealth` is told the outcome of every commit the runtime attempts (by
:class:`~shardkeeper.runtime.health.commitwatch.CommitWatch`, a thin wrapper around the
store), and of every read (kept apart: an answered read proves nothing about
commits; a link that answers no read is gray too, and the fires and the leader's
duties stall on their reads before any commit). An *answer* is any reply of the
server, a refusal (a condition found false) included; a *failure* is a store error
(timeout, connection loss, unknown outcome) while the store reported itself
connected. Once a request has been attempted and
neither it nor any later-sent request of its kind was answered for ``window()``
seconds (one session timeout T; a request still in flight counts from its send
time, so the operation timeout does not lengthen the bound), the instance is
:attr:`~Health.RELINQUISHED`: the runtime fences every execution and gives up its
session (``CoordinationStore.relinquish_session``), so the owner-absent conditions
hold elsewhere and failover runs. While relinquished no write of the runtime is let
through except the *probe* commit, sent once a check; the first probe answered
makes the instance :attr:`~Health.HEALTHY` again and it rejoins (runtime/health/graylink.py).

The clock is injectable: the unit tests drive it by hand. The part does no store I/O.
"""

from __future__ import annotations

import bisect
import enum
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["KINDS", "CommitHealth", "Health", "Sent"]


class Health(enum.Enum):
    """Where the instance stands with its commits."""

    #: commits are answered (or none failed for long enough to matter)
    HEALTHY = "healthy"
    #: the session was given up; writes wait for a probe commit to be answered
    RELINQUISHED = "relinquished"


class _Record:
    """The outcomes of one kind of request (not thread-safe: the owner locks)."""

    def __init__(self) -> None:
        #: send times of the requests in flight (a time may repeat: a count each)
        self.inflight: Counter[float] = Counter()
        #: send times, in order, of the failed requests sent at or after the
        #: latest-sent request that was answered (an answer to a later request proves
        #: the link carried them after: the earlier failures no longer count)
        self.failed: list[float] = []
        self.answered_sent = -math.inf

    def landed(self, sent: float) -> None:
        left = self.inflight[sent] - 1
        if left > 0:
            self.inflight[sent] = left
        else:
            self.inflight.pop(sent, None)

    def answered(self, sent: float) -> None:
        if sent > self.answered_sent:
            self.answered_sent = sent
            del self.failed[: bisect.bisect_right(self.failed, sent)]

    def failure(self, sent: float) -> None:
        # a tie with an answered request's send time still counts: the order of two
        # requests sent in the same clock tick is unknown
        if sent >= self.answered_sent:
            bisect.insort(self.failed, sent)

    def unanswered_since(self) -> float | None:
        pending = [t for t in self.inflight if t > self.answered_sent]
        if self.failed:
            pending.append(self.failed[0])
        return min(pending) if pending else None


class Sent(NamedTuple):
    """A request on its way: when it was sent and its kind (from
    :meth:`CommitHealth.sending`)."""

    at: float
    kind: str


#: the kinds of request the record keeps apart: an answered read proves nothing about
#: commits (a link may carry one and not the other)
KINDS = ("commit", "read")


class CommitHealth:
    """The commit-health record of one runtime (module docstring).

    ``window``: seconds a request may go unanswered (with no answer to a later one of
    its kind) before :meth:`should_relinquish` is true; asked each time, as the
    negotiated session timeout may change at a reconnect. ``clock``: monotonic
    seconds. :meth:`sending` takes ``"commit"`` (the default) or ``"read"``: reads
    are kept apart from commits, and a link that answers neither is gray too (its
    leader and its fires stall on reads first).
    """

    def __init__(
        self, window: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._state = Health.HEALTHY
        self._records = {kind: _Record() for kind in KINDS}
        #: how often this instance gave up its session for unanswered requests
        self.relinquished = 0
        #: how often it rejoined after an answered probe
        self.rejoined = 0

    def _record(self, kind: str) -> _Record:
        record = self._records.get(kind)
        if record is None:
            raise ValueError(f"unknown request kind {kind!r}; use one of {', '.join(KINDS)}")
        return record

    @property
    def state(self) -> Health:
        """The current state."""
        return self._state

    @property
    def writes_allowed(self) -> bool:
        """Whether the runtime's writes go to the store (False while relinquished)."""
        return self._state is Health.HEALTHY

    def now(self) -> float:
        """The clock this record measures with."""
        return self._clock()

    def sending(self, kind: str = "commit") -> Sent:
        """A request of ``kind`` goes out now; pass what this returns to
        :meth:`answered`, :meth:`failed` or :meth:`withdrawn` (one of them must
        follow)."""
        with self._lock:
            record = self._record(kind)
            sent = Sent(self._clock(), kind)
            record.inflight[sent.at] += 1
            return sent

    def answered(self, sent: Sent) -> None:
        """The request was answered (a commit applied or refused)."""
        with self._lock:
            record = self._record(sent.kind)
            record.landed(sent.at)
            record.answered(sent.at)

    def withdrawn(self, sent: Sent) -> None:
        """The request ended without news of the link (refused by the client before it
        went out, or not a store error): it no longer counts."""
        with self._lock:
            self._record(sent.kind).landed(sent.at)

    def failed(self, sent: Sent) -> None:
        """The request got no answer (a store error)."""
        with self._lock:
            record = self._record(sent.kind)
            record.landed(sent.at)
            record.failure(sent.at)

    def _unanswered_since(self) -> float | None:
        """Under the lock: the send time of the oldest request that failed or is still
        in flight with no later-sent request of its kind answered (None: none)."""
        found = [t for r in self._records.values() if (t := r.unanswered_since()) is not None]
        return min(found) if found else None

    def unanswered_for(self) -> float:
        """Seconds since that oldest unanswered request was sent (0: none)."""
        with self._lock:
            since = self._unanswered_since()
            return 0.0 if since is None else max(0.0, self._clock() - since)

    def should_relinquish(self) -> bool:
        """Whether the session must be given up now: healthy, and a request attempted
        for the window with no answer to it or to any later one of its kind."""
        with self._lock:
            if self._state is not Health.HEALTHY:
                return False
            since = self._unanswered_since()
            return since is not None and self._clock() - since >= self._window()

    def forget(self) -> None:
        """Forget every outcome so far (a new session: they were the old one's). The
        state stays: a relinquished instance still waits for its probe."""
        with self._lock:
            self._records = {kind: _Record() for kind in KINDS}

    def relinquish(self) -> None:
        """Record that the session is being given up: writes are held from now on."""
        with self._lock:
            if self._state is Health.RELINQUISHED:
                return
            self._state = Health.RELINQUISHED
            self.relinquished += 1

    def probe_answered(self, sent: float) -> bool:
        """A probe commit sent at ``sent`` was answered: healthy again, and no request
        sent before it counts any more. Returns whether this ended a relinquished
        state (the caller then rejoins)."""
        with self._lock:
            for record in self._records.values():
                record.answered(sent)
            if self._state is not Health.RELINQUISHED:
                return False
            self._state = Health.HEALTHY
            self.rejoined += 1
            return True

    def __repr__(self) -> str:
        return f"CommitHealth({self._state.value}, unanswered_for={self.unanswered_for():.2f}s)"
