"""Size limits that several layers check: configuration refuses a job whose
assignment could not be stored, and coordination encodes assignments within it.

Kept apart from both so that configuration (below coordination) need not import
coordination for a constant.
"""

from __future__ import annotations

__all__ = ["ASSIGNMENT_MAX_BYTES"]

ASSIGNMENT_MAX_BYTES = 900_000
"""The largest assignment value written: under ZooKeeper's 1 MB request limit
(1,048,575 bytes; the backend refuses requests over 1,000,000 bytes of values) with
room for the other operations of the reshard commit. etcd takes 1.5 MiB."""
