"""Log lines that repeat while the store is down, at one per 30 s instead of several a second.

During an outage the skip summary (:mod:`shardkeeper.runtime.fire.skiplog`) logs one line
per 30 s, but the store clients retried below it and logged every retry: kazoo's
``Connection dropped`` WARNING about twice a second, the etcd watch recovery an INFO
line five times a second (newcomer review 2026-12, D17). Here such a line is let
through when it is news (the first one, or the first after a quiet window), then once
per window with the number held back since the last one, the same cadence as the skip
summary.

* :class:`LogThrottle`: the counting, for code that logs its own retries (the etcd
  watch recovery).
* :class:`RetryLogFilter`: a :class:`logging.Filter` for a library's logger (kazoo's),
  throttling the records whose format string is one of the given ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

__all__ = ["WINDOW", "LogThrottle", "RetryLogFilter"]

#: seconds between two lines of one kind while it repeats: the skip summary's cadence
WINDOW = 30.0


@dataclass
class _Kind:
    logged_at: float
    seen_at: float
    held: int = 0


class LogThrottle:
    """Which lines of a kind to log: the first, then one per ``window`` seconds.

    A kind is any hashable key (a message's format string, say). A line of a kind not
    seen for a whole window is news again and logged at once.
    """

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[Hashable, _Kind] = {}

    def admit(self, kind: Hashable) -> int | None:
        """None: hold this line back; else log it, and the int is how many lines of
        ``kind`` were held back since the last one logged (0: none)."""
        with self._lock:
            now = self._clock()
            state = self._kinds.get(kind)
            if state is None:
                self._kinds[kind] = _Kind(logged_at=now, seen_at=now)
                return 0
            quiet = now - state.seen_at >= self.window
            state.seen_at = now
            if quiet or now - state.logged_at >= self.window:
                held, state.held, state.logged_at = state.held, 0, now
                return held
            state.held += 1
            return None

    def held(self, kind: Hashable) -> int:
        """How many lines of ``kind`` are held back since the last one logged."""
        with self._lock:
            state = self._kinds.get(kind)
            return state.held if state is not None else 0

    def suffix(self, held: int) -> str:
        """What a logged line adds about the ``held`` ones before it ("" for none)."""
        if not held:
            return ""
        return (
            f" ({held} more like it not logged; one line per {self.window:.0f}s while it repeats)"
        )


class RetryLogFilter(logging.Filter):
    """Throttles the records whose format string (``record.msg``) is one of
    ``messages``; every other record passes untouched.

    A record let through after held-back ones says how many (its message is
    formatted then, with the count appended). Put it on the logger the library logs
    through: a filter on a logger sees only that logger's own records.
    """

    def __init__(self, messages: Iterable[str], throttle: LogThrottle | None = None) -> None:
        super().__init__()
        self.messages = frozenset(messages)
        self.throttle = throttle or LogThrottle()

    def filter(self, record: logging.LogRecord) -> bool:
        """False to drop ``record`` (held back), True to log it (see the class)."""
        if not isinstance(record.msg, str) or record.msg not in self.messages:
            return True
        held = self.throttle.admit(record.msg)
        if held is None:
            return False
        if held:
            try:
                message = record.getMessage()
            except Exception:  # a broken format string is the handler's business
                return True
            record.msg, record.args = message + self.throttle.suffix(held), None
        return True
