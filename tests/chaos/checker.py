"""History checker for the chaos runs: no lost work, no unfenced overlap, no stuck state.

Inputs (all written by the chaos driver into one directory, see :func:`load_history`):

* ``exec-*.jsonl``: one file per worker process (tests/jobs/worker.py). Each execution
  appends a ``start`` record and, if the process lives long enough, an ``end`` record
  with ``valid`` (what ``ctx.is_valid()`` said at the end), ``valid_through`` (the
  time just before the last check of ``ctx.is_valid()`` that said true; the worker
  checks it every 50 ms while it works) and ``invalid_at`` (the first check that said
  false). Records carry instance, item, fire time, fencing token, execution id,
  failover and misfire flags. The worker also appends ``state`` records (every
  connection-state change of its store, with its time) and an ``exit`` record when its
  runtime stopped (by itself or asked to).
* ``events.jsonl``: the driver's log, one JSON object per line with ``t`` (wall clock,
  the same clock the workers use) and ``kind``: ``up`` (instance READY), ``kill``
  (kill -9), ``freeze`` / ``thaw`` (SIGSTOP / SIGCONT), ``partition`` / ``heal``
  (the instance's network namespace cut off / reconnected), ``slow`` / ``fast`` (its
  link through the slow proxy on / off), ``term`` (graceful stop asked), ``down`` (the
  process is gone), ``self_exit`` (the driver found the process gone without having
  stopped it), ``store_kill`` / ``store_up`` and ``store_isolate`` / ``store_rejoin``
  (member index; ``leader`` says whether it led), ``store_leader`` (a leader is
  serving again after a leader's loss), ``quiet`` (faults are over and every instance
  and member is back), ``stop`` (the driver stops the cluster).
* ``snapshots.jsonl``: registry reads taken during the quiet period: the assignment
  (owner of each item), the job's registered instances, running marks
  (item -> instance) and failover-queue entries (item -> instance it came from).

Definitions (``st`` = session timeout, ``P`` = trigger period; ``PRE``, ``SLACK``,
``WAIT`` (the sharding wait timeout) and ``OP`` (the operation timeout) are
:class:`Params` fields, printed in the report):

* Fire times are ``k * P``. The checked fire times are those in ``[first up + st + P,
  stop - PRE]``; the items are ``0..count-1``.
* An execution "ran" when it has an ``end`` record; it is "valid" when that record
  says ``valid=true``. An execution without an ``end`` record was interrupted; its
  interval ends when its process went ``down``.
* Owner of item ``i`` at time ``t``: the instance of the latest non-failover
  execution of ``i`` that started before ``t``.
* Disconnected: an instance's store is disconnected from a ``suspended`` or ``lost``
  state record until the next ``connected``/``reconnected`` one (measured by the
  instance itself).

Excuses, each counted by reason and in total (the report prints the excused fraction
of the run's (fire, item) pairs). Only what the evidence supports is excused:

* Instance fault windows. A kill, freeze or partition of instance X at ``f`` makes
  the fire times in ``[f - PRE, f + st + P + SLACK]`` unhealthy for every item owned
  by X at ``f`` (the store notices the death after one session timeout, the leader
  reshards at the next trigger); a graceful stop ``[f - PRE, down + P + SLACK]``.
  While the item stays orphaned, further faults extend the window. A heal, a thaw or
  a restart excuses nothing: rejoining must not lose fires.
* Store faults, narrowed to the evidence: (a) the owner's store was disconnected at
  the fire, or became disconnected within ``OP`` after it (its start commit was in
  flight when the member died or lost its peers), for at most ``st + P + SLACK``
  from the start of the disconnection (then its session has expired and the others
  must have taken its items); (b) while the store had no leader:
  from a leader's kill or isolation to the ``store_leader`` event (measured by the
  driver), plus ``PRE`` on both sides. A follower's loss excuses only (a).
* No instance up, unfrozen and not partitioned at the fire: all items.
* Coalesced: at the fire, an earlier fire of the item was demonstrably executing (a
  run with an earlier fire time covers the fire time), or its trigger was waiting (a
  normal or misfire run of an earlier fire started after the fire time, within
  ``WAIT + P + SLACK`` of its fire time). A late failover run is not evidence: the
  fires between an orphaned fire and its failover run had nothing running.

Findings (each one fails the run):

1. Lost work: a (fire, item) at a checked fire time without a valid run and without
   an excuse; a (fire, item) that started somewhere and never ended validly (a
   fenced run without takeover is accepted, counted and listed only when its
   instance's store was disconnected during the run).
2. Unfenced overlaps: two executions of one item overlap in time and both sides said
   ``ctx.is_valid()`` true during the overlap (checked against ``valid_through``):
   a partitioned or frozen instance must see the flag turn false before another
   instance starts its item. Overlaps in which one side had already seen false are
   fenced zombies: counted and listed as explained.
3. Fencing tokens of non-overlapping valid executions of an item grow in start order.
4. Unexplained duplicates: a (fire, item) with two valid runs where the later one is
   not a failover re-run after a fault of the earlier run's instance (kill, freeze,
   partition, graceful stop, its store disconnected, or a store member fault) between
   the two starts. Explained duplicates are counted and listed.
5. Stuck state after quiet: from ``3 st + 2 P + SLACK`` after ``quiet`` (long enough
   for session expiry, a failover pass and a repair), every snapshot must show every
   item owned by a live instance, registered instances equal to the live ones, no
   running mark or failover-queue entry naming a dead instance, and no phantom mark:
   a running mark naming a live instance that has no execution of that item in
   progress (within ``SLACK``).
6. Self-shutdowns: an instance that stopped without the driver asking.
7. Not rejoined: an instance healed from a partition that starts no execution within
   ``3 st + 2 P + SLACK`` of the heal (while it was not faulted again and the run
   went on): it must rejoin without a restart and get items again.

Reported, counted and listed but not failing the run: sessions lost by instances that
were neither frozen nor partitioned then (a store member's kill or isolation, a slow
link: the client did not move on in time, and its items failed over needlessly).

Reported: failover latency per kill -9 (time from the kill to the first start of an
orphaned (fire, item) on another instance), takeover latency after freezes and after
partitions (p50/p95/max).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Event",
    "Execution",
    "History",
    "Params",
    "Report",
    "Snapshot",
    "check",
    "load_history",
    "percentile",
]

INSTANCE_FAULTS = ("kill", "freeze", "term", "partition")
STORE_FAULTS = ("store_kill", "store_isolate")
#: events after which an instance is not healthy until it is back
UNHEALTHY = ("kill", "freeze", "term", "down", "partition", "self_exit")
#: events after which it is healthy again
HEALTHY = ("up", "thaw", "heal")
DISCONNECTED = ("suspended", "lost")


@dataclass(frozen=True)
class Params:
    """What the checker needs to know about the run (all in seconds, except count)."""

    count: int
    period: float = 1.0
    session_timeout: float = 2.0
    #: before a fault: a fire whose items the victim had not marked running yet
    pre: float = 0.5
    #: scheduling slack on a loaded machine (event delivery, JVM/etcd pauses)
    slack: float = 1.0
    #: the job's sharding_wait_timeout: how long a trigger may wait for a reshard
    wait_timeout: float = 5.0
    #: the registry's operation timeout: how long a commit may stay in flight
    operation_timeout: float = 2.0

    @property
    def crash_recover(self) -> float:
        """Seconds after a kill/freeze/partition until its items must run again."""
        return self.session_timeout + self.period + self.slack

    @property
    def quiet_deadline(self) -> float:
        """Seconds after quiet from which the registry must be clean."""
        return 3 * self.session_timeout + 2 * self.period + self.slack


@dataclass
class Execution:
    """One execution of one item by one instance (start record + optional end)."""

    instance: str
    item: int
    fire: float
    token: int
    execution_id: str
    failover: bool
    misfire: bool
    start: float
    end: float | None = None
    valid: bool | None = None
    #: end of the interval used for overlap checks (end, or when the process died)
    until: float = math.inf
    #: time just before the last ctx.is_valid() check that said true (None: unknown)
    valid_through: float | None = None
    #: time of the first ctx.is_valid() check that said false (None: never)
    invalid_at: float | None = None

    @property
    def key(self) -> tuple[float, int]:
        """(fire time rounded to ms, item)."""
        return (round(self.fire, 3), self.item)

    @property
    def believed_valid_until(self) -> float:
        """Until when the execution believed it was valid (and could act on it)."""
        if self.valid_through is not None:
            return self.valid_through
        if self.end is None:
            return self.until  # interrupted: it could act until it died
        # a record without the periodic checks: its only check was at the end
        return self.end if self.valid else -math.inf

    def describe(self) -> str:
        """One line for the report."""
        end = f"{self.end:.3f}" if self.end is not None else f"(died {self.until:.3f})"
        kind = "failover" if self.failover else "misfire" if self.misfire else "normal"
        fenced = f" invalid_at {self.invalid_at:.3f}" if self.invalid_at is not None else ""
        return (
            f"item {self.item} fire {self.fire:.3f} on {self.instance} [{kind}] "
            f"{self.start:.3f}..{end} token {self.token} valid={self.valid}{fenced}"
        )


@dataclass(frozen=True)
class Event:
    """One driver event."""

    t: float
    kind: str
    instance: str = ""
    member: int = -1
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """The registry state of the job at time ``t``."""

    t: float
    owners: dict[int, str]
    registered: frozenset[str]
    running: dict[int, str]
    queued: dict[int, str]


@dataclass
class History:
    """Everything the checker reads."""

    params: Params
    executions: list[Execution]
    events: list[Event]
    snapshots: list[Snapshot] = field(default_factory=list)
    #: per instance: (time, state) of every connection-state change of its store
    states: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    #: (instance, time) of every runtime stop the workers recorded
    exits: list[tuple[str, float]] = field(default_factory=list)
    #: (time, owner levels) of every assignment the driver saw: levels are
    #: (effective fire, {item: instance}), newest first (Assignment.owners_for)
    assignments: list[tuple[float, list[tuple[float, dict[int, str]]]]] = field(
        default_factory=list
    )
    #: (time, error) of every registry read of the observer that failed
    snapshot_errors: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Report:
    """The checker's findings; :meth:`render` for people, :attr:`ok` for asserts."""

    params: Params
    lost: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    zombie_overlaps: list[str] = field(default_factory=list)
    token_order: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    explained_duplicates: list[str] = field(default_factory=list)
    self_shutdowns: list[str] = field(default_factory=list)
    not_rejoined: list[str] = field(default_factory=list)
    spurious_session_loss: list[str] = field(default_factory=list)
    fenced_no_takeover: list[str] = field(default_factory=list)
    failover_latency: list[float] = field(default_factory=list)
    takeover_latency: list[float] = field(default_factory=list)
    partition_latency: list[float] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    excused: dict[str, int] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No lost work, no unfenced overlap, no token disorder, no unexplained
        duplicate, no stuck state, no self-shutdown, every healed instance back."""
        return not (
            self.lost
            or self.overlaps
            or self.token_order
            or self.stuck
            or self.duplicates
            or self.self_shutdowns
            or self.not_rejoined
        )

    @property
    def excused_fraction(self) -> float:
        """Excused (fire, item) pairs over all checked pairs."""
        pairs = int(self.stats.get("pairs", 0))
        return sum(self.excused.values()) / pairs if pairs else 0.0

    def render(self, limit: int = 25) -> str:
        """A readable multi-line report."""
        p = self.params
        s = self.stats
        lines = [
            "== chaos history check ==",
            f"params: items={p.count} period={p.period:g}s session_timeout="
            f"{p.session_timeout:g}s pre={p.pre:g}s slack={p.slack:g}s "
            f"wait={p.wait_timeout:g}s op={p.operation_timeout:g}s",
            f"fire times checked: {s.get('fires', 0)} ({s.get('first_fire', 0):.0f}.."
            f"{s.get('last_fire', 0):.0f}); (fire, item) pairs: {s.get('pairs', 0)}, "
            f"with a valid run: {s.get('covered', 0)}",
            f"SUMMARY pairs={s.get('pairs', 0)} lost={len(self.lost)} "
            f"duplicated={s.get('duplicates', 0)} (unexplained {len(self.duplicates)}) "
            f"overlaps: unfenced={len(self.overlaps)} fenced-zombie="
            f"{len(self.zombie_overlaps)} stuck-after-quiet={len(self.stuck)} "
            f"self-shutdowns={len(self.self_shutdowns)} "
            f"not-rejoined={len(self.not_rejoined)} "
            f"sessions-lost-without-instance-fault={len(self.spurious_session_loss)} "
            f"excused={100 * self.excused_fraction:.1f}% of pairs",
            f"executions: {s.get('executions', 0)} started, {s.get('ended', 0)} ended "
            f"({s.get('normal', 0)} normal, {s.get('failover', 0)} failover, "
            f"{s.get('misfire', 0)} misfire), {s.get('interrupted', 0)} interrupted by "
            f"kill -9, {s.get('invalid', 0)} ended with valid=false",
            "faults: " + (", ".join(f"{k}={v}" for k, v in s.get("fault_counts", {}).items())),
            f"excused (fire, item) pairs: {sum(self.excused.values())} of "
            f"{s.get('pairs', 0)} ({100 * self.excused_fraction:.1f}%): "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.excused.items())) or "none"),
            _latency_line("failover latency after kill -9", self.failover_latency),
            _latency_line("takeover latency after freeze", self.takeover_latency),
            _latency_line("takeover latency after partition", self.partition_latency),
            f"fenced without takeover (store disconnected during the run): "
            f"{len(self.fenced_no_takeover)}",
        ]
        if s.get("stuck_clean_after") is not None:
            lines.append(f"registry clean {s['stuck_clean_after']:.2f}s after quiet")
        sections = [
            ("LOST WORK", self.lost),
            ("UNFENCED OVERLAPS (both sides valid)", self.overlaps),
            ("FENCING TOKEN ORDER", self.token_order),
            ("UNEXPLAINED DUPLICATES", self.duplicates),
            ("STUCK STATE", self.stuck),
            ("SELF-SHUTDOWNS", self.self_shutdowns),
            ("NOT REJOINED AFTER HEAL", self.not_rejoined),
            (
                "sessions lost without an instance fault (reported, not failed)",
                self.spurious_session_loss,
            ),
            ("fenced-zombie overlaps (explained)", self.zombie_overlaps),
            ("duplicates (explained)", self.explained_duplicates),
            ("fenced without takeover (explained)", self.fenced_no_takeover),
            ("fault timeline", self.faults),
        ]
        for title, items in sections:
            if items:
                lines.append(f"-- {title}: {len(items)}")
                lines += [f"   {x}" for x in items[:limit]]
                if len(items) > limit:
                    lines.append(f"   ... {len(items) - limit} more")
        lines.append("RESULT: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank method; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _latency_line(title: str, values: list[float]) -> str:
    if not values:
        return f"{title}: no samples"
    return (
        f"{title}: n={len(values)} p50={percentile(values, 0.5):.2f}s "
        f"p95={percentile(values, 0.95):.2f}s max={max(values):.2f}s"
    )


# ---- loading ----------------------------------------------------------------------


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the last line of a process killed mid-write
        if isinstance(rec, dict):
            yield rec


def load_history(workdir: Path, params: Params) -> History:
    """Read ``exec-*.jsonl``, ``events.jsonl`` and ``snapshots.jsonl`` from ``workdir``."""
    records: list[dict[str, Any]] = []
    for path in sorted(workdir.glob("exec-*.jsonl")):
        records += _read_jsonl(path)
    events: list[Event] = []
    assignments: list[tuple[float, list[tuple[float, dict[int, str]]]]] = []
    events_path = workdir / "events.jsonl"
    if events_path.exists():
        for rec in _read_jsonl(events_path):
            if rec.get("kind") == "assignment":
                levels = [
                    (float(eff), {int(k): str(v) for k, v in dict(own).items()})
                    for eff, own in rec.get("levels", [])
                ]
                assignments.append((float(rec["t"]), levels))
                continue
            events.append(
                Event(
                    t=float(rec["t"]),
                    kind=str(rec["kind"]),
                    instance=str(rec.get("instance", "")),
                    member=int(rec.get("member", -1)),
                    extra={
                        k: v for k, v in rec.items() if k not in ("t", "kind", "instance", "member")
                    },
                )
            )
    snapshots: list[Snapshot] = []
    snapshot_errors: list[tuple[float, str]] = []
    snap_path = workdir / "snapshots.jsonl"
    if snap_path.exists():
        for rec in _read_jsonl(snap_path):
            if "error" in rec:
                snapshot_errors.append((float(rec["t"]), str(rec["error"])))
                continue
            snapshots.append(
                Snapshot(
                    t=float(rec["t"]),
                    owners={int(k): str(v) for k, v in rec.get("owners", {}).items()},
                    registered=frozenset(rec.get("registered", [])),
                    running={int(k): str(v) for k, v in rec.get("running", {}).items()},
                    queued={int(k): str(v) for k, v in rec.get("queued", {}).items()},
                )
            )
    states: dict[str, list[tuple[float, str]]] = defaultdict(list)
    exits: list[tuple[str, float]] = []
    for rec in records:
        if rec.get("phase") == "state":
            states[str(rec["instance"])].append((float(rec["t"]), str(rec["state"])))
        elif rec.get("phase") == "exit":
            exits.append((str(rec["instance"]), float(rec["t"])))
    for seq in states.values():
        seq.sort()
    return History(
        params,
        executions_from_records(records, events),
        events,
        snapshots,
        states=dict(states),
        exits=exits,
        snapshot_errors=snapshot_errors,
        assignments=assignments,
    )


def _assigned_owner(
    assignments: list[tuple[float, list[tuple[float, dict[int, str]]]]],
    fire: float,
    item: int,
    horizon: float,
) -> str | None:
    """The instance the assignment gave ``item`` for ``fire``, as the last assignment
    seen up to ``horizon`` says (each assignment keeps the owners in effect for recent
    fires, so the last one answers for a fire an earlier reshard already covered)."""
    chosen: list[tuple[float, dict[int, str]]] | None = None
    for t, levels in assignments:
        if t > horizon:
            break
        chosen = levels
    if not chosen:
        return None
    kept = [(eff, own) for eff, own in chosen if own]
    for eff, own in kept:
        if fire >= eff - 1e-6:
            return own.get(item)
    return kept[-1][1].get(item) if kept else None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def executions_from_records(
    records: Iterable[dict[str, Any]], events: Iterable[Event] = ()
) -> list[Execution]:
    """Pair start and end records into executions; an execution without an end runs
    until its instance went ``down`` (or forever if it never did)."""
    down = _first_down(events)
    out: dict[tuple[str, str, float], Execution] = {}
    ends: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("phase") == "start":
            ex = Execution(
                instance=str(rec["instance"]),
                item=int(rec["item"]),
                fire=float(rec["fire"]),
                token=int(rec.get("token", 0)),
                execution_id=str(rec.get("execution_id", "")),
                failover=bool(rec.get("failover", False)),
                misfire=bool(rec.get("misfire", False)),
                start=float(rec["start"]),
            )
            out[(ex.instance, ex.execution_id, ex.start)] = ex
        elif rec.get("phase") == "end":
            ends.append(rec)
    for rec in ends:
        k = (str(rec["instance"]), str(rec.get("execution_id", "")), float(rec["start"]))
        found = out.get(k)
        if found is None:  # the start line was torn: rebuild from the end record
            found = Execution(
                instance=k[0],
                item=int(rec["item"]),
                fire=float(rec["fire"]),
                token=int(rec.get("token", 0)),
                execution_id=k[1],
                failover=bool(rec.get("failover", False)),
                misfire=bool(rec.get("misfire", False)),
                start=k[2],
            )
            out[k] = found
        found.end = float(rec["end"])
        found.valid = bool(rec.get("valid", True))
        found.valid_through = _opt_float(rec.get("valid_through"))
        found.invalid_at = _opt_float(rec.get("invalid_at"))
    for ex in out.values():
        ex.until = ex.end if ex.end is not None else down.get(ex.instance, math.inf)
    return sorted(out.values(), key=lambda e: (e.start, e.instance))


def _first_down(events: Iterable[Event]) -> dict[str, float]:
    down: dict[str, float] = {}
    for ev in events:
        if ev.kind == "down" and ev.instance:
            down.setdefault(ev.instance, ev.t)
    return down


# ---- checking -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    start: float
    end: float
    reason: str


def check(history: History) -> Report:
    """Run every check on ``history`` (see the module docstring)."""
    p = history.params
    report = Report(p)
    events = sorted(history.events, key=lambda e: e.t)
    execs = history.executions
    down = _first_down(events)
    for ex in execs:
        # an interrupted execution lasted until its process died
        ex.until = ex.end if ex.end is not None else down.get(ex.instance, math.inf)
    report.faults = [_describe_event(ev) for ev in events if ev.kind not in ("up",)]
    counts: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev.kind in (*INSTANCE_FAULTS, *STORE_FAULTS, "slow", "self_exit"):
            counts[ev.kind] += 1
    report.stats["fault_counts"] = dict(counts)

    by_key: dict[tuple[float, int], list[Execution]] = defaultdict(list)
    by_item: dict[int, list[Execution]] = defaultdict(list)
    for ex in execs:
        by_key[ex.key].append(ex)
        by_item[ex.item].append(ex)

    disconnected = _disconnected_intervals(history.states, events)
    leaderless = _leaderless_windows(p, events)

    _check_started_work(report, by_key, disconnected, leaderless, _fault_intervals(events))
    _check_fired_work(report, history, events, by_key, by_item, disconnected, leaderless)
    _check_overlaps(report, by_item)
    _check_duplicates(report, events, by_key, disconnected)
    _check_stuck(report, history, events)
    _check_self_shutdowns(report, history, events)
    _check_rejoined(report, p, events, execs)
    _spurious_session_losses(report, p, history, events)
    _latencies(report, events, execs, by_key)

    ended = [e for e in execs if e.end is not None]
    report.stats.update(
        executions=len(execs),
        ended=len(ended),
        normal=sum(1 for e in ended if not e.failover and not e.misfire),
        failover=sum(1 for e in ended if e.failover),
        misfire=sum(1 for e in ended if e.misfire),
        interrupted=sum(1 for e in execs if e.end is None),
        invalid=sum(1 for e in ended if e.valid is False),
    )
    return report


def _describe_event(ev: Event) -> str:
    who = ev.instance or (f"member {ev.member}" if ev.member >= 0 else "")
    extra = " ".join(f"{k}={v}" for k, v in ev.extra.items())
    return f"{ev.t:.3f} {ev.kind} {who} {extra}".rstrip()


def _disconnected_intervals(
    states: dict[str, list[tuple[float, str]]], events: list[Event]
) -> dict[str, list[tuple[float, float]]]:
    """Per instance: when its store was not connected, from its own state records.
    An interval still open ends when the instance went down."""
    down = _first_down(events)
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for inst, seq in states.items():
        since: float | None = None
        for t, state in seq:
            if state in DISCONNECTED:
                if since is None:
                    since = t
            elif since is not None:
                out[inst].append((since, t))
                since = None
        if since is not None:
            out[inst].append((since, down.get(inst, math.inf)))
    return out


def _leaderless_windows(p: Params, events: list[Event]) -> list[_Window]:
    """From the loss of the store's leader (killed or isolated) until the driver saw a
    leader serving again (or st + P + SLACK when it logged none), PRE on both sides."""
    out: list[_Window] = []
    for n, ev in enumerate(events):
        if ev.kind not in STORE_FAULTS or not ev.extra.get("leader"):
            continue
        back = next(
            (e.t for e in events[n + 1 :] if e.kind == "store_leader"), ev.t + p.crash_recover
        )
        out.append(_Window(ev.t - p.pre, back + p.pre, "store without a leader"))
    return out


def _fault_intervals(events: list[Event]) -> dict[str, list[tuple[float, float]]]:
    """Per instance: frozen (freeze..thaw) and partitioned (partition..heal) intervals."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    since: dict[tuple[str, str], float] = {}
    for ev in events:
        if ev.kind in ("freeze", "partition"):
            since[(ev.instance, ev.kind)] = ev.t
        elif ev.kind == "thaw" and (ev.instance, "freeze") in since:
            out[ev.instance].append((since.pop((ev.instance, "freeze")), ev.t))
        elif ev.kind == "heal" and (ev.instance, "partition") in since:
            out[ev.instance].append((since.pop((ev.instance, "partition")), ev.t))
    for (inst, _kind), t in since.items():
        out[inst].append((t, math.inf))
    return out


