"""Request counting: a capability of the project's stores, outside the coordination
contract.

The benchmark harness and some tests measure what a piece of coordination costs in
requests to the server. The runtime never needs that number, so it is not part of
:class:`~shardkeeper.registry.base.CoordinationStore` (which is only coordination):
a store that counts implements :class:`CountsRequests`, and a caller checks with
``isinstance`` (or calls :func:`request_count`, which names the store that cannot).

Every store of the project implements it, each counting what it sends:

* :class:`~shardkeeper.registry.zookeeper.ZooKeeperStore`: every request sent, the
  tree watch's re-reads on the event thread included (a ``multi`` or ``multiRead``
  counts one);
* :class:`~shardkeeper.registry.etcd.EtcdStore`: the requests of the public methods
  (a transaction counts one, a re-sent request too); background keep-alives and watch
  recovery are not counted;
* :class:`~shardkeeper.registry.memory.MemoryStore`: each public call counts one.

Fault injection, the other capability tests need, is
:class:`~shardkeeper.registry.faults.SessionFaults`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["CountsRequests", "request_count"]


@runtime_checkable
class CountsRequests(Protocol):
    """A store that counts the requests it sends to its server."""

    @property
    def round_trips(self) -> int:
        """Requests sent to the server so far (grows only)."""
        ...


def request_count(store: object) -> int:
    """``store.round_trips``; TypeError naming the store's type when it does not count
    its requests (does not implement :class:`CountsRequests`)."""
    if not isinstance(store, CountsRequests):
        raise TypeError(
            f"{type(store).__name__} does not count its requests (no round_trips: it "
            "does not implement shardkeeper.registry.counting.CountsRequests)"
        )
    return store.round_trips
