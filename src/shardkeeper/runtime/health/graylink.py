"""The gray-link guard: give up the session when commits go unanswered, rejoin later.

Every ``cadence()`` seconds (T/3, on its own daemon thread) the guard asks the
runtime's :class:`~shardkeeper.runtime.health.commithealth.CommitHealth`:

* **healthy, but a commit unanswered for T** (``should_relinquish``): writes are held
  from now on (runtime/health/commitwatch.py), every execution is fenced (``is_valid()``
  turns false for good), and the store gives up its session
  (``CoordinationStore.relinquish_session``: ZooKeeper closes it, etcd revokes the
  lease and stops its keep-alive, the MemoryStore ends it). Its ephemeral nodes
  vanish: the membership nodes, so the leader may requeue this instance's marks and
  reshard without it, and the leader nodes, so a gray leader is no longer one (it
  could not resign: resigning is a commit). The store's next session comes at once;
  the held writes keep the registration from using it.
* **relinquished**: one probe commit, harmless: an ephemeral Put of
  ``/control/probe/{instance}`` on the store's new session. The first probe answered
  (applied or refused) makes the instance healthy again, and it rejoins through the
  path every new session takes (``rejoin``: the instance node re-put, every job's
  repair pass, which registers it again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from shardkeeper.coordination.paths import probe_path
from shardkeeper.errors import StoreError
from shardkeeper.registry.base import ConnectionState, CoordinationStore, Put
from shardkeeper.runtime.health.commithealth import CommitHealth, Health

__all__ = ["GrayLinkGuard"]

log = logging.getLogger(__name__)

_LIVE = (ConnectionState.CONNECTED, ConnectionState.RECONNECTED)


class GrayLinkGuard:
    """Watches one runtime's commit health (module docstring).

    ``store``: the runtime's own store (the probe is not held back with the other
    writes). ``active``: whether the runtime runs and is not stopping (a stop leaves
    anyway). ``fence``: fence every execution of every job. ``rejoin``: register again.
    """

    def __init__(
        self,
        store: CoordinationStore,
        health: CommitHealth,
        instance_id: str,
        *,
        cadence: Callable[[], float],
        stopped: threading.Event,
        active: Callable[[], bool],
        fence: Callable[[], None],
        rejoin: Callable[[], None],
    ) -> None:
        self._store = store
        self._health = health
        self._me = instance_id
        self._probe_path = probe_path(instance_id)
        self._cadence = cadence
        self._stopped = stopped
        self._active = active
        self._fence = fence
        self._rejoin = rejoin
        self._thread: threading.Thread | None = None
        #: monotonic time of the last relinquish and of the last rejoin (None: never)
        self.relinquished_at: float | None = None
        self.rejoined_at: float | None = None

    def start(self) -> None:
        """Start the thread (it ends when ``stopped`` is set)."""
        self._thread = threading.Thread(target=self._loop, name="sk-graylink", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.wait(self._cadence()):
            try:
                self.check()
            except Exception:  # a check must never end the loop
                log.exception("gray-link check failed")

    def check(self) -> str | None:
        """One check; returns what it did ("relinquished", "rejoined") or None."""
        if not self._active():
            return None
        if self._store.state not in _LIVE:
            # disconnected: the session machinery decides (the session may survive a
            # short drop; a long one ends it on the server anyway)
            return None
        if self._health.state is Health.HEALTHY:
            if not self._health.should_relinquish():
                return None
            self._relinquish()
            return "relinquished"
        if self._probe():
            self.rejoined_at = time.monotonic()
            log.warning("%s: a probe commit was answered: rejoining every job", self._me)
            self._rejoin()
            return "rejoined"
        return None

    def on_state(self, state: ConnectionState) -> None:
        """A state listener (on the store's event thread): a new session starts its
        record afresh (what went unanswered before belonged to the old one)."""
        if state is ConnectionState.CONNECTED:
            self._health.forget()

    def _relinquish(self) -> None:
        unanswered = self._health.unanswered_for()
        self._health.relinquish()  # first: no write of ours may use the next session
        self.relinquished_at = time.monotonic()
        log.warning(
            "%s: no commit answered for %.1fs while the session lives (a gray link): "
            "fencing every execution and giving up the session so that others take over",
            self._me,
            unanswered,
        )
        self._fence()
        try:
            self._store.relinquish_session()
        except StoreError as exc:
            # fenced all the same; the others take over once the session ends
            log.warning("%s: could not give up the session: %s", self._me, exc)

    def _probe(self) -> bool:
        """One probe commit; whether it was answered and ended the relinquished state."""
        if self._store.state not in _LIVE:
            return False
        sent = self._health.now()
        try:
            self._store.commit([Put(self._probe_path, str(time.time()).encode(), ephemeral=True)])
        except StoreError as exc:
            log.info("%s: probe commit not answered: %s", self._me, exc)
            return False
        return self._health.probe_answered(sent)
