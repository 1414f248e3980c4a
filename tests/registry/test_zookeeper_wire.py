"""The ZooKeeper backend's own request encoding is byte for byte kazoo's."""

from __future__ import annotations

from kazoo.protocol import serialization as zkproto
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from shardkeeper.registry.zookeeper import kazoo_private


def test_a_multi_and_a_multiread_encode_as_kazoo_encodes_them() -> None:
    """Every operation kind, both ACLs, a missing, an empty and a non-ASCII value:
    the faster encoding of ``multi`` and ``multiRead`` sends what kazoo would."""
    digest = make_digest_acl("operator", "secret", all=True)
    ops = [
        kazoo_private.create_op("/ns/jobs/a/config", b'{"x": 1}', [digest], False),
        kazoo_private.create_op("/ns/jobs/a/leader", b"me", OPEN_ACL_UNSAFE, True),
        kazoo_private.create_op("/ns/jobs/\u00e9", b"", [digest], False),
        zkproto.Create("/ns/jobs/a/none", None, [digest], 0),
        kazoo_private.check_op("/ns/jobs/a", -1),
        kazoo_private.check_op("/ns/jobs/a/sharding", 7),
        kazoo_private.delete_op("/ns/jobs/a/misfire/0", 3),
        kazoo_private.set_data_op("/ns/jobs/a/fired", b"1.5", -1),
    ]
    multi = kazoo_private._Multi(ops * 3)
    assert multi.serialize() == bytes(zkproto.Transaction.serialize(multi))

    reads = [kazoo_private.get_data_op("/ns/a"), kazoo_private.get_children_op("/ns/b")]
    multi_read = kazoo_private._MultiRead(reads)
    assert multi_read.serialize() == bytes(zkproto.Transaction.serialize(multi_read))