def _inside(t: float, windows: Iterable[_Window]) -> _Window | None:
    for w in windows:
        if w.start <= t <= w.end:
            return w
    return None


def _overlaps(a: float, b: float, intervals: Iterable[tuple[float, float]]) -> bool:
    return any(x < b and a < y for x, y in intervals)


def _check_started_work(
    report: Report,
    by_key: dict[tuple[float, int], list[Execution]],
    disconnected: dict[str, list[tuple[float, float]]],
    leaderless: list[_Window],
    faulted: dict[str, list[tuple[float, float]]],
) -> None:
    """A started (fire, item) left a running mark: it must end validly somewhere. A
    run fenced while its own store was disconnected (the session kept, nobody took
    over) is accepted and listed, unless its instance was frozen or partitioned then
    (its session expired: failover had to take the item over)."""
    for key, runs in sorted(by_key.items()):
        if any(e.valid is True for e in runs):
            continue
        fenced = [e for e in runs if e.valid is False]
        explained = [
            e
            for e in fenced
            if not _overlaps(e.start, e.end or math.inf, faulted.get(e.instance, []))
            and (
                _overlaps(e.start, e.end or math.inf, disconnected.get(e.instance, []))
                or any(e.start < w.end and w.start < (e.end or math.inf) for w in leaderless)
            )
        ]
        if fenced and len(explained) == len(runs):
            report.fenced_no_takeover += [e.describe() for e in explained]
            continue
        report.lost.append(
            f"started but never completed validly: fire {key[0]:.3f} item {key[1]}: "
            + "; ".join(e.describe() for e in runs)
        )


