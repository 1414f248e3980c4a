"""The step hooks of the in-memory store: pauses, injected failures, held events.

Step hooks
----------
* :meth:`MemoryServer.pause`: block the next matching call before or after it is
  applied, until :meth:`Pause.release` (or the pause's time limit, or close/shutdown).
* :meth:`MemoryStore.fail_next`: the next matching call(s) raise a StoreError, before
  or after being applied (a lost reply: unknown outcome).
* :meth:`MemoryStore.suspend` / :meth:`MemoryStore.resume`: a connection drop and its
  end; :meth:`MemoryStore.expire`: the session expires now;
  :meth:`MemoryStore.stop_refreshing`: the session is no longer renewed while calls
  are still answered (etcd's keep-alives failing), and ends unseen one timeout later.
* :meth:`MemoryServer.drop_events` / :meth:`MemoryServer.delay_events`: lose or hold
  watch events under a prefix.

Hooks match calls by operation name (``get``, ``exists``, ``children``, ``get_tree``,
``put``, ``create``, ``delete``, ``commit``) and by path *prefix*, segment-wise:
``/jobs/a`` matches ``/jobs/a`` and ``/jobs/a/x``, never ``/jobs/ab`` (for a commit,
any of its operations' paths). Every public call of a store counts as one round trip.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry.base import check_path
from shardkeeper.registry.memory.tree import _under

if TYPE_CHECKING:
    from shardkeeper.registry.memory.server import MemoryServer, _EventItem
    from shardkeeper.registry.memory.store import MemoryStore

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.memory")

#: the store calls the hooks can match
OPERATIONS = ("get", "exists", "children", "get_tree", "put", "create", "delete", "commit")
#: how long a pause blocks at most unless told otherwise (a forgotten release
#: must not hang a test)
_PAUSE_LIMIT = 30.0

When = Literal["before", "after"]
ErrorSpec = type[StoreError] | StoreError


def _check_op(op: str) -> str:
    if op not in OPERATIONS:
        raise ConfigError(f"unknown store operation {op!r}; valid ones are {', '.join(OPERATIONS)}")
    return op


def _check_when(when: str) -> When:
    if when not in ("before", "after"):
        raise ConfigError(f"when={when!r} is not valid; use 'before' or 'after'")
    return "before" if when == "before" else "after"


def _check_prefix(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        return check_path(path)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


class Pause:
    """A handle on one armed pause (:meth:`MemoryServer.pause`).

    The first call that matches blocks in it (``reached`` turns true) until
    :meth:`release`, until the pause's ``limit`` has passed (it then releases itself
    and logs a warning, so a forgotten release cannot hang a test), or until the
    store or server closes. A pause released before it was reached is disarmed. Also
    a context manager that releases on exit.
    """

    def __init__(
        self,
        server: MemoryServer,
        op: str,
        when: When,
        path: str | None,
        store: MemoryStore | None,
        thread: str | None,
        limit: float,
    ) -> None:
        self.op = op
        self.when: When = when
        self.path = path
        self.store = store
        self.thread = thread
        self.limit = limit
        #: the name of the thread whose call reached the pause (None before)
        self.reached_by: str | None = None
        self._server = server
        self._caller: MemoryStore | None = None
        self._reached = threading.Event()
        self._released = threading.Event()

    def __repr__(self) -> str:
        state = "released" if self.released else "reached" if self.reached else "armed"
        return f"Pause({self.op!r}, when={self.when!r}, path={self.path!r}, {state})"

    @property
    def reached(self) -> bool:
        """Whether a call has reached the pause (it may have been released since)."""
        return self._reached.is_set()

    @property
    def released(self) -> bool:
        """Whether the pause was released (or disarmed)."""
        return self._released.is_set()

    def wait_reached(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a call to reach the pause; True if one has."""
        return self._reached.wait(timeout)

    def release(self) -> None:
        """Let the blocked call go on (or disarm the pause if none reached it yet)."""
        self._released.set()
        self._server._disarm(self)

    def __enter__(self) -> Pause:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _matches(self, store: MemoryStore, op: str, paths: Sequence[str], thread: str) -> bool:
        if self.op != op or self.released:
            return False
        if self.store is not None and self.store is not store:
            return False
        if self.thread is not None and not thread.startswith(self.thread):
            return False
        return self.path is None or any(_under(p, self.path) for p in paths)

    def _block(self, caller: MemoryStore) -> None:
        self._caller = caller
        self.reached_by = threading.current_thread().name
        self._reached.set()
        if not self._released.wait(self.limit):
            _log.warning("%r was never released: it released itself after %g s", self, self.limit)
            self._released.set()


class EventHold:
    """A handle on held watch events (:meth:`MemoryServer.delay_events`).

    Events under the prefix are kept, in their order, until :meth:`release`, which
    hands them to the stores and stops holding. Also a context manager.
    """

    def __init__(self, server: MemoryServer, prefix: str, namespace: str | None) -> None:
        self.prefix = prefix
        self.namespace = namespace
        self._server = server
        self._events: list[tuple[str, _EventItem]] = []
        self._changed = threading.Condition(server._lock)
        self.released = False

    @property
    def held(self) -> int:
        """How many events are held now."""
        with self._server._lock:
            return len(self._events)

    def wait_held(self, count: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until at least ``count`` events are held."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._events) >= count, timeout)

    def release(self) -> None:
        """Deliver the held events (in their order) and stop holding; idempotent."""
        self._server._release_hold(self)

    def __enter__(self) -> EventHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _takes(self, namespace: str, path: str) -> bool:
        return (self.namespace is None or self.namespace == namespace) and _under(path, self.prefix)


@dataclass
class _Drop:
    prefix: str
    namespace: str | None
    remaining: int


@dataclass
class _Failure:
    op: str
    error: ErrorSpec
    applied: bool
    path: str | None
    remaining: int

    def matches(self, op: str, paths: Sequence[str]) -> bool:
        return (
            self.op == op
            and self.remaining > 0
            and (self.path is None or any(_under(p, self.path) for p in paths))
        )

    def raise_it(self, op: str, paths: Sequence[str]) -> None:
        if isinstance(self.error, StoreError):
            raise self.error
        where = f" {paths[0]}" if len(paths) == 1 else f" of {len(paths)} operations"
        outcome = "applied, reply lost" if self.applied else "not applied"
        raise self.error(f"{op}{where}: injected failure ({outcome})")
