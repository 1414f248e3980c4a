"""The store's clock, as seen from this instance: one sample of the offset.

``max_time_diff_seconds`` bounds how far an instance's clock may be from the store's
(fire times come from each instance's own clock). This module measures the offset,
``server time - local time``, with an error bound, on each backend:

* **ZooKeeper**: a write of the instance's own ephemeral node (``/control/clock/{id}``,
  its value unchanged) answers with the node's ``mtime``, the time the ZooKeeper leader
  stamped on the transaction, in milliseconds. The write happened somewhere between
  the local send and receive times, so the offset is ``mtime - midpoint`` within half
  the round trip (plus the millisecond of resolution).
* **etcd** answers its gRPC requests with no time at all. Its members' client URLs
  also serve HTTP (``/version``), and Go's HTTP server stamps every answer with a
  ``Date`` header from the member's clock, in **whole seconds** (RFC 9110,
  truncated). The server time is then within ``[Date, Date + 1 s)``: the offset is
  ``Date + 0.5 s - midpoint`` within half the round trip plus 0.5 s. The member asked
  is the first of the URL's endpoints that answers (TLS as the registry URL says).
* **MemoryStore** (tests): its server lives in this process, so its clock is this
  host's ``time.time()``; an injected local clock shows up as the offset.

The local clock is a parameter (``wall``) so that tests can shift it; the round trip
is timed on the monotonic clock, so a wall-clock step during a request does not
stretch it. Nothing here decides anything: runtime/clockskew.py does.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from shardkeeper.errors import StoreError, StoreUnavailableError
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.url import RegistrySettings

__all__ = ["ClockSample", "clock_sampler", "offset_sample"]

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
ZooKeeper sampler writes (unchanged) to get a server time."""


def clock_sampler(store: CoordinationStore, wall: WallClock = time.time) -> Sampler | None:
    """The sampler for ``store``'s backend, or None when it has no clock to offer."""
    if hasattr(store, "kazoo_client"):
        return _ZooKeeperSampler(store, wall)
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


class _ZooKeeperSampler:
    """Writes the clock node and reads the leader's mtime from the reply's stat."""

    def __init__(self, store: CoordinationStore, wall: WallClock) -> None:
        self._store = store
        self._wall = wall

    def __call__(self, path: str, value: bytes) -> ClockSample:
        client: Any = getattr(self._store, "kazoo_client")  # noqa: B009 (duck-typed)
        timeout = float(getattr(self._store, "operation_timeout", 5.0))
        for attempt in range(2):
            sent, start = self._wall(), time.monotonic()
            try:
                stat = client.set_async(path, value).get(timeout=timeout)
            except Exception as exc:  # kazoo's errors: the registry layer maps them
                if attempt == 0 and type(exc).__name__ == "NoNodeError":
                    # first sample of this session: create the ephemeral node, then set
                    self._store.put(path, value, ephemeral=True)
                    continue
                raise StoreError(f"clock sample (set {path}): {type(exc).__name__}") from exc
            round_trip = time.monotonic() - start
            return offset_sample(
                stat.mtime / 1000.0,
                sent,
                round_trip,
                resolution=0.001,
                source="zookeeper mtime",
            )
        raise StoreError(f"clock sample: {path} vanished twice")  # pragma: no cover


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
