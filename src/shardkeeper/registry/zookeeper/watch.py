"""The tree watch behind :meth:`~shardkeeper.registry.zookeeper.ZooKeeperStore.watch`.

Watches
    kazoo 2.11 has no persistent recursive watch (``addWatch``), and it forgets every
    one-shot watch when the connection drops (it never sends ``SetWatches``). So each
    :meth:`ZooKeeperStore.watch` runs a lean tree watcher: a data watch and a child
    watch on every node under the prefix (an exists watch on the prefix while it is
    absent) and a cache ``{path: (czxid, mzxid)}``. kazoo callbacks only enqueue; the
    store's single event thread re-reads the node that fired (re-arming its watch),
    diffs against the cache and emits CREATED/CHANGED/DELETED. Consequences (the
    contract's Watches section, in ``base.py``, allows exactly these): rapid changes
    to one node may be coalesced into one event carrying the latest value; a node
    created and deleted between two reads gives no event; a delete + re-create seen
    late is emitted as DELETED then CREATED (czxid differs); a re-read can discover a
    change before older changes of other nodes whose events are still queued, so
    events of different paths are not in store order.

    Per-path order holds: one session's reads are monotonic (ZooKeeper's guarantee),
    and an event is emitted only for a (czxid, mzxid) newer than the cached one, so
    the revisions of one path's events strictly increase. ZooKeeper does not report
    the zxid of a delete, so a DELETED event carries a bound: the parent's pzxid when
    its listing missed the node, the new czxid - 1 when it was re-created, and never
    less than the node's last mzxid + 1 (see ``_drop``).
    After RECONNECTED, or CONNECTED on a new session, every watcher re-reads its whole
    subtree, diffs and emits what changed, so no change is silently lost. A read that
    fails inside the event thread marks the watcher dirty; it is re-synced as soon as
    the connection allows. Initial state is not emitted: a watch reports changes.

    Excluded subtrees (``watch(..., exclude=...)``): a listed child for which
    ``exclude`` is True is dropped from the listing before anything else happens, so
    the watcher never reads it, never lists its children and sets no watch on it; a
    write below it costs the watcher nothing (a create or delete of the excluded node
    itself still fires its parent's child watch: one re-listing of the parent). An
    excluded prefix makes a watch that reads nothing at all.

    Implicit parents: ZooKeeper needs real parent nodes where etcd has none, so the
    store creates missing parents in the same multi as the node that needs them. They
    share its czxid, which is how a watcher recognises them: a new, empty, never
    written node with a child of the same czxid is an implicit parent and produces no
    events (as in etcd); a value later put on it is reported as CREATED. (An empty node
    created on purpose in the same commit as its child is indistinguishable and is
    treated as implicit too.)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo import exceptions as kz
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent, ZnodeStat

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
from shardkeeper.registry.zookeeper.events import _Events
from shardkeeper.registry.zookeeper.nodes import _child, _parent

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")


@dataclass(eq=False, kw_only=True)
class _TreeWatch(WatchDelivery):
    """State of one prefix watch; only the event thread touches the cache."""

    #: hands a fired kazoo watch over to the event thread (the store's _on_watch_fired)
    fired: Callable[[_TreeWatch, WatchedEvent], None]
    #: path -> (czxid, mzxid, implicit) of every node seen under the prefix; implicit
    #: parents (made only to hold a child) produce no events, as in etcd
    cache: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    #: path -> cached child paths (so a vanished subtree is found without a scan)
    kids: dict[str, set[str]] = field(default_factory=dict)
    dirty: bool = False
    #: the prefix itself is excluded: nothing to read, nothing to report
    void: bool = False

    def skips(self, path: str) -> bool:
        """Whether ``path`` is excluded. Only the node itself is asked: the walk
        reached it through ancestors that were asked (and kept) on the way down."""
        return self.exclude is not None and self.exclude(path)

    def admits(self, event: WatchEvent) -> bool:
        """Every event: the re-reads never read an excluded subtree (``exclude`` says
        what is never read, listed or watched), so nothing is filtered on delivery."""
        return True

    def on_zk(self, event: WatchedEvent) -> None:
        # runs on kazoo's callback thread: never read here, only hand over
        self.fired(self, event)


class _TreeWatcher(_Events):
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
            fired=self._on_watch_fired,
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
            w.cancelled = True
            raise OperationTimeoutError(
                f"watch {prefix}: not established within {self._settings.operation_timeout:g}s"
            ) from None
        return sub

    def _add_watch(self, w: _TreeWatch) -> None:
        with self._errors(w.prefix):
            self._sync(w, [w.prefix], full=True, emit=False, strict=True)
        with self._lock:
            if self._closed:
                raise StoreUnavailableError(f"ZooKeeper store for {self.namespace!r} is closed")
            if not w.cancelled:  # the caller may have given up waiting
                self._watches.append(w)

    def _unwatch(self, w: _TreeWatch) -> None:
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
        data_only: bool = False,
        strict: bool = False,
    ) -> None:
        """Re-read ``paths`` (re-arming their watches), diff with the cache, emit, and
        descend into new children (into every child when ``full``). A failed read marks
        the watcher dirty (re-synced later) unless ``strict``, which raises instead."""
        try:
            self._sync_levels(w, paths, full=full, emit=emit, data_only=data_only)
        except (kz.KazooException, KazooTimeoutError, StoreError):
            if strict:
                raise
            _log.debug("watch %s: re-read failed; will re-sync", w.prefix, exc_info=True)
            w.dirty = True
        else:
            if full and paths == [w.prefix]:
                w.dirty = False

    def _sync_levels(
        self, w: _TreeWatch, paths: list[str], *, full: bool, emit: bool, data_only: bool
    ) -> None:
        zk = self._zk
        if w.void:
            return
        level, first = paths, True
        # new empty nodes that had children when read: implicit parents if a child shares
        # their czxid (made in one multi); decided once the next level is read
        undecided: dict[str, tuple[bytes, ZnodeStat]] = {}
        # the undecided nodes with excluded children (not read): their listing's stat
        # and those children, so that _decide can still tell (see _born_with_hidden)
        hidden: dict[str, tuple[ZnodeStat, list[str]]] = {}
        while level and not w.cancelled:
            deadline = self._deadline()
            sent = [
                (
                    p,
                    self._send(zk.get_async, p, watch=w.on_zk),
                    None
                    if data_only and first and p in w.cache
                    else self._send(zk.get_children_async, p, watch=w.on_zk, include_data=True),
                )
                for p in level
            ]
            read: list[tuple[str, tuple[bytes, ZnodeStat] | None, Any]] = []
            for p, data_ar, kids_ar in sent:
                try:
                    got = self._wait(data_ar, deadline)
                    listing = self._wait(kids_ar, deadline) if kids_ar is not None else None
                except kz.NoNodeError:
                    got = listing = None
                read.append((p, got, listing))
            if undecided:
                self._decide(w, undecided, hidden, read, emit)
                undecided, hidden = {}, {}
            # one level may reveal several changes: report them in store order
            read.sort(key=lambda r: r[1][1].mzxid if r[1] is not None else 0)
            level, first = [], False
            for p, got, listing in read:
                if got is None:
                    self._drop(w, p, 0, emit)  # when it went is unknown: see _drop
                    if p == w.prefix:
                        self._watch_absent_prefix(w)
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
                if old is None and listing is None:
                    level.append(p)  # a new node: read it with its children
                    continue
                if p != w.prefix:
                    w.kids.setdefault(_parent(p), set()).add(p)
                if old is None:
                    if value == b"" and stat.version == 0 and listing and listing[0]:
                        undecided[p] = got
                    else:
                        w.cache[p] = (stat.czxid, stat.mzxid, False)
                        self._emit_if(emit, w, EventKind.CREATED, p, value, stat.mzxid)
                elif stat.mzxid > old[1]:
                    w.cache[p] = (stat.czxid, stat.mzxid, False)
                    # a value written onto an implicit parent is, logically, a new node
                    kind = EventKind.CREATED if old[2] else EventKind.CHANGED
                    self._emit_if(emit, w, kind, p, value, stat.mzxid)
                if listing is None:
                    continue
                names, parent_stat = listing
                current = {_child(p, n) for n in names}
                if w.exclude is not None:
                    # dropped here, before anything reads, watches or descends into them
                    out = sorted(c for c in current if w.skips(c))
                    current.difference_update(out)
                    if out and p in undecided:
                        hidden[p] = (parent_stat, out)
                for gone in sorted(w.kids.get(p, set()) - current):
                    self._drop(w, gone, parent_stat.pzxid, emit)
                level.extend(c for c in sorted(current) if full or c not in w.cache)
        if undecided:
            self._decide(w, undecided, hidden, [], emit)

    def _decide(
        self,
        w: _TreeWatch,
        undecided: dict[str, tuple[bytes, ZnodeStat]],
        hidden: dict[str, tuple[ZnodeStat, list[str]]],
        children: list[tuple[str, tuple[bytes, ZnodeStat] | None, Any]],
        emit: bool,
    ) -> None:
        """Settle whether each undecided node is an implicit parent, before any event of
        its children: a child created in the same transaction (same czxid) says so."""
        born_with_child = {
            _parent(p)
            for p, got, _ in children
            if got is not None
            and _parent(p) in undecided
            and got[1].czxid == undecided[_parent(p)][1].czxid
        }
        for p, (value, stat) in undecided.items():
            implicit = p in born_with_child or (
                p in hidden and self._born_with_hidden(stat, *hidden[p])
            )
            w.cache[p] = (stat.czxid, stat.mzxid, implicit)
            if not implicit:
                self._emit_if(emit, w, EventKind.CREATED, p, value, stat.mzxid)

    def _born_with_hidden(self, stat: ZnodeStat, listed: ZnodeStat, kids: list[str]) -> bool:
        """Whether a node was created in one multi with one of its excluded children
        ``kids`` (which the watcher does not read).

        ``listed`` is the node's stat from its listing. A node's pzxid starts at its
        czxid and moves with every child created or deleted, so an unchanged pzxid
        means the children listed were all made with the node: decided without a
        read, the usual case (a runtime's job node born with its first running mark).
        Otherwise the stats of those children are read, once and without a watch."""
        if listed.czxid != stat.czxid:
            # re-created between the two reads: no telling, so it counts as written
            # (as when a visible child of a newer incarnation is read); the data
            # watch fired by the delete re-reads it at once
            return False
        if listed.pzxid == stat.czxid:
            return True
        deadline = self._deadline()
        sent = [self._send(self._zk.exists_async, kid) for kid in kids]
        return any(
            (kid_stat := self._wait(ar, deadline)) is not None and kid_stat.czxid == stat.czxid
            for ar in sent
        )

    def _emit_if(
        self, emit: bool, w: _TreeWatch, kind: EventKind, path: str, value: bytes, rev: int
    ) -> None:
        if emit:
            self._emit(w, WatchEvent(kind, path, value, rev))

    def _watch_absent_prefix(self, w: _TreeWatch) -> None:
        stat = self._call(self._deadline(), self._zk.exists_async, w.prefix, watch=w.on_zk)
        if stat is not None:  # created between our read and the exists watch
            self._sync_levels(w, [w.prefix], full=True, emit=True, data_only=False)

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
