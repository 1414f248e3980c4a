"""Which earlier fires a run of an item stands for: no fire of an item silently lost.

A fire whose owner died, froze or lost its store before starting it is run by nobody:
the leader gives the item to another instance from a later fire on. With misfire on,
that later run is the fold of the missed fires (as a run here folds the fires that
came while it ran): it says which fire times it covers (``ctx.covers``), so an
operator, the history and the chaos checker see every (fire, item) either run or
folded. With misfire off the missed fires are recorded as skips instead.

How the gap is found, cheaply. This instance remembers, per item, the last fire a run
started here stands for (its own fire, or the last fire a misfire re-run folds; a
fire folded behind a running item counts once its re-run starts, so a re-run that
never comes leaves a gap the next start finds). A start whose item was decided here
at the schedule's previous fire has no gap: the steady state costs no read.
Otherwise (the item is new here: a reshard, a restart, a failover of its owner,
or this instance skipped fires of it) the item's stored result is read, once for the
whole batch, after the start commit: the completion commit that wrote it deleted the
last run's mark, so with our marks in place no other run of it can still be going,
and its ``fire_time`` is the last fire of the item that ran to its end anywhere. The
covered fires are the schedule's fire times strictly between that and this fire.

Fires an operator switched off are no run's to cover: a fire this instance skipped
because the job, or the item, was disabled (``disabled``, recorded as that skip) is
remembered here as held, and the gap leaves it out (a catch-up job must not process
the window the operator switched off, and the pair must not be counted twice, as a
skip and as a fold). All instances see a job's disable and skip its fires alike, so
the item's next owner knows those fires whoever owned it; an item's disable is known
to the owners that skipped it. An instance that was not running then (started
later) does not know them, and its first run of the item may still list them.

A run lists at most :data:`MAX_COVERS` of them, the newest (``ctx.covers``): a longer
gap (an outage of more than 100 intervals) is not lost for that, the run counts the
older ones it stands for without listing them (``ctx.covered_before``, the history's
``covered_before`` column, ``shardkeeper_covered_fires_total``).

An item that never completed anywhere (the first fires of a new job, or of items a
raised count added) is counted from when it was first due: the assignment says so
(``Assignment.births``), so the first fires lost to a fault are covered by the item's
first run like any other. An assignment that does not know (written by an older
version) gives nothing to count from, and such an item's first run covers nothing.
Without ``monitor_execution`` no result is stored, and runs cover nothing either.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.triggers.interval import IntervalTrigger

from shardkeeper.coordination.model import DocumentError
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.errors import StoreError
from shardkeeper.registry.base import CoordinationStore, Node

__all__ = ["MAX_COVERS", "SAME_FIRE", "Coverage", "Covered", "FireSchedule", "counted", "listed"]

log = logging.getLogger(__name__)

#: most fire times one run lists as covered (older missed fires are counted in
#: ``covered_before``, not listed: a document per run stays small)
MAX_COVERS = 100
#: fire times closer than this are the same fire (they are floats from one schedule)
SAME_FIRE = 1e-3
#: most operator-held stretches of fires remembered, for the job and for each item
MAX_HELD = 64
#: most trigger steps one look-up walks (a cron schedule fires at most once a second)
_WALK_LIMIT = 100_000
_YEAR = 366 * 86400.0


class FireSchedule:
    """The fire times of one job's APScheduler 3 trigger, looked up between two times
    (interval triggers by arithmetic: they are anchored at the epoch, k x interval;
    others by walking the trigger, bounded)."""

    def __init__(self, trigger: Any) -> None:
        self._trigger = trigger
        self._every: float | None = None
        self._origin = 0.0
        if isinstance(trigger, IntervalTrigger):
            self._every = trigger.interval.total_seconds()
            self._origin = trigger.start_date.timestamp()

    def between(self, after: float, before: float, limit: int = MAX_COVERS) -> list[float]:
        """Fire times strictly between ``after`` and ``before``: the newest ``limit``
        of them, oldest first."""
        return self.window(after, before, limit)[0]

    def window(
        self, after: float, before: float, limit: int = MAX_COVERS
    ) -> tuple[list[float], int]:
        """Fire times strictly between ``after`` and ``before``: the newest ``limit``
        of them, oldest first, and how many older ones there are besides (a schedule
        that is walked, not an interval, counts those of its first 100,000 steps)."""
        if self._every:
            every, origin = self._every, self._origin
            first = math.floor((after + SAME_FIRE - origin) / every) + 1
            last = math.ceil((before - SAME_FIRE - origin) / every) - 1
            older = max(0, last - limit + 1 - first)
            first = max(first, last - limit + 1)
            return [origin + k * every for k in range(first, last + 1)], older
        out: list[float] = []
        older = 0
        now = datetime.fromtimestamp(after, UTC) + timedelta(seconds=SAME_FIRE)
        prev: datetime | None = None
        for _ in range(_WALK_LIMIT):  # bounded: a gap of more fires keeps the oldest
            nxt = self._trigger.get_next_fire_time(prev, now)
            if nxt is None:
                break
            ts = nxt.timestamp()
            if ts >= before - SAME_FIRE:
                break
            if ts > after + SAME_FIRE:
                out.append(ts)
                if len(out) > limit:
                    del out[0]
                    older += 1
            prev = nxt
            now = nxt + timedelta(seconds=SAME_FIRE)
        return out, older

    def previous(self, before: float) -> float | None:
        """The latest fire time before ``before`` (None: none within a year)."""
        span = 1.0
        while span <= _YEAR:
            found = self.between(before - span, before, 1)
            if found:
                return found[-1]
            span *= 4
        return None


@dataclass(frozen=True)
class Covered:
    """The earlier fires one run of an item stands for: ``fires``, listed (the newest
    :data:`MAX_COVERS`, oldest first: ``ctx.covers``), and ``before`` more, older
    than those, counted but not listed (``ctx.covered_before``)."""

    fires: tuple[float, ...] = ()
    before: int = 0

    def __post_init__(self) -> None:
        if self.before < 0:
            raise ValueError(f"before={self.before!r}: a count of fires is >= 0")

    def __bool__(self) -> bool:
        return bool(self.fires) or self.before > 0

    def plus(self, more: Iterable[float], before: int = 0) -> Covered:
        """These and the fire times ``more`` (and ``before`` older unlisted ones): the
        newest :data:`MAX_COVERS` listed, the rest counted."""
        merged = sorted({*self.fires, *more})
        cut = max(0, len(merged) - MAX_COVERS)
        return Covered(tuple(merged[cut:]), self.before + before + cut)


def listed(covered: Mapping[int, Covered]) -> dict[int, tuple[float, ...]]:
    """The listed fire times per item (``Batch.covers``), items with any."""
    return {item: c.fires for item, c in covered.items() if c.fires}


def counted(covered: Mapping[int, Covered]) -> dict[int, int]:
    """The older fires counted but not listed per item (``Batch.covered_before``),
    items with any."""
    return {item: c.before for item, c in covered.items() if c.before}


class Coverage:
    """The fires each started item stands for, on one job of this instance (module
    docstring). Its memory of decided fires is its own; everything else is read."""

    def __init__(self, store: CoordinationStore, paths: JobPaths) -> None:
        self._store = store
        self._paths = paths
        self._lock = threading.Lock()
        #: item -> the latest fire time a run started here stands for (its own fire,
        #: or the last fire a misfire re-run folds); a fire folded behind a running
        #: item counts only once its re-run starts
        self._decided: dict[int, float] = {}
        #: items started here whose earlier fires could not be counted (the results
        #: read failed): their runs must not write a result (take_uncounted)
        self._uncounted: set[int] = set()
        #: stretches [first, last] of consecutive schedule fires skipped here because
        #: an operator disabled the job (every item's), oldest first; kept across
        #: sessions: they are facts about the job, not about our membership
        self._held: list[tuple[float, float]] = []
        #: the same for fires of single items an operator disabled
        self._held_items: dict[int, list[tuple[float, float]]] = {}

    def held(self, fire_time: float, schedule: FireSchedule, items: Collection[int] | None) -> None:
        """The schedule's fire at ``fire_time`` was skipped here for an operator's
        reason (the job disabled: ``items`` None; or these disabled ``items``): no
        run covers it (module docstring)."""
        prev = schedule.previous(fire_time)
        with self._lock:
            if items is None:
                _hold(self._held, fire_time, prev)
            else:
                for item in items:
                    _hold(self._held_items.setdefault(item, []), fire_time, prev)

    def forget(self) -> None:
        """A new session or membership: what was decided before says nothing now."""
        with self._lock:
            self._decided.clear()

    def undecided(self, items: Collection[int]) -> None:
        """The runs started here for ``items`` ended without a valid completion
        (fenced, handed off, or their completion refused): the fires they stood for
        may stand nowhere now, so the next start or claim of these items here reads
        their last completed run again instead of trusting what was decided here.
        (A run fenced and handed over by another instance carries no covers: this
        memory kept the next run here from covering them, and a 600 s etcd chaos run
        lost ten fires of a long item that way.)"""
        with self._lock:
            for item in items:
                self._decided.pop(item, None)

    def take_uncounted(self, items: Collection[int]) -> frozenset[int]:
        """Which of ``items``, just started here, could not have their earlier fires
        counted (``gaps`` met a store error): their runs must write no result. Each
        item is told once."""
        with self._lock:
            taken = self._uncounted.intersection(items)
            self._uncounted.difference_update(taken)
        return frozenset(taken)

    def decided(self, items: Collection[int], fire_time: float) -> None:
        """A run started here for ``items`` stands for ``fire_time`` (its own fire, a
        claimed failover's, or the last fire a misfire re-run folds). An item whose
        earlier fires could not be counted stays undecided (``gaps``)."""
        with self._lock:
            for item in items:
                if item in self._uncounted:
                    continue
                if self._decided.get(item, 0.0) < fire_time:
                    self._decided[item] = fire_time

    def gaps(
        self,
        items: Collection[int],
        fire_time: float,
        schedule: FireSchedule,
        *,
        monitored: bool,
        born: Callable[[int], float | None] | None = None,
    ) -> dict[int, Covered]:
        """For items just started for ``fire_time``: the schedule's earlier fires that
        no run stands for yet, per item that has any (module docstring): the newest
        :data:`MAX_COVERS` listed, the older ones counted. ``born``
        says when an item was first due (``Assignment.born``): an item with no
        result is counted from there. One store read at most, and none when every
        item was decided here at its previous fire. Never raises: an unreadable
        result covers nothing (logged)."""
        with self._lock:
            known = {i: self._decided.get(i) for i in items}
        self.decided(items, fire_time)
        prev = schedule.previous(fire_time)
        if prev is None or not monitored:
            return {}
        unknown = [i for i, last in known.items() if last is None or last < prev - SAME_FIRE]
        if not unknown:
            return {}
        try:
            tree = self._store.get_tree(self._paths.results_root)
        except StoreError as exc:
            # Nothing known of these items' earlier fires: this run covers none of
            # them, and must not hide them either. Its completion would write the
            # item's result for this fire, and the fires between the last result and
            # this one would then stand nowhere, for good (600 s etcd chaos run, seed
            # 20261236: a claim of 329 items met a store fault here, and 1,645 pairs
            # were lost without a word). So they stay undecided here and their runs
            # write no result: the next run of each, here or elsewhere, counts from
            # the last result written, and covers this fire as well (at least once).
            with self._lock:
                for item in unknown:
                    before = known[item]
                    if before is None:
                        self._decided.pop(item, None)
                    else:
                        self._decided[item] = before
                self._uncounted.update(unknown)
            log.warning(
                "%s: could not read the item results to find missed fires (%s): the runs "
                "of %d items cover nothing now and write no result, so that their next "
                "runs count the fires they could not",
                self._paths.job,
                exc,
                len(unknown),
            )
            return {}
        stored = self._last_fires(tree)
        out: dict[int, Covered] = {}
        for item in unknown:
            seen = [t for t in (stored.get(item), known[item]) if t is not None]
            if seen:
                if max(seen) >= prev - SAME_FIRE:
                    continue  # no gap
                missed, older = self._missed(item, schedule, max(seen), fire_time)
            else:
                first_due = born(item) if born is not None else None
                if first_due is None:
                    continue  # never ran anywhere, and nothing to count from
                # due from the first fire at or after ``first_due`` (a reshard that
                # applies from the next fire is dated a millisecond after this one)
                missed, older = self._missed(item, schedule, first_due - 1.5 * SAME_FIRE, fire_time)
            if missed:
                out[item] = Covered(tuple(missed), older)
        return out

    def stood_for(
        self, items: Collection[int], fire_time: float, schedule: FireSchedule
    ) -> set[int]:
        """Which of ``items`` a run started here since stands for ``fire_time``: one
        of that very fire, or a later one whose gap held it (a fire of the schedule
        between the item's last decided fire and the start is in the start's covers).
        A misfire re-run of that fire leaves them out. An item whose run ended
        without a valid completion is undecided again (``undecided``), and a new
        session forgets all: they are re-run."""
        # a fire off the schedule (an operator's run-now time) is in no gap
        on_schedule = bool(schedule.between(fire_time - 0.01, fire_time + 0.01, 1))
        with self._lock:
            decided = {i: self._decided.get(i) for i in items}
        return {
            i
            for i, last in decided.items()
            if last is not None
            and (abs(last - fire_time) < SAME_FIRE or (on_schedule and last > fire_time))
        }

    def _missed(
        self, item: int, schedule: FireSchedule, after: float, before: float
    ) -> tuple[list[float], int]:
        """The schedule's fires strictly between ``after`` and ``before`` that no
        operator held here for ``item``: the newest MAX_COVERS, and how many older."""
        with self._lock:
            held = sorted(
                (first, last)
                for first, last in (*self._held, *self._held_items.get(item, ()))
                if last > after and first < before
            )
        # the stretches of (after, before) outside the held ones, oldest first (a
        # held stretch's own ends are held fires: strictly between leaves them out)
        spans: list[tuple[float, float]] = []
        lo = after
        for first, last in held:
            if first > lo:
                spans.append((lo, first))
            lo = max(lo, last)
        spans.append((lo, before))
        fires: list[float] = []
        older = 0
        for lo, hi in reversed(spans):
            got, more = schedule.window(lo, hi, MAX_COVERS - len(fires))
            fires[:0] = got
            older += more
        return fires, older

    def _last_fires(self, tree: dict[str, Node]) -> dict[int, float]:
        root = self._paths.results_root + "/"
        out: dict[int, float] = {}
        for path, node in tree.items():
            name = path[len(root) :] if path.startswith(root) else ""
            if not name.isdigit():
                continue
            try:
                out[int(name)] = ItemResult.from_bytes(node.value, path).fire_time
            except DocumentError:
                continue
        return out


def _hold(stretches: list[tuple[float, float]], fire_time: float, prev: float | None) -> None:
    """Add the held fire ``fire_time`` (whose schedule predecessor is ``prev``) to
    ``stretches``: it extends the stretch that ends at ``prev``, else starts one."""
    for n, (first, last) in enumerate(stretches):
        if first - SAME_FIRE <= fire_time <= last + SAME_FIRE:
            return  # held already
        if prev is not None and abs(last - prev) <= SAME_FIRE:
            stretches[n] = (first, fire_time)
            break
    else:
        stretches.append((fire_time, fire_time))
        stretches.sort()
    del stretches[:-MAX_HELD]
