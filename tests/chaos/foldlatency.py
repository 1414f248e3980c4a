"""Fold latency and starvation of a chaos run: "overload folds, it does not starve".

The measure. For every pair (fire, item) of the schedule inside the window the
checker checks (its strict rules: fire times ``k * P`` in ``[first up + st + P,
stop - max(PRE, work + P)]``, the items the job had then, :class:`checker._Switches`
membership), the pair's *standing latency* is the time from the fire to the start
of the first done run that stands for it: the pair's own run, or a run whose
``covers`` names the fire with an entry the checker finds plausible
(:meth:`checker._Covers.check`). "Done" is the checker's :attr:`Execution.done`
(ended valid, not stopped, not refused; a crashed run ends invalid). Then, per job:

* pairs with the product's ``disabled`` or ``removed`` skip record are left out of
  the latencies and counted (``skipped``), and so are the pairs nothing stands for
  inside an operator's count change whose assignment had no such item (``no such
  item``: the checker's ``_no_such_item``, nothing was due);
* pairs nothing stands for are counted as ``none`` (the judges call them lost, or
  pending at the stop); those claimed only by an implausible covers entry are
  counted among them apart;
* p50 / p99 / max of the latencies (nearest rank, :func:`checker.percentile`), of
  every measured pair and of those outside every operator action's window (a pair
  of an item the operator switched off or cut waits for the switch back, not for the
  product); the pair with the max: its fire, item, the instance of the run that
  stood for it, and the faults and operator commands (of the job or of an instance)
  of the 15 s before its fire and of its wait;
* *starvation*: per item, the wait of each pair outside every operator action's
  window (one inside waits for the operator) runs from its fire to its standing
  run's start or to the item's next done run's start, whichever comes first (a run
  of an older fire serves the item too; for a ``none`` pair only the next run, else
  the stop); the waits that overlap or touch merge into spans ``[a, b)`` in which
  nothing stood for a due fire of the item. A span counts while the item's owner
  (:func:`checker._owner_at`: the instance of its last non-failover run started
  before ``a``) was alive, approximated by its records: from ``a`` to the owner's
  last record (of any job, any phase) in ``[a, b)``; 0 when it wrote none there (a
  dead, frozen or cut-off owner is the failover's business, not starvation; an
  owner alive but idle, with nothing else to run, is missed). The job's figure is
  the longest counted span of any item;
* a verdict against a bound (``--bound-seconds``; by default the checker's stuck
  bound :attr:`checker.Params.stuck_bound`: work + WAIT + 3 st + 2 P): OK when the
  max latency and the longest starvation are within it and no pair is ``none``.

The job parameters come from the run's ``report.txt`` (its ``params:`` line per job
and the ``jobs:`` line's kind and work; like tests/chaos/test_chaos.py's
``job_params``, only sleep, long and stateful jobs have a work in seconds). The
records are read one file at a time (:func:`checker._read_jsonl`) and only the
job's start, end and skip records are kept.

Usage: ``python -m tests.chaos.foldlatency WORKDIR [WORKDIR...] [--bound-seconds S]``.
"""

from __future__ import annotations

import argparse
import bisect
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.checker import (
    INSTANCE_FAULTS,
    OPERATOR_SKIPS,
    STORE_FAULTS,
    Event,
    Execution,
    History,
    Params,
    Skip,
    _Covers,
    _level_owners,
    _no_such_item,
    _owner_at,
    _read_jsonl,
    _skip_reason,
    _Switches,
    executions_from_records,
    percentile,
)

__all__ = [
    "JobMeasure",
    "PairLatency",
    "Starvation",
    "main",
    "measure_job",
    "measure_workdir",
    "read_params",
    "render",
]

#: seconds before a max-latency pair's fire from which its fault events are listed
FAULT_LOOKBACK = 15.0
#: event kinds listed next to the max-latency pair: the faults the checker counts
#: and the operator's commands
FAULT_KINDS = frozenset((*INSTANCE_FAULTS, *STORE_FAULTS, "slow", "self_exit", "down"))
#: the job phases this tool keeps (per job); every record counts as its instance's
#: activity
KEPT_PHASES = ("start", "end", "skip")


@dataclass(frozen=True)
class PairLatency:
    """One pair's standing latency and the run that stood for it."""

    fire: float
    item: int
    latency: float
    instance: str
    #: the run's own fire (the pair's, or a later one whose covers named it)
    run_fire: float
    #: the operator action whose window holds the pair (None: none)
    operator: str | None = None


