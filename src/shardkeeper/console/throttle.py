"""Failed password checks per user name: after too many, refuse for a while.

Guessing passwords through the login form or HTTP Basic is slowed down to
``limit`` failures per ``window`` seconds for each user name (known or not, so the
answer does not tell which names exist). Kept in memory: a restart, or another
replica, starts afresh; a proxy in front can limit per client address too.
"""

from __future__ import annotations

import threading
import time
from collections import deque

__all__ = ["LoginThrottle", "TooManyLogins"]


class TooManyLogins(Exception):
    """Too many failed password checks for a user name; ``retry_after`` seconds."""

    def __init__(self, user: str, retry_after: float) -> None:
        self.retry_after = max(int(retry_after) + 1, 1)
        super().__init__(f"too many failed logins for {user!r}: try again in {self.retry_after} s")


class LoginThrottle:
    """Counts failed password checks per user name (thread-safe)."""

    def __init__(self, limit: int = 5, window: float = 300.0) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, user: str, now: float) -> deque[float]:
        times = self._failures.setdefault(user, deque())
        while times and now - times[0] > self.window:
            times.popleft()
        return times

    def wait_for(self, user: str) -> float:
        """Seconds until ``user`` may try again (0: now)."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(user, now)
            if len(times) < self.limit:
                if not times:
                    self._failures.pop(user, None)
                return 0.0
            return max(self.window - (now - times[0]), 0.0)

    def failed(self, user: str) -> None:
        """Count a failed check for ``user``."""
        now = time.monotonic()
        with self._lock:
            self._recent(user, now).append(now)
            if len(self._failures) > 10_000:  # bound the memory of a name-spraying client
                oldest = min(self._failures, key=lambda u: self._failures[u][-1])
                del self._failures[oldest]

    def succeeded(self, user: str) -> None:
        """Forget the failures of ``user`` (a correct password)."""
        with self._lock:
            self._failures.pop(user, None)
