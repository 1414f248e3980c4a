"""Batched reads of the ZooKeeper backend: many nodes in one ``multiRead`` request.

A subtree is read level by level, each level in one request (the data and the children
of every node of the level), and a commit's pre-reads are one request whatever their
number. ZooKeeper answers each operation of a ``multiRead`` on its own, so a node
deleted meanwhile is just absent from the result. Large batches are cut into chunks
of :data:`MULTI_READ_CHUNK` operations so that no reply grows without bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kazoo import exceptions as kz
from kazoo.protocol.states import ZnodeStat

from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.nodes import _child
from shardkeeper.registry.zookeeper.transport import Transport

__all__ = ["MULTI_READ_CHUNK", "Reads", "Seen"]

#: operations per ``multiRead`` request (nodes are small; this bounds a reply's size)
MULTI_READ_CHUNK = 512

#: a node read: (data, stat), or None when it is absent
Seen = tuple[bytes, ZnodeStat] | None


class Reads:
    """Reads of many nodes with few requests, through the transport."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def multi_read(self, deadline: float, ops: list[Any]) -> list[Any]:
        """The results of ``ops`` (kazoo_private's read operations), in order; a
        failed operation's result is its kazoo exception (not raised)."""
        t = self._transport
        sent = [
            t.send_multi_read(ops[i : i + MULTI_READ_CHUNK])
            for i in range(0, len(ops), MULTI_READ_CHUNK)
        ]
        out: list[Any] = []
        for ar in sent:
            out.extend(t.wait(ar, deadline))
        return out

    def read_many(self, deadline: float, paths: Sequence[str]) -> dict[str, Seen]:
        """Data and stat of each of ``paths`` (None when absent), in one request."""
        t = self._transport
        if len(paths) == 1:  # a plain get: the same one request
            try:
                return {paths[0]: t.get(deadline, paths[0])}
            except kz.NoNodeError:
                return {paths[0]: None}
        results = self.multi_read(deadline, [kazoo_private.get_data_op(t.full(p)) for p in paths])
        out: dict[str, Seen] = {}
        for p, res in zip(paths, results, strict=True):
            if isinstance(res, kz.NoNodeError):
                out[p] = None
            elif isinstance(res, Exception):
                raise res
            else:
                out[p] = res
        return out

    def walk(self, deadline: float, root: str, *, with_data: bool) -> dict[str, Seen]:
        """The subtree at ``root`` in breadth-first order, one request per level."""
        full = self._transport.full
        out: dict[str, Seen] = {}
        level = [root]
        while level:
            ops: list[Any] = []
            for p in level:
                if with_data:
                    ops.append(kazoo_private.get_data_op(full(p)))
                ops.append(kazoo_private.get_children_op(full(p)))
            results = self.multi_read(deadline, ops)
            step = 2 if with_data else 1
            nxt: list[str] = []
            for i, p in enumerate(level):
                data = results[i * step] if with_data else None
                kids = results[i * step + step - 1]
                if isinstance(data, kz.NoNodeError) or isinstance(kids, kz.NoNodeError):
                    continue  # deleted while we walked
                for res in (data, kids):
                    if isinstance(res, Exception):
                        raise res
                out[p] = data
                nxt.extend(_child(p, k) for k in sorted(kids))
            level = nxt
        return out

    def read_level(
        self, level: list[str]
    ) -> list[tuple[str, tuple[bytes, ZnodeStat] | None, list[str] | None]]:
        """Data and children of each node of ``level``, in one request (a ``multiRead``,
        chunked if large): ``(path, (value, stat) or None when absent, children)``.
        A write falling between a node's two operations makes its listing a little
        newer than its stat; the callers allow for it (``watch.py``:
        ``_born_with_children``)."""
        t = self._transport
        ops: list[Any] = []
        for p in level:
            full = t.full(p)
            ops += [kazoo_private.get_data_op(full), kazoo_private.get_children_op(full)]
        results = self.multi_read(t.deadline(), ops)
        read: list[tuple[str, tuple[bytes, ZnodeStat] | None, list[str] | None]] = []
        for i, p in enumerate(level):
            got, names = results[2 * i], results[2 * i + 1]
            if isinstance(got, kz.NoNodeError) or isinstance(names, kz.NoNodeError):
                read.append((p, None, None))
                continue
            for res in (got, names):
                if isinstance(res, Exception):
                    raise res
            read.append((p, got, names))
        return read
