"""Commit health: whether this instance's writes still reach the store (the gray link).

A *gray* link keeps the session alive (pings or keep-alives get through, reads are
answered) while commits time out. Nothing else notices: the membership node stays, so
no other instance may take this instance's items (a requeue needs the owner's
membership gone), and a gray *leader* stops orphan requeue and resharding for the
whole job (reliability review, finding 2).

:class:`CommitHealth` is told the outcome of every commit the runtime attempts (by
:class:`~shardkeeper.runtime.commitwatch.CommitWatch`, a thin wrapper around the
store). An *answer* is any reply of the server, a refusal (a condition found false)
included; a *failure* is a store error (timeout, connection loss, unknown outcome)
while the store reported itself connected. Once a commit has been attempted and
neither it nor any commit sent after it was answered for ``window()`` seconds (one
session timeout T; a commit still in flight counts from its send time, so the
operation timeout does not lengthen the bound), the instance is
:attr:`~Health.RELINQUISHED`: the runtime fences every execution and gives up its
session (``CoordinationStore.relinquish_session``), so the owner-absent conditions
hold elsewhere and failover runs. While relinquished no write of the runtime is let
through except the *probe* commit, sent once a check; the first probe answered
makes the instance :attr:`~Health.HEALTHY` again and it rejoins (runtime/graylink.py).

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

__all__ = ["CommitHealth", "Health"]


class Health(enum.Enum):
    """Where the instance stands with its commits."""

    #: commits are answered (or none failed for long enough to matter)
    HEALTHY = "healthy"
    #: the session was given up; writes wait for a probe commit to be answered
    RELINQUISHED = "relinquished"


class CommitHealth:
    """The commit-health record of one runtime (module docstring).

    ``window``: seconds without an answered commit, while failed ones were attempted,
    after which :meth:`should_relinquish` is true (asked each time: the negotiated
    session timeout may change at a reconnect). ``clock``: monotonic seconds.
    """

    def __init__(
        self, window: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._state = Health.HEALTHY
        #: send times of the commits in flight (a time may repeat: a count each)
        self._inflight: Counter[float] = Counter()
        #: send times, in order, of the failed commits sent after the latest-sent
        #: commit that was answered (an answer to a later commit proves the link
        #: carried commits after them: they no longer count)
        self._failed: list[float] = []
        self._answered_sent = -math.inf
        #: how often this instance gave up its session for unanswered commits
        self.relinquished = 0
        #: how often it rejoined after an answered probe
        self.rejoined = 0

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

    def sending(self) -> float:
        """A commit goes out now; returns its send time, to pass to :meth:`answered`
        or :meth:`failed` (one of them must follow)."""
        with self._lock:
            sent = self._clock()
            self._inflight[sent] += 1
            return sent

    def _landed(self, sent: float) -> None:
        left = self._inflight[sent] - 1
        if left > 0:
            self._inflight[sent] = left
        else:
            self._inflight.pop(sent, None)

    def answered(self, sent: float) -> None:
        """The commit sent at ``sent`` was answered (applied or refused)."""
        with self._lock:
            self._landed(sent)
            if sent > self._answered_sent:
                self._answered_sent = sent
                at = bisect.bisect_right(self._failed, sent)
                del self._failed[:at]

    def withdrawn(self, sent: float) -> None:
        """The commit sent at ``sent`` ended without news of the link (refused by the
        client before it went out, or not a store error): it no longer counts."""
        with self._lock:
            self._landed(sent)

    def failed(self, sent: float) -> None:
        """The commit sent at ``sent`` got no answer (a store error)."""
        with self._lock:
            self._landed(sent)
            # a tie with an answered commit's send time still counts: the order of
            # two commits sent in the same clock tick is unknown
            if sent >= self._answered_sent:
                bisect.insort(self._failed, sent)

    def _unanswered_since(self) -> float | None:
        """Under the lock: the send time of the oldest commit that failed or is still
        in flight with no later-sent commit answered (None: there is none)."""
        pending = [t for t in self._inflight if t > self._answered_sent]
        if self._failed:
            pending.append(self._failed[0])
        return min(pending) if pending else None

    def unanswered_for(self) -> float:
        """Seconds since that oldest unanswered commit was sent (0: none)."""
        with self._lock:
            since = self._unanswered_since()
            return 0.0 if since is None else max(0.0, self._clock() - since)

    def should_relinquish(self) -> bool:
        """Whether the session must be given up now: healthy, and a commit attempted
        for the window with no answer to it or to any commit sent after it."""
        with self._lock:
            if self._state is not Health.HEALTHY:
                return False
            since = self._unanswered_since()
            return since is not None and self._clock() - since >= self._window()

    def relinquish(self) -> None:
        """Record that the session is being given up: writes are held from now on."""
        with self._lock:
            if self._state is Health.RELINQUISHED:
                return
            self._state = Health.RELINQUISHED
            self.relinquished += 1

    def probe_answered(self, sent: float) -> bool:
        """A probe commit sent at ``sent`` was answered: healthy again, and what was
        sent before it no longer counts. Returns whether this ended a relinquished
        state (the caller then rejoins)."""
        with self._lock:
            self._answered_sent = max(self._answered_sent, sent)
            self._failed = [t for t in self._failed if t > sent]
            if self._state is not Health.RELINQUISHED:
                return False
            self._state = Health.HEALTHY
            self.rejoined += 1
            return True

    def __repr__(self) -> str:
        return f"CommitHealth({self._state.value}, unanswered_for={self.unanswered_for():.2f}s)"
