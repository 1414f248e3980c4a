"""The reference in-memory store for users' tests: a registry in the process.

:class:`~shardkeeper.registry.memory.MemoryStore` implements the whole store contract
and passes the same contract suite as ZooKeeper and etcd; shardkeeper's own runtime
tests run on it. It fits a test of one process: a job's logic, its configuration,
what a runtime does on a fire, a reshard or a failover between runtimes of the same
process (each :class:`~shardkeeper.Runtime` on the same server is one instance). It
does not fit a test of what only a real store shows: several processes, a session
expiring on the server, a store's own limits, latency or failures (use the real
servers of :mod:`shardkeeper.testing.servers` and the pytest plugin for those).

:func:`memory_registry` gives a ``memory://`` URL on a server of its own, shut down
after the ``with`` block, so tests never share state::

    with memory_registry() as url:
        with Runtime(url) as rt:
            rt.add_job(job, JobConfig(name="sync", interval=1, sharding_total_count=4))
            ...
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from shardkeeper.registry.memory import MemoryServer, MemoryStore, named_server

__all__ = ["MemoryServer", "MemoryStore", "memory_registry", "named_server"]


@contextmanager
def memory_registry(namespace: str = "default", **options: float | str) -> Iterator[str]:
    """A ``memory://`` registry URL on a new in-process server, in ``namespace``,
    with ``options`` as URL options (``session_timeout=2``, ...); the server and every
    store on it are shut down when the block ends."""
    server = named_server(f"test-{uuid.uuid4().hex[:12]}")
    try:
        yield server.url(namespace, **options)
    finally:
        server.shutdown()
