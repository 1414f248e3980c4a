"""A slow network for tests: a userspace TCP proxy that delays and stalls traffic.

``tc netem`` needs kernel support that is not everywhere; :class:`SlowProxy` gives the
same effect for one TCP service: put it between a client and one store member (one
proxy per member, see :func:`slow_proxies`) and point the client's registry URL at
the proxies. While :attr:`SlowProxy.slow` is on, every chunk of data in either
direction is held for a random delay in ``delay`` (order kept), and a fraction
``stall_fraction`` of the chunks is held ``stall_seconds`` longer, the way a lost
packet waits for its retransmission. Turned off, it forwards at once. It can be
toggled while connections are open::

    proxies = slow_proxies(zk.hosts, delay=(0.05, 0.2), stall_fraction=0.1)
    url = "zk://" + ",".join(f"{h}:{p}" for h, p in (x.address for x in proxies)) + "/ns"
    ...                                 # start the instance on url
    for x in proxies: x.slow = True     # a slow link
    ...
    for x in proxies: x.close()

A *gray link* for ZooKeeper (``zookeeper_frames=True``): while
:attr:`SlowProxy.hold_requests` is on, the client's requests are held at the proxy,
in order, except its pings (xid -2) and the connect request that opens each
connection, which go through at once. The session lives (the server hears the
pings), every read and write times out. Turned off, the held requests are sent in
their order before anything newer (the server answers them late, as after a long
stall)::

    proxy = SlowProxy(zk_member, zookeeper_frames=True)
    proxy.hold_requests = True          # the session lives, nothing is answered

Bounded: at most ``max_connections`` connections at once (more are refused), a
connection whose held data exceeds ``max_buffer`` bytes is closed, and the proxy
closes itself ``max_seconds`` after it started; its threads are daemons. It only
ever connects to its one ``target``.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

__all__ = ["ZK_PING_XID", "SlowProxy", "slow_proxies"]

#: the xid of a ZooKeeper ping request (the jute protocol's reserved value)
ZK_PING_XID = -2


class SlowProxy:
    """Forward TCP from ``listen`` (host, port; port 0 = any free) to ``target``.

    ``delay``: (low, high) seconds added to each chunk while slow; ``stall_fraction``
    (0..1) of the chunks get ``stall_seconds`` more. ``slow`` starts as given.
    ``zookeeper_frames``: the target speaks ZooKeeper's protocol; the client's
    stream is then forwarded a frame at a time, so that :attr:`hold_requests` can
    hold its requests and let its pings through (module docstring).
    """

    def __init__(
        self,
        target: tuple[str, int],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        *,
        delay: tuple[float, float] = (0.05, 0.2),
        stall_fraction: float = 0.0,
        stall_seconds: float = 1.0,
        slow: bool = False,
        max_connections: int = 64,
        max_buffer: int = 16 << 20,
        max_seconds: float = 3600.0,
        seed: int | None = None,
        zookeeper_frames: bool = False,
    ) -> None:
        low, high = delay
        if not 0 <= low <= high <= 30:
            raise ValueError(
                f"delay must be (low, high) with 0 <= low <= high <= 30 s, not {delay!r}"
            )
        if not 0 <= stall_fraction <= 1:
            raise ValueError(f"stall_fraction must be within 0..1, not {stall_fraction!r}")
        if not 0 <= stall_seconds <= 60:
            raise ValueError(f"stall_seconds must be within 0..60, not {stall_seconds!r}")
        if max_connections < 1 or max_buffer < 1 or max_seconds <= 0:
            raise ValueError(
                "max_connections, max_buffer and max_seconds must be positive, not "
                f"{max_connections!r}, {max_buffer!r}, {max_seconds!r}"
            )
        self.target = target
        self.delay = (float(low), float(high))
        self.stall_fraction = stall_fraction
        self.stall_seconds = stall_seconds
        #: whether traffic is delayed now (toggle at any time)
        self.slow = slow
        self.zookeeper_frames = zookeeper_frames
        #: ZooKeeper only: whether requests other than pings are held now (toggle at
        #: any time); needs ``zookeeper_frames``
        self.hold_requests = False
        #: ZooKeeper: the most requests one connection had held at once, and the
        #: pings let through while requests were held
        self.most_held = 0
        self.pings_passed = 0
        self.max_connections = max_connections
        self.max_buffer = max_buffer
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        #: connections accepted and chunks forwarded so far (for tests and reports)
        self.accepted = 0
        self.chunks = 0
        self._listener = socket.create_server(listen, reuse_port=False)
        self._listener.settimeout(0.2)
        self._deadline = time.monotonic() + max_seconds
        self._thread = threading.Thread(target=self._accept_loop, name="slow-proxy", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the proxy listens on."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def closed(self) -> bool:
        """Whether the proxy has stopped (closed, or its ``max_seconds`` are over)."""
        return self._stop.is_set()

    def close(self) -> None:
        """Stop accepting, close every connection; idempotent."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(2)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- machinery ----------------------------------------------------------------

    def _hold_for(self) -> float:
        if not self.slow:
            return 0.0
        with self._rng_lock:
            held = self._rng.uniform(*self.delay)
            if self.stall_fraction and self._rng.random() < self.stall_fraction:
                held += self.stall_seconds
        return held

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() > self._deadline:
                break
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            with self._lock:
                full = len(self._conns) >= 2 * self.max_connections
            if full:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # the target is down: the client sees a closed connection
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.update((client, upstream))
                self.accepted += 1
            if self.zookeeper_frames:
                self._zk_requests(client, upstream)
            else:
                self._pipe(client, upstream)
            self._pipe(upstream, client)
        self.close()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        """Two threads per direction: a reader that stamps each chunk with its due
        time (never earlier than the chunk before it, so order is kept) and a writer
        that sends it then."""
        queue: deque[tuple[float, bytes]] = deque()
        cond = threading.Condition()
        state = {"held": 0, "eof": False}

        def drop() -> None:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

        def reader() -> None:
            last_due = 0.0
            while not self._stop.is_set():
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                with cond:
                    if not data:
                        state["eof"] = True
                        cond.notify()
                        return
                    due = max(time.monotonic() + self._hold_for(), last_due)
                    last_due = due
                    queue.append((due, data))
                    state["held"] += len(data)
                    over = state["held"] > self.max_buffer
                    cond.notify()
                if over:
                    drop()
                    return

        def writer() -> None:
            while not self._stop.is_set():
                with cond:
                    while not queue and not state["eof"] and not self._stop.is_set():
                        cond.wait(0.2)
                    if not queue:
                        if state["eof"] or self._stop.is_set():
                            break
                        continue
                    due, data = queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._stop.wait(wait)
                    continue
                with cond:
                    queue.popleft()
                    state["held"] -= len(data)
                try:
                    dst.sendall(data)
                except OSError:
                    break
                self.chunks += 1
            drop()

        for fn in (reader, writer):
            threading.Thread(target=fn, name="slow-proxy-pipe", daemon=True).start()

    def _zk_requests(self, src: socket.socket, dst: socket.socket) -> None:
        """The client-to-server direction of a ZooKeeper connection, a frame at a time
        (a 4-byte big-endian length, then the frame; a request starts with its xid):
        the first frame (the connect request) and pings go out at once, any other
        request waits while :attr:`hold_requests` is on, in order. Delays of ``slow``
        do not apply here."""
        frames: deque[tuple[bool, bytes]] = deque()  # (is a ping or the connect, frame)
        cond = threading.Condition()
        state = {"held": 0, "eof": False}

        def drop() -> None:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

        def reader() -> None:
            buffer = b""
            first = True
            while not self._stop.is_set():
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    with cond:
                        state["eof"] = True
                        cond.notify()
                    return
                buffer += data
                parsed: list[tuple[bool, bytes]] = []
                while len(buffer) >= 4:
                    (size,) = struct.unpack(">i", buffer[:4])
                    if size < 0 or len(buffer) < 4 + size:
                        break
                    frame, buffer = buffer[: 4 + size], buffer[4 + size :]
                    urgent = first or (
                        size >= 4 and struct.unpack(">i", frame[4:8])[0] == ZK_PING_XID
                    )
                    first = False
                    parsed.append((urgent, frame))
                with cond:
                    frames.extend(parsed)
                    state["held"] += sum(len(f) for _u, f in parsed)
                    over = state["held"] + len(buffer) > self.max_buffer
                    cond.notify()
                if over:
                    drop()
                    return

        def next_frame() -> tuple[bool, bytes] | None:
            """Under ``cond``: the frame to send now (taken off the queue), or None."""
            if not frames:
                return None
            if not self.hold_requests or frames[0][0]:
                return frames.popleft()
            for at, (urgent, frame) in enumerate(frames):
                if urgent:  # a ping overtakes the held requests
                    del frames[at]
                    return urgent, frame
            return None

        def writer() -> None:
            while not self._stop.is_set():
                with cond:
                    picked = next_frame()
                    while picked is None:
                        if state["eof"] or self._stop.is_set():
                            drop()
                            return
                        cond.wait(0.05)  # also notices hold_requests turning off
                        picked = next_frame()
                    urgent, frame = picked
                    state["held"] -= len(frame)
                    if self.hold_requests and urgent:
                        self.pings_passed += 1
                    waiting = sum(1 for u, _f in frames if not u)
                    self.most_held = max(self.most_held, waiting)
                try:
                    dst.sendall(frame)
                except OSError:
                    break
                self.chunks += 1
            drop()

        for fn in (reader, writer):
            threading.Thread(target=fn, name="slow-proxy-zk", daemon=True).start()


def slow_proxies(
    targets: Iterable[tuple[str, int]], listen_host: str = "127.0.0.1", **options: Any
) -> list[SlowProxy]:
    """One :class:`SlowProxy` per target (store member), listening on ``listen_host``
    on free ports; ``options`` are passed to each (delay=, stall_fraction=, ...)."""
    out: list[SlowProxy] = []
    try:
        for target in targets:
            out.append(SlowProxy(target, (listen_host, 0), **options))
    except BaseException:
        for proxy in out:
            proxy.close()
        raise
    return out
