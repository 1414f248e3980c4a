"""Every use of a private part of the ``etcd3`` client library (cslab-etcd3), in one place.

Only ``transport.py`` imports this module, and nothing else of the backend touches the
client: the transport calls only the functions of this module for these, and uses
nothing else of the client but its documented API (``MultiEndpointEtcd3Client``,
``Endpoint``, ``endpoints``, ``endpoint_in_use``, ``channel``, ``Endpoint.fail`` /
``is_failed`` / ``netloc``, ``close``, the generated ``etcdrpc`` stubs (the messages
are built by ``messages.py``), ``Watcher.add_callback`` / ``cancel`` / ``close``, the
exceptions and event types).

Each item below was checked against cslab-etcd3 0.12.1 (the version pinned by
``constraints.txt``); a new version of the client must be checked against this list:

* :func:`use_endpoint` sets ``client._current_endpoint_label``: the client only
  fails over when the endpoint in use is marked failed, then to the first unmarked one
  in its dict order. The store chooses the next member in URL order itself (see
  ``transport.py``), and this setter is the only way to tell the client which one. The
  setter also drops the client's cached stubs (the store builds its own).
* :func:`forget_failure` resets ``Endpoint.last_failed`` (a public attribute, but
  written by nobody outside the client): when every member was marked failed, the
  store takes the one that failed longest ago, which must then count as usable.
* :func:`set_token` / :func:`token_metadata` write and read ``client.metadata``: the
  client would attach the auth token as gRPC call credentials, which gRPC refuses on
  a plaintext channel, so the store authenticates itself and sends the token as
  metadata (the client's own requests then carry it too).
* :func:`replace_channel` calls ``Endpoint._mkchannel`` and replaces
  ``Endpoint.channel``: the ``drop_connection`` fault hook closes the channel in use
  and needs a new one with the same options in its place.
* :func:`open_watcher` builds an ``etcd3.watch.Watcher`` on a stub of our own
  (:class:`WatchStub`) instead of asking the client for one: the client's watcher
  sends neither our metadata (require a leader, the token) nor lets us end its
  stream, and it is cached across endpoint changes. ``Watcher`` calls
  ``stub.Watch(requests, timeout, credentials=..., metadata=...)``, which is what
  :class:`WatchStub` provides.
* :func:`stream_thread` reads ``Watcher._callback_thread``: a closed store waits for
  the watcher's stream thread to end, so that it leaves no thread behind.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import etcd3.etcdrpc as rpc
import etcd3.watch

__all__ = [
    "WatchStub",
    "forget_failure",
    "open_watcher",
    "replace_channel",
    "set_token",
    "stream_thread",
    "token_metadata",
    "use_endpoint",
]


def use_endpoint(client: Any, endpoint: Any) -> None:
    """Make ``endpoint`` the one ``client`` sends requests to."""
    client._current_endpoint_label = endpoint.netloc


def forget_failure(endpoint: Any) -> None:
    """Let ``endpoint`` count as not failed (it is being chosen although it failed)."""
    endpoint.last_failed = 0


def set_token(client: Any, metadata: tuple[tuple[str, str], ...] | None) -> None:
    """Make ``metadata`` (the auth token, or None) the metadata of ``client``'s requests."""
    client.metadata = metadata


def token_metadata(client: Any) -> tuple[tuple[str, str], ...] | None:
    """The auth-token metadata set by :func:`set_token` (None without a token)."""
    metadata: tuple[tuple[str, str], ...] | None = client.metadata
    return metadata


def replace_channel(endpoint: Any, options: list[tuple[str, int]]) -> Any:
    """Put a new gRPC channel (with ``options``) in ``endpoint``; return the old one."""
    old = endpoint.channel
    endpoint.channel = endpoint._mkchannel(options)
    return old


class WatchStub:
    """The watch stub of one channel, keeping the stream call so that a watcher
    replaced by another can end its stream (the server keeps a stream whose client
    only stopped sending, and its thread would live on)."""

    def __init__(self, channel: Any) -> None:
        self._stub = rpc.WatchStub(channel)
        self.call: Any = None

    def Watch(self, *args: Any, **kwargs: Any) -> Any:  # the gRPC method name
        self.call = self._stub.Watch(*args, **kwargs)
        return self.call

    def cancel(self) -> None:
        """End the stream (its thread gets CANCELLED and stops)."""
        call = self.call
        if call is not None:
            with contextlib.suppress(Exception):
                call.cancel()


def open_watcher(
    channel: Any, timeout: float, metadata: tuple[tuple[str, str], ...]
) -> tuple[Any, WatchStub]:
    """A new ``Watcher`` on ``channel`` whose requests carry ``metadata``, and its stub."""
    stub = WatchStub(channel)
    return etcd3.watch.Watcher(stub, timeout=timeout, metadata=metadata), stub


def stream_thread(watcher: Any) -> threading.Thread | None:
    """The thread that reads ``watcher``'s stream, if it has one."""
    thread = getattr(watcher, "_callback_thread", None)
    return thread if isinstance(thread, threading.Thread) else None
