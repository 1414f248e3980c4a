"""The demo's story, step by step, each step checked and bounded.

1. start a throw-away ZooKeeper (or etcd) server with :mod:`shardkeeper.testing`;
2. start three worker processes and show the assignment the leader wrote to
   ``/jobs/demo-orders/sharding`` and a trigger that ran all 8 items as assigned;
3. start a fourth worker and show the reshard at the next trigger;
4. ``kill -9`` a worker in the middle of an item and show the item taken over by a
   survivor (failover) and the assignment after the reshard, again fully covered;
5. stop the survivors with SIGTERM (graceful), check the registry is clean, and
   print a summary: executions per item, failover and reshard times.

Every wait has a deadline; a step that does not happen raises :class:`DemoFailure`
with what was expected and what was seen. Whatever happens (error, Ctrl-C,
SIGTERM), :meth:`Story.close` kills every worker's process group and the server.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from demo import ITEM_PARAMETERS, JOB_NAME
from demo.journal import Event, JournalReader
from demo.output import Output, escape
from demo.worker import demo_config
from shardkeeper.coordination.model import Assignment
from shardkeeper.coordination.paths import job_paths
from shardkeeper.coordination.snapshot import JobSnapshot, read_instances, read_snapshot
from shardkeeper.errors import StoreError
from shardkeeper.localregistry import ServerCluster, local_cluster
from shardkeeper.registry import CoordinationStore, open_store
from shardkeeper.runtime.execute.batch import FIRE_LEAD

__all__ = ["FAST", "NORMAL", "DemoFailure", "Story", "Timing"]

T = TypeVar("T")

ITEMS = sorted(ITEM_PARAMETERS)


class DemoFailure(Exception):
    """A step of the story did not happen (the message says which and what was seen)."""


@dataclass(frozen=True)
class Timing:
    """The pace of the demo.

    ``cron`` fires every ``period`` seconds on every instance at the same wall-clock
    second (a cron trigger, unlike an interval, is aligned across processes), each
    item takes ``work`` seconds, and a dead instance's session ends after
    ``session_timeout`` seconds.
    """

    cron: str
    period: float
    work: float
    session_timeout: float
    grace: float


#: the pace of ``make demo``
NORMAL = Timing(cron="*/2 * * * * *", period=2.0, work=1.0, session_timeout=2.0, grace=5.0)
#: a quicker pace for the test suite
FAST = Timing(cron="* * * * * *", period=1.0, work=0.6, session_timeout=1.5, grace=3.0)


@dataclass
class Worker:
    """One worker process and what the story knows about it."""

    name: str
    popen: subprocess.Popen[bytes]
    journal: JournalReader
    log_path: Path
    instance_id: str = ""
    ready_at: float | None = None
    killed_at: float | None = None
    stopping: bool = False
    stopped_event: bool = False

    @property
    def pid(self) -> int:
        """The worker's process id (also its process group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """The process has not exited."""
        return self.popen.poll() is None


@dataclass
class FireLine:
    """Starts recorded for one fire time (for the live feed)."""

    fire: float
    runs: dict[int, str] = field(default_factory=dict)
    printed: bool = False


