"""The runtime's view of its store: every call passes through, commits are watched.

:class:`CommitWatch` wraps the runtime's :class:`CoordinationStore` for the parts that
coordinate jobs (the runners and the registrar). It adds two things and nothing else:

* the outcome of every :meth:`commit` and :meth:`commit_groups`, and of every read,
  is told to the runtime's :class:`~shardkeeper.runtime.health.commithealth.CommitHealth`
  (answered, or failed with a store error while the store reported itself
  connected: a failure while disconnected is the session machinery's business, not
  a gray link's);
* while the health record holds writes (the session was given up for unanswered
  commits), every write (commit, commit_groups, put, create, delete) is refused with
  :class:`~shardkeeper.errors.StoreUnavailableError` before it is sent. That keeps a
  re-registration on the store's next session from slipping in before a probe commit
  was answered: the new session itself is fine, the link is not.

Watches and listeners go to the store unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shardkeeper.errors import StoreError, StoreLimitError, StoreUnavailableError
from shardkeeper.registry import batching
from shardkeeper.registry.base import (
    CommitResult,
    ConnectionState,
    CoordinationStore,
    GroupsResult,
    Node,
    Op,
    PathFilter,
    StateListener,
    Subscription,
    WatchListener,
)
from shardkeeper.runtime.health.commithealth import CommitHealth

__all__ = ["CommitWatch"]

_T = TypeVar("_T")

_LIVE = (ConnectionState.CONNECTED, ConnectionState.RECONNECTED)


class CommitWatch(CoordinationStore):
    """``store`` with its commits reported to ``health`` and its writes held while
    ``health`` says so (module docstring). Anything not in the contract (a backend's
    own attributes, the fault hooks) is looked up on ``store``."""

    def __init__(self, store: CoordinationStore, health: CommitHealth) -> None:
        self._inner = store
        self._health = health
        self.namespace = store.namespace

    @property
    def inner(self) -> CoordinationStore:
        """The store every call goes to."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        # only reached for names this class does not define: a backend's extras
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"CommitWatch({self._inner!r}, {self._health!r})"

    # -- the watched and gated calls ---------------------------------------------------

    def _gate(self, what: str) -> None:
        if not self._health.writes_allowed:
            raise StoreUnavailableError(
                f"{what}: held back: this instance gave up its session because its "
                "commits were not answered; it writes again once a probe commit is"
            )

    def _watched(self, what: str, call: Callable[[], _T], kind: str = "commit") -> _T:
        # every reply is an answer: a refusal proves the link carries commits too
        if kind == "commit":
            self._gate(what)
        health = self._health
        live = self._inner.state in _LIVE
        if not live:
            # the connection is down: SUSPENDED/LOST already stop the runtime acting,
            # and the session machinery, not this record, decides what follows
            return call()
        sent = health.sending(kind)
        try:
            result = call()
        except StoreLimitError:
            health.withdrawn(sent)  # refused before it was sent: no news of the link
            raise
        except StoreError:
            health.failed(sent)
            raise
        except BaseException:
            health.withdrawn(sent)  # not a store outcome (a bug, an interrupt)
            raise
        health.answered(sent)
        return result

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """The store's commit, its outcome reported (module docstring)."""
        return self._watched("commit", lambda: self._inner.commit(ops))

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """The store's commit_groups, its outcome reported (module docstring)."""
        return self._watched("commit", lambda: batching.commit_groups(self._inner, fixed, groups))

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """The store's put (held while writes are held)."""
        self._gate(f"put {path}")
        return self._inner.put(path, value, ephemeral=ephemeral)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """The store's create (held while writes are held)."""
        self._gate(f"create {path}")
        return self._inner.create(path, value, ephemeral=ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """The store's delete (held while writes are held)."""
        self._gate(f"delete {path}")
        self._inner.delete(path, recursive=recursive)

    # -- passed through ------------------------------------------------------------------

    def start(self) -> None:
        """Start the store."""
        self._inner.start()

    def close(self) -> None:
        """Close the store."""
        self._inner.close()

    def relinquish_session(self) -> None:
        """The store's :meth:`CoordinationStore.relinquish_session`."""
        self._inner.relinquish_session()

    @property
    def session_id(self) -> str:
        """The store's session id."""
        return self._inner.session_id

    @property
    def state(self) -> ConnectionState:
        """The store's connection state."""
        return self._inner.state

    @property
    def session_timeout(self) -> float:
        """The store's session timeout."""
        return self._inner.session_timeout

    @property
    def max_ops_per_commit(self) -> int:
        """The store's limit (registry/batching.py: its default for a store without one)."""
        return batching.max_ops_per_commit(self._inner)

    @property
    def max_commit_bytes(self) -> int | None:
        """The store's limit."""
        return batching.max_commit_bytes(self._inner)

    @property
    def max_groups_per_commit(self) -> int | None:
        """The store's limit."""
        return batching.max_groups_per_commit(self._inner)

    def group_bytes(self, group: Sequence[Op]) -> int:
        """As the store counts it."""
        return batching.group_bytes(self._inner, group)

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """As the store counts it."""
        return batching.commit_bytes(self._inner, ops)

    def get(self, path: str) -> Node | None:
        """The store's get, its outcome reported (a read)."""
        return self._watched("get", lambda: self._inner.get(path), "read")

    def exists(self, path: str) -> bool:
        """The store's exists, its outcome reported (a read)."""
        return self._watched("exists", lambda: self._inner.exists(path), "read")

    def children(self, path: str) -> list[str]:
        """The store's children, its outcome reported (a read)."""
        return self._watched("children", lambda: self._inner.children(path), "read")

    def get_tree(self, path: str) -> dict[str, Node]:
        """The store's get_tree, its outcome reported (a read)."""
        return self._watched("get_tree", lambda: self._inner.get_tree(path), "read")

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """The store's watch."""
        return self._inner.watch(prefix, listener, exclude=exclude)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """The store's state listener."""
        return self._inner.add_state_listener(listener)
