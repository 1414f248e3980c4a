"""Error mapping: how gRPC and etcd3 failures become shardkeeper errors, and which of
them mean "this member cannot serve now" (the store then moves on to another member).

Errors and costs
----------------
Every request carries ``operation_timeout``. gRPC errors are translated in one place
(:func:`translated`, the store's ``_translated``): DEADLINE_EXCEEDED and etcd's own "request timed
out" -> OperationTimeoutError (outcome unknown); UNAVAILABLE -> StoreUnavailableError
(a write that failed so may have been applied too: re-read, never re-send blindly);
UNAUTHENTICATED, PERMISSION_DENIED and refused credentials -> StoreAuthError; too many
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import etcd3.exceptions
import grpc

from shardkeeper.errors import (
    OperationTimeoutError,
    SessionLostError,
    ShardkeeperError,
    StoreAuthError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry.url import RegistrySettings

__all__ = [
    "CANNOT_SERVE",
    "cannot_serve",
    "during_election",
    "error_for",
    "is_stale_token",
    "translated",
]


def is_stale_token(exc: grpc.RpcError) -> bool:
    # The server forgets simple auth tokens on restart and after their TTL; the
    # request was refused before being applied, so re-authenticating and sending it
    # again is safe.
    details = (exc.details() or "").lower()
    return (exc.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in details) or (
        exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "auth store is old" in details
    )


#: gRPC codes that mean "the member that got this request cannot serve it now": no
#: answer within the deadline, unreachable, no leader, leader changed, "request timed
#: out", or the channel closed under the request. The next request goes to another.
CANNOT_SERVE = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
    }
)


def cannot_serve(exc: grpc.RpcError) -> bool:
    """Whether ``exc`` says its member cannot serve now (see ``CANNOT_SERVE``)."""
    return exc.code() in CANNOT_SERVE


def during_election(exc: BaseException) -> bool:
    """Whether ``exc`` (a gRPC error, or one translated from it) is a live member
    refusing a request because it has no leader ("no leader": cut off from its peers,
    or its cluster elects one; "leader changed"): the request was not served."""
    cause = exc if isinstance(exc, grpc.RpcError) else exc.__cause__
    if not isinstance(cause, grpc.RpcError) or cause.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (cause.details() or "").lower()
    return "leader changed" in details or "no leader" in details


@contextlib.contextmanager
def translated(what: str, settings: RegistrySettings, lease: Callable[[], int]) -> Iterator[None]:
    """THE boundary: turn grpc/etcd3 exceptions into shardkeeper errors.

    ``lease`` gives the session lease id at the time of the error (for the message of
    a lost lease)."""
    try:
        yield
    except ShardkeeperError:
        raise
    except grpc.RpcError as exc:
        raise error_for(exc, what, settings, lease()) from exc
    except etcd3.exceptions.NoServerAvailableError as exc:
        raise StoreUnavailableError(
            f"{what}: no etcd endpoint of {settings.hosts_string} is reachable"
        ) from exc
    except etcd3.exceptions.WatchTimedOut as exc:
        raise OperationTimeoutError(
            f"{what}: etcd at {settings.hosts_string} did not confirm the watch "
            f"within {settings.operation_timeout:g} s"
        ) from exc
    except etcd3.exceptions.Etcd3Exception as exc:
        raise StoreError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        # grpc's error for a request on a channel this client closed (a thread of
        # ours still at work while the runtime stops): a store that no longer answers
        if "closed channel" not in str(exc):
            raise
        raise StoreUnavailableError(f"{what}: the etcd client is closed") from exc


def error_for(exc: grpc.RpcError, what: str, settings: RegistrySettings, lease: int) -> StoreError:
    """The shardkeeper error for a gRPC error of request ``what``."""
    code = exc.code()
    details = exc.details() or str(code)
    low = details.lower()
    hosts = settings.hosts_string
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
        code == grpc.StatusCode.UNAVAILABLE and "timed out" in low
    ):
        return OperationTimeoutError(
            f"{what}: no answer from etcd at {hosts} within "
            f"{settings.operation_timeout:g} s ({details}); the outcome is unknown"
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return StoreUnavailableError(f"{what}: etcd at {hosts} is unavailable: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
        code == grpc.StatusCode.INVALID_ARGUMENT
        and ("authentication failed" in low or "user name is empty" in low)
    ):
        user = settings.username
        who = f"user {user!r}" if user else "no credentials (give user:password in the URL)"
        return StoreAuthError(f"{what}: etcd at {hosts} refused {who}: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT and (
        "too many operations" in low or "too large" in low
    ):
        return StoreLimitError(f"{what}: refused by etcd: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return StoreLimitError(f"{what}: refused by etcd: {details}")
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in low:
        return SessionLostError(
            f"{what}: the session lease {lease:x} has expired; wait for CONNECTED and retry"
        )
    return StoreError(f"{what}: etcd error {code.name}: {details}")
