"""kazoo's threading handler with a cheaper ``select``.

kazoo's connection thread calls ``handler.select`` before every socket read: once per
packet header and once per body, so two or three times per reply or watch
notification. kazoo's own ``select`` builds a ``selectors.DefaultSelector`` per call
(an epoll object: create, register, wait, close), which costs more than the read it
guards; a burst of thousands of notifications (a start-up that registers thousands of
jobs, a reshard) spent most of its time there. This handler answers the same question
with one ``poll`` object per call, no file descriptor of its own and no limit on the
descriptor's number (kazoo moved away from ``select.select`` for that limit).

The handler is kazoo's public extension point (``KazooClient(handler=...)``); only
``select`` differs from :class:`kazoo.handlers.threading.SequentialThreadingHandler`.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

__all__ = ["PollingHandler"]

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """:class:`SequentialThreadingHandler` whose ``select`` uses ``poll`` (see the
    module docstring)."""

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