def _owner_at(runs: list[Execution], t: float) -> str | None:
    owner = None
    for e in runs:  # sorted by start
        if e.start > t:
            break
        if not e.failover:
            owner = e.instance
    return owner


def _instance_windows(
    p: Params, events: list[Event], by_item: dict[int, list[Execution]]
) -> dict[int, list[_Window]]:
    """Per item: the unhealthy windows caused by faults of its owner (chained)."""
    downs = _first_down(events)
    faults = [ev for ev in events if ev.kind in INSTANCE_FAULTS]

    def recover(ev: Event) -> float:
        if ev.kind == "term":
            return downs.get(ev.instance, ev.t) - ev.t + p.period + p.slack
        return p.crash_recover

    out: dict[int, list[_Window]] = defaultdict(list)
    for item, runs in by_item.items():
        for ev in faults:
            if _owner_at(runs, ev.t) != ev.instance:
                continue
            end = ev.t + recover(ev)
            # the item stays orphaned until a run of it with a later fire starts
            back = min(
                (e.start for e in runs if e.fire > ev.t and e.start > ev.t), default=math.inf
            )
            changed = True
            while changed:
                changed = False
                for other in faults:
                    if ev.t < other.t <= end and other.t < back:
                        new_end = max(end, other.t + recover(other))
                        if new_end > end:
                            end, changed = new_end, True
            out[item].append(_Window(ev.t - p.pre, end, f"{ev.kind} of owner {ev.instance}"))
    return out


