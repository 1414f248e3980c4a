"""History checker for the chaos runs: no lost work, no overlap, no stuck state.

Inputs (all written by the chaos driver into one directory, see :func:`load_history`):

* ``exec-*.jsonl``: one file per worker process (tests/jobs/worker.py). Each execution
  appends a ``start`` record and, if the process lives long enough, an ``end`` record
  (with ``valid`` = what ``ctx.is_valid()`` said at the end). Records carry instance,
  item, fire time, fencing token, execution id, failover and misfire flags.
* ``events.jsonl``: the driver's log, one JSON object per line with ``t`` (wall clock,
  the same clock the workers use) and ``kind``:
  ``up`` (instance, pid: READY), ``kill`` (kill -9), ``freeze`` / ``thaw`` (SIGSTOP /
  SIGCONT), ``term`` (graceful stop asked), ``down`` (the process is gone),
  ``store_kill`` / ``store_up`` (member index), ``quiet`` (faults are over and every
  instance and member is back), ``stop`` (the driver stops the cluster).
* ``snapshots.jsonl``: registry reads taken during the quiet period: the assignment
  (owner of each item), the job's registered instances, running marks
  (item -> instance) and failover-queue entries (item -> instance it came from).

Definitions (``st`` = session timeout, ``P`` = trigger period, ``PRE`` and ``SLACK``
are :class:`Params` fields, printed in the report):

* Fire times are ``k * P`` (interval triggers are anchored at the epoch). The
  checked fire times are those in ``[first up + st + P, stop - PRE]``; the items are
  ``0..count-1``.
* An execution "ran" when it has an ``end`` record; it is "valid" when that record
  says ``valid=true``. An execution without an ``end`` record was interrupted; its
  interval ends when its process went ``down``.
* Owner of item ``i`` at time ``t``: the instance of the latest non-failover
  execution of ``i`` that started before ``t`` (the assignment is only observable
  through what instances run; failover runs do not move ownership).
* Fault windows. A fault of instance X at ``f`` (kill, freeze or graceful stop) makes
  the fire times in ``[f - PRE, f + recover]`` unhealthy for every item owned by X at
  ``f``: ``recover`` is ``st + P + SLACK`` for kill and freeze (the store notices the
  death after one session timeout, the leader reshards at the next trigger), and
  ``(down - f) + P + SLACK`` for a graceful stop (the instance leaves once its items
  finished; the others reshard at the next trigger). ``PRE`` covers a trigger that
  fired just before the fault but whose items the owner had not yet marked running:
  nobody else knows such a fire happened. While an item stays orphaned (no run of it
  with a later fire has started), any further fault (of the leader, say) extends its
  window by that fault's ``recover``. A store member kill makes ``[f - PRE, f + st +
  P + SLACK]`` unhealthy for every item (clients of that member are SUSPENDED and do
  not start items until they reconnect; a leader election leaves the store without
  quorum; a request caught in it ends at the operation timeout, which the driver
  keeps at the session timeout). A fire time with no instance up and unfrozen is
  unhealthy for all items.
  A fire time at which an earlier fire of the item had not finished (its run was
  executing, or its trigger was still waiting, e.g. for a reshard held up by a dead
  instance's running marks, so the run started after ``t``) is coalesced by the
  misfire rule (the item runs once more, not once per missed fire; an item running
  elsewhere is skipped): excused and counted.

Assertions:

1. no lost work: every (fire, item) at a healthy fire time has a valid run; and every
   (fire, item) that ever started (even in an unhealthy window) has a valid run
   somewhere, because a started execution leaves a running mark that failover must
   pick up. A run that ended with ``valid=false`` on an instance that was never
   frozen while it ran (fenced because the store was silent, session kept) is
   accepted only inside a store-fault window; it is counted as "fenced, no takeover".
2. no overlap: no two executions of one item overlap in time unless one of them ended
   with ``valid=false`` (a zombie whose session was lost: it was told so); those are
   counted and listed. Fencing tokens of non-overlapping executions of an item grow
   in start order.
3. no stuck state: after ``quiet``, within ``st + 2 P + SLACK`` a snapshot shows every
   item owned by a live instance, the registered instances equal the live ones, and
   no running mark or failover-queue entry names a dead instance; every later
   snapshot too.
4. failover latency per kill -9 (reported, not asserted): for each execution the
   victim had started and not ended, the time from the kill to the first start of
   the same (fire, item) on another instance. Same for freezes (takeover latency).
"""

