"""Fault helpers for tests: real server-side session expiry, and polling with a deadline.

:func:`expire_session` ends a store's session *on the server*, the way a long GC pause
or a network partition would, rather than faking the event on the client side:

* ZooKeeper: a second client connects with the same session id and password, then
  closes it; the server ends the session and deletes its ephemeral nodes, and the
  original client learns on its next contact that its session has expired.
* etcd: the store's lease is revoked through a separate client; every key attached to
  it is deleted and the store's next keep-alive finds the lease gone.

:func:`wait_until` is the standard way tests wait for a condition: poll with a
deadline and fail with a message that says what was awaited; never sleep as
synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.url import RegistrySettings

__all__ = ["expire_session", "wait_until"]

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value.

    Returns that value. On the deadline raises ``AssertionError`` with ``message``
    (a string, or a callable evaluated then, to show the state at the time) and the
    timeout. Exceptions from ``predicate`` propagate: a check that crashes is a bug,
    not a "not yet".
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


def _settings_of(
    store: CoordinationStore, url: str | RegistrySettings | None
) -> RegistrySettings | None:
    if isinstance(url, RegistrySettings):
        return url
    if url is not None:
        return RegistrySettings.from_url(url)
    for name in ("settings", "_settings"):
        settings = getattr(store, name, None)
        if isinstance(settings, RegistrySettings):
            return settings
    return None


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

    ``url`` (or settings) says where the server is and which credentials to use; by
    default it is taken from ``store.settings`` (and for ZooKeeper, failing that, from
    the store's kazoo client). With ``wait`` (default) returns only once the store has
    a *new* session (so it has been through LOST and CONNECTED), within ``timeout``.

    Works on the backends' test hooks: ``store.kazoo_client`` (ZooKeeper) and
    ``store.lease_id`` (etcd).
    """
    old = _session_id(store)
    settings = _settings_of(store, url)
    kazoo_client: Any = getattr(store, "kazoo_client", None)
    if kazoo_client is not None:
        _expire_zookeeper(kazoo_client, settings, timeout)
    elif hasattr(store, "lease_id"):
        if settings is None:
            raise ValueError(
                "expire_session on etcd needs the server address: pass url= or give the "
                "store a .settings attribute"
            )
        _revoke_etcd_lease(int(store.lease_id), settings, timeout)
    else:
        raise TypeError(
            f"{type(store).__name__} exposes neither kazoo_client (ZooKeeper) nor lease_id "
            "(etcd): cannot expire its session"
        )
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


def _expire_zookeeper(client: Any, settings: RegistrySettings | None, timeout: float) -> None:
    from kazoo.client import KazooClient

    client_id = client.client_id
    if client_id is None:
        raise RuntimeError("the store's kazoo client has no session to expire")
    if settings is not None:
        hosts = settings.hosts_string
    else:
        hosts = ",".join(f"{h}:{p}" for h, p in client.hosts)
    # Same session id and password: the server hands the session over to this
    # connection, and closing it ends the session for everybody.
    twin = KazooClient(hosts=hosts, client_id=client_id, timeout=timeout)
    try:
        twin.start(timeout=timeout)
        twin.stop()
    finally:
        twin.close()


def _revoke_etcd_lease(lease_id: int, settings: RegistrySettings, timeout: float) -> None:
    import etcd3
    from etcd3 import etcdrpc

    endpoints = [
        etcd3.Endpoint(host, port, secure=False, time_retry=0.5) for host, port in settings.hosts
    ]
    # No user/password to the client: it would attach the token as gRPC call
    # credentials, which grpc refuses on a plaintext channel. Send it as metadata.
    client = etcd3.MultiEndpointEtcd3Client(endpoints=endpoints, timeout=timeout, failover=True)
    try:
        metadata = None
        if settings.username is not None:
            auth = client.authstub.Authenticate(
                etcdrpc.AuthenticateRequest(name=settings.username, password=settings.password),
                timeout,
            )
            metadata = (("token", auth.token),)
        client.leasestub.LeaseRevoke(
            etcdrpc.LeaseRevokeRequest(ID=lease_id), timeout, metadata=metadata
        )
    finally:
        client.close()
