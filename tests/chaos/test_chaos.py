"""Chaos runs: worker processes on a 3-node ZooKeeper ensemble / etcd cluster, random
faults, then the history checker (tests/chaos/checker.py).

A seeded driver (the seed is printed; ``SHARDKEEPER_CHAOS_SEED=N`` replays the same
fault schedule) repeatedly picks one fault, injects it, holds it, repairs it and
waits a little: kill -9 and restart of an instance, SIGSTOP past the session timeout
then SIGCONT (a zombie), kill and restart of one store member, graceful stop and
start. Every fault is logged with its time to ``events.jsonl``. Then a quiet period
in which the registry is read a few times a second, then the cluster stops and the
checker judges the history.

The short runs (about a minute per backend) are part of the default test run; the
long ones are marked ``chaos`` and only run with ``-m chaos`` (``make chaos
DURATION=600``), for ``--chaos-duration`` seconds each.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.coordination.model import Assignment, DocumentError, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import StoreError
from shardkeeper.registry import CoordinationStore, open_store
from shardkeeper.testing.servers import ServerCluster
from tests.chaos.checker import Params, Report, check, load_history
from tests.jobs.cluster import Cluster, Instance

JOB = "chaos"
P = JobPaths(JOB)
SESSION_TIMEOUT = 2.0
PERIOD = 1.0
ITEMS = 8
WORK = 0.5
FAULTS = ("kill", "freeze", "store", "graceful")
SEED_VAR = "SHARDKEEPER_CHAOS_SEED"


@dataclass(frozen=True)
class Plan:
    """Shape of one chaos run."""

    duration: float
    instances: int
    seed: int
    items: int = ITEMS
    work: float = WORK
    #: seconds between a kill -9 and the start of the replacement instance
    restart_delay: tuple[float, float] = (0.5, 2.5)


def chaos_seed() -> int:
    """The seed from SHARDKEEPER_CHAOS_SEED, or a fresh random one."""
    raw = os.environ.get(SEED_VAR)
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


class Driver:
    """Runs the workers, injects faults and records what it did."""

    def __init__(
        self,
        plan: Plan,
        servers: ServerCluster,
        url: str,
        workdir: Path,
        out: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.servers = servers
        self.url = url
        self.workdir = workdir
        self.rng = random.Random(plan.seed)
        self.out = out
        self.workers = Cluster(
            url=url,
            workdir=workdir,
            defaults={
                "job": JOB,
                "interval": PERIOD,
                "count": plan.items,
                "work": plan.work,
                "failover": True,
                "grace": 10,
            },
        )
        self.live: list[Instance] = []
        self.frozen: list[Instance] = []
        self._events = workdir / "events.jsonl"

    # -- recording ----------------------------------------------------------------

    def log(self, kind: str, **fields: Any) -> float:
        """Append one event (with the wall-clock time the workers also use)."""
        t = time.time()
        with self._events.open("a") as fh:
            fh.write(json.dumps({"t": t, "kind": kind, **fields}) + "\n")
        return t

    def start_instance(self) -> Instance:
        """Start one worker and log it up once it is READY."""
        inst = self.workers.start(ready_timeout=40)
        self.live.append(inst)
        self.log("up", instance=inst.instance_id, pid=inst.proc.pid)
        return inst

    # -- faults -------------------------------------------------------------------

    def _pace(self, low: float, high: float) -> None:
        # The workload: bounded pauses between and during faults.
        time.sleep(self.rng.uniform(low, high))

    def _mid_execution(self) -> None:
        # Land just after a fire, while the items of that trigger are executing, so a
        # kill or a freeze leaves running marks behind for failover.
        now = time.time()
        time.sleep((PERIOD - now % PERIOD) + self.rng.uniform(0.05, 0.3))

    def fault_kill(self) -> None:
        """kill -9 an instance, then start a new one."""
        victim = self.rng.choice(self.live)
        self._mid_execution()
        self.log("kill", instance=victim.instance_id)
        victim.kill()
        self.live.remove(victim)
        self.log("down", instance=victim.instance_id)
        self._pace(*self.plan.restart_delay)
        self.start_instance()

    def fault_freeze(self) -> None:
        """SIGSTOP an instance past its session timeout (it becomes a zombie), SIGCONT."""
        victim = self.rng.choice(self.live)
        self._mid_execution()
        victim.proc.send_signal(signal.SIGSTOP)
        self.frozen.append(victim)
        held = SESSION_TIMEOUT + self.rng.uniform(1.0, 2.5)
        self.log("freeze", instance=victim.instance_id, hold=round(held, 2))
        time.sleep(held)
        victim.proc.send_signal(signal.SIGCONT)
        self.frozen.remove(victim)
        self.log("thaw", instance=victim.instance_id)

    def fault_store(self) -> None:
        """Kill one store member, restart it on the same ports and data."""
        member = self.rng.randrange(self.servers.size)
        self.log("store_kill", member=member)
        self.servers.kill(member)
        self._pace(1.0, 3.0)
        self.servers.restart(member)
        self.log("store_up", member=member)

    def fault_graceful(self) -> None:
        """SIGTERM an instance (it finishes its items and leaves), start a new one."""
        victim = self.rng.choice(self.live)
        self.log("term", instance=victim.instance_id)
        code = victim.term(timeout=30)
        self.live.remove(victim)
        self.log("down", instance=victim.instance_id, code=code)
        self._pace(0.5, 2.0)
        self.start_instance()

    def run(self) -> None:
        """Start the instances, inject faults for the duration, then go quiet."""
        for _ in range(self.plan.instances):
            self.start_instance()
        self._pace(3.0, 3.0)  # let the first reshards settle: faults start on a steady job
        until = time.time() + self.plan.duration
        # every kind of fault at least once (in a seeded order), then random ones
        order = list(FAULTS)
        self.rng.shuffle(order)
        while time.time() < until:
            kind = order.pop(0) if order else self.rng.choice(FAULTS)
            self.out(f"  {time.strftime('%H:%M:%S')} fault: {kind}")
            getattr(self, f"fault_{kind}")()
            self._pace(1.5, 4.0)
        self.log("quiet")

    # -- observation and teardown -------------------------------------------------

    def observe(self, seconds: float) -> None:
        """Read the registry a few times a second for ``seconds`` (the quiet period)."""
        store = open_store(self.url)
        store.start()
        try:
            deadline = time.time() + seconds
            with (self.workdir / "snapshots.jsonl").open("a") as fh:
                while time.time() < deadline:
                    snap = snapshot(store)
                    if snap is not None:
                        fh.write(json.dumps(snap) + "\n")
                    time.sleep(0.25)  # sampling rate of the observer, not a synchronisation
        finally:
            store.close()

    def stop(self) -> None:
        """Stop every worker (thawing frozen ones first) and log them down."""
        for inst in self.frozen:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)
        self.log("stop")
        self.workers.stop()
        for inst in self.live:
            self.log("down", instance=inst.instance_id, code=inst.proc.returncode)
        self.live.clear()


def snapshot(store: CoordinationStore) -> dict[str, Any] | None:
    """The job's registry state now (None if the store did not answer)."""
    try:
        t = time.time()
        node = store.get(P.sharding)
        owners: dict[str, str] = {}
        if node is not None:
            owners = {str(i): o for i, o in Assignment.from_bytes(node.value).owners.items()}
        running: dict[str, str] = {}
        for name in store.children(P.running_root):
            mark = store.get(P.running(int(name)))
            if mark is not None:
                running[name] = RunningMark.from_bytes(mark.value).instance_id
        queued: dict[str, str] = {}
        for name in store.children(P.failover_queue):
            entry = store.get(P.failover_item(int(name)))
            if entry is not None:
                queued[name] = FailoverEntry.from_bytes(entry.value).from_instance
        registered = store.children(P.instances)
    except (StoreError, DocumentError):
        return None
    return {
        "t": t,
        "owners": owners,
        "registered": registered,
        "running": running,
        "queued": queued,
    }


