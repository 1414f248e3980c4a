"""The tree watch behind :meth:`~shardkeeper.registry.zookeeper.ZooKeeperStore.watch`.

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
    it from there (``events.py``: ``_own_multi``). Consequences
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
from shardkeeper.registry._events import CallTimeout, WatchDelivery
from shardkeeper.registry.base import (
    EventKind,
    PathFilter,
    Subscription,
    WatchEvent,
    WatchListener,
    check_path,
    is_excluded,
)
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.events import _Events
from shardkeeper.registry.zookeeper.nodes import _child, _parent
from shardkeeper.registry.zookeeper.reads import _Reads

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")


#: entries of a watch's parent-exclusion map before it is emptied (one per parent node)
_PARENTS_OUT_MAX = 100_000


@dataclass(eq=False, kw_only=True)
class _TreeWatch(WatchDelivery):
    """State of one prefix watch; only the event thread touches the cache."""

    #: path -> (czxid, mzxid, implicit) of every node seen under the prefix; implicit
    #: parents (made only to hold a child) produce no events, as in etcd
    cache: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    #: path -> cached child paths (so a vanished subtree is found without a scan)
    kids: dict[str, set[str]] = field(default_factory=dict)
    #: path -> type of its latest notification, not yet handled (filled on kazoo's
    #: connection thread and emptied on the event thread, both under the store's lock)
    pending: dict[str, int] = field(default_factory=dict)
    #: path -> (value, zxid, implicit) of nodes a multi of ours created, taken out of
    #: ``pending`` as the multi's reply was read (kazoo's connection thread, under the
    #: store's lock): their state at that zxid is known, so the drain caches and
    #: reports them without a read (``events.py``: _own_multi)
    known: dict[str, tuple[bytes, int, bool]] = field(default_factory=dict)
    #: path -> notification type held by a drain for a multi of ours in flight that
    #: creates the path: its reply moves it to ``known``, or gives it back to
    #: ``pending`` when it did not create it (``events.py``)
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


_Read = tuple[str, tuple[bytes, ZnodeStat] | None, list[str] | None]


class _TreeWatcher(_Events, _Reads):
    """Prefix watches: one :class:`_TreeWatch` each, synced on the event thread."""

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch every change at or below ``prefix`` (established when this returns),
        leaving out the subtrees ``exclude`` rejects without reading them."""
        check_path(prefix)
        _ = self._zk  # raises unless started
        w = _TreeWatch(
            prefix=prefix,
            listener=listener,
            exclude=exclude,
            void=is_excluded(prefix, exclude),
        )
        sub = Subscription(cancel_fn=lambda: self._unwatch(w))
        # set up on the event thread, in order with the re-reads of the other watches
        # (at once when called from a listener, i.e. on that thread)
        try:
            self._loop.call(
                functools.partial(self._add_watch, w), self._settings.operation_timeout + 1
            )
        except CallTimeout:
            self._unwatch(w)
            raise OperationTimeoutError(
                f"watch {prefix}: not established within {self._settings.operation_timeout:g}s"
            ) from None
        return sub

    def _add_watch(self, w: _TreeWatch) -> None:
        with self._lock:
            if self._closed:
                raise StoreUnavailableError(f"ZooKeeper store for {self.namespace!r} is closed")
            if w.cancelled:  # the caller gave up waiting
                return
            # listed before the watch is set, so that no notification after it is missed
            # (those that overlap the first read re-read a node already cached: no event)
            self._watches.append(w)
        try:
            with self._errors(w.prefix):
                self._sync(w, [w.prefix], full=True, emit=False, strict=True)
        except BaseException:
            self._unwatch(w)
            raise

    def _unwatch(self, w: _TreeWatch) -> None:
        # the server-side watch stays until the connection ends: its notifications are
        # for no listed watcher and cost nothing but the packet
        w.cancelled = True
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _emit(self, w: _TreeWatch, event: WatchEvent) -> None:
        # on the event thread, in the middle of a re-read: delivered now, in its order
        self._loop.deliver_watch(w, event)

    def _sync(
        self,
        w: _TreeWatch,
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
                self._call(
                    self._deadline(),
                    kazoo_private.submit_add_watch,
                    self._zk,
                    self._full(w.prefix),
                )
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

    def _read_level(self, level: list[str]) -> list[_Read]:
        """Data and children of each node of ``level``, in one request (a ``multiRead``,
        chunked if large): ``(path, (value, stat) or None when absent, children)``.
        A write falling between a node's two operations makes its listing a little
        newer than its stat; the callers allow for it (see _born_with_children)."""
        ops: list[Any] = []
        for p in level:
            full = self._full(p)
            ops += [kazoo_private.get_data_op(full), kazoo_private.get_children_op(full)]
        results = self._multi_read(self._deadline(), ops)
        read: list[_Read] = []
        for i, p in enumerate(level):
            got, names = results[2 * i], results[2 * i + 1]
            if isinstance(got, kz.NoNodeError) or isinstance(names, kz.NoNodeError):
                read.append((p, None, None))
                continue
            for res in (got, names):
                if isinstance(res, Exception):
                    raise res
            read.append((p, got, names))
        return read

    def _sync_levels(self, w: _TreeWatch, paths: list[str], *, full: bool, emit: bool) -> None:
        if w.void:
            return
        level = paths
        while level and not w.cancelled:
            read = self._read_level(level)
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

    def _adopt(self, w: _TreeWatch, known: dict[str, tuple[bytes, int, bool]]) -> None:
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
        found = self._read_many(self._deadline(), kids)
        return any(got is not None and got[1].czxid == stat.czxid for got in found.values())

    def _emit_if(
        self, emit: bool, w: _TreeWatch, kind: EventKind, path: str, value: bytes, rev: int
    ) -> None:
        if emit:
            self._emit(w, WatchEvent(kind, path, value, rev))

    def _drop(self, w: _TreeWatch, path: str, revision: int, emit: bool) -> None:
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
