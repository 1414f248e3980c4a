"""Registry documents: round trips and the per-fire assignment rule."""

from __future__ import annotations

import pytest

from shardkeeper.coordination.model import Assignment, DocumentError, RunningMark, next_births


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


def test_each_fire_keeps_the_owners_in_effect_for_it_across_several_reshards() -> None:
    """Three reshards in three fires: a fire still waiting from before the first one
    uses the owners that were in effect for it, not the newest (found by the chaos
    checker: an item ran twice for one fire when a follower's waiting fire read an
    assignment two reshards newer)."""
    from shardkeeper.coordination.model import Assignment

    doc = Assignment(
        total=2,
        owners={0: "c", 1: "c"},
        effective_fire=575.0,
        previous={0: "b", 1: "b"},
        previous_effective=574.0,
        older=((573.0, {0: "a", 1: "a"}),),
    )
    assert doc.items_of("c", 575.0) == [0, 1]
    assert doc.items_of("b", 574.5) == [0, 1]
    assert doc.items_of("a", 573.0) == [0, 1] and doc.items_of("b", 573.0) == []
    back = Assignment.from_bytes(doc.to_bytes())
    assert back.owners_for(573.2) == {0: "a", 1: "a"} and back.owners_for(574.0) == doc.previous


def test_births_say_when_each_item_was_first_due() -> None:
    """The first assignment makes every item born at its fire; a raise of the count
    adds the new items' breakpoint; a cut forgets the items gone, so items raised
    again are born again; an assignment that does not know its births (an older
    version wrote it) makes its items born at the next one, never earlier."""
    first = Assignment(
        total=4, owners=dict.fromkeys(range(4), "a"), births=next_births(None, 4, 100.0)
    )
    assert first.births == ((0, 100.0),)
    assert [first.born(i) for i in (0, 3, 4, -1)] == [100.0, 100.0, None, None]
    raised = Assignment(
        total=8, owners=dict.fromkeys(range(8), "a"), births=next_births(first, 8, 110.001)
    )
    assert [raised.born(i) for i in (3, 4, 7)] == [100.0, 110.001, 110.001]
    cut = Assignment(
        total=6, owners=dict.fromkeys(range(6), "a"), births=next_births(raised, 6, 120.0)
    )
    assert cut.births == ((0, 100.0), (4, 110.001))
    cut_more = Assignment(
        total=3, owners=dict.fromkeys(range(3), "a"), births=next_births(cut, 3, 125.0)
    )
    assert cut_more.births == ((0, 100.0),)
    again = next_births(cut_more, 5, 130.0)
    assert again == ((0, 100.0), (3, 130.0))
    # round trip, and an old document without births
    back = Assignment.from_bytes(raised.to_bytes())
    assert back.births == raised.births and back.born(5) == 110.001
    old = Assignment(total=4, owners=dict.fromkeys(range(4), "a"))
    assert Assignment.from_bytes(old.to_bytes()).born(0) is None
    assert next_births(old, 4, 140.0) == ((0, 140.0),)
