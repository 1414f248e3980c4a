"""Registry documents: round trips and the per-fire assignment rule."""

from __future__ import annotations

import pytest

from shardkeeper.coordination.model import Assignment, DocumentError, RunningMark


def test_assignment_round_trip_and_fire_rule() -> None:
    """A fire before effective_fire uses the previous owners; later fires the new ones."""
    a = Assignment(
        total=3,
        owners={0: "a", 1: "b", 2: "b"},
        generation=2,
        effective_fire=100.001,
        previous={0: "a", 1: "a", 2: "b"},
    )
    b = Assignment.from_bytes(a.to_bytes())
    assert b == a
    assert b.items_of("a", 100.0) == [0, 1]  # this fire started under the old one
    assert b.items_of("a", 101.0) == [0]
    assert b.items_of("b") == [1, 2]


def test_assignment_without_previous_uses_owners() -> None:
    """An assignment effective from this fire has no previous owners to fall back to."""
    a = Assignment(total=2, owners={0: "a", 1: "b"}, effective_fire=50.0)
    assert a.items_of("b", 10.0) == [1]


def test_malformed_documents_are_refused_with_the_path() -> None:
    """A value that is not the expected JSON names the node it came from."""
    with pytest.raises(DocumentError, match="/jobs/x/sharding"):
        Assignment.from_bytes(b"[1,2]", "/jobs/x/sharding")
    with pytest.raises(DocumentError, match="/jobs/x/running/1"):
        RunningMark.from_bytes(b'{"instance_id": "a"}', "/jobs/x/running/1")