@dataclass(frozen=True)
class Starvation:
    """The longest span an item waited with its owner alive (see the module docstring)."""

    item: int
    start: float
    end: float
    owner: str
    #: the owner's last record inside the span: the span counted is start..alive_until
    alive_until: float

    @property
    def seconds(self) -> float:
        """The span counted: from its start to the owner's last record inside it."""
        return self.alive_until - self.start


@dataclass
class JobMeasure:
    """The figures of one job of one run."""

    job: str
    params: Params
    bound: float
    pairs: int = 0
    skipped: int = 0
    none: int = 0
    #: of ``none``: pairs named only by implausible covers entries
    none_implausible: int = 0
    latencies: list[float] = field(default_factory=list)
    #: the latencies of the pairs outside every operator action's window
    latencies_clean: list[float] = field(default_factory=list)
    #: pairs the assignment in effect did not have (an operator's count change)
    no_item: int = 0
    #: (fire, item) -> its standing latency (the measured pairs only)
    standing: dict[tuple[float, int], float] = field(default_factory=dict)
    worst: PairLatency | None = None
    #: the faults and operator commands of the 15 s before the worst pair's fire, and
    #: of its wait (each: kind, instance or member, offset from the fire)
    worst_before: list[str] = field(default_factory=list)
    worst_during: list[str] = field(default_factory=list)
    starvation: Starvation | None = None
    #: a few of the ``none`` pairs, for the reader
    none_examples: list[str] = field(default_factory=list)
    first_fire: float = math.nan
    last_fire: float = math.nan

    @property
    def max_latency(self) -> float:
        """The largest standing latency (nan: no pair measured)."""
        return max(self.latencies) if self.latencies else math.nan

    @property
    def starved(self) -> float:
        """The longest starvation span counted (0 for none)."""
        return self.starvation.seconds if self.starvation is not None else 0.0

    @property
    def failures(self) -> list[str]:
        """Why the job fails the bound (empty: it holds)."""
        out = []
        if self.latencies and self.max_latency > self.bound:
            out.append(f"max latency {self.max_latency:.2f}s > {self.bound:g}s")
        if self.starved > self.bound:
            out.append(f"starved {self.starved:.2f}s > {self.bound:g}s")
        if self.none:
            out.append(f"{self.none} pair(s) with nothing standing for them")
        return out

    def verdict(self) -> str:
        """One line: OK or FAIL against the bound, with the figures."""
        why = self.failures
        head = "OK" if not why else "FAIL"
        figures = (
            f"max latency {_fmt(self.max_latency)}s, starved {self.starved:.2f}s, "
            f"none {self.none}, bound {self.bound:g}s"
        )
        return f"VERDICT {self.job or '-'}: {head} ({figures})" + (
            ": " + "; ".join(why) if why else ""
        )


# ---- report.txt ---------------------------------------------------------------------

_HEADER = re.compile(r"^== chaos history check(?:: job (\S+))? ==\s*$")
_FIELD = re.compile(r"(\w+)=([-+0-9.eE]+|inf|nan)s?\b")
_JOB = re.compile(r"([\w.-]+) \((\w+): (\d+) items every ([-+0-9.eE]+)s, work ([-+0-9.eE]+)\)")
_ONE_JOB = re.compile(r", work ([-+0-9.eE]+)s,")
#: the workload kinds whose work is seconds (test_chaos.job_params: the others' is 0)
TIMED_KINDS = ("sleep", "long", "stateful")


def read_params(report: Path) -> dict[str, Params]:
    """The checker's parameters of each job, from a run's ``report.txt``: each
    ``== chaos history check: job NAME ==`` header's ``params:`` line, and the work of
    the job from the ``jobs:`` line (a one-job run: name "", the first line's work)."""
    text = report.read_text()
    works: dict[str, float] = {}
    one_work = 0.0
    for line in text.splitlines():
        if line.startswith("jobs: "):
            for job, kind, _count, _interval, work in _JOB.findall(line):
                works[job] = float(work) if kind in TIMED_KINDS else 0.0
        elif line.startswith("chaos ") and (m := _ONE_JOB.search(line)):
            one_work = float(m.group(1))
    out: dict[str, Params] = {}
    name: str | None = None
    for line in text.splitlines():
        if m := _HEADER.match(line):
            name = m.group(1) or ""
            continue
        if name is not None and line.startswith("params: "):
            f = {k: float(v) for k, v in _FIELD.findall(line)}
            out[name] = Params(
                count=int(f["items"]),
                period=f["period"],
                session_timeout=f["session_timeout"],
                pre=f.get("pre", 0.5),
                slack=f.get("slack", 1.0),
                wait_timeout=f.get("wait", 5.0),
                operation_timeout=f.get("op", 2.0),
                name=name,
                work=works.get(name, one_work if not name else 0.0),
                strict=True,
            )
            name = None
    if not out:
        raise ValueError(f"{report}: no '== chaos history check' section with a params line")
    return out


