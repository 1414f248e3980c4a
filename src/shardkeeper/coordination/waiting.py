"""Bounded waits that wake up early when the registry changes.

Watch events are hints (see the store contract): a waiter re-reads the store each
time it is woken, and at least every ``poll`` seconds in case an event was folded
into another. Every wait has a deadline; there is no unbounded wait anywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["ChangeSignal"]


class ChangeSignal:
    """A counter bumped on every relevant registry event, with bounded waits."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seq = 0

    def notify(self) -> None:
        """Wake every waiter (called from the store's event thread)."""
        with self._cond:
            self._seq += 1
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float, poll: float = 0.25) -> bool:
        """Re-evaluate ``predicate`` on each change (and every ``poll`` s) until it is
        true or ``timeout`` seconds pass. Returns the last value of the predicate."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._seq
            if predicate():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._cond:
                if self._seq == seen:
                    self._cond.wait(min(poll, remaining))
