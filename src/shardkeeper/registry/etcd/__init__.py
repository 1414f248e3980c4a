"""The etcd backend of :class:`~shardkeeper.registry.base.CoordinationStore` (etcd v3 API).

Built on the ``etcd3`` package (cslab-etcd3): its client manages the gRPC channels
and endpoint failover, its ``Watcher`` multiplexes every watch of a store over ONE
gRPC watch stream. Requests are sent through the client's stubs with explicit
protobuf messages so that every call carries the operation timeout and the response
header (the store revision) is available; the parts describe them as plain records
(``records``), which the transport alone turns into etcd3's generated messages
(``messages``).

The store is composed of parts, each owning its state and talking to the others
through small named interfaces (drawn in ``store.py``; no class here is a mixin):

* ``transport``: :class:`~shardkeeper.registry.etcd.transport.Transport`, the one part
  that touches the ``etcd3`` client: its endpoints, member choice and failover,
  authentication, requests (reads re-sent while safe, transactions, the lease's
  requests) and the watch stream; ``client_private``: every use of a private part of
  the client, with why (imported by ``transport`` alone); ``messages``: the one module
  that builds the generated ``etcdrpc`` messages, from the records (imported by
  ``transport`` alone);
* ``session``: :class:`~shardkeeper.registry.etcd.session.Session`, the lease, its
  keep-alive thread and the connection states;
* ``watch``: :class:`~shardkeeper.registry.etcd.watch.TreeWatch`, the watches on one
  shared stream, resume and RESYNC, and their recovery thread;
* ``planner`` and ``conditions``: the pure planner (a commit as one transaction:
  compares, folded writes, ephemeral-parent guards, the 128-operation budget, the
  verdict of a failed one) and ``Commits``, which sends what it plans; ``nesting``:
  ``commit_groups`` as nested transactions (pure plan and verdict per group);
* ``records``: the requests as plain frozen dataclasses (``Compare``, ``Range``,
  ``PutKey``, ``DeleteRange``, ``Txn``): what the planner returns and its tests read;
* ``keys``: :class:`~shardkeeper.registry.etcd.keys.Keyspace`, paths onto etcd's flat
  keyspace (namespaces, subtree ranges, pure parents); ``errors``: translation of
  gRPC/etcd3 errors (the one boundary); ``core``: the constants several parts use;
* ``store``: :class:`EtcdStore`, which builds the parts and implements the public
  methods on them.

Importing this package without the ``etcd3`` client (the ``shardkeeper[etcd]`` extra)
raises ImportError naming ``etcd3``; :func:`shardkeeper.registry.open_store` turns it
into an error naming the extra.
"""

from __future__ import annotations

# Imported first and on its own: without the extra this line raises ImportError naming
# etcd3, even when the modules below are still cached from an earlier import.
import etcd3  # noqa: F401

from shardkeeper.registry.etcd.store import EtcdStore

__all__ = ["EtcdStore"]
