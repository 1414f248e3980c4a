"""The constants of the etcd backend that several of its parts use: the gRPC channel
options, the pause between attempts while the server is unreachable, and how many
groups one request nests.

(No state lives here: each part of :class:`~shardkeeper.registry.etcd.EtcdStore` owns
its own, see the package docstring.)
"""

from __future__ import annotations

__all__ = ["CHANNEL_OPTIONS", "RETRY_DELAY", "groups_per_commit"]

# gRPC's default reconnect backoff grows to two minutes: after a long outage the
# channel would sit idle long after the server is back. Cap it at one second.
#
# gRPC's client also refuses answers over 4 MiB by default, and etcd sends a range as
# one answer: a namespace with a job of 10,000 items made every read of /jobs (the
# CLI's disable and enable of an instance) fail with "Received message larger than
# max" (600 s chaos on etcd). etcd bounds requests (--max-request-bytes), not answers;
# the tree a store reads is the user's data, so the client takes any size gRPC can.
MAX_ANSWER_BYTES = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
]
#: pause between attempts while the server is unreachable (session thread, start)
RETRY_DELAY = 0.2


def groups_per_commit(limit: int) -> int:
    """Groups one request carries at ``limit`` operations per transaction: containers
    and groups per container each take at most half of the limit (etcd 3.4 checks each
    nested transaction against the whole limit; older servers counted the outer
    operations against the nested ones, which halves keep within)."""
    return (limit // 2 - 8) * (limit // 2)
