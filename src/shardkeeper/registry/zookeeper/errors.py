"""The one place that translates kazoo's exceptions into shardkeeper's.

Errors and timeouts
    Every request is sent asynchronously and awaited against a per-call deadline of
    ``operation_timeout``; kazoo exceptions are translated in :func:`translate` only.
    A read (``get``, ``exists``, ``children``, ``get_tree``) that fails with
    ConnectionLoss (in flight when its member died or froze) is sent once more within
    the same deadline: kazoo queues it until it has reconnected, to another member if
    need be. Writes are not re-sent: their outcome is unknown.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kazoo import exceptions as kz
from kazoo.handlers.threading import KazooTimeoutError

from shardkeeper.errors import (
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionLostError,
    StoreAuthError,
    StoreError,
    StoreUnavailableError,
)


@contextmanager
def translate(what: str, hosts: str, t: float) -> Iterator[None]:
    """Translate kazoo exceptions into shardkeeper's (the one place that does): ``what``
    names the request, ``hosts`` the ensemble, ``t`` the operation timeout in seconds."""
    try:
        yield
    except KazooTimeoutError:
        raise OperationTimeoutError(
            f"{what}: ZooKeeper at {hosts} did not answer within {t:g}s; the outcome is unknown"
        ) from None
    except (kz.ConnectionLoss, kz.ConnectionClosedError) as e:
        raise StoreUnavailableError(
            f"{what}: lost the connection to ZooKeeper at {hosts} ({type(e).__name__})"
        ) from None
    except (kz.SessionExpiredError, kz.SessionMovedError):
        raise SessionLostError(f"{what}: the ZooKeeper session expired") from None
    except (kz.NoAuthError, kz.AuthFailedError, kz.InvalidACLError) as e:
        raise StoreAuthError(
            f"{what}: ZooKeeper refused access ({type(e).__name__}): check the "
            "user name and password of the registry URL"
        ) from None
    except kz.NoNodeError:
        raise NoNodeError(what) from None
    except kz.NodeExistsError:
        raise NodeExistsError(what) from None
    except kz.NoChildrenForEphemeralsError:
        raise StoreError(f"{what}: an ephemeral node cannot have children") from None
    except kz.KazooException as e:
        raise StoreError(f"{what}: ZooKeeper error {type(e).__name__}: {e}") from e


def _first_error(results: list[Any]) -> tuple[int, Exception] | None:
    """The failing operation of a multi: ZooKeeper marks the ones before it rolled back
    and the ones after it inconsistent."""
    for i, r in enumerate(results):
        if isinstance(r, Exception) and not isinstance(
            r, kz.RolledBackError | kz.RuntimeInconsistency
        ):
            return i, r
    if any(isinstance(r, Exception) for r in results):
        return 0, kz.RolledBackError()
    return None