def _fault_windows(p: Params, events: list[Event]) -> dict[str, list[_Window]]:
    """Per instance: the windows in which its own faults excuse its fires."""
    downs = _first_down(events)
    out: dict[str, list[_Window]] = defaultdict(list)
    for ev in events:
        if ev.kind not in INSTANCE_FAULTS:
            continue
        if ev.kind == "term":
            end = ev.t + downs.get(ev.instance, ev.t) - ev.t + p.period + p.slack
        else:
            end = ev.t + p.crash_recover
        out[ev.instance].append(_Window(ev.t - p.pre, end, f"{ev.kind} of owner {ev.instance}"))
    return out


def _nobody_healthy(events: list[Event]) -> list[_Window]:
    """Intervals in which no instance was up, unfrozen and not partitioned."""
    healthy: set[str] = set()
    out: list[_Window] = []
    since: float | None = None
    seen_up = False
    for ev in events:
        if ev.kind in HEALTHY:
            healthy.add(ev.instance)
            seen_up = seen_up or ev.kind == "up"
        elif ev.kind in UNHEALTHY:
            healthy.discard(ev.instance)
        if seen_up and not healthy and since is None:
            since = ev.t
        elif healthy and since is not None:
            out.append(_Window(since, ev.t, "no healthy instance"))
            since = None
    if since is not None:
        out.append(_Window(since, math.inf, "no healthy instance"))
    return out


