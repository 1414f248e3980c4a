"""The assignment's encodings: ranges, packed, the first form, and their size bounds."""

from __future__ import annotations

import json
import random

import pytest

from shardkeeper.config import MAX_SHARDING_TOTAL_COUNT
from shardkeeper.coordination import assignment_codec as codec
from shardkeeper.coordination.model import Assignment, DocumentError
from shardkeeper.coordination.strategies import BUILTIN_STRATEGIES
from shardkeeper.errors import JobConfigError

INSTANCES = [f"worker-{i:03d}.prod@{10_000 + i}@{i:06x}" for i in range(100)]


def owners_of(by_instance: dict[str, list[int]]) -> dict[int, str]:
    return {item: inst for inst, items in by_instance.items() for item in items}


def scatter(total: int, instances: list[str], seed: int = 7) -> dict[int, str]:
    """A strategy's worst case for the readable form: every item's owner at random."""
    rng = random.Random(seed)
    return {item: rng.choice(instances) for item in range(total)}


# -- ranges ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "text"),
    [
        ([], ""),
        ([7], "7"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 1, 2, 5, 10, 15, 20], "0-2,5-20/5"),
        ([3, 5], "3,5"),  # two terms of a stride are shorter as a list
        ([4, 1, 0, 2, 2], "0-2,4"),  # unsorted input and duplicates
        (list(range(3, 100_000, 100)), "3-99903/100"),
    ],
)
def test_ranges_round_trip(items: list[int], text: str) -> None:
    assert codec.encode_ranges(items) == text
    assert codec.decode_ranges(text) == sorted(set(items))


@pytest.mark.parametrize("text", ["a", "1-", "5-2", "-1", "1-9/0", "0-99999999999", "1,,2"])
def test_bad_ranges_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="range"):
        codec.decode_ranges(text)


# -- packed ------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [3, 300, 70_000])
def test_packed_round_trip_for_every_table_width(count: int) -> None:
    """1-, 2- and 4-byte indices; items without an owner stay without one."""
    instances = [f"i{n}" for n in range(count)]
    table = {inst: n for n, inst in enumerate(instances)}
    owners = {item: instances[(item * 7919) % count] for item in range(0, 2 * count, 2)}
    text = codec.encode_packed(owners, table)
    assert codec.decode_packed(text, instances) == owners


@pytest.mark.parametrize(
    "text", ["not base64!", "AAAA", codec.encode_packed({0: "a", 1: "b"}, {"a": 0, "b": 1})]
)
def test_bad_packed_values_are_refused(text: str) -> None:
    """Bad base64/zlib, and an index beyond the table (here a table of one)."""
    with pytest.raises(ValueError):
        codec.decode_packed(text, ["a"])


# -- the Assignment document ----------------------------------------------------------


def assignment(owners: dict[int, str], previous: dict[int, str] | None = None) -> Assignment:
    return Assignment(
        total=len(owners),
        owners=owners,
        generation=4,
        leader=INSTANCES[0],
        at=1.5,
        effective_fire=2.5,
        previous=previous or {},
    )


@pytest.mark.parametrize("strategy", sorted(BUILTIN_STRATEGIES))
def test_builtin_strategies_at_the_largest_count_stay_readable_and_small(strategy: str) -> None:
    """100,000 items over 100 instances: the readable form, a few kB (the first form
    took about 3 MB, over both stores' limits)."""
    by_instance = BUILTIN_STRATEGIES[strategy](INSTANCES, "job", MAX_SHARDING_TOTAL_COUNT)
    doc = assignment(owners_of(by_instance), previous=owners_of(by_instance))
    raw = doc.to_bytes()
    assert json.loads(raw)["encoding"] == "ranges"
    assert len(raw) < 20_000
    assert Assignment.from_bytes(raw) == doc


def test_scattered_items_switch_to_the_packed_form() -> None:
    """A strategy that gives every item to a random instance: packed, well under 1 MB."""
    owners = scatter(MAX_SHARDING_TOTAL_COUNT, INSTANCES)
    doc = assignment(owners, previous=scatter(MAX_SHARDING_TOTAL_COUNT, INSTANCES, seed=8))
    raw = doc.to_bytes()
    assert json.loads(raw)["encoding"] == "packed"
    assert len(raw) <= codec.worst_case_bytes(MAX_SHARDING_TOTAL_COUNT, len(INSTANCES))
    assert len(raw) < 400_000
    assert Assignment.from_bytes(raw) == doc


def test_small_assignments_are_readable_by_a_person() -> None:
    doc = assignment({0: "a", 1: "a", 2: "b", 3: "a"}, previous={0: "b", 1: "b"})
    data = json.loads(doc.to_bytes())
    assert data["owners"] == {"a": "0-1,3", "b": "2"}
    assert data["previous"] == {"b": "0-1"}
    assert data["format"] == 2


def test_the_first_form_is_still_read() -> None:
    """Values written before the compact encodings (one pair per item)."""
    raw = json.dumps(
        {
            "total": 3,
            "owners": {"0": "a", "1": "b", "2": "a"},
            "generation": 2,
            "leader": "a",
            "at": 1.0,
            "effective_fire": 0.0,
            "previous": {"0": "b"},
        }
    ).encode()
    doc = Assignment.from_bytes(raw)
    assert doc.owners == {0: "a", 1: "b", 2: "a"} and doc.previous == {0: "b"}
    assert doc.items_of("a") == [0, 2]


@pytest.mark.parametrize(
    "data",
    [
        {"format": 2, "encoding": "ranges", "total": 2, "owners": {"a": "0-1", "b": "1"}},
        {"format": 2, "encoding": "zip", "total": 1, "owners": {}},
        {"format": 3, "total": 1, "owners": {}},
        {"format": 2, "encoding": "packed", "total": 1, "instances": [], "owners": "eJz7"},
        {"format": 2, "encoding": "ranges", "total": 1, "owners": {"a": "x"}},
    ],
)
def test_malformed_documents_are_document_errors(data: dict[str, object]) -> None:
    """An item given twice, an unknown form, bad packed data, a bad range."""
    with pytest.raises(DocumentError, match="an assignment"):
        Assignment.from_bytes(json.dumps(data).encode(), "/jobs/j/sharding")


def test_worst_case_at_the_largest_count_fits_the_store() -> None:
    """The bound MAX_SHARDING_TOTAL_COUNT relies on: any strategy, 1,000 instances with
    64-character ids, after a count change from the largest count."""
    bound = codec.worst_case_bytes(
        MAX_SHARDING_TOTAL_COUNT, 1_000, 64, previous_total=MAX_SHARDING_TOTAL_COUNT
    )
    assert bound < codec.ASSIGNMENT_MAX_BYTES * 0.8


def test_an_assignment_over_the_limit_is_refused_naming_count_and_limit() -> None:
    """Only absurd instance counts get there: the error names the sizes."""
    many = [f"{'x' * 60}-{n}" for n in range(20_000)]
    doc = assignment({item: many[item % len(many)] for item in range(40_000)})
    with pytest.raises(JobConfigError) as info:
        doc.to_bytes()
    message = str(info.value)
    assert "40000 items over 20000 instances" in message
    assert f"limit of {codec.ASSIGNMENT_MAX_BYTES} bytes" in message
