"""Chaos runs: worker processes on a 3-node ZooKeeper ensemble / etcd cluster, random
faults, then the history checker (tests/chaos/checker.py).

A seeded driver (the seed is printed; ``SHARDKEEPER_CHAOS_SEED=N`` replays the same
fault schedule) repeatedly picks one fault, injects it, holds it, repairs it and
waits a little: kill -9 and restart of an instance, SIGSTOP past the session timeout
then SIGCONT (a zombie), kill and restart of one store member, graceful stop and
start, and the network faults of :mod:`shardkeeper.testing.netns` and
:mod:`shardkeeper.testing.proxy`: a partition of one instance (its network
namespace cut off for 1-5 session timeouts while it keeps running, then healed), a
slow link (50-200 ms each way, 10% of chunks stalled 0.3 s more, for a few seconds),
and a partition of one store member from its peers (its clients still reach it).
For those, every store member runs in a network namespace of its own and every
instance in another, reaching the store through its own slow proxies (off unless a
slow-link fault is on). Where network namespaces cannot be made (not root, no
``ip``), the run says so and uses the loopback cluster without the network faults.
Every fault is logged with its time to ``events.jsonl``. Then a quiet period
(``3 st + 2 P + slack`` and a few seconds more) in which the registry is read a few
times a second, then the cluster stops and the checker judges the history.

The short runs (about a minute per backend, starting with a partition) are part of
the default test run; the long ones are marked ``chaos`` and only run with
``-m chaos`` (``make chaos DURATION=600``, ``STORE=zk|etcd`` for one store), for
``--chaos-duration`` seconds each, with the production-like workload of
:func:`production_jobs` (every instance runs four jobs: tests/chaos/worker.py), an
operator acting through the CLI during the faults (tests/chaos/operators.py) and,
on ZooKeeper, gray links (the proxy holds requests, lets pings through); the checker
judges every job apart. ``test_chaos_stateful`` (also ``-m chaos``) runs the same
faults on a workload with state (:func:`stateful_jobs`): items that checkpoint every
step and resume after a kill, freeze, partition or graceful stop, some of them in
worker processes that crash; the checker also judges the resumes, the zombies'
checkpoint writes and the crashes (tests/chaos/checker.py, findings 9-11).
"""

from __future__ import annotations

import inspect
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.coordination.model import Assignment, DocumentError, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import StoreError
from shardkeeper.registry import CoordinationStore, WatchEvent, open_store
from shardkeeper.registry.url import DEFAULT_OPERATION_TIMEOUT, DEFAULT_SESSION_TIMEOUT
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.netns import Netns, NetworkLab, unavailable_reason
from shardkeeper.testing.proxy import SlowProxy, slow_proxies
from shardkeeper.testing.servers import ClusterError, ServerCluster, cluster_class
from tests.chaos.checker import JobsReport, Params, Report, check, check_jobs, load_history
from tests.chaos.launcher import ChaosCluster
from tests.chaos.operators import Jobs, Operator
from tests.chaos.worker import JobSpec
from tests.jobs.cluster import Cluster, Instance

# CPU-heavy: one xdist worker runs all of these, so they never compete with each other
pytestmark = pytest.mark.xdist_group("cpu-heavy")

JOB = "chaos"
P = JobPaths(JOB)
SESSION_TIMEOUT = 2.0
PERIOD = 1.0
ITEMS = 8
WORK = 0.5
FAULTS = ("kill", "freeze", "store", "graceful")
NET_FAULTS = ("partition", "slow", "isolate")
FAULTS_VAR = "SHARDKEEPER_CHAOS_FAULTS"
SEED_VAR = "SHARDKEEPER_CHAOS_SEED"
#: seconds to wait for the operator's current action (a CLI call, a restart) at the end
CLI_JOIN = 120.0
#: seconds a killed store member gets to be ready again after its restart
STORE_RESTART_TIMEOUT = 120.0
#: attempts to start a worker (its start fails while the store is faulted)
START_ATTEMPTS = 3
#: the slow-link fault: delay per chunk and direction, and the stalled fraction
SLOW_DELAY = (0.05, 0.2)
SLOW_STALL_FRACTION = 0.1
SLOW_STALL = 0.3
#: the gray link: the proxy switch that holds requests but lets session traffic
#: through (SlowProxy(zookeeper_frames=True).hold_requests: ZooKeeper only)
GRAY_MODES = ("hold_requests",)
#: the bulk job: items per instance (each fire's start spans several commits) and its
#: interval (what 4 instances sustain on a 2-core machine: see docs/validation.md);
#: SHARDKEEPER_CHAOS_BULK_INTERVAL=N overrides it for one run
BULK_PER_INSTANCE = 2500
BULK_INTERVAL_VAR = "SHARDKEEPER_CHAOS_BULK_INTERVAL"
BULK_INTERVAL = float(os.environ.get(BULK_INTERVAL_VAR) or 15.0)
#: ZooKeeper heap per member for the production-like workload (the 96 MB default of
#: the test servers runs out of memory with thousands of marks a fire: issue 25)
ZK_HEAP_MB = 512
#: etcd's default heartbeat and election timeout (ms), for the production-like run
ETCD_PRODUCTION_TIMINGS = {"heartbeat_ms": 100, "election_ms": 1000}
#: etcd keeps every revision until compacted: the driver compacts this often, as
#: --auto-compaction-mode=periodic would
ETCD_COMPACT_EVERY = 30.0
#: the bulk job's PRE (see job_params)
BULK_PRE = 3.0