class Story:
    """Runs the demo (see module docstring). Use :meth:`run`, then always :meth:`close`."""

    def __init__(self, backend: str, timing: Timing, workdir: Path, out: Output) -> None:
        self.backend = backend
        self.timing = timing
        self.workdir = workdir
        self.out = out
        self.cluster: ServerCluster | None = None
        self.store: CoordinationStore | None = None
        self.url = ""
        self.workers: list[Worker] = []
        self.events: list[Event] = []
        self.assignments: list[Assignment] = []
        self.fires: dict[float, FireLine] = {}
        self.failover_times: list[tuple[int, str, float]] = []
        self.reshard_times: list[tuple[str, float]] = []
        self.stop_times: dict[str, float] = {}
        self.paths = job_paths(JOB_NAME)
        self.sharding_wait = demo_config(timing.cron).sharding_wait_timeout
        #: things that went wrong without stopping the story (reported at the end)
        self.problems: list[str] = []

    # -- the story ------------------------------------------------------------------

    def run(self) -> None:
        """Tell the whole story; raises DemoFailure when a step does not happen."""
        t = self.timing
        self.out.say(
            f"job [bold]{JOB_NAME}[/bold]: {len(ITEMS)} items, cron '{t.cron}' "
            f"(every {t.period:g}s), {t.work:g}s of work per item, failover on, "
            f"session timeout {t.session_timeout:g}s"
        )
        self._start_registry()
        self._first_three()
        self._fourth_joins()
        self._kill_one()
        self._stop_all()
        self._summary()
        if self.problems:
            raise DemoFailure(f"{len(self.problems)} problem(s) seen: " + "; ".join(self.problems))

    def _start_registry(self) -> None:
        self.out.heading(f"1. a local {self.backend} registry")
        self.cluster = local_cluster(self.backend, self.workdir / self.backend, timeout=60.0)
        self.cluster.start()
        self.url = self.cluster.url(
            "demo",
            session_timeout=self.timing.session_timeout,
            connection_timeout=5.0,
            # at most the session timeout, as the registry URL requires
            operation_timeout=self.timing.session_timeout,
        )
        self.store = open_store(self.url)
        self.store.start()
        self.out.ok(
            f"{self.backend} serves on {self.cluster.hosts_string} "
            f"(ready in {self.cluster.start_seconds or 0:.1f}s); registry URL [bold]"
            f"{escape(self.url)}[/bold]"
        )

    def _first_three(self) -> None:
        self.out.heading("2. three instances share the 8 items")
        for name in ("w1", "w2", "w3"):
            self._spawn(name)
        self._wait_ready(self.workers)
        ids = {w.instance_id for w in self.workers}
        assignment = self._wait(
            lambda: self._assignment_over(ids),
            30.0,
            "an assignment of all 8 items over w1, w2 and w3",
        )
        first_ready = min(w.ready_at or 0.0 for w in self.workers)
        self._show_assignment(assignment, "after w1, w2, w3 started")
        self.reshard_times.append(
            (
                "first assignment over 3 instances (from the first ready)",
                assignment.at - first_ready,
            )
        )
        self._check_reshard_trigger(assignment, after=first_ready)

    def _fourth_joins(self) -> None:
        self.out.heading("3. a fourth instance joins: the leader reshards at the next trigger")
        before = self._current()
        w4 = self._spawn("w4")
        self._wait_ready([w4])
        joined = w4.ready_at or time.time()
        ids = {w.instance_id for w in self.workers}
        assignment = self._wait(
            lambda: self._assignment_over(ids, newer_than=before.generation),
            self.timing.period * 3 + 15,
            "a new assignment that includes w4",
        )
        self._show_assignment(assignment, "after w4 joined", previous=before)
        self.reshard_times.append(("reshard after w4 joined", assignment.at - joined))
        self._check_reshard_trigger(assignment, after=joined)

    def _kill_one(self) -> None:
        self.out.heading("4. kill -9 an instance in the middle of an item: failover")
        before = self._current()
        leader = self._leader()
        picked = self._wait(
            lambda: self._busy_victim(exclude=leader),
            6 * self.timing.period + 10,
            "a moment when an instance other than the leader is in the middle of an item",
        )
        victim, running = picked
        victim.killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        victim.popen.wait(timeout=10)
        self._poll()
        # what the victim had started and not finished when it died (its last lines)
        in_flight = self._in_flight(victim)
        if not in_flight:
            in_flight = running
        items = ", ".join(f"{i} ({ITEM_PARAMETERS[i]})" for i in sorted(in_flight))
        self.out.say(
            f"[bold red]kill -9[/bold red] {victim.name} (pid {victim.pid}) while it runs "
            f"item(s) {items}; leader is {self._name(leader or '')}"
        )
        self.out.say(
            f"its session ends after {self.timing.session_timeout:g}s; then the leader queues "
            "its unfinished items and a survivor claims each one as soon as it is idle; "
            f"until the leader reshards at a later trigger, {victim.name}'s items run only "
            "through failover"
        )
        killed_at = victim.killed_at
        expected = set(in_flight)
        deadline = self.timing.session_timeout + 4 * self.timing.period + 15
        taken = self._wait(
            lambda: self._taken_over(victim, expected, killed_at),
            deadline,
            f"failover of item(s) {sorted(expected)} from {victim.name}",
        )
        for item, event in sorted(taken.items()):
            delay = event.t - killed_at
            same = event.execution_id == in_flight[item]
            self.failover_times.append((item, event.worker, delay))
            self.out.ok(
                f"item {item} ({ITEM_PARAMETERS[item]}) taken over by {event.worker} "
                f"{delay:.2f}s after the kill (failover run of the trigger of "
                f"{_hms(event.fire)}; same execution id: {'yes' if same else 'NO'})"
            )
        survivors = {w.instance_id for w in self.workers if w.alive()}
        assignment = self._wait(
            lambda: self._assignment_over(survivors, newer_than=before.generation),
            self.timing.session_timeout + 4 * self.timing.period + 20,
            f"a new assignment without {victim.name}",
        )
        self._show_assignment(assignment, f"after {victim.name} died", previous=before)
        self.reshard_times.append(
            (f"reshard after {victim.name} was killed", assignment.at - killed_at)
        )
        self._check_reshard_trigger(assignment, after=killed_at)

    def _check_reshard_trigger(self, a: Assignment, after: float) -> None:
        """Check that the first trigger ``a`` applies to (the one at which it was
        written, or the next when that one had started already) ran every item on its
        owner; a gap is recorded as a problem and the story waits for a later
        trigger that does run every item (failing if none comes)."""
        # The leader writes the assignment inside the trigger's processing, which
        # begins up to FIRE_LEAD before the trigger is due, and cron fires are aligned
        # to multiples of the period: that trigger is the last multiple of the period
        # at or before the write plus the lead.
        fire = math.floor((a.at + FIRE_LEAD) / self.timing.period) * self.timing.period
        if a.effective_fire > fire + 1e-6:
            # some instance had started that trigger already: one assignment per
            # trigger cluster-wide, so the new owners take over from the next one
            fire = math.ceil(a.effective_fire / self.timing.period) * self.timing.period
        expected = {i: self._name(o) for i, o in a.owners_for(fire).items()}
        # A follower waits up to sharding_wait_timeout for a reshard before it runs
        # its items: only after that can an item be said to be missing.
        limit = fire + self.sharding_wait + self.timing.work + 2.0
        self._wait(
            lambda: self._runs_of(fire) == expected or time.time() > limit,
            limit - time.time() + 5.0,
            f"the end of the trigger of {_hms(fire)}",
        )
        runs = self._runs_of(fire)
        self._print_fire(fire)
        if runs == expected:
            self.out.ok(
                f"the trigger of {_hms(fire)}, the first that generation {a.generation} "
                "applies to, ran every item on its assigned instance"
            )
            return
        missing = sorted(set(expected) - set(runs))
        misplaced = sorted(i for i in runs if i in expected and runs[i] != expected[i])
        details = []
        if missing:
            owners = ", ".join(f"{i}->{expected[i]}" for i in missing)
            details.append(
                f"item(s) {missing} ran nowhere (owners in generation {a.generation}: {owners})"
            )
        if misplaced:
            details.append(
                "item(s) " + ", ".join(f"{i} ran on {runs[i]} not {expected[i]}" for i in misplaced)
            )
        problem = (
            f"trigger {_hms(fire)} (generation {a.generation} written at {_hms_ms(a.at)}): "
            + "; ".join(details)
        )
        self.problems.append(problem)
        self.out.say(f"[bold red]PROBLEM[/bold red] {escape(problem)}")
        later = self._wait(
            lambda: self._complete_fire(a, after=fire),
            4 * self.timing.period + 10,
            f"a later trigger that runs all 8 items as generation {a.generation} assigns them",
        )
        self._print_fire(later)
        self.out.say(f"the next trigger, {_hms(later)}, ran every item on its assigned instance")

    def _runs_of(self, fire: float) -> dict[int, str]:
        line = self.fires.get(fire)
        return dict(line.runs) if line else {}

    def _stop_all(self) -> None:
        self.out.heading("5. graceful stop (SIGTERM)")
        alive = [w for w in self.workers if w.alive()]
        sent = time.time()
        for w in alive:
            w.stopping = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGTERM)
        self.out.say("SIGTERM sent to " + ", ".join(w.name for w in alive))
        deadline = time.monotonic() + self.timing.grace + 15
        for w in alive:
            try:
                code = w.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise DemoFailure(
                    f"{w.name} (pid {w.pid}) did not stop within {self.timing.grace + 15:g}s "
                    "of SIGTERM"
                ) from None
            self.stop_times[w.name] = time.time() - sent
            if code != 0:
                raise DemoFailure(f"{w.name} exited with code {code} after SIGTERM (expected 0)")
        self._poll()
        for w in alive:
            if not w.stopped_event:
                raise DemoFailure(f"{w.name} exited without recording a graceful stop")
            self.out.ok(
                f"{w.name} stopped gracefully in {self.stop_times[w.name]:.2f}s (exit code 0)"
            )
        store = self._store()
        clean = self._wait(
            lambda: self._registry_clean(store),
            5.0,
            "a clean registry: no instance registered, no running mark, no queued failover",
        )
        self.out.ok(f"registry is clean: {clean}")

    def _summary(self) -> None:
        self.out.heading("summary")
        runs: dict[int, Counter[str]] = defaultdict(Counter)
        failovers: Counter[int] = Counter()
        for e in self.events:
            if e.kind == "start":
                runs[e.item][e.worker] += 1
                if e.failover:
                    failovers[e.item] += 1
        rows = [
            [
                str(i),
                ITEM_PARAMETERS[i],
                str(sum(runs[i].values())),
                " ".join(f"{w}x{n}" for w, n in sorted(runs[i].items())),
                str(failovers[i]),
            ]
            for i in ITEMS
        ]
        self.out.table(
            "executions per item",
            ["item", "parameter", "runs", "by instance", "failover runs"],
            rows,
        )
        timing_rows = [[what, f"{seconds:.2f}s"] for what, seconds in self.reshard_times]
        timing_rows += [
            [f"failover of item {item} to {worker} (kill -> start elsewhere)", f"{delay:.2f}s"]
            for item, worker, delay in self.failover_times
        ]
        timing_rows += [
            [f"graceful stop of {name} (SIGTERM -> exit)", f"{seconds:.2f}s"]
            for name, seconds in self.stop_times.items()
        ]
        self.out.table("timings", ["what", "time"], timing_rows)
        generations = ", ".join(
            f"{a.generation} ({len(set(a.owners.values()))} instance(s))" for a in self.assignments
        )
        self.out.say(f"assignment generations seen: {generations}")
        delays = [d for _, _, d in self.failover_times]
        self.out.ok(
            f"failover time observed: {min(delays):.2f}s to {max(delays):.2f}s from kill -9 to "
            f"the orphaned item running elsewhere (session timeout "
            f"{self.timing.session_timeout:g}s; a survivor busy with its own items claims "
            "after them)"
        )

    # -- processes ------------------------------------------------------------------

    def _spawn(self, name: str) -> Worker:
        wdir = self.workdir / "workers"
        wdir.mkdir(parents=True, exist_ok=True)
        journal = wdir / f"{name}.jsonl"
        log_path = wdir / f"{name}.log"
        cmd = [
            sys.executable,
            "-m",
            "demo.worker",
            "--registry",
            self.url,
            "--name",
            name,
            "--journal",
            str(journal),
            "--cron",
            self.timing.cron,
            "--work",
            str(self.timing.work),
            "--grace",
            str(self.timing.grace),
            "--parent-pid",
            str(os.getpid()),
        ]
        # the demo lives next to the package, not in it: workers find it from the repo
        repo = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                # its own process group, so that one killpg takes all it may spawn
                start_new_session=True,
            )
        worker = Worker(name=name, popen=popen, journal=JournalReader(journal), log_path=log_path)
        self.workers.append(worker)
        self.out.say(f"started {name} (pid {popen.pid}): python -m demo.worker")
        return worker

    def _wait_ready(self, workers: list[Worker]) -> None:
        self._wait(
            lambda: all(w.ready_at is not None for w in workers),
            30.0,
            "readiness of " + ", ".join(w.name for w in workers),
        )
        for w in workers:
            self.out.ok(f"{w.name} registered as instance [bold]{escape(w.instance_id)}[/bold]")

    def close(self) -> None:
        """Kill every worker process group and the server (idempotent, never raises)."""
        for w in self.workers:
            if w.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.popen.wait(timeout=10)
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
            self.store = None
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
            self.cluster = None

    # -- observation ----------------------------------------------------------------

    def _store(self) -> CoordinationStore:
        if self.store is None:
            raise DemoFailure("the registry is not started")
        return self.store

    def _poll(self) -> None:
        """Read new journal lines and the assignment; fail if a worker died on its own."""
        for w in self.workers:
            for e in w.journal.read_new():
                self._record(w, e)
        for w in self.workers:
            if not w.alive() and w.killed_at is None and not w.stopping:
                raise DemoFailure(
                    f"{w.name} (pid {w.pid}) exited on its own with code {w.popen.returncode}"
                )
        assignment = self._read_assignment()
        if assignment is not None and (
            not self.assignments or assignment.generation != self.assignments[-1].generation
        ):
            self.assignments.append(assignment)
        self._flush_feed(final=False)

    def _record(self, w: Worker, e: Event) -> None:
        self.events.append(e)
        if e.kind == "ready":
            w.instance_id = e.instance_id
            w.ready_at = e.t
        elif e.kind == "stopped":
            w.stopped_event = True
        elif e.kind == "start":
            if e.failover:
                self.out.feed(
                    f"[yellow]{e.worker} runs item {e.item} ({e.param}) as a failover of the "
                    f"trigger of {_hms(e.fire)}[/yellow]"
                )
                return
            line = self.fires.setdefault(e.fire, FireLine(e.fire))
            if line.printed:
                # a start after the line was printed (delayed by a reshard wait)
                self.out.feed(f"{_hms(e.fire)} late: {e.worker} item {e.item}")
            line.runs[e.item] = e.worker

    def _flush_feed(self, *, final: bool) -> None:
        # a trigger's line is printed once its items had time to start
        due = time.time() - min(self.timing.period, self.timing.work + 0.3)
        for fire in sorted(self.fires):
            if final or fire <= due:
                self._print_fire(fire)

    def _print_fire(self, fire: float) -> None:
        line = self.fires.get(fire)
        if line is None or line.printed:
            return
        line.printed = True
        by_worker: dict[str, list[int]] = defaultdict(list)
        for item, worker in sorted(line.runs.items()):
            by_worker[worker].append(item)
        parts = " | ".join(
            f"{w}: {' '.join(str(i) for i in items)}" for w, items in sorted(by_worker.items())
        )
        count = f"{len(line.runs)}/{len(ITEMS)} items"
        self.out.feed(f"trigger {_hms(fire)}  {parts}  ({count})")

    def _wait(self, predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll until ``predicate`` returns something other than None/False."""
        deadline = time.monotonic() + timeout
        while True:
            self._poll()
            result = predicate()
            if result is not None and result is not False:
                return result
            if time.monotonic() >= deadline:
                raise DemoFailure(f"{what} did not happen within {timeout:g}s; {self._state()}")
            time.sleep(0.02)

    def _state(self) -> str:
        current = self.assignments[-1] if self.assignments else None
        owners = self._owners_text(current) if current else "none"
        alive = ", ".join(f"{w.name}={'up' if w.alive() else 'down'}" for w in self.workers)
        return f"workers: {alive}; last assignment seen: {owners}"

    def _snapshot(self) -> JobSnapshot | None:
        """The job's registry subtree as the operations API reads it (None while the
        job is not registered or the store does not answer)."""
        try:
            return read_snapshot(self._store(), JOB_NAME)
        except StoreError:
            return None

    def _read_assignment(self) -> Assignment | None:
        snap = self._snapshot()
        return snap.assignment if snap is not None else None

    def _current(self) -> Assignment:
        if not self.assignments:
            raise DemoFailure("no assignment has been written yet")
        return self.assignments[-1]

    def _leader(self) -> str | None:
        snap = self._snapshot()
        return snap.leader if snap is not None else None

    def _assignment_over(self, ids: set[str], newer_than: int = -1) -> Assignment | None:
        """The current assignment if it covers every item, its owners are exactly
        ``ids`` and its generation is above ``newer_than``."""
        if not self.assignments:
            return None
        a = self.assignments[-1]
        if a.generation <= newer_than or set(a.owners) != set(ITEMS):
            return None
        return a if set(a.owners.values()) == ids else None

    def _complete_fire(self, assignment: Assignment, after: float) -> float | None:
        """A fire after ``after`` whose (non-failover) runs are exactly the assignment."""
        expected = {i: self._name(o) for i, o in assignment.owners.items()}
        for fire in sorted(self.fires):
            if fire > after and self.fires[fire].runs == expected:
                return fire
        return None

    def _running_of(self, w: Worker) -> dict[int, Event]:
        starts: dict[str, Event] = {}
        for e in self.events:
            if e.worker != w.name:
                continue
            if e.kind == "start":
                starts[e.execution_id] = e
            elif e.kind == "end":
                starts.pop(e.execution_id, None)
        return {e.item: e for e in starts.values()}

    def _busy_victim(self, exclude: str | None) -> tuple[Worker, dict[int, str]] | None:
        now = time.time()
        for w in self.workers:
            if not w.alive() or w.instance_id == exclude:
                continue
            running = self._running_of(w)
            # well inside the item's run: started a moment ago, far from its end
            if running and all(
                0.1 <= now - e.t <= self.timing.work - 0.3 for e in running.values()
            ):
                return w, {i: e.execution_id for i, e in running.items()}
        return None

    def _in_flight(self, w: Worker) -> dict[int, str]:
        return {i: e.execution_id for i, e in self._running_of(w).items()}

    def _taken_over(self, victim: Worker, items: set[int], since: float) -> dict[int, Event] | None:
        found: dict[int, Event] = {}
        for e in self.events:
            if (
                e.kind == "start"
                and e.failover
                and e.item in items
                and e.worker != victim.name
                and e.t > since
                and e.item not in found
            ):
                found[e.item] = e
        return found if set(found) == items else None

    def _registry_clean(self, store: CoordinationStore) -> str | None:
        snap = read_snapshot(store, JOB_NAME)
        if read_instances(store) or snap is None:
            return None
        if snap.instances or snap.running or snap.failover:
            return None
        return "no instance registered, no running mark, empty failover queue"

    # -- display ----------------------------------------------------------------------

    def _name(self, instance_id: str) -> str:
        for w in self.workers:
            if w.instance_id == instance_id:
                return w.name
        return instance_id or "?"

    def _owners_text(self, a: Assignment) -> str:
        by: dict[str, list[int]] = defaultdict(list)
        for item, owner in sorted(a.owners.items()):
            by[self._name(owner)].append(item)
        return " | ".join(f"{n}: {' '.join(map(str, items))}" for n, items in sorted(by.items()))

    def _show_assignment(
        self, a: Assignment, when: str, previous: Assignment | None = None
    ) -> None:
        rows = []
        for item in ITEMS:
            owner = a.owners.get(item, "")
            name = self._name(owner)
            moved = ""
            if previous is not None and previous.owners.get(item) != owner:
                moved = f"moved from {self._name(previous.owners.get(item, ''))}"
            rows.append([str(item), ITEM_PARAMETERS[item], f"{name}  {owner}", moved])
        self.out.ok(
            f"assignment generation {a.generation} {when}, written by leader "
            f"{self._name(a.leader)} to {self.paths.sharding} at {_hms(a.at)}"
        )
        self.out.table(
            f"{self.paths.sharding} (generation {a.generation})",
            ["item", "parameter", "instance", "change"],
            rows,
        )
        self.out.say(f"per instance: {escape(self._owners_text(a))}")


def _hms(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def _hms_ms(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]
