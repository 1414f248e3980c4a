"""The one module that builds etcd3's generated protobuf messages (``etcd3.etcdrpc``).

The other parts of the backend describe their requests as plain records
(``records.py``); the transport, the only module that imports this one, turns them into
the messages it sends, and builds the lease's and authentication's requests here too.
The generated gRPC stubs are the client's side and stay with the transport (and
``client_private``'s watch stub). ``tests/registry/test_client_privates.py``
(``test_only_messages_builds_etcd3s_generated_messages``) checks that no other module
of the package imports the generated code for its messages.

Every field is given as the records hold it: a default (an empty ``range_end``, a
``limit`` of 0) encodes as the field left unset, so the messages are byte for byte
those the parts used to build themselves. A compare's operand is set on the field of
its target (``version``, ``create_revision``, ``mod_revision``, ``value``, ``lease``),
0 included: the field of etcd's ``target_union`` is then the one named.
"""

from __future__ import annotations

from typing import Any

import etcd3.etcdrpc as rpc

from shardkeeper.registry.etcd.records import (
    Compare,
    DeleteRange,
    PutKey,
    Range,
    Request,
    Result,
    Target,
    Txn,
)

__all__ = [
    "authenticate",
    "compare",
    "kv_request",
    "lease_grant",
    "lease_keep_alive",
    "lease_revoke",
    "range_request",
    "request_op",
    "txn_request",
]

#: a compare's target: etcd's enum value and the field of its operand
_TARGETS: dict[Target, tuple[int, str]] = {
    Target.VERSION: (rpc.Compare.VERSION, "version"),
    Target.CREATE: (rpc.Compare.CREATE, "create_revision"),
    Target.MOD: (rpc.Compare.MOD, "mod_revision"),
    Target.VALUE: (rpc.Compare.VALUE, "value"),
    Target.LEASE: (rpc.Compare.LEASE, "lease"),
}
_RESULTS: dict[Result, int] = {
    Result.EQUAL: rpc.Compare.EQUAL,
    Result.GREATER: rpc.Compare.GREATER,
    Result.LESS: rpc.Compare.LESS,
    Result.NOT_EQUAL: rpc.Compare.NOT_EQUAL,
}


def compare(c: Compare) -> Any:
    """The ``Compare`` message of ``c``."""
    target, field = _TARGETS[c.target]
    operand: dict[str, Any] = {field: c.wanted}
    return rpc.Compare(
        key=c.key, range_end=c.range_end, target=target, result=_RESULTS[c.result], **operand
    )


def range_request(r: Range) -> Any:
    """The ``RangeRequest`` of ``r``."""
    return rpc.RangeRequest(
        key=r.key,
        range_end=r.range_end,
        keys_only=r.keys_only,
        limit=r.limit,
        min_create_revision=r.min_create_revision,
    )


def request_op(op: Request) -> Any:
    """The ``RequestOp`` holding ``op`` (one operation of a transaction's branch)."""
    if isinstance(op, Range):
        return rpc.RequestOp(request_range=range_request(op))
    if isinstance(op, PutKey):
        put = rpc.PutRequest(key=op.key, value=op.value, lease=op.lease, prev_kv=op.prev_kv)
        return rpc.RequestOp(request_put=put)
    if isinstance(op, DeleteRange):
        delete = rpc.DeleteRangeRequest(key=op.key, range_end=op.range_end)
        return rpc.RequestOp(request_delete_range=delete)
    return rpc.RequestOp(request_txn=txn_request(op))


def txn_request(t: Txn) -> Any:
    """The ``TxnRequest`` of ``t`` (nested transactions included)."""
    return rpc.TxnRequest(
        compare=[compare(c) for c in t.compare],
        success=[request_op(op) for op in t.success],
        failure=[request_op(op) for op in t.failure],
    )


def kv_request(request: Range | Txn) -> tuple[str, Any]:
    """The KV service's method for a read-only ``request`` and its message."""
    if isinstance(request, Range):
        return "Range", range_request(request)
    return "Txn", txn_request(request)


def lease_grant(ttl: int) -> Any:
    """A ``LeaseGrantRequest`` of ``ttl`` seconds."""
    return rpc.LeaseGrantRequest(TTL=ttl)


def lease_revoke(lease: int) -> Any:
    """A ``LeaseRevokeRequest`` of ``lease``."""
    return rpc.LeaseRevokeRequest(ID=lease)


def lease_keep_alive(lease: int) -> Any:
    """A ``LeaseKeepAliveRequest`` of ``lease``."""
    return rpc.LeaseKeepAliveRequest(ID=lease)


def authenticate(name: str | None, password: str) -> Any:
    """An ``AuthenticateRequest`` for the user ``name``."""
    return rpc.AuthenticateRequest(name=name, password=password)