def production_jobs(instances: int) -> tuple[JobSpec, ...]:
    """The workload of ``make chaos``: today's job and three that look like
    production (issue 25 section 5), all run by every instance at once."""
    return (
        JobSpec(JOB, "sleep", PERIOD, ITEMS, WORK),
        JobSpec("bulk", "bulk", BULK_INTERVAL, BULK_PER_INSTANCE * instances),
        # items 2.5 intervals long that poll should_stop(): folding and interruption
        JobSpec("long", "long", 2.0, 6, 5.0),
        # 1.5 M pure-Python iterations an item (about 0.3 s on an idle core)
        JobSpec("cpu", "cpu", 2.0, 4, 1.5),
    )


#: the stateful jobs: items of STATEFUL_WORK seconds (2.5 intervals), a checkpoint
#: every 0.25 s step (tests/chaos/worker.py); the crashing job's runs (failover runs
#: excepted) end their worker process with this chance
STATEFUL_INTERVAL = 2.0
STATEFUL_WORK = 5.0
CRASH_CHANCE = 0.3


def stateful_jobs() -> tuple[JobSpec, ...]:
    """The workload of ``test_chaos_stateful``: today's job beside two stateful ones
    (issue 28 section 5), one in threads and one in worker processes whose runs
    sometimes crash. The production-like workload (:func:`production_jobs`) stays as
    it is, so that its runs stay comparable."""
    return (
        JobSpec(JOB, "sleep", PERIOD, ITEMS, WORK),
        JobSpec("stateful", "stateful", STATEFUL_INTERVAL, 4, STATEFUL_WORK),
        JobSpec(
            "crashing",
            "stateful",
            STATEFUL_INTERVAL,
            2,
            STATEFUL_WORK,
            executor="process",
            crash=CRASH_CHANCE,
        ),
    )


def operator_jobs() -> Jobs:
    """What the operator acts on in the production workload."""
    return Jobs(
        trigger=(JOB, "long"),
        item_job=JOB,
        item_count=ITEMS,
        switch_job="cpu",
        count_job=JOB,
        count_low=ITEMS,
        count_high=ITEMS + 4,
    )


#: the gray link of etcd: the proxy cannot hold etcd's requests apart from its
#: keep-alives (one HTTP/2 connection carries both), so the instance holds its own
#: requests (``EtcdStore.hold_requests``: SIGUSR1 on, SIGUSR2 off, tests/chaos/worker.py)
#: while its keep-alives and watch stream go on: the nearest equivalent
SIGNAL_GRAY = "in-process hold (SIGUSR1/SIGUSR2)"


def gray_mode(backend: str) -> str | None:
    """The name of the proxy's gray-link switch for ``backend`` (requests held,
    session pings let through), :data:`SIGNAL_GRAY` for etcd, or None when neither
    can be made."""
    if backend == "etcd":
        return SIGNAL_GRAY
    if backend != "zookeeper":
        return None
    if "zookeeper_frames" not in inspect.signature(SlowProxy).parameters:
        return None
    probe = SlowProxy(("127.0.0.1", 9), max_seconds=1, zookeeper_frames=True)
    try:
        return next((n for n in GRAY_MODES if hasattr(probe, n)), None)
    finally:
        probe.close()


def link_options(gray: str | None) -> dict[str, Any]:
    """The options of an instance's link proxies for the run's gray mode: the proxy
    reads ZooKeeper's frames only when its own switch makes the gray link (an etcd
    link through a frame-reading proxy carries nothing: every worker failed to start
    with :data:`SIGNAL_GRAY`, a 600 s etcd run ended in its first 40 s)."""
    return {"zookeeper_frames": True} if gray in GRAY_MODES else {}


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
    #: how long an instance partition lasts, in session timeouts
    partition_hold: tuple[float, float] = (1.0, 5.0)
    #: the fault to start with (the short runs start with a partition)
    first: str | None = None
    #: the jobs every instance runs (empty: today's single job, tests/jobs/worker.py)
    jobs: tuple[JobSpec, ...] = ()
    #: an operator acts through the CLI during the faults (tests/chaos/operators.py)
    operator: bool = False
    #: the instances' registry timings (fault lengths are counted in session timeouts)
    session_timeout: float = SESSION_TIMEOUT
    operation_timeout: float = SESSION_TIMEOUT


