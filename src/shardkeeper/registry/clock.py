"""The store's clock, as seen from this instance: one sample of the offset.

``max_time_diff_seconds`` bounds how far an instance's clock may be from the store's
(fire times come from each instance's own clock). This module measures the offset,
``server time - local time``, with an error bound, on each backend:

* **ZooKeeper**: a write of the instance's own ephemeral node (``/control/clock/{id}``,
  its value unchanged) answers with the node's ``mtime``, the time the ZooKeeper leader
  stamped on the transaction, in milliseconds. The write happened somewhere between
  the local send and receive times, so the offset is ``mtime - midpoint`` within half
  the round trip (plus the millisecond of resolution). The store sends the write
  itself, through its transport (:class:`ServerClock`: ``ZooKeeperStore.server_time``);
  this module only times it.
* **etcd** answers its gRPC requests with no time at all. Its members' client URLs
  also serve HTTP (``/version``), and Go's HTTP server stamps every answer with a
  ``Date`` header from the member's clock, in **whole seconds** (RFC 9110,
  truncated). The server time is then within ``[Date, Date + 1 s)``: the offset is
  ``Date + 0.5 s - midpoint`` within half the round trip plus 0.5 s. The member asked
  is the first of the URL's endpoints that answers (TLS as the registry URL says).
* **MemoryStore** (tests): its server lives in this process, so its clock is this
  host's ``time.time()``; an injected local clock shows up as the offset.

A store whose own requests can carry its server's time implements
:class:`ServerClock` (ZooKeeper does; etcd's gRPC answers carry none, so the etcd store
does not, and its members' HTTP ``Date`` is read here). The local clock is a parameter
(``wall``) so that tests can shift it; the round trip is timed on the monotonic clock,
so a wall-clock step during a request does not stretch it. Nothing here decides
anything: runtime/clockskew.py does.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from shardkeeper.errors import StoreError, StoreUnavailableError
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.url import RegistrySettings

__all__ = ["ClockSample", "ServerClock", "ServerTime", "clock_sampler", "offset_sample"]

WallClock = Callable[[], float]


@dataclass(frozen=True)
class ClockSample:
    """One measurement: ``offset`` = store time - local time (seconds; positive when the
    local clock is behind), true within ``offset ± error``. ``at`` is the local wall
    time of the measurement, ``source`` says what was asked (for logs and the CLI)."""

    offset: float
    error: float
    at: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``/control/clock/{instance}`` node's fields)."""
        return {
            "offset": round(self.offset, 4),
            "error": round(self.error, 4),
            "at": round(self.at, 3),
            "source": self.source,
        }


def offset_sample(
    server_time: float,
    sent: float,
    round_trip: float,
    *,
    resolution: float = 0.0,
    source: str = "",
) -> ClockSample:
    """The offset from a server time read between the local wall time ``sent`` and
    ``sent + round_trip``. ``resolution``: the server time is truncated to it (1.0 for
    an HTTP ``Date``, 0.001 for a ZooKeeper mtime), so the true server time lies in
    ``[server_time, server_time + resolution)``."""
    if round_trip < 0:
        raise ValueError(f"round_trip {round_trip!r} is negative; give the measured seconds")
    if resolution < 0:
        raise ValueError(f"resolution {resolution!r} is negative; give seconds >= 0")
    midpoint = sent + round_trip / 2
    return ClockSample(
        offset=server_time + resolution / 2 - midpoint,
        error=round_trip / 2 + resolution / 2,
        at=midpoint,
        source=source,
    )


Sampler = Callable[[str, bytes], ClockSample]
"""``sample(node_path, node_value)``: one measurement (raises StoreError when the store
does not answer). The path and value are those of the instance's clock node, which the
store of a :class:`ServerClock` writes (unchanged) to get a server time."""


@dataclass(frozen=True)
class ServerTime:
    """The time a server stamped on one request: ``seconds`` since the epoch, truncated
    to ``resolution`` (the true time lies in ``[seconds, seconds + resolution)``);
    ``source`` says what was read (``ClockSample.source``)."""

    seconds: float
    resolution: float
    source: str


