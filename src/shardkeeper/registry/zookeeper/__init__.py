"""ZooKeeper backend of the :class:`~shardkeeper.registry.base.CoordinationStore` contract.

Built on kazoo 2.11. The contract is documented once, in ``base.py``; this package only
records how each part maps onto ZooKeeper and the choices that mapping forced, each
part in the docstring of the module that does it:

* ``store.py``: :class:`ZooKeeperStore`, the public methods; it COMPOSES the parts
  below (no mixin: each part owns its state, and they talk through small named
  Protocols, drawn in its docstring);
* ``transport.py``: ``Transport``, the one part that touches the kazoo client (every
  request, the connection, the second clients that end a session);
* ``session.py``: ``Session``, connection states, the session id, the namespace node,
  credentials, relinquish;
* ``watch.py``: ``TreeWatch``, the tree watch behind :meth:`ZooKeeperStore.watch`
  (one persistent recursive watch per prefix; the drains and re-reads on the event
  thread);
* ``planner.py``: ``Commits``, one ``multi`` each (the table of how each operation is
  sent), over the pure ``plan.py`` (operations and pre-reads in, the multi out);
* ``reads.py``: ``Reads``, reads of many nodes in one ``multiRead``;
* ``owned.py``: our own ephemeral nodes of known incarnation (checked with no pre-read);
* ``handler.py``: kazoo's threading handler with a ``poll``-based ``select``;
* ``errors.py``: the one translation of kazoo's exceptions, and timeouts;
* ``security.py``: the credential filter on kazoo's logs, ACL checks and repair;
* ``kazoo_private.py``: the adapter onto kazoo: a ``KazooClient`` subclass with its
  connection-handler subclass, the hand-built requests and their records, every use
  of kazoo's private API (nothing else touches it; only the transport uses its client
  and requests, the other parts build its records);
* ``nodes.py``: path helpers and the znode -> :class:`~shardkeeper.registry.base.Node` mapping.

Namespace
    The store confines itself to the znode ``/<namespace>`` with a client-side chroot
    (as the Java client and kazoo do: ZooKeeper itself has no chroot). A ``/`` inside
    the namespace is escaped as ``%2F`` (as the etcd backend does), so namespace
    ``team/app`` is the single znode ``/team%2Fapp`` and never nests inside the tree
    of namespace ``team``. :meth:`ZooKeeperStore.start` creates the node if it is absent.

Node fields
    ``version`` = ``stat.version``, ``revision`` = ``stat.mzxid``, ``created_revision`` =
    ``stat.czxid``, ``ephemeral`` = ``stat.ephemeralOwner != 0``.

Ephemeral nodes
    Bound to the kazoo session. ``put(ephemeral=True)`` on a node that is persistent
    or owned by another session replaces it (``delete`` + ``create`` in one multi).
"""

from __future__ import annotations

from shardkeeper.registry.zookeeper.store import ZooKeeperStore

__all__ = ["ZooKeeperStore"]
