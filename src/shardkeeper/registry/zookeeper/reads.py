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
from shardkeeper.registry.zookeeper.session import _Session

__all__ = ["MULTI_READ_CHUNK"]

#: operations per ``multiRead`` request (nodes are small; this bounds a reply's size)
MULTI_READ_CHUNK = 512


class _Reads(_Session):
    """Reads of many nodes with few requests."""

    def _multi_read(self, deadline: float, ops: list[Any]) -> list[Any]:
        """The results of ``ops`` (kazoo_private's read operations), in order; a
        failed operation's result is its kazoo exception (not raised)."""
        sent = [
            self._send(kazoo_private.submit_multi_read, self._zk, ops[i : i + MULTI_READ_CHUNK])
            for i in range(0, len(ops), MULTI_READ_CHUNK)
        ]
        out: list[Any] = []
        for ar in sent:
            out.extend(self._wait(ar, deadline))
        return out

    def _read_many(
        self, deadline: float, paths: Sequence[str]
    ) -> dict[str, tuple[bytes, ZnodeStat] | None]:
        """Data and stat of each of ``paths`` (None when absent), in one request."""
        if len(paths) == 1:  # a plain get: the same one request
            try:
                return {paths[0]: self._call(deadline, self._zk.get_async, paths[0])}
            except kz.NoNodeError:
                return {paths[0]: None}
        results = self._multi_read(
            deadline, [kazoo_private.get_data_op(self._full(p)) for p in paths]
        )
        out: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        for p, res in zip(paths, results, strict=True):
            if isinstance(res, kz.NoNodeError):
                out[p] = None
            elif isinstance(res, Exception):
                raise res
            else:
                out[p] = res
        return out

    def _walk(
        self, deadline: float, root: str, *, with_data: bool
    ) -> dict[str, tuple[bytes, ZnodeStat] | None]:
        """The subtree at ``root`` in breadth-first order, one request per level."""
        out: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        level = [root]
        while level:
            ops: list[Any] = []
            for p in level:
                if with_data:
                    ops.append(kazoo_private.get_data_op(self._full(p)))
                ops.append(kazoo_private.get_children_op(self._full(p)))
            results = self._multi_read(deadline, ops)
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