def chosen_faults(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The fault kinds of this run: all of ``kinds``, or those named in
    SHARDKEEPER_CHAOS_FAULTS (comma-separated; ``none`` for a calm run that measures
    what the workload sustains with no fault and no operator). An unknown name is
    refused."""
    raw = os.environ.get(FAULTS_VAR, "").strip()
    if not raw:
        return kinds
    if raw == "none":
        return ()
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in kinds]
    if unknown:
        raise ValueError(
            f"{FAULTS_VAR}={raw!r}: {', '.join(unknown)} not among this run's faults "
            f"{', '.join(kinds)} (or 'none')"
        )
    return names


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
        net: Network | None = None,
    ) -> None:
        self.plan = plan
        self.servers = servers
        self.url = url
        self.net = net
        #: per instance id: its network namespace and slow proxies (with ``net``)
        self.links: dict[str, tuple[Netns, list[SlowProxy]]] = {}
        self.workdir = workdir
        self.rng = random.Random(plan.seed)
        self.out = out
        self.workers: Cluster | ChaosCluster
        if plan.jobs:
            self.workers = ChaosCluster(url=url, workdir=workdir, jobs=plan.jobs, grace=10)
        else:
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
        #: instances a fault or the operator is acting on (the other one leaves them be)
        self.busy: set[str] = set()
        self.lock = threading.RLock()
        self._events = workdir / "events.jsonl"
        self._events_lock = threading.Lock()
        #: set when the side threads (operator, compactor) must end
        self._quit = threading.Event()
        self.operator: Operator | None = None
        self.gray = gray_mode(servers.backend) if net is not None and plan.jobs else None

    # -- recording ----------------------------------------------------------------

    def log(self, kind: str, at: float | None = None, **fields: Any) -> float:
        """Append one event (with the wall-clock time the workers also use, or
        ``at``: when an operator's command began)."""
        t = time.time() if at is None else at
        line = json.dumps({"t": t, "kind": kind, **fields}) + "\n"
        with self._events_lock, self._events.open("a") as fh:
            fh.write(line)
        return t

    # -- sharing instances with the operator ----------------------------------------

    def _victim(self) -> Instance | None:
        """A live instance nobody else is acting on (now marked busy), or None."""
        with self.lock:
            free = [i for i in self.live if i.instance_id not in self.busy]
            if not free:
                return None
            victim = self.rng.choice(free)
            self.busy.add(victim.instance_id)
            return victim

    def _done(self, inst: Instance) -> None:
        with self.lock:
            self.busy.discard(inst.instance_id)

    def live_ids(self) -> list[str]:
        """Ids of the live instances nobody is acting on."""
        with self.lock:
            return [i.instance_id for i in self.live if i.instance_id not in self.busy]

    def all_ids(self) -> list[str]:
        """Ids of every live instance."""
        with self.lock:
            return [i.instance_id for i in self.live]

    def operator_restart(self, instance_id: str, stop: Callable[[str], bool]) -> bool:
        """The operator's restart of one instance: ``stop`` asks it to leave (the
        CLI's shutdown), then its exit is awaited and a new instance started."""
        with self.lock:
            inst = next(
                (
                    i
                    for i in self.live
                    if i.instance_id == instance_id and i.instance_id not in self.busy
                ),
                None,
            )
            if inst is None:
                return False
            self.busy.add(instance_id)
        try:
            self.log("term", instance=instance_id, via="cli shutdown")
            if not stop(instance_id):
                inst.proc.send_signal(signal.SIGTERM)  # the CLI failed: the supervisor's way
            try:
                code: int | None = inst.proc.wait(40)
            except subprocess.TimeoutExpired:
                inst.kill()
                code = inst.proc.returncode
            with self.lock:
                self.live.remove(inst)
            self.log("down", instance=instance_id, code=code)
            self._release(inst)
            self.start_instance()
        finally:
            self._done(inst)
        return True

    def start_instance(self) -> Instance:
        """Start one worker (a supervisor's way: a start refused while the store is
        faulted is tried again, up to START_ATTEMPTS times, each logged)."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_instance()
            except (RuntimeError, TimeoutError) as exc:
                self.log("start_failed", attempt=attempt, error=str(exc)[:300])
                self.out(f"  {time.strftime('%H:%M:%S')} a worker failed to start ({attempt})")
                if attempt == START_ATTEMPTS:
                    raise
                self._pace(1.0, 2.0)
        raise AssertionError("unreachable")

    def _start_instance(self) -> Instance:
        """Start one worker and log it up once it is READY. With network faults on, in
        a namespace of its own and through slow proxies (off) to every member."""
        if self.net is None:
            inst = self.workers.start(ready_timeout=40)
        else:
            lab = self.net.lab
            box = lab.namespace()
            proxies = slow_proxies(
                self.servers.hosts,
                listen_host=lab.host_address,
                delay=SLOW_DELAY,
                stall_fraction=SLOW_STALL_FRACTION,
                stall_seconds=SLOW_STALL,
                seed=self.rng.randrange(2**31),
                max_seconds=self.plan.duration + 900,
                **link_options(self.gray),
            )
            hosts = ",".join(f"{h}:{p}" for h, p in (x.address for x in proxies))
            url = self.url.replace(self.servers.hosts_string, hosts, 1)
            try:
                inst = self.workers.start(ready_timeout=40, prefix=box.prefix, url=url)
            except BaseException:
                for x in proxies:
                    x.close()
                lab.remove(box)
                raise
            self.links[inst.instance_id] = (box, proxies)
        with self.lock:
            self.live.append(inst)
        self.log("up", instance=inst.instance_id, pid=inst.proc.pid)
        return inst

    def _release(self, inst: Instance) -> None:
        """Remove a gone instance's namespace and proxies."""
        link = self.links.pop(inst.instance_id, None)
        if link is not None and self.net is not None:
            box, proxies = link
            for x in proxies:
                x.close()
            self.net.lab.remove(box)

    def reap(self) -> None:
        """An instance that exited without being asked is a self-shutdown: log it and
        start a replacement (a supervisor would)."""
        for inst in list(self.live):
            code = inst.proc.poll()
            if code is None or inst.instance_id in self.busy:
                continue
            with self.lock:
                self.live.remove(inst)
            self.log("self_exit", instance=inst.instance_id, code=code)
            self.log("down", instance=inst.instance_id, code=code)
            self._release(inst)
            self.out(f"  {time.strftime('%H:%M:%S')} {inst.instance_id} exited by itself")
            self.start_instance()

    def _leader(self) -> int | None:
        try:
            return int(self.servers.leader())  # type: ignore[attr-defined]
        except ClusterError:
            return None

    def _log_new_leader(self, old: int) -> None:
        """After the leader's loss: log when another member serves as leader."""
        try:
            wait_until(
                lambda: (x := self._leader()) is not None and x != old,
                20,
                interval=0.05,
                message="no new store leader",
            )
        except AssertionError:
            return  # the checker then uses its fixed window
        now = self._leader()
        self.log("store_leader", member=now if now is not None else -1)

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
        victim = self._victim()
        if victim is None:
            return
        try:
            self._mid_execution()
            self.log("kill", instance=victim.instance_id)
            victim.kill()
            with self.lock:
                self.live.remove(victim)
            self.log("down", instance=victim.instance_id)
            self._release(victim)
        finally:
            self._done(victim)
        self._pace(*self.plan.restart_delay)
        self.start_instance()

    def fault_freeze(self) -> None:
        """SIGSTOP an instance past its session timeout (it becomes a zombie), SIGCONT."""
        victim = self._victim()
        if victim is None:
            return
        try:
            self._mid_execution()
            victim.proc.send_signal(signal.SIGSTOP)
            self.frozen.append(victim)
            held = self.plan.session_timeout + self.rng.uniform(1.0, 2.5)
            self.log("freeze", instance=victim.instance_id, hold=round(held, 2))
            time.sleep(held)
            victim.proc.send_signal(signal.SIGCONT)
            self.frozen.remove(victim)
            self.log("thaw", instance=victim.instance_id)
        finally:
            self._done(victim)

    def fault_store(self) -> None:
        """Kill one store member, restart it on the same ports and data."""
        member = self.rng.randrange(self.servers.size)
        leader = self._leader() == member
        self.log("store_kill", member=member, leader=leader)
        self.servers.kill(member)
        began = time.time()
        if leader:
            self._log_new_leader(member)
        self._pace(max(0.0, 1.0 - (time.time() - began)), max(0.0, 3.0 - (time.time() - began)))
        try:
            # a member restarted under the bulk job syncs tens of MB from its peers on
            # a loaded machine: it may take longer than a test server's start
            self.servers.restart(member, timeout=STORE_RESTART_TIMEOUT)
        except ClusterError as exc:
            # still syncing: the run goes on with two members (a fault like any other;
            # the next store fault or the end of the run finds it up or restarts it)
            self.log("store_slow_start", member=member, error=str(exc))
            return
        self.log("store_up", member=member)

    def fault_graceful(self) -> None:
        """SIGTERM an instance (it finishes its items and leaves), start a new one."""
        victim = self._victim()
        if victim is None:
            return
        try:
            self.log("term", instance=victim.instance_id)
            code = victim.term(timeout=30)
            with self.lock:
                self.live.remove(victim)
            self.log("down", instance=victim.instance_id, code=code)
            self._release(victim)
        finally:
            self._done(victim)
        self._pace(0.5, 2.0)
        self.start_instance()

    def fault_partition(self) -> None:
        """Cut an instance's network namespace off while its items run (1-5 session
        timeouts), then heal it: it must fence itself and rejoin without a restart."""
        victim = self._victim()
        if victim is None:
            return
        try:
            box, _ = self.links[victim.instance_id]
            self._mid_execution()
            held = self.plan.session_timeout * self.rng.uniform(*self.plan.partition_hold)
            box.cut()
            self.log("partition", instance=victim.instance_id, hold=round(held, 2))
            time.sleep(held)
            box.heal()
            self.log("heal", instance=victim.instance_id)
        finally:
            self._done(victim)

    def fault_slow(self) -> None:
        """Slow an instance's link down (delay and stalls) for a few seconds."""
        victim = self._victim()
        if victim is None:
            return
        try:
            _, proxies = self.links[victim.instance_id]
            held = self.rng.uniform(3.0, 8.0)
            for x in proxies:
                x.slow = True
            self.log("slow", instance=victim.instance_id, hold=round(held, 2))
            time.sleep(held)
            for x in proxies:
                x.slow = False
            self.log("fast", instance=victim.instance_id)
        finally:
            self._done(victim)

    def fault_gray(self) -> None:
        """A gray link: the instance's requests are held (commits stall past the
        operation timeout) while its session traffic goes through, for 1-5 session
        timeouts; it must fence itself and give its items up (issue 25 section 2)."""
        assert self.gray is not None
        victim = self._victim()
        if victim is None:
            return
        try:
            _, proxies = self.links[victim.instance_id]
            self._mid_execution()
            held = self.plan.session_timeout * self.rng.uniform(1.0, 5.0)
            self._set_gray(victim, proxies, True)
            self.log("gray", instance=victim.instance_id, hold=round(held, 2), mode=self.gray)
            time.sleep(held)
            self._set_gray(victim, proxies, False)
            self.log("gray_end", instance=victim.instance_id)
        finally:
            self._done(victim)

    def _set_gray(self, victim: Instance, proxies: list[SlowProxy], on: bool) -> None:
        """Turn the gray link of ``victim`` on or off (its proxies' switch, or for
        etcd a signal to the worker, which holds its own requests)."""
        assert self.gray is not None
        if self.gray == SIGNAL_GRAY:
            if victim.proc.poll() is None:
                victim.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
            return
        for x in proxies:
            setattr(x, self.gray, on)

    def fault_isolate(self) -> None:
        """Partition one store member from its peers (its clients still reach it)."""
        assert self.net is not None
        member = self.rng.randrange(self.servers.size)
        spots = self.net.members
        leader = self._leader() == member
        self.net.lab.isolate(spots[member], spots)
        self.log("store_isolate", member=member, leader=leader)
        began = time.time()
        if leader:
            self._log_new_leader(member)
        time.sleep(max(0.0, self.rng.uniform(2.0, 5.0) - (time.time() - began)))
        self.net.lab.rejoin(spots[member])
        self.log("store_rejoin", member=member)
        # the rejoined member catches up before the next fault
        wait_until(self.servers.healthy, 30, interval=0.1, message="store not healthy")

    def watch_assignments(self) -> CoordinationStore:
        """Log every assignment the store holds (with the owners it keeps for recent
        fires) as an ``assignment`` event: the checker tells from it which instance
        a reshard had just given an item to when a fault hit that instance. And each
        job's leader as a ``leader`` event (``holder``; None when the node went): a
        fault of the leader delays the reshard a healed instance waits for."""
        store = open_store(self.url)
        store.start()
        names = [j.name for j in self.plan.jobs] or [JOB]
        paths = {JobPaths(name).sharding: name for name in names}

        def seen(event: WatchEvent) -> None:
            job = paths.get(event.path)
            if job is None or event.value is None:
                return
            try:
                doc = Assignment.from_bytes(event.value)
            except (DocumentError, ValueError):
                return
            levels = [(doc.effective_fire, doc.owners)]
            levels += [(doc.previous_effective, doc.previous), *doc.older]
            self.log(
                "assignment",
                job=job,
                generation=doc.generation,
                levels=[[eff, _owners_json(own)] for eff, own in levels],
            )

        leaders = {JobPaths(name).leader: name for name in names}

        def leader(event: WatchEvent) -> None:
            job = leaders.get(event.path)
            if job is None:
                return
            holder = None if event.value is None else event.value.decode(errors="replace")
            # "holder", not "instance": the checker reads an event's instance as
            # the one a fault hit
            self.log("leader", job=job, holder=holder)

        for path in paths:
            store.watch(path, seen)
        for path in leaders:
            store.watch(path, leader)
        return store

    def run(self) -> None:
        """Start the instances, inject faults for the duration, then go quiet."""
        self._assignments = self.watch_assignments()
        for _ in range(self.plan.instances):
            self.start_instance()
        self._pace(3.0, 3.0)  # let the first reshards settle: faults start on a steady job
        until = time.time() + self.plan.duration
        kinds = FAULTS + (NET_FAULTS if self.net is not None else ())
        if self.gray is not None:
            kinds += ("gray",)
        kinds = chosen_faults(kinds)
        self._side: list[threading.Thread] = []
        if self.plan.operator and kinds:  # a calm run has no operator either
            self.operator = Operator(self, self.url, operator_jobs(), self.plan.seed + 1, self.out)
            self._side.append(
                threading.Thread(
                    target=self.operator.run, args=(until - 10,), name="operator", daemon=True
                )
            )
        if self.servers.backend == "etcd" and self.plan.jobs:
            self._side.append(
                threading.Thread(target=self._compact, args=(until,), name="compactor", daemon=True)
            )
        for th in self._side:
            th.start()
        # every kind of fault at least once (in a seeded order), then random ones
        order = list(kinds)
        self.rng.shuffle(order)
        if self.plan.first in order:
            order.remove(self.plan.first)
            order.insert(0, self.plan.first)
        while time.time() < until:
            self.reap()
            if not kinds:  # a calm run: the workload's own baseline, no fault at all
                self._pace(1.5, 4.0)
                continue
            kind = order.pop(0) if order else self.rng.choice(kinds)
            self.out(f"  {time.strftime('%H:%M:%S')} fault: {kind}")
            getattr(self, f"fault_{kind}")()
            self._pace(1.5, 4.0)
        self._join_side()
        self.reap()
        self.log("quiet")

    def _join_side(self) -> None:
        """Wait for the operator (its current action and the restore of its
        switches) and the compactor to end."""
        op = getattr(self, "operator", None)
        if op is not None:
            op.stop()
        self._quit.set()
        for th in getattr(self, "_side", []):
            th.join(CLI_JOIN)
            if th.is_alive():
                self.out(f"  {th.name} did not end within {CLI_JOIN:g}s")
        self._side = []
        if op is not None:
            self.operator = None
            self.out(
                f"operator: {op.commands} CLI commands, {op.failures} failed"
                + "".join(f"\n  operator error: {e}" for e in op.errors)
            )

    def _compact(self, until: float) -> None:
        """etcd: compact the history every ETCD_COMPACT_EVERY seconds (a production
        etcd runs with auto-compaction; the test servers do not)."""
        endpoints = self.servers.hosts_string
        while time.time() < until and not self._quit.wait(ETCD_COMPACT_EVERY):
            try:
                status = subprocess.run(
                    ["etcdctl", f"--endpoints={endpoints}", "endpoint", "status", "-w", "json"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                    env={**os.environ, "ETCDCTL_API": "3"},
                )
                rev = max(int(x["Status"]["header"]["revision"]) for x in json.loads(status.stdout))
                subprocess.run(
                    ["etcdctl", f"--endpoints={endpoints}", "compact", str(rev)],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                    env={**os.environ, "ETCDCTL_API": "3"},
                )
                self.log("etcd_compact", revision=rev)
            except (subprocess.SubprocessError, ValueError, KeyError, OSError) as exc:
                self.log("etcd_compact_failed", error=str(exc)[-200:])

    # -- observation and teardown -------------------------------------------------

    def observe(self, seconds: float) -> None:
        """Read the registry a few times a second for ``seconds`` (the quiet period)."""
        store = open_store(self.url)
        store.start()
        names = [j.name for j in self.plan.jobs] or [JOB]
        try:
            deadline = time.time() + seconds
            with (self.workdir / "snapshots.jsonl").open("a") as fh:
                # until a round has begun after the deadline: a slow read (thousands
                # of marks) must not leave the end of the period unobserved
                began = 0.0
                while began < deadline:
                    began = time.time()
                    for name in names:
                        snap = snapshot(store, name)
                        if snap is not None:
                            fh.write(json.dumps(snap) + "\n")
                    time.sleep(0.25)  # sampling rate of the observer, not a synchronisation
        finally:
            store.close()

    def stop(self) -> None:
        """Stop every worker (thawing frozen ones, healing cut links first) and log
        them down; remove their namespaces and proxies."""
        self._join_side()
        for inst in self.frozen:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)
        for box, proxies in self.links.values():
            if box.is_cut:
                box.heal()
            for x in proxies:
                x.slow = False
                if self.gray is not None and self.gray != SIGNAL_GRAY:
                    setattr(x, self.gray, False)
        if self.net is not None:
            for spot in self.net.members:
                self.net.lab.rejoin(spot)
        watcher = getattr(self, "_assignments", None)
        if watcher is not None:
            watcher.close()
        self.log("stop")
        self.workers.stop()
        for inst in self.live:
            self.log("down", instance=inst.instance_id, code=inst.proc.returncode)
        for inst in self.workers.instances:
            self._release(inst)
        self.live.clear()


def _owners_json(owners: dict[int, str]) -> Any:
    """An assignment level for events.jsonl: ``{item: instance}``, or for thousands of
    items the compact ``{"ids": [...], "owner": [index per item, -1: none]}`` the
    checker also reads (tests/chaos/checker.py's OwnerList)."""
    if len(owners) <= 256:
        return {str(i): o for i, o in owners.items()}
    ids = sorted(set(owners.values()))
    index = {x: n for n, x in enumerate(ids)}
    size = max(owners) + 1
    return {"ids": ids, "owner": [index[owners[i]] if i in owners else -1 for i in range(size)]}


def snapshot(store: CoordinationStore, job: str = JOB) -> dict[str, Any] | None:
    """The job's registry state now, or ``{"t", "error"}`` if it could not be read
    (``t`` when the read began, ``t_end`` when it ended: thousands of marks take a
    while to read)."""
    P = JobPaths(job)
    try:
        t = time.time()
        node = store.get(P.sharding)
        owners: dict[str, str] = {}
        if node is not None:
            owners = {str(i): o for i, o in Assignment.from_bytes(node.value).owners.items()}
        # one tree read per kind (etcd: one range read), not a get per mark: a bulk
        # fire leaves thousands of marks
        running: dict[str, str] = {}
        for path, mark in store.get_tree(P.running_root).items():
            name = path.rsplit("/", 1)[-1]
            if path != P.running_root and name.isdigit() and mark.value:
                running[name] = RunningMark.from_bytes(mark.value).instance_id
        queued: dict[str, str] = {}
        for path, entry in store.get_tree(P.failover_queue).items():
            name = path.rsplit("/", 1)[-1]
            if path != P.failover_queue and name.isdigit() and entry.value:
                queued[name] = FailoverEntry.from_bytes(entry.value).from_instance
        registered = store.children(P.instances)
    except (StoreError, DocumentError, ValueError) as exc:
        # recorded, not dropped: a run whose registry cannot be read must say why
        return {"t": time.time(), "job": job, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "t": t,
        "t_end": time.time(),
        "job": job,
        "owners": owners,
        "registered": registered,
        "running": running,
        "queued": queued,
    }


def run_chaos(
    plan: Plan,
    servers: ServerCluster,
    namespace: str,
    workdir: Path,
    net: Network | None = None,
) -> tuple[Report | JobsReport, str]:
    """One full chaos run; returns the checker's report and its text."""
    # operation_timeout at or below the session timeout, as docs/registry-backends.md
    # advises: a request stuck in a store leader election then ends within it
    url = servers.url(
        namespace,
        session_timeout=plan.session_timeout,
        operation_timeout=plan.operation_timeout,
        connection_timeout=10,
    )
    params = Params(
        count=plan.items,
        period=PERIOD,
        session_timeout=plan.session_timeout,
        operation_timeout=plan.operation_timeout,
        work=plan.work,
        # the one-job run (test_chaos_short) runs with misfire on too: judged by the
        # same strict rules as the production-like runs (issue 35 section 1)
        strict=True,
    )
    per_job = {spec.name: job_params(spec, plan) for spec in plan.jobs}
    quiet = max([params.quiet_deadline] + [x.quiet_deadline for x in per_job.values()])
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    out(
        f"chaos {servers.backend}: seed {plan.seed} (replay with {SEED_VAR}={plan.seed}), "
        f"{plan.duration:.0f}s, {plan.instances} instances, {plan.items} items, work "
        f"{plan.work}s, workdir {workdir}, network faults: "
        + ("on" if net is not None else f"OFF ({unavailable_reason()})")
    )
    if plan.jobs:
        out(
            "jobs: "
            + "; ".join(
                f"{j.name} ({j.kind}: {j.count} items every {j.interval:g}s, work {j.work:g})"
                for j in plan.jobs
            )
            + f"; operator: {'on' if plan.operator else 'off'}"
        )
    driver = Driver(plan, servers, url, workdir, out, net)
    if plan.jobs:
        out(
            "gray link: "
            + (
                f"proxy mode {driver.gray!r}"
                if driver.gray
                else f"OFF (the proxy has no mode for {servers.backend} that holds requests "
                "but lets session traffic through"
                + ("" if net is not None else "; no network faults")
                + ")"
            )
        )
    began = time.time()
    try:
        driver.run()
        # long enough to see repairs (session expiry, failover, a repair pass) and
        # then the registry staying clean
        driver.observe(quiet + 4.0)
    finally:
        driver.stop()
    report: Report | JobsReport = (
        check_jobs(workdir, per_job) if plan.jobs else check(load_history(workdir, params))
    )
    text = "\n".join(lines) + f"\nwall time {time.time() - began:.0f}s\n" + report.render()
    (workdir / "report.txt").write_text(text)
    print(report.render(), flush=True)
    return report, text


def job_params(spec: JobSpec, plan: Plan) -> Params:
    """The checker's parameters for one job of the workload."""
    # pre: how long before a fault its owner may not have marked a fire's items
    # running yet; the bulk job's start spans several commits of 2,500 marks each
    pre = BULK_PRE if spec.kind == "bulk" else 0.5
    return Params(
        count=spec.count,
        period=spec.interval,
        session_timeout=plan.session_timeout,
        operation_timeout=plan.operation_timeout,
        wait_timeout=spec.sharding_wait,
        pre=pre,
        name=spec.name,
        work=spec.work if spec.kind in ("sleep", "long", "stateful") else 0.0,
        # every job of the workload runs with misfire on: a fire its owner never
        # started must run later or be named in a later run's covers (issue 25, 4)
        strict=True,
    )


@pytest.fixture
def chaos_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the run's logs go (kept by pytest for post-mortems)."""
    yield tmp_path


@dataclass
class Network:
    """The chaos run's network lab and the namespaces of the store members."""

    lab: NetworkLab
    members: list[Netns]


@pytest.fixture
def chaos_store(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerCluster, Network | None]]:
    """A 3-member store whose members each run in a network namespace (fresh for the
    test, removed after it), or, where namespaces cannot be made, the session's
    loopback cluster without network faults."""
    if unavailable_reason() is not None:
        name = "zk_ensemble" if backend == "zookeeper" else "etcd_cluster"
        yield request.getfixturevalue(name), None
        return
    with NetworkLab() as lab:
        members = lab.store_members(3)
        sizing: dict[str, Any] = {"heap_mb": ZK_HEAP_MB} if backend == "zookeeper" else {}
        if backend == "etcd" and request.node.get_closest_marker("chaos") is not None:
            # the production-like run (make chaos): etcd's own timings, not the test
            # servers' 20/200 ms, which a loaded 2-core machine turned into leader
            # elections in a run with no fault at all
            sizing.update(ETCD_PRODUCTION_TIMINGS)
        servers = cluster_class(backend)(
            size=3,
            base_dir=tmp_path_factory.mktemp(f"chaos-{backend}"),
            host=[m.address for m in members],
            prefixes=[m.prefix for m in members],
            **sizing,
        )
        with servers:
            yield servers, Network(lab, members)


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_chaos_short(
    backend: str,
    chaos_store: tuple[ServerCluster, Network | None],
    namespace: str,
    chaos_dir: Path,
) -> None:
    """About a minute of random faults on each backend, starting with a partition of
    an instance: the checker finds no lost work, no unfenced overlap, no unexplained
    duplicate, no stuck state and no self-shutdown."""
    # The replacement of a killed instance starts once the death has been handled
    # (session timeout + a trigger + the failover runs), as a supervisor with a
    # restart back-off would; the long run restarts at once.
    servers, net = chaos_store
    plan = Plan(
        duration=40,
        instances=3,
        seed=chaos_seed(),
        restart_delay=(SESSION_TIMEOUT + 1.5, SESSION_TIMEOUT + 2.5),
        first="partition" if net is not None else None,
    )
    report, text = run_chaos(plan, servers, namespace, chaos_dir, net)
    assert report.ok, text + "\n" + _worker_logs(chaos_dir) + "\n" + report.verdict()


@pytest.mark.chaos
@pytest.mark.cluster
def test_chaos_long(
    backend: str,
    chaos_store: tuple[ServerCluster, Network | None],
    namespace: str,
    chaos_dir: Path,
    chaos_duration: int,
) -> None:
    """``--chaos-duration`` seconds of random faults with 4 instances running the
    production-like workload (make chaos): today's job, a bulk job of 2,500 items per
    instance, long items that poll should_stop(), CPU-bound items, an operator acting
    through the CLI, a gray link where the proxy can make one; every job checked."""
    servers, net = chaos_store
    plan = Plan(
        duration=chaos_duration,
        instances=4,
        seed=chaos_seed(),
        jobs=production_jobs(4),
        operator=True,
        # the product's default timings (a production-like run): 2 s sessions on a
        # 2-core machine running 3 store members and 4 instances of this workload
        # lose sessions with no fault at all (docs/validation.md)
        session_timeout=DEFAULT_SESSION_TIMEOUT,
        operation_timeout=DEFAULT_OPERATION_TIMEOUT,
    )
    report, text = run_chaos(plan, servers, namespace, chaos_dir, net)
    assert report.ok, text + "\n" + _worker_logs(chaos_dir) + "\n" + report.verdict()


@pytest.mark.chaos
@pytest.mark.cluster
def test_chaos_stateful(
    backend: str,
    chaos_store: tuple[ServerCluster, Network | None],
    namespace: str,
    chaos_dir: Path,
    chaos_duration: int,
) -> None:
    """``--chaos-duration`` seconds of random faults with 3 instances running
    :func:`stateful_jobs`: besides the checks of every job, no resumed run starts
    from an older checkpoint than the last accepted one of its fire, every zombie's
    checkpoint after a takeover was refused, no crashed worker process took its
    instance down; and the faults made runs resume."""
    servers, net = chaos_store
    plan = Plan(
        duration=chaos_duration,
        instances=3,
        seed=chaos_seed(),
        jobs=stateful_jobs(),
        # the product's default timings, as the production-like run (etcd runs with
        # its own there: a lease of 2 s is too close to its 1 s election timeout)
        session_timeout=DEFAULT_SESSION_TIMEOUT,
        operation_timeout=DEFAULT_OPERATION_TIMEOUT,
    )
    report, text = run_chaos(plan, servers, namespace, chaos_dir, net)
    assert report.ok, text + "\n" + _worker_logs(chaos_dir) + "\n" + report.verdict()
    assert isinstance(report, JobsReport)
    stats = report.reports["stateful"].stats
    crashes = report.reports["crashing"].stats.get("crashes", 0)
    # without resumes and crashes the run checked nothing of what it is for
    assert stats.get("ckpt_accepted", 0) > 0 and stats.get("resumes", 0) > 0, text
    assert crashes > 0, text


def _worker_logs(workdir: Path, lines: int = 30) -> str:
    parts = []
    for path in sorted(workdir.glob("worker-*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"== {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)
