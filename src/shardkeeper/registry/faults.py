"""The fault-hook protocol: session faults every store can inject on itself, for tests.

Tests (and :func:`shardkeeper.testing.faults.expire_session`) use this protocol rather
than reaching into a backend's client. Every store of the project implements it:

* :class:`~shardkeeper.registry.memory.MemoryStore`: ends the session in the in-process
  server; a drop is a suspension followed at once by a resume.
* :class:`~shardkeeper.registry.zookeeper.ZooKeeperStore`: a second client takes over
  the session (same id and password) and closes it, so the server ends it; a drop shuts
  the client's socket down (kazoo reconnects, the session survives).
* :class:`~shardkeeper.registry.etcd.EtcdStore`: the session lease is revoked on the
  server; a drop closes the gRPC channel (the store opens a new one).

Both faults are real on the real backends: the server sees them, other clients see
their consequences (the ephemeral nodes of an expired session are deleted).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["SessionFaults"]


@runtime_checkable
class SessionFaults(Protocol):
    """A store that can end its own session or drop its connection on purpose."""

    def expire_session(self, timeout: float = 15.0) -> None:
        """End the current session on the SERVER side, for real, within ``timeout``
        seconds: its ephemeral nodes are deleted and the store goes through LOST, then
        CONNECTED with a new session (asynchronously on the real backends: wait for
        the new session id). Raises StoreError if it cannot be done."""

    def drop_connection(self) -> None:
        """Cut the client's connection to the server now. The session survives when the
        client is back in time (SUSPENDED, then RECONNECTED)."""