# ---- reading ------------------------------------------------------------------------


@dataclass
class _Run:
    """A run directory's records, kept per job (start, end and skip records only),
    with every instance's record times and the driver's events."""

    records: dict[str, list[dict[str, Any]]]
    skips: dict[str, list[Skip]]
    activity: dict[str, list[float]]
    events: list[Event]
    assignments: dict[str, list[tuple[float, list[tuple[float, Mapping[int, str]]]]]]


def _record_time(rec: Mapping[str, Any]) -> float | None:
    for key in ("end", "t", "t_end", "start"):
        value = rec.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _read_run(workdir: Path, jobs: Iterable[str]) -> _Run:
    """One pass over the run's files (one file in memory at a time)."""
    wanted = set(jobs)
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    skips: dict[str, list[Skip]] = defaultdict(list)
    activity: dict[str, list[float]] = defaultdict(list)
    for path in sorted(workdir.glob("exec-*.jsonl")):
        for rec in _read_jsonl(path):
            instance = rec.get("instance")
            t = _record_time(rec)
            if instance and t is not None:
                activity[str(instance)].append(t)
            phase = rec.get("phase")
            job = str(rec.get("job", ""))
            if phase not in KEPT_PHASES or job not in wanted:
                continue
            if phase != "skip":
                records[job].append(rec)
                continue
            try:
                skips[job].append(
                    Skip(
                        job=job,
                        instance=str(instance or ""),
                        item=int(rec["item"]),
                        fire=float(rec["fire"]),
                        reason=_skip_reason(rec["reason"]),
                        t=None if rec.get("t") is None else float(rec["t"]),
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue  # a torn line
    for seq in activity.values():
        seq.sort()
    # the events as checker._read_raw reads them (it reads every exec file with them)
    events: list[Event] = []
    assignments: dict[str, list[tuple[float, list[tuple[float, Mapping[int, str]]]]]] = defaultdict(
        list
    )
    events_path = workdir / "events.jsonl"
    if events_path.exists():
        for rec in _read_jsonl(events_path):
            if rec.get("kind") == "assignment":
                job = str(rec.get("job", ""))
                if job in wanted:
                    levels = [
                        (float(eff), _level_owners(own)) for eff, own in rec.get("levels", [])
                    ]
                    assignments[job].append((float(rec["t"]), levels))
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
    events.sort(key=lambda e: e.t)
    return _Run(dict(records), dict(skips), dict(activity), events, dict(assignments))


# ---- measuring ----------------------------------------------------------------------


def checked_fires(p: Params, events: Sequence[Event], execs: Sequence[Execution]) -> list[float]:
    """The fire times the checker's strict rules check (``_check_pairs_strict``
    computes them inline; the same formula): ``[first up + st + P, stop - max(PRE,
    work + P)]``, the stop being the first ``stop`` event (else the last start)."""
    ups = [ev.t for ev in events if ev.kind == "up"]
    if not ups:
        return []
    stops = [ev.t for ev in events if ev.kind == "stop"]
    stop = min(stops) if stops else max((e.start for e in execs), default=0.0)
    k0 = math.ceil((min(ups) + p.session_timeout + p.period) / p.period - 1e-9)
    k1 = math.floor((stop - max(p.pre, p.work + p.period)) / p.period + 1e-9)
    return [round(k * p.period, 3) for k in range(k0, k1 + 1)]


def _stop(events: Sequence[Event], execs: Sequence[Execution]) -> float:
    stops = [ev.t for ev in events if ev.kind == "stop"]
    if stops:
        return min(stops)
    return max([e.start for e in execs] + [ev.t for ev in events] + [0.0])


def _describe(ev: Event, origin: float) -> str:
    who = ev.instance or (f"member {ev.member}" if ev.member >= 0 else "")
    what = ev.kind + (f" {who}" if who else "")
    if ev.kind.startswith("op_"):
        extra = ",".join(f"{k}={v}" for k, v in ev.extra.items() if k in ("job", "item", "new"))
        what += f" [{extra}]" if extra else ""
    return f"{what}@{ev.t - origin:+.2f}s"


def measure_job(
    p: Params,
    records: Iterable[dict[str, Any]],
    skips: Iterable[Skip],
    events: Sequence[Event],
    activity: Mapping[str, Sequence[float]],
    assignments: Sequence[tuple[float, list[tuple[float, Mapping[int, str]]]]] = (),
    bound: float | None = None,
) -> JobMeasure:
    """The figures of one job (see the module docstring); ``events`` sorted by time,
    ``activity`` per instance the sorted times of all its records."""
    execs = executions_from_records(records, events)
    out = JobMeasure(p.name, p, p.stuck_bound if bound is None else bound)
    by_item: dict[int, list[Execution]] = defaultdict(list)
    for e in execs:  # sorted by start
        by_item[e.item].append(e)
    cov = _Covers(p, by_item)
    # the first start of a done run standing for each pair, and that run
    stand: dict[tuple[float, int], Execution] = {}
    implausible: set[tuple[float, int]] = set()

    def offer(key: tuple[float, int], e: Execution) -> None:
        held = stand.get(key)
        if held is None or e.start < held.start:
            stand[key] = e

    for runs in cov.done_by_end.values():
        for e in runs:
            offer(e.key, e)
            for c in e.covers:
                key = (round(c, 3), e.item)
                if cov.check(e, c) is None:
                    offer(key, e)
                else:
                    implausible.add(key)
    operator = {s.key for s in skips if s.reason in OPERATOR_SKIPS}
    history = History(p, execs, list(events), assignments=list(assignments))
    ops = _Switches.of(p, list(events), history)
    fires = checked_fires(p, events, execs)
    stop = _stop(events, execs)
    if fires:
        out.first_fire, out.last_fire = fires[0], fires[-1]
    # the starts of the item's done runs: each stands for its own fire at least, and
    # ends the wait of every fire of the item before it (the item is served)
    served = {item: sorted(e.start for e in runs) for item, runs in cov.done_by_end.items()}
    waits: dict[int, list[tuple[float, float]]] = defaultdict(list)
    worst: tuple[float, float, int, Execution, str | None] | None = None
    for t in fires:
        for item in range(ops.max_items()):
            member, op = ops.membership(p, t, item)
            if not member:
                continue
            out.pairs += 1
            if (t, item) in operator:
                out.skipped += 1
                continue
            run = stand.get((t, item))
            if run is None and op is not None and _no_such_item(p, history, t, item):
                out.no_item += 1  # the checker's OP_NO_ITEM: nothing was due
                continue
            starts = served.get(item, [])
            k = bisect.bisect_left(starts, t)
            nxt = starts[k] if k < len(starts) else max(stop, t)
            if run is None:
                out.none += 1
                out.none_implausible += (t, item) in implausible
                if len(out.none_examples) < 5:
                    out.none_examples.append(f"fire {t:.3f} item {item}")
                if op is None:
                    waits[item].append((t, nxt))
                continue
            latency = run.start - t
            out.latencies.append(latency)
            out.standing[(t, item)] = latency
            if op is None:
                # a pair the operator held back waits for the operator: no starvation
                out.latencies_clean.append(latency)
                waits[item].append((t, min(run.start, nxt)))
            if worst is None or latency > worst[0]:
                worst = (latency, t, item, run, op)
    if worst is not None:
        latency, t, item, e, op = worst
        out.worst = PairLatency(t, item, latency, e.instance, e.fire, op)
        out.worst_before = [
            _describe(ev, t)
            for ev in events
            if t - FAULT_LOOKBACK <= ev.t <= t and _relevant(ev, p.name)
        ]
        out.worst_during = [
            _describe(ev, t) for ev in events if t < ev.t <= e.start and _relevant(ev, p.name)
        ]
    out.starvation = _longest_starvation(waits, by_item, activity)
    return out


def _relevant(ev: Event, job: str) -> bool:
    """A fault (of an instance or a store member), or an operator's command on the
    job or on an instance."""
    if ev.kind in FAULT_KINDS:
        return True
    if not ev.kind.startswith("op_"):
        return False
    return ev.kind.endswith("_instance") or str(ev.extra.get("job", "")) == job


def _longest_starvation(
    waits: Mapping[int, list[tuple[float, float]]],
    by_item: Mapping[int, list[Execution]],
    activity: Mapping[str, Sequence[float]],
) -> Starvation | None:
    """The longest span (see the module docstring) over every item."""
    best: Starvation | None = None
    for item, spans in waits.items():
        merged: list[list[float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        runs = by_item.get(item, [])
        for a, b in merged:
            owner = _owner_at(runs, a)
            if owner is None:
                continue
            seq = activity.get(owner, ())
            # records in [a, b): the run that ends the span starts at b, by the owner
            # as often as not, and says nothing of the span itself
            i = bisect.bisect_left(seq, b) - 1
            if i < 0 or seq[i] < a:
                continue  # no record of the owner inside the span: not alive
            found = Starvation(item, a, b, owner, seq[i])
            if best is None or found.seconds > best.seconds:
                best = found
    return best


def measure_workdir(workdir: Path, bound: float | None = None) -> list[JobMeasure]:
    """Every job of the run in ``workdir`` (its ``report.txt`` names them)."""
    params = read_params(workdir / "report.txt")
    run = _read_run(workdir, params)
    return [
        measure_job(
            p,
            run.records.get(name, []),
            run.skips.get(name, []),
            run.events,
            run.activity,
            run.assignments.get(name, []),
            bound,
        )
        for name, p in params.items()
    ]


# ---- output -------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def render(workdir: Path, measures: Sequence[JobMeasure]) -> str:
    """The figures of each job, then one verdict line per job."""
    lines = [f"== fold latency: {workdir} =="]
    for m in measures:
        lat, clean = m.latencies, m.latencies_clean
        lines.append(
            f"job {m.job or '-'}: period {m.params.period:g}s work {m.params.work:g}s "
            f"st {m.params.session_timeout:g}s wait {m.params.wait_timeout:g}s; fires "
            f"{m.first_fire:.0f}..{m.last_fire:.0f}; pairs {m.pairs}: measured {len(lat)}, "
            f"skipped (disabled/removed) {m.skipped}, no such item {m.no_item}, none {m.none}"
            + (f" (claimed only by implausible covers: {m.none_implausible})" if m.none else "")
        )
        lines.append(
            f"  standing latency p50 {_fmt(percentile(lat, 0.5))}s p99 "
            f"{_fmt(percentile(lat, 0.99))}s max {_fmt(m.max_latency)}s; outside operator "
            f"windows ({len(clean)} pairs): p50 {_fmt(percentile(clean, 0.5))}s p99 "
            f"{_fmt(percentile(clean, 0.99))}s max {_fmt(max(clean, default=math.nan))}s"
        )
        if m.worst is not None:
            w = m.worst
            lines.append(
                f"  max pair: fire {w.fire:.3f} item {w.item}, {w.latency:.2f}s, run on "
                f"{w.instance} (its fire {w.run_fire:.3f})"
                + (f", inside {w.operator}" if w.operator else "")
            )
            lines.append(
                f"    events {FAULT_LOOKBACK:g}s before the fire: "
                f"{', '.join(m.worst_before) or 'none'}"
            )
            lines.append(f"    events during its wait: {', '.join(m.worst_during) or 'none'}")
        if m.none_examples:
            lines.append(f"  none: {', '.join(m.none_examples)}" + (" ..." if m.none > 5 else ""))
        s = m.starvation
        if s is None:
            lines.append("  starvation: no span with a live owner")
        else:
            lines.append(
                f"  starvation: {s.seconds:.2f}s, item {s.item} owned by {s.owner}: nothing "
                f"standing {s.start:.3f}..{s.end:.3f} ({s.end - s.start:.2f}s), the owner's "
                f"last record inside at {s.alive_until:.3f}"
            )
    lines += [m.verdict() for m in measures]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the measure of each run directory; 1 when a job fails its bound."""
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.foldlatency", description=__doc__)
    ap.add_argument("workdirs", nargs="+", type=Path, metavar="WORKDIR")
    ap.add_argument(
        "--bound-seconds",
        type=float,
        default=None,
        help="the bound of the verdict (default: each job's work + wait + 3 st + 2 P)",
    )
    args = ap.parse_args(argv)
    failed = False
    for workdir in args.workdirs:
        measures = measure_workdir(workdir, args.bound_seconds)
        print(render(workdir, measures), flush=True)
        failed = failed or any(m.failures for m in measures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
