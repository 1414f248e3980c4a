"""A background sender: one thread, a bounded queue, retries with backoff.

``submit`` never blocks: it puts the alert on the queue, or drops it when the queue
is full (counted in :attr:`AlertSender.dropped` and logged, at most once a minute).
The thread sends alerts one by one; a send that raises :class:`SendError` with
``retry=True`` is tried again after ``backoff``, ``2 * backoff``, ... (at most
``max_backoff``), up to ``attempts`` tries in all, then dropped and counted in
:attr:`AlertSender.failed`. So a dead or hanging endpoint costs the sender thread
``attempts * (timeout + backoff)`` per alert at most, and the workers nothing.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from shardkeeper.alerts.message import Alert

__all__ = ["AlertSender", "SendError"]

log = logging.getLogger(__name__)

#: alerts waiting at most: beyond, new alerts are dropped (a storm of failures
#: must not grow memory without bound)
QUEUE_SIZE = 100
DROP_LOG_SECONDS = 60.0


class SendError(Exception):
    """A send failed; ``retry`` says whether trying again may help (a timeout, a 5xx,
    a refused connection) or not (a 4xx: the request itself is wrong)."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class AlertSender:
    """Sends alerts through ``send`` on its own daemon thread (module docstring)."""

    def __init__(
        self,
        send: Callable[[Alert], None],
        *,
        name: str,
        attempts: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._send = send
        self.name = name
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._queue: queue.Queue[Alert | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_drop_log = 0.0
        #: alerts delivered, given up after retries, dropped on a full queue
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    def submit(self, alert: Alert) -> bool:
        """Queue ``alert`` (never blocks). False when it was dropped."""
        if self._closed.is_set():
            return False
        self._ensure_thread()
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            with self._lock:
                self.dropped += 1
                dropped = self.dropped
                now = time.monotonic()
                loud = now - self._last_drop_log >= DROP_LOG_SECONDS
                if loud:
                    self._last_drop_log = now
            if loud:
                log.warning(
                    "%s: alert queue full (%d waiting); alerts dropped so far: %d",
                    self.name,
                    self._queue.qsize(),
                    dropped,
                )
            return False
        return True

    def pending(self) -> int:
        """Alerts waiting to be sent."""
        return self._queue.qsize()

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking alerts; send what is queued within ``timeout`` seconds."""
        self._closed.set()
        thread = self._thread
        if thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        thread.join(timeout)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            self._deliver(alert)

    def _deliver(self, alert: Alert) -> None:
        delay = self._backoff
        for attempt in range(1, self._attempts + 1):
            try:
                self._send(alert)
            except SendError as exc:
                if not exc.retry or attempt == self._attempts:
                    with self._lock:
                        self.failed += 1
                    log.error(
                        "%s: alert for job %r item %d not delivered after %d attempt(s): %s",
                        self.name,
                        alert.job,
                        alert.item,
                        attempt,
                        exc,
                    )
                    return
                log.info("%s: alert send failed (%s); retry in %.1fs", self.name, exc, delay)
                # a closing sender still retries: close() bounds the wait by its join
                time.sleep(delay)
                delay = min(delay * 2, self._max_backoff)
            except Exception:  # a bug in a transport must not end the thread
                with self._lock:
                    self.failed += 1
                log.exception("%s: alert transport failed", self.name)
                return
            else:
                with self._lock:
                    self.sent += 1
                return
