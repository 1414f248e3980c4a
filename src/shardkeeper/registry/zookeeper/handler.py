"""kazoo's threading handler with a cheaper ``select``.

kazoo's connection thread calls ``handler.select`` before every socket read: once per
packet header and once per body, so two or three times per reply or watch
notification. kazoo's own ``select`` builds a ``selectors.DefaultSelector`` per call
(an epoll object: create, register, wait, close), which costs more than the read it
guards; a burst of thousands of notifications (a start-up that registers thousands of
jobs, a reshard) spent most of its time there. This handler answers the same question
with one ``poll`` object per call, no file descriptor of its own and no limit on the
descriptor's number (kazoo moved away from ``select.select`` for that limit).

Reads are buffered as well. kazoo reads each packet with two ``recv`` calls (its
length, then its body), each after a ``select``: three system calls and three polls
a packet, in a burst of small watch notifications. The handler's
``create_connection`` wraps kazoo's socket in :class:`BufferedSocket`, which reads
what the kernel holds (up to 64 KiB) in one ``recv`` and serves kazoo's small reads
from it. kazoo already skips its ``select`` when the socket reports ``pending()``
bytes (as an SSL socket does), and this handler's ``select`` reports such a socket
readable at once. The others it was asked about are then polled without waiting,
at most every millisecond: the request queue's wake-up is never starved by a burst
of replies, and a burst does not cost a poll per packet.

The handler is kazoo's public extension point (``KazooClient(handler=...)``); only
``select`` and ``create_connection`` differ from
:class:`kazoo.handlers.threading.SequentialThreadingHandler`.
"""

from __future__ import annotations

import math
import select
import time
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

__all__ = ["BufferedSocket", "PollingHandler"]

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL


#: what one ``recv`` of the real socket asks for: a burst of notifications in one call
_CHUNK = 65536


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


#: how long bytes may be served from a buffer before the other descriptors a
#: ``select`` asks about (kazoo's request wake-up) are polled again
_RECHECK = 0.001


class BufferedSocket:
    """kazoo's connection socket with a read buffer (see the module docstring).

    ``recv`` returns buffered bytes first and reads the real socket only when the
    buffer is empty, in one large read; ``pending()`` counts the buffered bytes
    (and those the real socket holds decrypted, for SSL). Everything else is the
    real socket's (``raw``)."""

    __slots__ = ("_data", "_pos", "_raw_pending", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._data = b""
        self._pos = 0
        #: an SSL socket's own count of decrypted bytes (a plain socket has none)
        self._raw_pending = getattr(raw, "pending", None)

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes: buffered ones, else one read of the real socket."""
        if self._pos < len(self._data):
            chunk = self._data[self._pos : self._pos + size]
            self._pos += len(chunk)
            return chunk
        data: bytes = self.raw.recv(max(size, _CHUNK))
        if len(data) <= size:
            return data
        self._data, self._pos = data, size
        return data[:size]

    def pending(self) -> int:
        """Bytes a ``recv`` returns without waiting."""
        held = len(self._data) - self._pos
        return held + int(self._raw_pending()) if self._raw_pending is not None else held

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """:class:`SequentialThreadingHandler` whose ``select`` uses ``poll`` (see the
    module docstring)."""

    #: when ``select`` last polled the kernel (monotonic seconds)
    _polled = 0.0

    def select(
        self,
        rlist: Sequence[Any],
        wlist: Sequence[Any],
        xlist: Sequence[Any],
        timeout: float | None = None,
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """Like kazoo's: the objects of ``rlist`` ready to read and of ``wlist`` ready
        to write within ``timeout`` seconds (None: wait); ``xlist`` is not watched
        (kazoo's own ignores it too). An error or hang-up counts as ready, so that
        the caller's read or write meets it."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        ready = [obj for obj in rlist if type(obj) is BufferedSocket and obj.pending() > 0]
        if not ready:
            self._polled = time.monotonic()
            return self._poll(rlist, wlist, timeout)
        # bytes wait in a buffer, not in the kernel: ready now. The others are
        # polled (without waiting) at most every _RECHECK seconds meanwhile: often
        # enough for a queued request not to wait behind a burst of replies, and not
        # a poll per buffered packet.
        now = time.monotonic()
        if now - self._polled < _RECHECK and not wlist:
            return ready, [], []
        self._polled = now
        rest = [obj for obj in rlist if not any(obj is r for r in ready)]
        readable, writable, _ = self._poll(rest, wlist, 0)
        return ready + readable, writable, []

    def create_connection(self, *args: Any, **kwargs: Any) -> BufferedSocket:
        """kazoo's connection, its reads buffered (:class:`BufferedSocket`)."""
        return BufferedSocket(super().create_connection(*args, **kwargs))

    def _poll(
        self, rlist: Sequence[Any], wlist: Sequence[Any], timeout: float | None
    ) -> tuple[list[Any], list[Any], list[Any]]:
        readers: dict[int, list[Any]] = {}
        writers: dict[int, list[Any]] = {}
        for obj in rlist:
            readers.setdefault(_fd(obj), []).append(obj)
        for obj in wlist:
            writers.setdefault(_fd(obj), []).append(obj)
        poller = select.poll()
        for fd in readers.keys() | writers.keys():
            poller.register(
                fd,
                (select.POLLIN | select.POLLPRI if fd in readers else 0)
                | (select.POLLOUT if fd in writers else 0),
            )
        ms = None if timeout is None else math.ceil(timeout * 1000)
        readable: list[Any] = []
        writable: list[Any] = []
        for fd, events in poller.poll(ms):
            # as kazoo's own: a descriptor ready both ways is reported as readable
            if events & _READABLE and fd in readers:
                readable += readers[fd]
            elif events & _WRITABLE and fd in writers:
                writable += writers[fd]
        return readable, writable, []
