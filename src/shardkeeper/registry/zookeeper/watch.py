"""The tree watch behind :meth:`~shardkeeper.registry.zookeeper.ZooKeeperStore.watch`:
:class:`TreeWatch`, the part that owns every watch of a store, hears kazoo's
notifications (the transport's :class:`~.transport.MultiListener`) and re-reads on
the store's event thread.

Watches
    Each :meth:`ZooKeeperStore.watch` sets one persistent recursive watch on its prefix
    (``addWatch``, ZooKeeper 3.6+; see ``kazoo_private``): the server then notifies
    every create, data change and delete at or below it, with no watch to re-arm per
    node. The watcher keeps a cache ``{path: (czxid, mzxid)}``. Notifications only note
    their path and kind (kazoo's connection thread); the store's single event thread
    then re-reads all the paths noted so far in one ``multiRead`` (data and children of
    each, chunked when large), diffs against the cache and emits
    CREATED/CHANGED/DELETED. A path whose latest notification is a delete is not read:
    notifications come in store order, so it is gone (a commit's absence guard, a create
    and delete of one node, costs nothing). A burst of changes (a registration of
    thousands of nodes, a reshard) costs a few requests, not two per node. Nodes the
    store's own multis create are not read at all: as the multi's reply is read
    (kazoo's connection thread, after the multi's own notifications and before any
    later one), a created node whose latest notification is that CREATED moves to
    ``known`` with its value and the multi's zxid, and the drain caches and reports
    it from there (:meth:`TreeWatch.applied`). Consequences
    (the contract's Watches section, in ``base.py``, allows exactly these): rapid
    changes to one node may be coalesced into one event carrying the latest value; a
    node created and deleted between two reads gives no event; a delete + re-create seen
    late is emitted as DELETED then CREATED (czxid differs); a re-read can discover a
    change before older changes of other nodes whose events are still queued, so events
    of different paths are not in store order.

    Per-path order holds: one session's reads are monotonic (ZooKeeper's guarantee),
    and an event is emitted only for a (czxid, mzxid) newer than the cached one, so
    the revisions of one path's events strictly increase. ZooKeeper does not report
    the zxid of a delete, so a DELETED event carries a bound: the parent's pzxid when
    its listing missed the node, the new czxid - 1 when it was re-created, and never
    less than the node's last mzxid + 1 (see ``_drop``).
    kazoo never re-sends watches after a reconnect and the server drops them with the
    connection, so after RECONNECTED, or CONNECTED on a new session, every watcher
    sets its watch again and re-reads its whole subtree (one request per level),
    diffs and emits what changed: no change is silently lost. A read that fails
    inside the event thread marks the watcher dirty; it is re-synced as soon as the
    connection allows. Initial state is not emitted: a watch reports changes.

    Excluded subtrees (``watch(..., exclude=...)``): a listed child for which
    ``exclude`` is True is dropped from the listing before anything else happens, so
    the watcher never reads it or lists its children, and a noted path in an excluded
    subtree is dropped before the re-read. ZooKeeper still notifies writes there (a
    recursive watch cannot leave a subtree out): each costs a notification packet and
    a set insertion on kazoo's connection thread, no request. An excluded prefix
    makes a watch that reads nothing at all.

    Implicit parents: ZooKeeper needs real parent nodes where etcd has none, so the
    store creates missing parents in the same multi as the node that needs them. They
    share its czxid, which is how a watcher recognises them: a new, empty, never
    written node with a child of the same czxid is an implicit parent and produces no
    events (as in etcd); a value later put on it is reported as CREATED. Usually the
    node's own stat tells (pzxid still equal to czxid with children: they were all
    made with it); otherwise its children's stats are read. (An empty node created on
    purpose in the same commit as its child is indistinguishable and is treated as
    implicit too.)
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kazoo import exceptions as kz
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat

from shardkeeper.errors import (
    OperationTimeoutError,
    StoreError,
    StoreUnavailableError,
)
from shardkeeper.registry._events import CallTimeout, EventLoop, WatchDelivery
from shardkeeper.registry.base import (
    EventKind,
    PathFilter,
    Subscription,
    WatchEvent,
    WatchListener,
    check_path,
    is_excluded,
)
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.nodes import _child, _parent
from shardkeeper.registry.zookeeper.owned import OwnedEphemerals
from shardkeeper.registry.zookeeper.reads import Reads
from shardkeeper.registry.zookeeper.transport import Flight, Transport

__all__ = ["DIRTY_RETRY", "TreeWatch", "Watch"]

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")


#: entries of a watch's parent-exclusion map before it is emptied (one per parent node)
_PARENTS_OUT_MAX = 100_000


@dataclass(eq=False, kw_only=True)
class Watch(WatchDelivery):
    """State of one prefix watch; only the event thread touches the cache."""

    #: path -> (czxid, mzxid, implicit) of every node seen under the prefix; implicit
    #: parents (made only to hold a child) produce no events, as in etcd
    cache: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    #: path -> cached child paths (so a vanished subtree is found without a scan)
    kids: dict[str, set[str]] = field(default_factory=dict)
    #: path -> type of its latest notification, not yet handled (filled on kazoo's
    #: connection thread and emptied on the event thread, both under the tree watch's lock)
    pending: dict[str, int] = field(default_factory=dict)
    #: path -> (value, zxid, implicit) of nodes a multi of ours created, taken out of
    #: ``pending`` as the multi's reply was read (kazoo's connection thread, under the
    #: tree watch's lock): their state at that zxid is known, so the drain caches and
    #: reports them without a read (:meth:`TreeWatch.applied`)
    known: dict[str, tuple[bytes, int, bool]] = field(default_factory=dict)
    #: path -> notification type held by a drain for a multi of ours in flight that
    #: creates the path: its reply moves it to ``known``, or gives it back to
    #: ``pending`` when it did not create it (:meth:`TreeWatch.landed`)
    held: dict[str, int] = field(default_factory=dict)
    dirty: bool = False
    #: the prefix itself is excluded: nothing to read, nothing to report
    void: bool = False
    #: the connection epoch (``owned.py``) in which the server-side watch was last set;
    #: -1 before that
    armed: int = -1
    #: parent path -> whether ``exclude`` rejects it or an ancestor: the verdict the
    #: connection thread needs to drop a notification of an excluded subtree at once
    #: (a fire of 10,000 items notifies 20,000 running-mark changes to every
    #: instance); ``exclude`` is a function of the path alone, so a verdict never goes
    #: stale, and the map holds one entry per parent node seen
    parents_out: dict[str, bool] = field(default_factory=dict)

    def covers(self, path: str) -> bool:
        """Whether ``path`` is at or below the prefix."""
        p = self.prefix
        return p == "/" or path == p or path.startswith(p + "/")

    def skips(self, path: str) -> bool:
        """Whether ``path`` is excluded. Only the node itself is asked: the walk
        reached it through ancestors that were asked (and kept) on the way down."""
        return self.exclude is not None and self.exclude(path)

    def admits(self, event: WatchEvent) -> bool:
        """Every event: the re-reads never read an excluded subtree (``exclude`` says
        what is never read or listed), so nothing is filtered on delivery."""
        return True

    def notes(self, path: str) -> bool:
        """Whether a notification of ``path`` is for this watch: at or below its
        prefix and not in an excluded subtree. Called on kazoo's connection thread
        for every notification, so the exclusion is one split and one map lookup for
        the parent (cached, :attr:`parents_out`) and one ``exclude`` call for the path
        itself."""
        if self.cancelled or not self.covers(path):
            return False
        if self.exclude is None:
            return True
        parent = path.rpartition("/")[0] or "/"
        try:
            out = self.parents_out.get(parent)
            if out is None:
                if len(self.parents_out) >= _PARENTS_OUT_MAX:  # a bound, not reached in use
                    self.parents_out.clear()
                out = path != "/" and is_excluded(parent, self.exclude)
                self.parents_out[parent] = out
            return not out and not self.exclude(path)
        except Exception:  # a broken filter excludes nothing (as on delivery)
            _log.debug("watch %s: exclude(%r) failed", self.prefix, path, exc_info=True)
            return True


#: the notifications of a persistent recursive watch (no child events in that mode)
_CHANGES = frozenset(
    {kazoo_private.NODE_CREATED, kazoo_private.NODE_DATA_CHANGED, kazoo_private.NODE_DELETED}
)

#: how often a dirty watcher is retried while its re-sync keeps failing
DIRTY_RETRY = 0.25


class TreeWatch:
    """Every prefix watch of one store: one :class:`Watch` each, synced on the event
    thread (see the module docstring). Owns the watches, their lock and the multis of
    ours in flight; implements the transport's :class:`~.transport.MultiListener`, the
    session's :class:`~.session.Resync` and the commits' :class:`~.planner.Coverage`.

    Threads: kazoo's connection thread calls :meth:`notified`, :meth:`applied` (and
    request threads :meth:`take_off`, :meth:`landed`), which only note and post; the
    event thread runs the drains and re-reads.
    """

    def __init__(
        self,
        settings: RegistrySettings,
        transport: Transport,
        reads: Reads,
        loop: EventLoop,
        owned: OwnedEphemerals,
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._reads = reads
        self._loop = loop
        #: our ephemeral nodes of known incarnation (deletes reported here, the epoch
        #: in which each watch was armed read here)
        self._owned = owned
        # guards the list of watches, their pending/known/held maps and ``inflight``
        self._lock = threading.Lock()
        self._closed = False
        self._watches: list[Watch] = []
        #: path -> creates of it in multis of ours in flight (:meth:`take_off`)
        self.inflight: dict[str, int] = {}

    # -- the store's calls ------------------------------------------------------------

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch every change at or below ``prefix`` (established when this returns),
        leaving out the subtrees ``exclude`` rejects without reading them."""
        check_path(prefix)
        _ = self._transport.client  # raises unless started
        w = Watch(
            prefix=prefix,
            listener=listener,
            exclude=exclude,
            void=is_excluded(prefix, exclude),
        )
        sub = Subscription(cancel_fn=lambda: self._unwatch(w))
        # set up on the event thread, in order with the re-reads of the other watches
        # (at once when called from a listener, i.e. on that thread)
        timeout = self._settings.operation_timeout
        try:
            self._loop.call(functools.partial(self._add_watch, w), timeout + 1)
        except CallTimeout:
            self._unwatch(w)
            raise OperationTimeoutError(
                f"watch {prefix}: not established within {timeout:g}s"
            ) from None
        return sub

    def close(self) -> None:
        """Cancel every watch; no watch is added from now on."""
        with self._lock:
            self._closed = True
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancelled = True

    # -- commits.Coverage ---------------------------------------------------------------

    def covered(self, path: str) -> bool:
        """Whether a recursive watch armed on the current connection covers ``path``:
        then every delete of it reaches the tap (see ``owned.py``)."""
        epoch = self._owned.epoch
        return any(
            w.armed == epoch and not w.cancelled and w.covers(path) for w in list(self._watches)
        )

    # -- handed over by kazoo's threads (transport.MultiListener) -----------------------

    def notified(self, etype: int, path: str) -> None:
        """A notification, on kazoo's connection thread: never read here, only note
        the path and its latest change, and hand over (one drain task per burst: the
        paths pile up until it runs)."""
        if etype == kazoo_private.NODE_DELETED:
            self._owned.deleted(path)
        if etype not in _CHANGES:
            return
        for w in list(self._watches):
            # an excluded subtree's notification is dropped here, before the lock and
            # the drain: the runtime's watch excludes the running marks, which change
            # by the thousand at every fire of a big job
            if not w.notes(path):
                continue
            with self._lock:
                first = not w.pending
                w.pending[path] = etype
            if first:
                self._loop.post(functools.partial(self._drain, w))

    def take_off(self, ops: list[Any]) -> Flight | None:
        """A multi of ours is sent: what it creates is in flight (None without a
        watch: nothing to adopt or hold)."""
        return self.in_flight(ops) if self._watches else None

    def in_flight(self, ops: list[Any]) -> Flight:
        """Note the nodes ``ops`` create as in flight (see :class:`~.transport.Flight`).

        In op order: a node the same multi deletes after creating it (an absence
        guard's create+delete pair) is in flight but not made by it. Adopting it
        would report a node that no longer exists (review finding 9); holding its
        CREATED until the reply lets its DELETED, drained before or after, cost no
        read.
        """
        root = len(self._transport.chroot)
        made: dict[str, bytes] = {}
        paths: list[str] = []
        for op in ops:
            got = kazoo_private.created(op)
            if got is not None:
                path = got[0][root:] or "/"
                made[path] = got[1]
                paths.append(path)
                continue
            gone = kazoo_private.deleted(op)
            if gone is not None:
                made.pop(gone[root:] or "/", None)
        with self._lock:
            for path in paths:
                self.inflight[path] = self.inflight.get(path, 0) + 1
        return Flight(made, tuple(paths))

    def applied(self, made: dict[str, bytes], ops: list[Any], zxid: int) -> None:
        """A multi of ours creating ``made`` applied, on kazoo's connection thread as
        its reply is read: its notifications came just before, and no later one yet.
        A node it created whose latest notification is that CREATED (pending, or held
        by a drain that ran meanwhile) is known without a read: its value, and the
        multi's zxid as its czxid and mzxid (see :attr:`Watch.known`). A registration
        of 5,000 jobs creates 30,000 nodes: none is re-read."""
        # an empty node created with a child in one multi is an implicit parent
        parents = {_parent(p) for p in made if p != "/"}
        created = kazoo_private.NODE_CREATED
        for w in list(self._watches):
            if w.cancelled or w.void:
                continue
            with self._lock:
                pending, held = w.pending, w.held
                moved = False
                for path, value in made.items():
                    if pending.get(path) == created:
                        # a drain is queued: it was posted when the entry was noted
                        del pending[path]
                    elif held.get(path) == created:
                        del held[path]
                        moved = True
                    else:
                        continue
                    w.known[path] = (value, zxid, value == b"" and path in parents)
            if moved:
                self._loop.post(functools.partial(self._drain, w))

    def landed(self, paths: Iterable[str]) -> None:
        """The multi creating ``paths`` was answered (or given up on)."""
        with self._lock:
            for path in paths:
                left = self.inflight.get(path, 0) - 1
                if left > 0:
                    self.inflight[path] = left
                else:
                    self.inflight.pop(path, None)
        self._release_held()

    def _release_held(self) -> None:
        # a multi of ours was answered: what drains held for it and it did not
        # create (it failed, or another multi did) is noted again, to be read
        for w in list(self._watches):
            with self._lock:
                back = [p for p in w.held if p not in self.inflight]
                if not back:
                    continue
                first = not w.pending
                for path in back:
                    w.pending.setdefault(path, w.held.pop(path))
            if first:
                self._loop.post(functools.partial(self._drain, w))

    # -- session.Resync and the event loop's retry ---------------------------------------

    def resync_all(self) -> None:
        """After a reconnect or a new session (on the event thread): set every watch
        again and re-read its subtree."""
        for w in list(self._watches):
            if not w.cancelled:
                self._sync(w, [w.prefix], full=True, emit=True)

    def dirty(self) -> bool:
        """Whether a watcher waits for a re-sync that failed (on the event thread)."""
        return any(w.dirty for w in list(self._watches))

    def resync_dirty(self) -> None:
        """Re-sync the dirty watchers if the connection allows (on the event thread)."""
        if not self._transport.connected:
            return  # the state event of the reconnect re-syncs every watcher
        for w in list(self._watches):
            if w.dirty and not w.cancelled:
                self._sync(w, [w.prefix], full=True, emit=True)

    # -- on the event thread ------------------------------------------------------------

    def _add_watch(self, w: Watch) -> None:
        with self._lock:
            if self._closed:
                raise StoreUnavailableError(
                    f"ZooKeeper store for {self._settings.namespace!r} is closed"
                )
            if w.cancelled:  # the caller gave up waiting
                return
            # listed before the watch is set, so that no notification after it is missed
            # (those that overlap the first read re-read a node already cached: no event)
            self._watches.append(w)
        try:
            with self._transport.errors(w.prefix):
                self._sync(w, [w.prefix], full=True, emit=False, strict=True)
        except BaseException:
            self._unwatch(w)
            raise

    def _unwatch(self, w: Watch) -> None:
        # the server-side watch stays until the connection ends: its notifications are
        # for no listed watcher and cost nothing but the packet
        w.cancelled = True
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _drain(self, w: Watch) -> None:
        with self._lock:
            noted, w.pending = w.pending, {}
            known, w.known = w.known, {}
            # a node a multi of ours in flight creates: its reply will tell the node
            # as it made it (applied), so it is held rather than read now
            inflight = self.inflight
            if inflight:
                for path in [p for p, e in noted.items() if p in inflight]:
                    if noted[path] == kazoo_private.NODE_CREATED:
                        w.held[path] = noted.pop(path)
            # a CREATED held earlier is outdated by any later notification of its
            # path (a delete or change drained now): the multi's reply must not
            # adopt it, and the later one is handled below as usual
            if w.held:
                for path in [p for p in noted if p in w.held]:
                    del w.held[path]
        if w.cancelled or w.void:
            return
        if known:
            # before the paths noted since: their notifications are later
            self._adopt(w, known)
        reread: list[str] = []
        for path, etype in noted.items():
            if is_excluded(path, w.exclude):
                continue
            if etype == kazoo_private.NODE_DELETED:
                # Notifications arrive in store order, so a node whose latest one is a
                # delete is gone now (a re-creation would have come after it): no read.
                self._drop(w, path, 0, True)
            else:
                reread.append(path)
        if reread:
            self._sync(w, sorted(reread), full=False)

    def _emit(self, w: Watch, event: WatchEvent) -> None:
        # on the event thread, in the middle of a re-read: delivered now, in its order
        self._loop.deliver_watch(w, event)

    def _sync(
        self,
        w: Watch,
        paths: list[str],
        *,
        full: bool,
        emit: bool = True,
        strict: bool = False,
    ) -> None:
        """Re-read ``paths``, diff with the cache, emit, and descend into new children
        (into every child when ``full``). A full re-sync of the whole prefix first sets
        the recursive watch (again). A failed read marks the watcher dirty (re-synced
        later) unless ``strict``, which raises instead."""
        whole = full and paths == [w.prefix]
        if whole:
            with self._lock:
                # the whole re-read below finds them as they are now
                w.known.clear()
                w.held.clear()
        try:
            if whole and not w.void:
                # read before sending: a connection change meanwhile leaves it stale
                epoch = self._owned.epoch
                t = self._transport
                t.add_watch(t.deadline(), t.full(w.prefix))
                w.armed = epoch
            self._sync_levels(w, paths, full=full, emit=emit)
        except (kz.KazooException, KazooTimeoutError, StoreError):
            if strict:
                raise
            _log.debug("watch %s: re-read failed; will re-sync", w.prefix, exc_info=True)
            w.dirty = True
        else:
            if whole:
                w.dirty = False

    def _sync_levels(self, w: Watch, paths: list[str], *, full: bool, emit: bool) -> None:
        if w.void:
            return
        level = paths
        while level and not w.cancelled:
            read = self._reads.read_level(level)
            queued = set(level)
            # one level may reveal several changes: report them in store order
            read.sort(key=lambda r: r[1][1].mzxid if r[1] is not None else 0)
            level = []
            for p, got, names in read:
                if got is None or names is None:
                    self._drop(w, p, 0, emit)  # when it went is unknown: see _drop
                    continue
                value, stat = got
                old = w.cache.get(p)
                if old is not None and (stat.czxid, stat.mzxid) < old[:2]:
                    # Older than what was reported: never from one session's reads, which
                    # ZooKeeper keeps monotonic, but a path must not go back in time.
                    continue
                if old is not None and old[0] != stat.czxid:
                    # deleted and re-created since we last looked: a new node, and the
                    # delete came before its creation
                    self._drop(w, p, stat.czxid - 1, emit)
                    old = None
                if p != w.prefix:
                    w.kids.setdefault(_parent(p), set()).add(p)
                listed = [_child(p, n) for n in names]
                if old is None:
                    implicit = (
                        value == b""
                        and stat.version == 0
                        and bool(listed)
                        and self._born_with_children(stat, listed)
                    )
                    w.cache[p] = (stat.czxid, stat.mzxid, implicit)
                    if not implicit:
                        self._emit_if(emit, w, EventKind.CREATED, p, value, stat.mzxid)
                elif stat.mzxid > old[1]:
                    w.cache[p] = (stat.czxid, stat.mzxid, False)
                    # a value written onto an implicit parent is, logically, a new node
                    kind = EventKind.CREATED if old[2] else EventKind.CHANGED
                    self._emit_if(emit, w, kind, p, value, stat.mzxid)
                # dropped here, before anything reads or descends into them
                current = {c for c in listed if not w.skips(c)}
                for gone in sorted(w.kids.get(p, set()) - current):
                    self._drop(w, gone, stat.pzxid, emit)
                level.extend(
                    c for c in sorted(current) if (full or c not in w.cache) and c not in queued
                )

    def _adopt(self, w: Watch, known: dict[str, tuple[bytes, int, bool]]) -> None:
        """Cache and report (CREATED) nodes our own multis created, as a re-read would
        have found them at the multi's zxid: in store order, parents first; an
        implicit parent silently; a cached older incarnation dropped first."""
        for p in sorted(known, key=lambda q: (known[q][1], q.count("/"), q)):
            if is_excluded(p, w.exclude):
                continue
            value, zxid, implicit = known[p]
            old = w.cache.get(p)
            if old is not None:
                if old[:2] >= (zxid, zxid):
                    continue  # a read found it already (or something newer)
                if old[0] != zxid:
                    self._drop(w, p, zxid - 1, True)
            if p != w.prefix:
                w.kids.setdefault(_parent(p), set()).add(p)
            w.cache[p] = (zxid, zxid, implicit)
            if not implicit:
                self._emit(w, WatchEvent(EventKind.CREATED, p, value, zxid))

    def _born_with_children(self, stat: ZnodeStat, kids: list[str]) -> bool:
        """Whether a new, empty, never written node was created in one multi with one
        of its children ``kids`` (as listed, excluded ones included): an implicit
        parent.

        A node's pzxid starts at its czxid and moves with every child created or
        deleted, so an unchanged pzxid means the children it had when ``stat`` was
        read were all made with it: decided without a read, the usual case. (The
        count is the stat's, not the listing's, which may be a little newer.)
        Otherwise the stats of the listed children are read, once, in one request."""
        if stat.pzxid == stat.czxid:
            return bool(stat.numChildren > 0)
        found = self._reads.read_many(self._transport.deadline(), kids)
        return any(got is not None and got[1].czxid == stat.czxid for got in found.values())

    def _emit_if(
        self, emit: bool, w: Watch, kind: EventKind, path: str, value: bytes, rev: int
    ) -> None:
        if emit:
            self._emit(w, WatchEvent(kind, path, value, rev))

    def _drop(self, w: Watch, path: str, revision: int, emit: bool) -> None:
        """Forget ``path`` and its cached subtree, emitting DELETED children first
        (implicit parents vanish silently, as they were never reported).

        ZooKeeper does not tell the zxid of a delete. ``revision`` is a bound the
        caller knows to be below any later incarnation of ``path`` (the parent's pzxid
        when the listing missed it, the new czxid - 1 when it was re-created, 0 when
        unknown); it is raised to just above the node's last reported mzxid, so that
        each path's events keep strictly increasing revisions."""
        for kid in sorted(w.kids.pop(path, set())):
            self._drop(w, kid, revision, emit)
        w.kids.get(_parent(path), set()).discard(path)
        seen = w.cache.pop(path, None)
        if emit and seen is not None and not seen[2]:
            rev = max(revision, seen[1] + 1)
            self._emit(w, WatchEvent(EventKind.DELETED, path, None, rev))