def _check_fired_work(
    report: Report,
    history: History,
    events: list[Event],
    by_key: dict[tuple[float, int], list[Execution]],
    by_item: dict[int, list[Execution]],
    disconnected: dict[str, list[tuple[float, float]]],
    leaderless: list[_Window],
) -> None:
    p = history.params
    ups = [ev.t for ev in events if ev.kind == "up"]
    stops = [ev.t for ev in events if ev.kind == "stop"]
    if not ups:
        report.lost.append("no instance ever came up: the history is empty, nothing was checked")
        return
    first = math.ceil((min(ups) + p.session_timeout + p.period) / p.period) * p.period
    last_t = (min(stops) if stops else max(e.start for e in history.executions)) - p.pre
    fires = [
        round(k * p.period, 3)
        for k in range(math.ceil(first / p.period), math.floor(last_t / p.period) + 1)
    ]
    per_item = _instance_windows(p, events, by_item)
    per_instance = _fault_windows(p, events)
    nobody = _nobody_healthy(events)
    # a disconnected owner excuses its fires only until its session could have
    # expired and the others resharded (st + P + slack): later fires must run elsewhere
    clipped = {
        inst: [(a, min(b, a + p.crash_recover)) for a, b in spans]
        for inst, spans in disconnected.items()
    }
    excused: dict[str, int] = defaultdict(int)
    covered = 0
    for t in fires:
        for item in range(p.count):
            runs = by_key.get((t, item), [])
            if any(e.valid is True for e in runs):
                covered += 1
                continue
            if runs:
                continue  # started: judged by _check_started_work
            owner = _owner_at(by_item.get(item, []), t)
            if _inside(t, nobody):
                excused["no healthy instance"] += 1
            elif _inside(t, leaderless):
                excused["store without a leader (measured)"] += 1
            elif owner is not None and _overlaps(
                t, t + p.operation_timeout, clipped.get(owner, [])
            ):
                excused["owner's store disconnected (measured)"] += 1
            elif w := _inside(t, per_item.get(item, [])):
                excused[w.reason.split(" of ")[0] + " of owner"] += 1
            elif _busy(p, by_item.get(item, []), t):
                excused["coalesced: earlier fire running or waiting"] += 1
            elif (
                (assigned := _assigned_owner(history.assignments, t, item, t + p.wait_timeout))
                is not None
                and assigned != owner
                and (
                    (w := _inside(t, per_instance.get(assigned, [])))
                    or _overlaps(t, t + p.operation_timeout, clipped.get(assigned, []))
                )
            ):
                # a reshard had just given the item to an instance hit by a fault
                # before it could start it (the runs alone still name the old owner)
                kind = w.reason.split(" of ")[0] if w else "store disconnected"
                excused[f"{kind} of the newly assigned owner"] += 1
            else:
                report.lost.append(
                    f"never ran: fire {t:.3f} item {item} (last owner {owner}; "
                    f"{_context(t, events)})"
                )
    report.excused = dict(excused)
    report.stats.update(
        fires=len(fires),
        first_fire=fires[0] if fires else 0.0,
        last_fire=fires[-1] if fires else 0.0,
        pairs=len(fires) * p.count,
        covered=covered,
    )


