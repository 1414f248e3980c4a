"""Sharding strategies: ElasticJob's test vectors, Java hashCode, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardkeeper.coordination.strategies import (
    BUILTIN_STRATEGIES,
    ShardingStrategy,
    average,
    check_assignment,
    java_hash_code,
    odevity,
    resolve_strategy,
    round_robin,
)
from shardkeeper.errors import JobConfigError

A, B, C, D = "host-a@1", "host-b@2", "host-c@3", "host-d@4"
ABC = [A, B, C]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("order-sync", 710219194),
        ("jobA", 3267620),
        ("orderJob", 1234284943),
        # Overflows 32 bits and wraps negative, as in Java.
        ("polygenelubricants", -2147483648),
        ("hello world", 1794106052),
        ("Aa", 2112),
        ("BB", 2112),
        # One code point outside the BMP counts as a UTF-16 surrogate pair.
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
        ("é", 233),
    ],
)
def test_java_hash_code_matches_java(text: str, expected: int) -> None:
    """java_hash_code gives Java's String.hashCode, including overflow and surrogates."""
    assert java_hash_code(text) == expected


# Every vector of semantics.md section 4: (strategy, instances, job, total, expected).
VECTORS = [
    ("average", ABC, "any", 10, {A: [0, 1, 2, 9], B: [3, 4, 5], C: [6, 7, 8]}),
    ("average", ABC, "any", 8, {A: [0, 1, 6], B: [2, 3, 7], C: [4, 5]}),
    ("average", [A, B, C, D], "any", 2, {A: [0], B: [1], C: [], D: []}),
    ("odevity", ABC, "order-sync", 10, {C: [0, 1, 2, 9], B: [3, 4, 5], A: [6, 7, 8]}),
    ("round_robin", ABC, "order-sync", 10, {B: [0, 1, 2, 9], C: [3, 4, 5], A: [6, 7, 8]}),
    ("round_robin", ABC, "jobA", 10, {C: [0, 1, 2, 9], A: [3, 4, 5], B: [6, 7, 8]}),
    ("odevity", ABC, "orderJob", 10, {A: [0, 1, 2, 9], B: [3, 4, 5], C: [6, 7, 8]}),
]


@pytest.mark.parametrize(("name", "instances", "job", "total", "expected"), VECTORS)
def test_semantics_vectors(
    name: str, instances: list[str], job: str, total: int, expected: dict[str, list[int]]
) -> None:
    """Each built-in strategy reproduces ElasticJob's assignment for the documented vectors."""
    assert BUILTIN_STRATEGIES[name](instances, job, total) == expected


def test_vector_hash_parities_are_as_documented() -> None:
    """The vectors rely on order-sync and jobA having even hashes and orderJob an odd one."""
    assert java_hash_code("order-sync") % 2 == 0
    assert java_hash_code("jobA") % 2 == 0
    assert java_hash_code("orderJob") % 2 == 1
    assert abs(java_hash_code("order-sync")) % 3 == 1
    assert abs(java_hash_code("jobA")) % 3 == 2


def test_odevity_with_odd_hash_equals_average() -> None:
    """An odd job-name hash leaves the list as it is, so odevity equals average."""
    assert odevity(ABC, "orderJob", 10) == average(ABC, "orderJob", 10)


@pytest.mark.parametrize("strategy", [average, odevity, round_robin])
def test_no_instances_gives_empty_assignment(strategy: ShardingStrategy) -> None:
    """With no live instances nothing is assigned and nothing fails."""
    assert strategy([], "job", 5) == {}


@pytest.mark.parametrize("strategy", [average, odevity, round_robin])
def test_every_instance_is_a_key_even_without_items(strategy: ShardingStrategy) -> None:
    """An instance that gets no item is still present with an empty list."""
    result = strategy([A, B, C, D], "job", 1)
    assert set(result) == {A, B, C, D}
    assert sorted(len(v) for v in result.values()) == [0, 0, 0, 1]


def test_round_robin_handles_int_min_hash() -> None:
    """The one hash where Java's Math.abs stays negative still gives a valid rotation."""
    job = "polygenelubricants"
    assert java_hash_code(job) == -(2**31)
    result = round_robin(ABC, job, 10)
    # abs(-2**31) % 3 == 2: the list starts at host-c.
    assert result == {C: [0, 1, 2, 9], A: [3, 4, 5], B: [6, 7, 8]}


instance_lists = st.lists(
    st.text(alphabet="abcdefgh-@0123456789", min_size=1, max_size=12),
    min_size=1,
    max_size=20,
    unique=True,
).map(sorted)
job_names = st.text(min_size=1, max_size=30)
totals = st.integers(min_value=0, max_value=300)


