"""Size limits that several layers check: configuration refuses a job whose
assignment could not be stored, and coordination encodes assignments within it.

Kept apart from both so that configuration (below coordination) need not import
coordination for a constant.
"""

from __future__ import annotations

__all__ = ["ASSIGNMENT_MAX_BYTES", "CHECKPOINT_DEFAULT_BYTES", "CHECKPOINT_MAX_BYTES"]

ASSIGNMENT_MAX_BYTES = 900_000
"""The largest assignment value written: under ZooKeeper's 1 MB request limit
(1,048,575 bytes; the backend refuses requests over 1,000,000 bytes of values) with
room for the other operations of the reshard commit. etcd takes 1.5 MiB."""

CHECKPOINT_DEFAULT_BYTES = 65_536
"""The default ``checkpoint_max_bytes``: the largest JSON of one item's checkpoint
state. Every checkpoint write carries the whole state, so a small one is cheap."""

CHECKPOINT_MAX_BYTES = 262_144
"""The most ``checkpoint_max_bytes`` may be: a state travels in the completion commit
of its item beside the mark's deletion, and several items' commits are packed up to
the stores' request limits (ZooKeeper about 1 MB, etcd 1.5 MiB), so one item's state
stays well under them."""