def _busy(p: Params, runs: list[Execution], t: float) -> bool:
    """Whether an earlier fire of the item demonstrably had not finished at ``t``: a
    run of it was executing at ``t``, or its trigger was waiting at ``t`` (a normal or
    misfire run of it started after ``t``, within the sharding wait of its fire). A
    failover run is no evidence: it re-runs an orphan, nothing ran in between."""
    bound = p.wait_timeout + p.period + p.slack
    for e in runs:
        if e.fire >= t:
            continue
        if e.start < t < e.until:
            return True
        if not e.failover and e.start > t and e.start - e.fire <= bound:
            return True
    return False


def _context(t: float, events: list[Event]) -> str:
    """The driver events around ``t`` (for a lost-work line)."""
    near = [ev for ev in events if t - 8 <= ev.t <= t + 2 and ev.kind != "up"]
    return "events: " + (", ".join(f"{ev.kind}@{ev.t - t:+.2f}s" for ev in near) or "none")


def _check_overlaps(report: Report, by_item: dict[int, list[Execution]]) -> None:
    """Unfenced overlap: both sides believed they were valid at some moment of the
    overlap. Otherwise the side that had already seen false is a fenced zombie."""
    for _item, runs in sorted(by_item.items()):
        ordered = sorted(runs, key=lambda e: e.start)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if b.start >= a.until:
                    if a.valid is not False and b.valid is not False and b.token <= a.token:
                        report.token_order.append(
                            f"token did not grow: {a.describe()} then {b.describe()}"
                        )
                    continue
                overlap_start = b.start
                line = f"{a.describe()} || {b.describe()}"
                both_valid = (
                    a.believed_valid_until >= overlap_start
                    and b.believed_valid_until >= overlap_start
                )
                if both_valid:
                    report.overlaps.append(line)
                else:
                    report.zombie_overlaps.append(line)