@given(instances=instance_lists, job=job_names, total=totals)
@pytest.mark.parametrize("name", sorted(BUILTIN_STRATEGIES))
def test_every_item_assigned_exactly_once(
    name: str, instances: list[str], job: str, total: int
) -> None:
    """Every item 0..total-1 has exactly one owner, and only listed instances own items."""
    result = BUILTIN_STRATEGIES[name](instances, job, total)
    assert set(result) == set(instances)
    items = sorted(i for owned in result.values() for i in owned)
    assert items == list(range(total))
    assert check_assignment(result, instances, total) == {k: sorted(v) for k, v in result.items()}


@given(instances=instance_lists, job=job_names, total=totals)
@pytest.mark.parametrize("name", sorted(BUILTIN_STRATEGIES))
def test_sizes_differ_by_at_most_one(name: str, instances: list[str], job: str, total: int) -> None:
    """Every built-in strategy is an average over some order: loads differ by at most 1."""
    sizes = [len(v) for v in BUILTIN_STRATEGIES[name](instances, job, total).values()]
    assert max(sizes) - min(sizes) <= 1


@given(instances=instance_lists, job=job_names, total=totals)
@pytest.mark.parametrize("name", sorted(BUILTIN_STRATEGIES))
def test_deterministic(name: str, instances: list[str], job: str, total: int) -> None:
    """The same input always gives the same assignment, without mutating the input."""
    before = list(instances)
    first = BUILTIN_STRATEGIES[name](instances, job, total)
    second = BUILTIN_STRATEGIES[name](list(instances), job, total)
    assert first == second
    assert instances == before


@given(instances=instance_lists, total=totals)
def test_average_gives_remainder_to_first_instances(instances: list[str], total: int) -> None:
    """With average, the first total % n instances hold one item more than the rest."""
    n = len(instances)
    result = average(instances, "x", total)
    for k, instance in enumerate(instances):
        assert len(result[instance]) == total // n + (1 if k < total % n else 0)


@given(text=st.text(max_size=50))
def test_java_hash_code_is_signed_32_bit(text: str) -> None:
    """The hash always fits a Java int."""
    assert -(2**31) <= java_hash_code(text) < 2**31


def test_resolve_builtin_names() -> None:
    """The three names resolve to the built-in functions."""
    assert resolve_strategy("average") is average
    assert resolve_strategy("odevity") is odevity
    assert resolve_strategy("round_robin") is round_robin


def _reverse_strategy(instances: list[str], job_name: str, total: int) -> dict[str, list[int]]:
    return average(list(reversed(instances)), job_name, total)


NOT_CALLABLE = 42


@pytest.mark.parametrize(
    "path",
    [f"{__name__}:_reverse_strategy", f"{__name__}._reverse_strategy"],
)
def test_resolve_import_path(path: str) -> None:
    """A custom strategy is found by 'module:attr' or 'module.attr'."""
    assert resolve_strategy(path) is _reverse_strategy


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("fancy", "valid choices are average, odevity, round_robin"),
        ("no_such_module_xyz:thing", "cannot import module 'no_such_module_xyz'"),
        (f"{__name__}:missing_attr", "has no attribute 'missing_attr'"),
        (f"{__name__}:NOT_CALLABLE", "not callable"),
    ],
)
def test_resolve_errors_name_the_value(value: str, fragment: str) -> None:
    """An unusable strategy is refused with its value and what would be valid."""
    with pytest.raises(JobConfigError) as info:
        resolve_strategy(value)
    assert repr(value) in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ({A: [0, 1], B: [1]}, "item 1 twice"),
        ({A: [0], B: [1]}, "items [2] unassigned"),
        ({A: [0, 1, 2], "ghost": []}, "'ghost'"),
        ({A: [0, 1, 2, 3]}, "item 3"),
        ({A: [0, 1, -1, 2]}, "item -1"),
    ],
)
def test_check_assignment_rejects_bad_results(
    assignment: dict[str, list[int]], fragment: str
) -> None:
    """A custom strategy's result is refused when it is not a partition of the items."""
    with pytest.raises(ValueError, match=None) as info:
        check_assignment(assignment, [A, B], 3)
    assert fragment in str(info.value)


def test_check_assignment_fills_missing_instances() -> None:
    """Instances left out of a custom result get an empty list; items come back sorted."""
    assert check_assignment({A: [2, 0, 1]}, [A, B], 3) == {A: [0, 1, 2], B: []}
