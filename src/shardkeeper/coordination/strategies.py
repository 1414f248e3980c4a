"""Sharding strategies: pure functions from (instances, job name, total) to an assignment.

A strategy receives the live, enabled instance ids in a deterministic order (the caller
sorts them by id), the job name and the sharding total count, and returns the items
each instance owns. Every instance in the list is a key of the result, even one that
owns no item, so a caller can tell "owns nothing" from "unknown".

The three built-in strategies reproduce ElasticJob's arithmetic exactly, so a job
moved from ElasticJob to shardkeeper with the same instance list keeps its assignment:

``average`` (the default)
    Instance ``k`` of ``n`` gets the ``total // n`` consecutive items starting at
    ``k * (total // n)``; the ``total % n`` items left at the tail go one each to the
    first instances (item ``total // n * n + k`` to instance ``k``).
``odevity``
    The instance list is reversed when the Java ``String.hashCode()`` of the job
    name is even, then ``average`` is applied. Jobs with even and odd hashes thus
    load opposite ends of the list.
``round_robin``
    The list is rotated left by ``abs(hashCode(job)) % n``, then ``average`` is
    applied, which spreads the "first instances get the remainder" bias over jobs.

Users can plug in their own strategy by import path (``package.module:function``);
it must follow :class:`ShardingStrategy`, and :func:`check_assignment` tells whether
what it returned is usable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from shardkeeper._imports import import_object, is_import_path
from shardkeeper.errors import JobConfigError

__all__ = [
    "BUILTIN_STRATEGIES",
    "ShardingStrategy",
    "average",
    "check_assignment",
    "java_hash_code",
    "odevity",
    "resolve_strategy",
    "round_robin",
]


class ShardingStrategy(Protocol):
    """A pure function assigning the items ``0..total-1`` to instances.

    It must be deterministic (every instance computes or reads the same result), give
    every item to exactly one of ``instances``, and return every instance as a key.
    With no instances it returns an empty mapping.
    """

    def __call__(
        self, instances: Sequence[str], job_name: str, total: int
    ) -> dict[str, list[int]]: ...


def java_hash_code(s: str) -> int:
    """Java's ``String.hashCode()`` of ``s``: signed 32-bit, over UTF-16 code units.

    Characters outside the Basic Multilingual Plane count as two units (a surrogate
    pair), as they do in Java, so results match the JVM for every string.
    """
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def average(instances: Sequence[str], job_name: str, total: int) -> dict[str, list[int]]:
    """ElasticJob's average allocation (the default); ``job_name`` is not used."""
    n = len(instances)
    if n == 0:
        return {}
    per = total // n
    result: dict[str, list[int]] = {}
    for k, instance in enumerate(instances):
        result[instance] = list(range(k * per, (k + 1) * per))
    # The remainder lies at the tail and goes one item each to the first instances.
    for k in range(total % n):
        result[instances[k]].append(per * n + k)
    return result


def odevity(instances: Sequence[str], job_name: str, total: int) -> dict[str, list[int]]:
    """Average over the list reversed when the job name's Java hash code is even."""
    if java_hash_code(job_name) % 2 == 0:
        return average(list(reversed(instances)), job_name, total)
    return average(instances, job_name, total)


def round_robin(instances: Sequence[str], job_name: str, total: int) -> dict[str, list[int]]:
    """Average over the list rotated left by ``abs(hashCode(job_name)) % n``.

    ElasticJob takes Java's ``Math.abs``, which is negative (and then fails) for the
    one hash value ``-2**31``; here the mathematical absolute value is used, which is
    the same for every other hash.
    """
    n = len(instances)
    if n == 0:
        return {}
    offset = abs(java_hash_code(job_name)) % n
    rotated = [*instances[offset:], *instances[:offset]]
    return average(rotated, job_name, total)


BUILTIN_STRATEGIES: Mapping[str, ShardingStrategy] = {
    "average": average,
    "odevity": odevity,
    "round_robin": round_robin,
}
"""The strategies selectable by name in ``JobConfig.sharding_strategy``."""


def resolve_strategy(name: str) -> ShardingStrategy:
    """The strategy named ``name``: a built-in name or an import path to a callable.

    Raises :class:`~shardkeeper.errors.JobConfigError` naming the value and the valid
    choices when it is neither, cannot be imported, or is not callable.
    """
    builtin = BUILTIN_STRATEGIES.get(name)
    if builtin is not None:
        return builtin
    choices = ", ".join(BUILTIN_STRATEGIES)
    if not is_import_path(name):
        raise JobConfigError(
            f"unknown sharding strategy {name!r}; valid choices are {choices}, "
            "or an import path 'package.module:function'"
        )
    obj = import_object(name, "sharding strategy")
    if not callable(obj):
        raise JobConfigError(
            f"sharding strategy {name!r} resolves to a {type(obj).__name__}, which is not "
            f"callable; give a function (instances, job_name, total) -> dict[str, list[int]]"
        )
    # A user object that is callable is taken on trust here; check_assignment()
    # verifies what it returns each time it is used.
    strategy: ShardingStrategy = obj  # type: ignore[assignment]
    return strategy


def check_assignment(
    assignment: Mapping[str, Sequence[int]], instances: Sequence[str], total: int
) -> dict[str, list[int]]:
    """Validate a strategy's result and return it normalised (every instance, sorted items).

    Raises :class:`ValueError` naming the problem when an item is outside
    ``0..total-1``, assigned twice or not at all, or given to an unknown instance.
    Instances missing from the result get an empty list.
    """
    known = set(instances)
    owner: dict[int, str] = {}
    result: dict[str, list[int]] = {instance: [] for instance in instances}
    for instance, items in assignment.items():
        if instance not in known:
            raise ValueError(
                f"strategy assigned items to {instance!r}, which is not one of the "
                f"instances {list(instances)!r}"
            )
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < total:
                raise ValueError(
                    f"strategy assigned item {item!r} to {instance!r}; items are 0..{total - 1}"
                )
            if item in owner:
                raise ValueError(
                    f"strategy assigned item {item} twice: to {owner[item]!r} and {instance!r}"
                )
            owner[item] = instance
            result[instance].append(item)
    if instances:
        missing = sorted(set(range(total)) - owner.keys())
        if missing:
            raise ValueError(f"strategy left items {missing!r} unassigned")
    for items in result.values():
        items.sort()
    return result
