"""The reference in-memory :class:`~shardkeeper.registry.base.CoordinationStore`, with step hooks.

A :class:`MemoryServer` is a store server living in the process: one tree of nodes per
namespace, one store-wide revision counter, sessions. Several :class:`MemoryStore`
objects on one server behave like several processes on one real store: each has its
own session, its own ephemeral nodes, its own event thread and connection state.

It implements the whole contract of ``base.py`` and passes
``tests/registry/test_contract.py`` next to the real backends. It is a reference and a
test seam (deterministic tests replay races with the hooks below), never a replacement
for the real stores in multi-process, chaos or CLI tests.

The package, by role:

* ``tree.py``: the data model (one namespace's tree, commit conditions);
* ``server.py``: :class:`MemoryServer`, its transactions and event fan-out, and
  :func:`named_server`;
* ``store.py``: :class:`MemoryStore`, one client with its session and event thread;
* ``hooks.py``: the step hooks (pauses, injected failures, held or dropped events).

URLs
----
``memory://NAME/namespace?session_timeout=S`` (see ``registry/url.py``) opens a store
on the process-wide server called NAME (created on first use, forgotten by its
:meth:`MemoryServer.shutdown`): :func:`named_server`.
"""

from __future__ import annotations

from shardkeeper.registry.memory.hooks import OPERATIONS, EventHold, Pause
from shardkeeper.registry.memory.server import MemoryServer, named_server
from shardkeeper.registry.memory.store import MemoryStore

__all__ = [
    "OPERATIONS",
    "EventHold",
    "MemoryServer",
    "MemoryStore",
    "Pause",
    "named_server",
]
