"""The etcd backend of :class:`~shardkeeper.registry.base.CoordinationStore` (etcd v3 API).

Built on the ``etcd3`` package (cslab-etcd3): its client manages the gRPC channels
and endpoint failover, its ``Watcher`` multiplexes every watch of a store over ONE
gRPC watch stream. Requests are sent through the client's stubs with explicit
protobuf messages so that every call carries the operation timeout and the response
header (the store revision) is available.

The package, by role (each module's docstring has the details of its part):

* ``keys``: mapping paths onto etcd's flat keyspace (namespaces, subtree ranges,
  pure parents);
* ``conditions`` and ``planner``: a commit as one transaction (compares, folded
  writes, ephemeral-parent guards, the 128-operation budget);
* ``session``: the lease, its keep-alive loop and the connection states; the event
  thread;
* ``watch``: the shared watch stream, resume and RESYNC;
* ``members``: requests, re-sent reads, authentication, moving on between members;
* ``errors``: translation of gRPC/etcd3 errors (the one boundary);
* ``client_private``: every use of a private part of the etcd3 client, with why;
* ``core``: the state all of them share; ``store``: :class:`EtcdStore`'s public
  methods.

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