def _instance_faulted(
    inst: str,
    a: float,
    b: float,
    events: list[Event],
    disconnected: dict[str, list[tuple[float, float]]],
) -> str | None:
    """Why ``inst`` may have lost track of a run between ``a`` and ``b`` (or None)."""
    for ev in events:
        if a <= ev.t <= b and (
            (ev.instance == inst and ev.kind in (*INSTANCE_FAULTS, "self_exit"))
            or ev.kind in STORE_FAULTS
        ):
            return f"{ev.kind}@{ev.t:.3f}"
    if _overlaps(a, b, disconnected.get(inst, [])):
        return "its store disconnected"
    return None


def _check_duplicates(
    report: Report,
    events: list[Event],
    by_key: dict[tuple[float, int], list[Execution]],
    disconnected: dict[str, list[tuple[float, float]]],
) -> None:
    """A (fire, item) that ran more than once (fenced runs included) is listed; it is
    explained by a fenced zombie, or by a failover re-run after a fault of the first
    run's instance. Two valid runs without such a fault are unexplained."""
    count = 0
    for key, runs in sorted(by_key.items()):
        ran = sorted((e for e in runs if e.end is not None), key=lambda e: e.start)
        if len(ran) < 2:
            continue
        count += 1
        valid = [e for e in ran if e.valid is True]
        reasons: list[str] = []
        if any(e.valid is False for e in ran):
            reasons.append("fenced zombie")
        for earlier, later in itertools.pairwise(valid):
            why = (
                _instance_faulted(
                    earlier.instance, earlier.start, later.start, events, disconnected
                )
                if later.failover
                else None
            )
            if why is None:
                reasons = []
                break
            reasons.append(f"failover after {why}")
        line = f"fire {key[0]:.3f} item {key[1]}: " + "; ".join(e.describe() for e in ran)
        if reasons or len(valid) < 2:
            report.explained_duplicates.append(f"{line} [{', '.join(reasons) or 'fenced'}]")
        else:
            report.duplicates.append(line)
    report.stats["duplicates"] = count


def _live_at(events: list[Event], t: float) -> set[str]:
    live: set[str] = set()
    for ev in events:
        if ev.t > t:
            break
        if ev.kind in HEALTHY:
            live.add(ev.instance)
        elif ev.kind in UNHEALTHY:
            live.discard(ev.instance)
    return live