from __future__ import annotations

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

INSTANCE_FAULTS = ("kill", "freeze", "term")
STORE_FAULTS = ("store_kill",)


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

    @property
    def crash_recover(self) -> float:
        """Seconds after a kill/freeze/store fault until its items must run again."""
        return self.session_timeout + self.period + self.slack


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

    @property
    def key(self) -> tuple[float, int]:
        """(fire time rounded to ms, item)."""
        return (round(self.fire, 3), self.item)

    def describe(self) -> str:
        """One line for the report."""
        end = f"{self.end:.3f}" if self.end is not None else f"(died {self.until:.3f})"
        kind = "failover" if self.failover else "misfire" if self.misfire else "normal"
        return (
            f"item {self.item} fire {self.fire:.3f} on {self.instance} [{kind}] "
            f"{self.start:.3f}..{end} token {self.token} valid={self.valid}"
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


@dataclass
class Report:
    """The checker's findings; :meth:`render` for people, :attr:`ok` for asserts."""

    params: Params
    lost: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    zombie_overlaps: list[str] = field(default_factory=list)
    token_order: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    fenced_no_takeover: list[str] = field(default_factory=list)
    failover_latency: list[float] = field(default_factory=list)
    takeover_latency: list[float] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    excused: dict[str, int] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No lost work, no unexcused overlap, no token disorder, no stuck state."""
        return not (self.lost or self.overlaps or self.token_order or self.stuck)

    def render(self, limit: int = 25) -> str:
        """A readable multi-line report."""
        p = self.params
        s = self.stats
        lines = [
            "== chaos history check ==",
            f"params: items={p.count} period={p.period:g}s session_timeout="
            f"{p.session_timeout:g}s pre={p.pre:g}s slack={p.slack:g}s",
            f"fire times checked: {s.get('fires', 0)} ({s.get('first_fire', 0):.0f}.."
            f"{s.get('last_fire', 0):.0f}); (fire, item) pairs: {s.get('pairs', 0)}, "
            f"with a valid run: {s.get('covered', 0)}",
            f"executions: {s.get('executions', 0)} started, {s.get('ended', 0)} ended "
            f"({s.get('normal', 0)} normal, {s.get('failover', 0)} failover, "
            f"{s.get('misfire', 0)} misfire), {s.get('interrupted', 0)} interrupted by "
            f"kill -9, {s.get('invalid', 0)} ended with valid=false; "
            f"duplicated (fire, item): {s.get('duplicates', 0)}",
            "faults: " + (", ".join(f"{k}={v}" for k, v in s.get("fault_counts", {}).items())),
            "excused (fire, item) pairs: "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.excused.items())) or "none"),
            _latency_line("failover latency after kill -9", self.failover_latency),
            _latency_line("takeover latency after freeze", self.takeover_latency),
            f"overlaps excused (zombie, valid=false): {len(self.zombie_overlaps)}",
            f"fenced without takeover (inside store-fault windows): {len(self.fenced_no_takeover)}",
        ]
        if s.get("stuck_clean_after") is not None:
            lines.append(f"registry clean {s['stuck_clean_after']:.2f}s after quiet")
        sections = [
            ("LOST WORK", self.lost),
            ("OVERLAPS", self.overlaps),
            ("FENCING TOKEN ORDER", self.token_order),
            ("STUCK STATE", self.stuck),
            ("zombie overlaps (excused)", self.zombie_overlaps),
            ("fenced without takeover (excused)", self.fenced_no_takeover),
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
    events_path = workdir / "events.jsonl"
    if events_path.exists():
        for rec in _read_jsonl(events_path):
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
    snap_path = workdir / "snapshots.jsonl"
    if snap_path.exists():
        for rec in _read_jsonl(snap_path):
            snapshots.append(
                Snapshot(
                    t=float(rec["t"]),
                    owners={int(k): str(v) for k, v in rec.get("owners", {}).items()},
                    registered=frozenset(rec.get("registered", [])),
                    running={int(k): str(v) for k, v in rec.get("running", {}).items()},
                    queued={int(k): str(v) for k, v in rec.get("queued", {}).items()},
                )
            )
    return History(params, executions_from_records(records, events), events, snapshots)


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
        ex = out.get(k)
        if ex is None:  # the start line was torn: rebuild from the end record
            ex = Execution(
                instance=k[0],
                item=int(rec["item"]),
                fire=float(rec["fire"]),
                token=int(rec.get("token", 0)),
                execution_id=k[1],
                failover=bool(rec.get("failover", False)),
                misfire=bool(rec.get("misfire", False)),
                start=k[2],
            )
            out[k] = ex
        ex.end = float(rec["end"])
        ex.valid = bool(rec.get("valid", True))
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
        if ev.kind in (*INSTANCE_FAULTS, *STORE_FAULTS):
            counts[ev.kind] += 1
    report.stats["fault_counts"] = dict(counts)

    by_key: dict[tuple[float, int], list[Execution]] = defaultdict(list)
    by_item: dict[int, list[Execution]] = defaultdict(list)
    for ex in execs:
        by_key[ex.key].append(ex)
        by_item[ex.item].append(ex)

    frozen = _frozen_intervals(events)
    store_windows = [
        _Window(ev.t - p.pre, ev.t + p.crash_recover, f"store member {ev.member} killed")
        for ev in events
        if ev.kind in STORE_FAULTS
    ]

    _check_started_work(report, by_key, frozen, store_windows)
    _check_fired_work(report, history, events, by_key, by_item, store_windows)
    _check_overlaps(report, by_item)
    _check_stuck(report, history, events)
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
        duplicates=sum(
            1 for runs in by_key.values() if sum(1 for e in runs if e.valid is True) > 1
        ),
    )
    return report


def _describe_event(ev: Event) -> str:
    who = ev.instance or (f"member {ev.member}" if ev.member >= 0 else "")
    extra = " ".join(f"{k}={v}" for k, v in ev.extra.items())
    return f"{ev.t:.3f} {ev.kind} {who} {extra}".rstrip()


def _frozen_intervals(events: list[Event]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    since: dict[str, float] = {}
    for ev in events:
        if ev.kind == "freeze":
            since[ev.instance] = ev.t
        elif ev.kind == "thaw" and ev.instance in since:
            out[ev.instance].append((since.pop(ev.instance), ev.t))
    for inst, t in since.items():
        out[inst].append((t, math.inf))
    return out


def _inside(t: float, windows: Iterable[_Window]) -> _Window | None:
    for w in windows:
        if w.start <= t <= w.end:
            return w
    return None


def _check_started_work(
    report: Report,
    by_key: dict[tuple[float, int], list[Execution]],
    frozen: dict[str, list[tuple[float, float]]],
    store_windows: list[_Window],
) -> None:
    """A started (fire, item) left a running mark: it must end validly somewhere."""
    for key, runs in sorted(by_key.items()):
        if any(e.valid is True for e in runs):
            continue
        fenced = [e for e in runs if e.valid is False]
        spurious = [
            e
            for e in fenced
            if not any(a < (e.end or math.inf) and e.start < b for a, b in frozen[e.instance])
        ]
        if spurious and all(_inside(e.start, store_windows) for e in spurious):
            report.fenced_no_takeover += [e.describe() for e in spurious]
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
    faults = [ev for ev in events if ev.kind in (*INSTANCE_FAULTS, *STORE_FAULTS)]

    def recover(ev: Event) -> float:
        if ev.kind == "term":
            return downs.get(ev.instance, ev.t) - ev.t + p.period + p.slack
        return p.crash_recover

    out: dict[int, list[_Window]] = defaultdict(list)
    for item, runs in by_item.items():
        for ev in faults:
            if ev.kind in STORE_FAULTS or _owner_at(runs, ev.t) != ev.instance:
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


def _nobody_healthy(events: list[Event]) -> list[_Window]:
    """Intervals in which no instance was up and unfrozen."""
    healthy: set[str] = set()
    out: list[_Window] = []
    since: float | None = None
    seen_up = False
    for ev in events:
        if ev.kind == "up":
            healthy.add(ev.instance)
            seen_up = True
        elif ev.kind == "thaw":
            healthy.add(ev.instance)
        elif ev.kind in ("kill", "freeze", "term", "down"):
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
    store_windows: list[_Window],
) -> None:
    p = history.params
    ups = [ev.t for ev in events if ev.kind == "up"]
    stops = [ev.t for ev in events if ev.kind == "stop"]
    if not ups:
        return
    first = math.ceil((min(ups) + p.session_timeout + p.period) / p.period) * p.period
    last_t = (min(stops) if stops else max(e.start for e in history.executions)) - p.pre
    fires = [
        round(k * p.period, 3)
        for k in range(math.ceil(first / p.period), math.floor(last_t / p.period) + 1)
    ]
    per_item = _instance_windows(p, events, by_item)
    nobody = _nobody_healthy(events)
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
            if _inside(t, nobody):
                excused["no healthy instance"] += 1
            elif _inside(t, store_windows):
                excused["store member fault"] += 1
            elif w := _inside(t, per_item.get(item, [])):
                excused[w.reason.split(" of ")[0] + " of owner"] += 1
            elif _busy(by_item.get(item, []), t):
                excused["coalesced: earlier fire still pending or running"] += 1
            else:
                owner = _owner_at(by_item.get(item, []), t)
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


def _busy(runs: list[Execution], t: float) -> bool:
    """Whether an earlier fire of the item had not finished at ``t``: it was running,
    or it had fired and its run had not started yet (its trigger was waiting for a
    reshard). The misfire rule then coalesces the fire at ``t``."""
    return any(e.fire < t and (e.start > t or e.start < t < e.until) for e in runs)


def _context(t: float, events: list[Event]) -> str:
    """The driver events around ``t`` (for a lost-work line)."""
    near = [ev for ev in events if t - 8 <= ev.t <= t + 2 and ev.kind != "up"]
    return "events: " + (", ".join(f"{ev.kind}@{ev.t - t:+.2f}s" for ev in near) or "none")


def _check_overlaps(report: Report, by_item: dict[int, list[Execution]]) -> None:
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
                line = f"{a.describe()} || {b.describe()}"
                if a.valid is False or b.valid is False:
                    report.zombie_overlaps.append(line)
                else:
                    report.overlaps.append(line)


def _live_at(events: list[Event], t: float) -> set[str]:
    live: set[str] = set()
    for ev in events:
        if ev.t > t:
            break
        if ev.kind in ("up", "thaw"):
            live.add(ev.instance)
        elif ev.kind in ("kill", "freeze", "term", "down"):
            live.discard(ev.instance)
    return live


def _check_stuck(report: Report, history: History, events: list[Event]) -> None:
    p = history.params
    quiet = [ev.t for ev in events if ev.kind == "quiet"]
    if not quiet:
        return
    q = max(quiet)
    live = _live_at(events, q)
    deadline = q + p.session_timeout + 2 * p.period + p.slack
    snaps = sorted((s for s in history.snapshots if s.t >= q), key=lambda s: s.t)
    if not snaps or snaps[-1].t < deadline:
        report.stuck.append(
            f"no registry snapshot after the deadline {deadline - q:.1f}s past quiet "
            "(the quiet period was too short to judge)"
        )
        return
    clean_since: float | None = None
    last_problems: list[str] = []
    for snap in snaps:
        problems = _snapshot_problems(snap, live, p.count)
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


def _snapshot_problems(snap: Snapshot, live: set[str], count: int) -> list[str]:
    out: list[str] = []
    unowned = [i for i in range(count) if snap.owners.get(i) not in live]
    if unowned:
        out.append(f"items {unowned} not owned by a live instance ({snap.owners})")
    if snap.registered != live:
        out.append(f"registered {sorted(snap.registered)} != live {sorted(live)}")
    dead_running = {i: o for i, o in snap.running.items() if o not in live}
    if dead_running:
        out.append(f"running marks of dead instances {dead_running}")
    dead_queued = {i: o for i, o in snap.queued.items() if o not in live}
    if dead_queued:
        out.append(f"failover queue entries from dead instances {dead_queued}")
    return out


def _latencies(
    report: Report,
    events: list[Event],
    execs: list[Execution],
    by_key: dict[tuple[float, int], list[Execution]],
) -> None:
    for ev in events:
        if ev.kind not in ("kill", "freeze"):
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
                target = report.failover_latency if ev.kind == "kill" else report.takeover_latency
                target.append(min(later) - ev.t)