def run_chaos(
    plan: Plan, servers: ServerCluster, namespace: str, workdir: Path
) -> tuple[Report, str]:
    """One full chaos run; returns the checker's report and its text."""
    # operation_timeout at or below the session timeout, as docs/registry-backends.md
    # advises: a request stuck in a store leader election then ends within it
    url = servers.url(
        namespace,
        session_timeout=SESSION_TIMEOUT,
        operation_timeout=SESSION_TIMEOUT,
        connection_timeout=10,
    )
    params = Params(count=plan.items, period=PERIOD, session_timeout=SESSION_TIMEOUT)
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    out(
        f"chaos {servers.backend}: seed {plan.seed} (replay with {SEED_VAR}={plan.seed}), "
        f"{plan.duration:.0f}s, {plan.instances} instances, {plan.items} items, work "
        f"{plan.work}s, workdir {workdir}"
    )
    driver = Driver(plan, servers, url, workdir, out)
    began = time.time()
    try:
        driver.run()
        # long enough to see the registry clean up and then stay clean
        driver.observe(SESSION_TIMEOUT + 2 * PERIOD + params.slack + 3.0)
    finally:
        driver.stop()
    report = check(load_history(workdir, params))
    text = "\n".join(lines) + f"\nwall time {time.time() - began:.0f}s\n" + report.render()
    (workdir / "report.txt").write_text(text)
    print(report.render(), flush=True)
    return report, text


@pytest.fixture
def chaos_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the run's logs go (kept by pytest for post-mortems)."""
    yield tmp_path


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_chaos_short(backend: str, cluster: ServerCluster, namespace: str, chaos_dir: Path) -> None:
    """About a minute of random faults on each backend: the checker finds no lost work,
    no unexcused overlap and no stuck state."""
    # The replacement of a killed instance starts once the death has been handled
    # (session timeout + a trigger + the failover runs), as a supervisor with a
    # restart back-off would. A replacement that registers while the leader is
    # still resharding for a trigger that fired before it started is given items
    # for that trigger which nobody runs: a known bug (docs/failover.md, "Known
    # issues"), which the long run, restarting at once, still exercises.
    plan = Plan(
        duration=40,
        instances=3,
        seed=chaos_seed(),
        restart_delay=(SESSION_TIMEOUT + 1.5, SESSION_TIMEOUT + 2.5),
    )
    report, text = run_chaos(plan, cluster, namespace, chaos_dir)
    assert report.ok, text + "\n" + _worker_logs(chaos_dir)


@pytest.mark.chaos
@pytest.mark.cluster
def test_chaos_long(
    backend: str, cluster: ServerCluster, namespace: str, chaos_dir: Path, chaos_duration: int
) -> None:
    """``--chaos-duration`` seconds of random faults with 4 instances (make chaos)."""
    plan = Plan(duration=chaos_duration, instances=4, seed=chaos_seed())
    report, text = run_chaos(plan, cluster, namespace, chaos_dir)
    assert report.ok, text + "\n" + _worker_logs(chaos_dir)


def _worker_logs(workdir: Path, lines: int = 30) -> str:
    parts = []
    for path in sorted(workdir.glob("worker-*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"== {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)
