"""The rule between a job's fire deadline and its registry's request timeout.

A fire is decided within ``sharding_wait_timeout`` of its start (the trigger's
deadline). Its start commit is one request, bounded by the registry's
``operation_timeout``; one that times out has an unknown outcome, and only a second
attempt inside the deadline can adopt marks the store applied late (otherwise the
fire is skipped at once, and with failover off such marks are deleted as strays:
review 2026-12, finding 11). So the deadline must hold two requests: the attempt that
timed out and its retry.

The registry's own rule (``operation_timeout`` at most ``session_timeout``) is checked
where the URL is parsed (:func:`shardkeeper.registry.url.timeout_problem`); this one
needs both a job config and the registry, so the runtime checks it as a job is added.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from shardkeeper.errors import JobConfigError

__all__ = ["START_ATTEMPTS", "BoundsRequests", "check_fire_deadline", "request_bound"]

START_ATTEMPTS = 2
"""Requests of ``operation_timeout`` each that ``sharding_wait_timeout`` must hold: a
start commit that timed out, and the retry that adopts or decides its items."""


@runtime_checkable
class BoundsRequests(Protocol):
    """A store whose every request waits at most ``operation_timeout`` seconds (the
    ZooKeeper and etcd stores: the registry URL's option of that name)."""

    @property
    def operation_timeout(self) -> float:
        """The longest one request waits, in seconds."""
        ...


def request_bound(store: object) -> float | None:
    """``store.operation_timeout``, or None for a store without one (the in-process
    MemoryStore sends no request anywhere). A store wrapper that forwards a backend's
    attributes (the runtime's commit watch) answers for its backend.

    Read with ``getattr``, not ``isinstance(store, BoundsRequests)``: from Python 3.12
    a runtime-checkable protocol looks attributes up statically, so a wrapper that
    forwards them through ``__getattr__`` no longer matched, and the fire-deadline
    check was skipped for every real store on 3.12 and 3.13."""
    bound = getattr(store, "operation_timeout", None)
    if isinstance(bound, bool) or not isinstance(bound, int | float):
        return None
    return float(bound)


def check_fire_deadline(
    job: str, sharding_wait_timeout: float, operation_timeout: float | None
) -> None:
    """JobConfigError unless ``sharding_wait_timeout`` holds :data:`START_ATTEMPTS`
    requests of ``operation_timeout`` (None: a store whose requests never wait on a
    server, such as the in-process memory store, where any deadline holds them)."""
    if operation_timeout is None:
        return
    need = START_ATTEMPTS * operation_timeout
    if sharding_wait_timeout >= need:
        return
    raise JobConfigError(
        f"job {job!r}: sharding_wait_timeout={sharding_wait_timeout:g} leaves no room to "
        f"retry a start commit that timed out after the registry's operation_timeout="
        f"{operation_timeout:g}; give sharding_wait_timeout >= {need:g} "
        f"({START_ATTEMPTS} x operation_timeout), or a registry URL with "
        f"operation_timeout <= {sharding_wait_timeout / START_ATTEMPTS:g}"
    )