def _check_stuck(report: Report, history: History, events: list[Event]) -> None:
    p = history.params
    quiet = [ev.t for ev in events if ev.kind == "quiet"]
    if not quiet:
        return
    q = max(quiet)
    live = _live_at(events, q)
    deadline = q + p.quiet_deadline
    snaps = sorted((s for s in history.snapshots if s.t >= q), key=lambda s: s.t)
    if not snaps or snaps[-1].t < deadline:
        errors = [e for t, e in history.snapshot_errors if t >= q]
        report.stuck.append(
            f"no registry snapshot after the deadline {deadline - q:.1f}s past quiet "
            + (
                f"({len(errors)} reads failed, the last: {errors[-1]})"
                if errors
                else "(the quiet period was too short to judge)"
            )
        )
        return
    in_progress: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for ex in history.executions:
        in_progress[(ex.instance, ex.item)].append((ex.start - p.slack, ex.until + p.slack))
    clean_since: float | None = None
    last_problems: list[str] = []
    for snap in snaps:
        problems = _snapshot_problems(snap, live, p.count, in_progress)
        if problems:
            if snap.t > deadline or clean_since is not None:
                report.stuck.append(
                    f"{snap.t - q:+.2f}s after quiet: " + "; ".join(problems) + f" (live: {live})"
                )
            clean_since = None
            last_problems = problems
        elif clean_since is None:
            clean_since = snap.t
    if clean_since is None or clean_since > deadline:
        report.stuck.append("registry never clean within the deadline: " + "; ".join(last_problems))
    else:
        report.stats["stuck_clean_after"] = clean_since - q


def _snapshot_problems(
    snap: Snapshot,
    live: set[str],
    count: int,
    in_progress: dict[tuple[str, int], list[tuple[float, float]]],
) -> list[str]:
    out: list[str] = []
    unowned = [i for i in range(count) if snap.owners.get(i) not in live]
    if unowned:
        out.append(f"items {unowned} not owned by a live instance ({snap.owners})")
    if snap.owners and not set(snap.owners.values()) & live:
        out.append("the assignment names only dead instances")
    if snap.registered != live:
        out.append(f"registered {sorted(snap.registered)} != live {sorted(live)}")
    dead_running = {i: o for i, o in snap.running.items() if o not in live}
    if dead_running:
        out.append(f"running marks of dead instances {dead_running}")
    phantom = {
        i: o
        for i, o in snap.running.items()
        if o in live and not any(a <= snap.t <= b for a, b in in_progress.get((o, i), []))
    }
    if phantom:
        out.append(f"phantom running marks of live instances (nothing in progress) {phantom}")
    dead_queued = {i: o for i, o in snap.queued.items() if o not in live}
    if dead_queued:
        out.append(f"failover queue entries from dead instances {dead_queued}")
    return out


def _check_self_shutdowns(report: Report, history: History, events: list[Event]) -> None:
    """An instance whose runtime stopped (exit record, or the driver found it gone)
    without the driver asking (term, or the final stop)."""
    asked: dict[str, float] = {}
    stop = min((ev.t for ev in events if ev.kind == "stop"), default=math.inf)
    for ev in events:
        if ev.kind in ("term", "kill"):
            asked.setdefault(ev.instance, ev.t)
    seen: set[str] = set()
    for inst, t in history.exits:
        if t < stop and not asked.get(inst, math.inf) <= t and inst not in seen:
            seen.add(inst)
            report.self_shutdowns.append(f"{inst} stopped by itself at {t:.3f}")
    for ev in events:
        if ev.kind == "self_exit" and ev.instance not in seen:
            seen.add(ev.instance)
            report.self_shutdowns.append(
                f"{ev.instance} found gone at {ev.t:.3f} (exit code {ev.extra.get('code')})"
            )


def _check_rejoined(report: Report, p: Params, events: list[Event], execs: list[Execution]) -> None:
    """After a heal the instance must run items again, without a restart."""
    stop = min((ev.t for ev in events if ev.kind == "stop"), default=math.inf)
    for ev in events:
        if ev.kind != "heal":
            continue
        deadline = ev.t + p.quiet_deadline
        interrupted = any(
            ev.t < other.t <= deadline
            and other.instance == ev.instance
            and other.kind in (*INSTANCE_FAULTS, "down", "self_exit")
            for other in events
        )
        if interrupted or deadline > stop:
            continue
        if not any(e.instance == ev.instance and ev.t < e.start <= deadline for e in execs):
            report.not_rejoined.append(
                f"{ev.instance} healed at {ev.t:.3f} started nothing within {p.quiet_deadline:g}s"
            )


def _spurious_session_losses(
    report: Report, p: Params, history: History, events: list[Event]
) -> None:
    """LOST on an instance that was not frozen or partitioned (up to a session timeout
    and slack before): its store client did not keep the session through a store or
    network fault that left the store with a quorum."""
    faulted = _fault_intervals(events)
    for inst, seq in sorted(history.states.items()):
        for t, state in seq:
            if state != "lost":
                continue
            if any(a <= t <= b + p.session_timeout + p.slack for a, b in faulted.get(inst, [])):
                continue
            report.spurious_session_loss.append(
                f"{inst} lost its session at {t:.3f} ({_context(t, events)})"
            )


def _latencies(
    report: Report,
    events: list[Event],
    execs: list[Execution],
    by_key: dict[tuple[float, int], list[Execution]],
) -> None:
    targets = {
        "kill": report.failover_latency,
        "freeze": report.takeover_latency,
        "partition": report.partition_latency,
    }
    for ev in events:
        if ev.kind not in targets:
            continue
        orphans = [
            e
            for e in execs
            if e.instance == ev.instance and e.start <= ev.t and (e.end is None or e.end > ev.t)
        ]
        for orphan in orphans:
            later = [
                e.start for e in by_key[orphan.key] if e.instance != ev.instance and e.start > ev.t
            ]
            if later:
                targets[ev.kind].append(min(later) - ev.t)
