"""Fault helpers for tests: real server-side session expiry, and polling with a deadline.

:func:`expire_session` ends a store's session *on the server*, the way a long GC pause
or a network partition would, rather than faking the event on the client side. It
goes through the stores' fault-hook protocol
(:class:`~shardkeeper.registry.faults.SessionFaults`):

* ZooKeeper: a second client connects with the same session id and password, then
  closes it; the server ends the session and deletes its ephemeral nodes, and the
  original client learns on its next contact that its session has expired.
* etcd: the store's lease is revoked; every key attached to it is deleted and the
  store's session thread finds the lease gone.
* memory: the in-process server ends the session at once.

:func:`wait_until` is the standard way tests wait for a condition: poll with a
deadline and fail with a message that says what was awaited; never sleep as
synchronisation.

Network faults live next door: :mod:`shardkeeper.testing.netns` (an instance cut off
from the store, a store member cut off from its peers, with real Linux network
namespaces) and :mod:`shardkeeper.testing.proxy` (a slow link: delay and stalls
switched on and off). Process faults need no helper: ``SIGKILL``, ``SIGSTOP`` and
``SIGCONT`` on the instance's process, and ``kill``/``pause``/``restart`` of a store
member on :class:`~shardkeeper.testing.servers.ZooKeeperCluster` and
:class:`~shardkeeper.testing.servers.EtcdCluster`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.faults import SessionFaults
from shardkeeper.registry.url import RegistrySettings

__all__ = ["expire_session", "wait_until"]

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | Literal[False] | None],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value.

    Returns that value, typed without ``None`` and ``False`` (a truthy value is
    neither): ``wait_until(lambda: store.get(path))`` is a ``Node``, and
    ``wait_until(lambda: len(runs) >= 2 and runs)`` a list. On the deadline raises
    ``AssertionError`` with ``message`` (a string, or a callable evaluated then, to
    show the state at the time) and the timeout. Exceptions from ``predicate``
    propagate: a check that crashes is a bug, not a "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"{text} (waited {timeout:g} s)")
        time.sleep(interval)


def _session_id(store: CoordinationStore) -> str | None:
    try:
        return store.session_id
    except Exception:  # a store between sessions may refuse to answer: "no session"
        return None


def expire_session(
    store: CoordinationStore,
    *,
    url: str | RegistrySettings | None = None,
    wait: bool = True,
    timeout: float = 15.0,
) -> str:
    """Expire ``store``'s current session on the server; return the expired session id.

    Works on every store that implements
    :class:`~shardkeeper.registry.faults.SessionFaults` (both real backends and the
    in-memory store): the store ends its own session on the server side. With ``wait``
    (default) returns only once the store has a *new* session (so it has been through
    LOST and CONNECTED), within ``timeout``.

    ``url`` is accepted for the callers written before the protocol existed and is not
    needed: a store knows its server and credentials.
    """
    del url  # the store knows where its server is
    if not isinstance(store, SessionFaults):
        raise TypeError(
            f"{type(store).__name__} does not implement SessionFaults (expire_session, "
            "drop_connection): cannot expire its session"
        )
    old = _session_id(store)
    store.expire_session(timeout)
    if wait:
        wait_until(
            lambda: (sid := _session_id(store)) is not None and sid != old,
            timeout,
            message=lambda: (
                f"store did not get a new session after expiring {old} "
                f"(state {store.state}, session {_session_id(store)})"
            ),
        )
    return old or ""