class ServerClock(Protocol):
    """A store whose own request tells its server's time (the ZooKeeper store: the
    ``mtime`` of a write). The sampler times the call; the store sends one request in
    it, on its own connection (its transport), and counts it in no request count."""

    def server_time(self, path: str, value: bytes) -> ServerTime | None:
        """Write ``value`` (unchanged) to the instance's ephemeral clock node ``path``
        and return the time the server stamped on the write; None when the node does
        not exist (the sampler creates it, ephemeral, and asks again). Raises
        StoreError when the server does not answer."""
        ...


def clock_sampler(store: CoordinationStore, wall: WallClock = time.time) -> Sampler | None:
    """The sampler for ``store``'s backend, or None when it has no clock to offer.

    :class:`ServerClock` is looked up with ``getattr``, not ``isinstance``: a store
    wrapper that forwards a backend's attributes through ``__getattr__`` (the runtime's
    commit watch) answers for its backend on every Python (config/timing.py says why)."""
    server_time = getattr(store, "server_time", None)
    if callable(server_time):
        return _ServerClockSampler(store, server_time, wall)
    settings = getattr(store, "settings", None)
    if isinstance(settings, RegistrySettings) and settings.backend == "etcd":
        return _EtcdDateSampler(settings, wall)
    if type(store).__name__ == "MemoryStore":
        return lambda _path, _value: _local_sample(wall)
    return None


def _local_sample(wall: WallClock) -> ClockSample:
    sent, start = wall(), time.monotonic()
    server = time.time()
    return offset_sample(server, sent, time.monotonic() - start, source="memory server")


class _ServerClockSampler:
    """Times the store's :meth:`ServerClock.server_time` (on ZooKeeper: a write of the
    clock node, whose reply's stat carries the leader's mtime)."""

    def __init__(
        self,
        store: CoordinationStore,
        server_time: Callable[[str, bytes], ServerTime | None],
        wall: WallClock,
    ) -> None:
        self._store = store
        self._server_time = server_time
        self._wall = wall

    def __call__(self, path: str, value: bytes) -> ClockSample:
        for attempt in range(2):
            sent, start = self._wall(), time.monotonic()
            try:
                stamp = self._server_time(path, value)
            except StoreError:
                raise
            except Exception as exc:  # anything else still reads as "no answer"
                raise StoreError(f"clock sample (set {path}): {type(exc).__name__}") from exc
            round_trip = time.monotonic() - start
            if stamp is None:
                if attempt == 0:
                    # first sample of this session: create the ephemeral node, then set
                    self._store.put(path, value, ephemeral=True)
                    continue
                break
            return offset_sample(
                stamp.seconds,
                sent,
                round_trip,
                resolution=stamp.resolution,
                source=stamp.source,
            )
        raise StoreError(f"clock sample: {path} vanished twice")


class _EtcdDateSampler:
    """Reads the ``Date`` header of ``GET /version`` on the first member that answers."""

    def __init__(self, settings: RegistrySettings, wall: WallClock) -> None:
        self._settings = settings
        self._wall = wall

    def __call__(self, path: str, value: bytes) -> ClockSample:
        problems: list[str] = []
        for host, port in self._settings.hosts:
            try:
                return self._ask(host, port)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                problems.append(f"{host}:{port}: {exc}")
        raise StoreUnavailableError("clock sample: no etcd member answered: " + "; ".join(problems))

    def _ask(self, host: str, port: int) -> ClockSample:
        timeout = self._settings.operation_timeout
        conn: http.client.HTTPConnection
        if self._settings.tls:
            from shardkeeper.registry.tls import ssl_context  # only for TLS registries

            conn = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=ssl_context(self._settings)
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()  # the handshake is not part of the timed exchange
            sent, start = self._wall(), time.monotonic()
            conn.request("GET", "/version")
            response = conn.getresponse()
            round_trip = time.monotonic() - start
            response.read()
            date = response.getheader("Date")
        finally:
            conn.close()
        if not date:
            raise ValueError("the answer has no Date header")
        server = parsedate_to_datetime(date).timestamp()
        return offset_sample(
            server, sent, round_trip, resolution=1.0, source=f"etcd {host}:{port} Date header"
        )
