"""Every registry path shardkeeper uses, built in this one module.

The tree inside a namespace (the same on ZooKeeper and etcd)::

    /instances/{instance}                  E  process metadata (JSON): host, pid, version,
                                              started_at, labels, jobs
    /control/shutdown/{instance}           P  operator asks that instance to stop gracefully
    /control/probe/{instance}              E  a gray instance's probe commit: answered,
                                              it rejoins (runtime/health/graylink.py)
    /control/clock/{instance}              E  the instance's latest clock sample (JSON:
                                              offset, error, at, source, limit, skewed
                                              jobs; runtime/clockskew.py)
    /jobs/{job}/config                     P  the JobConfig (JSON), incl. job_class
    /jobs/{job}/instances/{instance}       E  membership of that instance in the job (JSON)
    /jobs/{job}/leader                     E  id of the elected leader
    /jobs/{job}/sharding                   P  the assignment (JSON): total, owners by item,
                                              instances, generation, leader, at
    /jobs/{job}/necessary                  P  "reshard at the next trigger" flag (reason)
    /jobs/{job}/removed                    P  fires owed by items a count cut removed, until
                                              the leader records them as skips (JSON;
                                              coordination/cuts.py)
    /jobs/{job}/running/{item}             E/P item is executing now (JSON: instance, fire
                                              time, execution id, failover); persistent
                                              when failover is on, so a crash leaves it
                                              for the survivors to take over
    /jobs/{job}/running/{item}/fence-{id}  P  fence child of a persistent mark: its
                                              unique incarnation (completion checks it)
    /jobs/{job}/failover/queue/{item}      P  orphaned item waiting for a taker (JSON)
    /jobs/{job}/misfire/{item}             P  a trigger was missed while the item ran
    /jobs/{job}/progress/{item}            P  the running execution's last progress (JSON:
                                              execution id, done, total, note, times;
                                              runtime/fire/checkpoints.py), fenced like a
                                              checkpoint, deleted by its completion
    /jobs/{job}/results/{item}             P  how the item's last execution ended (JSON:
                                              outcome, times, last ok, error; written by
                                              the completion commit)
    /jobs/{job}/disabled/job               P  whole job switched off by an operator
    /jobs/{job}/disabled/items/{item}      P  item switched off
    /jobs/{job}/disabled/instances/{inst}  P  instance gets no items of this job
    /jobs/{job}/skewed/{instance}          E  the instance's clock is past the job's
                                              max_time_diff_seconds: no items for it (JSON)
    /jobs/{job}/trigger/{instance}         P  a one-off job's catch-up addressed to one
                                              instance (runtime/runner/oneoff.py)
    /jobs/{job}/runnow/{request}           P  an operator's run-now request (JSON: by, at,
                                              params, total, items): kept until each of
                                              its items has a record (coordination/runnow.py)
    /jobs/{job}/runnow/{request}/{item}    P  the item's record for that request: started
                                              (created in its start commit) or skipped
    /jobs/{job}/once/{fire}                P  done-marker of a cluster-wide-once listener
    /jobs/{job}/fired/{instance}           P  last fire time this instance started items for
    /jobs/{job}/done                       P  a one-off job (``at``) is done: every item of
                                              its fire completed, or the fire was skipped
                                              (JSON: at, done_at, by, skipped items)
    /audit/jobs/{job}/{entry}              P  one operator action on the job (JSON: who,
                                              via, host, action, target, outcome, details);
                                              the newest 200 per job are kept
                                              (ops/audit.py); outside /jobs/{job}, so that
                                              removing a job keeps its audit trail
    /audit/namespace/{entry}               P  the same, for actions on no job (shutdown,
                                              fix-acl, an instance switch that found no job)
    /checkpoints/{job}/{item}/{fire-ms}    P  the last accepted checkpoint of one fire's
                                              run of the item (JSON: execution id, state,
                                              ended outcome; coordination/checkpoints.py);
                                              outside /jobs/{job}, so that the snapshot
                                              reads of the tools never read the states;
                                              the newest few fires per item are kept

E = ephemeral (bound to the instance's session), P = persistent.
Instance ids look like ``host@pid@suffix``; job names use ``[A-Za-z0-9._-]``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUDIT",
    "CHECKPOINTS",
    "CONTROL",
    "FENCE_PREFIX",
    "INSTANCES",
    "JOBS",
    "InstanceNode",
    "JobNode",
    "JobPaths",
    "ParsedNode",
    "ShutdownNode",
    "Unknown",
    "audit_entry",
    "audit_job_root",
    "audit_namespace_root",
    "checkpoint_item_root",
    "checkpoint_job_root",
    "checkpoint_path",
    "clock_path",
    "instance_path",
    "is_high_churn",
    "job_paths",
    "parse",
    "parse_job_path",
    "probe_path",
    "shutdown_path",
]

INSTANCES = "/instances"
#: name prefix of a persistent running mark's fence child
FENCE_PREFIX = "fence-"
JOBS = "/jobs"
CONTROL = "/control"
#: the operators' audit trail (read by the tools only; never by an instance)
AUDIT = "/audit"
#: the items' checkpoints (read by the runs that resume or carry them, never watched)
CHECKPOINTS = "/checkpoints"


def instance_path(instance_id: str) -> str:
    """Process-level membership node of an instance."""
    return f"{INSTANCES}/{instance_id}"


def shutdown_path(instance_id: str) -> str:
    """Remote graceful-shutdown request for an instance."""
    return f"{CONTROL}/shutdown/{instance_id}"


def clock_path(instance_id: str) -> str:
    """``/control/clock/{instance}``: the instance's latest clock sample (ephemeral)."""
    return f"{CONTROL}/clock/{instance_id}"


def probe_path(instance_id: str) -> str:
    """``/control/probe/{instance}``: the gray-link guard's probe commit (ephemeral)."""
    return f"{CONTROL}/probe/{instance_id}"


def audit_job_root(job: str) -> str:
    """``/audit/jobs/{job}``: parent of the audit entries of one job."""
    return f"{AUDIT}/jobs/{job}"


def audit_namespace_root() -> str:
    """``/audit/namespace``: parent of the audit entries that concern no job."""
    return f"{AUDIT}/namespace"


def checkpoint_job_root(job: str) -> str:
    """``/checkpoints/{job}``: parent of one job's checkpoints (removed with the job)."""
    return f"{CHECKPOINTS}/{job}"


def checkpoint_item_root(job: str, item: int) -> str:
    """``/checkpoints/{job}/{item}``: parent of the checkpoints of one item, one per fire."""
    return f"{CHECKPOINTS}/{job}/{item}"


def checkpoint_path(job: str, item: int, fire_time: float) -> str:
    """``/checkpoints/{job}/{item}/{fire-ms}``: the checkpoint of one fire's run of an
    item (milliseconds of the fire time, as execution ids count them)."""
    return f"{checkpoint_item_root(job, item)}/{round(fire_time * 1000)}"


def audit_entry(root: str, entry_id: str) -> str:
    """One audit entry under ``root`` (:func:`audit_job_root` or
    :func:`audit_namespace_root`); ids sort oldest first."""
    return f"{root}/{entry_id}"


@dataclass(frozen=True)
class JobPaths:
    """The paths of one job's subtree."""

    job: str

    @property
    def root(self) -> str:
        """``/jobs/{job}``."""
        return f"{JOBS}/{self.job}"

    @property
    def config(self) -> str:
        """Stored job configuration."""
        return f"{self.root}/config"

    @property
    def instances(self) -> str:
        """Parent of the job's membership nodes."""
        return f"{self.root}/instances"

    def instance(self, instance_id: str) -> str:
        """Membership node of one instance in this job."""
        return f"{self.instances}/{instance_id}"

    @property
    def leader(self) -> str:
        """Ephemeral leader node."""
        return f"{self.root}/leader"

    @property
    def sharding(self) -> str:
        """The assignment document."""
        return f"{self.root}/sharding"

    @property
    def necessary(self) -> str:
        """Reshard-needed flag."""
        return f"{self.root}/necessary"

    @property
    def removed(self) -> str:
        """Fires owed by items a cut of the count removed (coordination/cuts.py)."""
        return f"{self.root}/removed"

    @property
    def running_root(self) -> str:
        """Parent of the running marks."""
        return f"{self.root}/running"

    def running(self, item: int) -> str:
        """Running mark of one item."""
        return f"{self.running_root}/{item}"

    @property
    def failover_queue(self) -> str:
        """Parent of queued orphaned items."""
        return f"{self.root}/failover/queue"

    def failover_item(self, item: int) -> str:
        """Queue entry of one orphaned item."""
        return f"{self.failover_queue}/{item}"

    @property
    def misfire_root(self) -> str:
        """Parent of misfire marks."""
        return f"{self.root}/misfire"

    def misfire(self, item: int) -> str:
        """Misfire mark of one item."""
        return f"{self.misfire_root}/{item}"

    @property
    def progress_root(self) -> str:
        """Parent of the running executions' progress documents."""
        return f"{self.root}/progress"

    def progress(self, item: int) -> str:
        """Last progress of the execution running ``item`` (runtime/fire/checkpoints.py)."""
        return f"{self.progress_root}/{item}"

    @property
    def results_root(self) -> str:
        """Parent of the last-result documents."""
        return f"{self.root}/results"

    def result(self, item: int) -> str:
        """Last result of one item (coordination/results.py)."""
        return f"{self.results_root}/{item}"

    @property
    def disabled_job(self) -> str:
        """Whole-job switch."""
        return f"{self.root}/disabled/job"

    @property
    def disabled_items(self) -> str:
        """Parent of disabled-item switches."""
        return f"{self.root}/disabled/items"

    def disabled_item(self, item: int) -> str:
        """Switch of one item."""
        return f"{self.disabled_items}/{item}"

    @property
    def disabled_instances(self) -> str:
        """Parent of disabled-instance switches."""
        return f"{self.root}/disabled/instances"

    def disabled_instance(self, instance_id: str) -> str:
        """Switch of one instance for this job."""
        return f"{self.disabled_instances}/{instance_id}"

    @property
    def skewed_root(self) -> str:
        """Parent of the clock-skew marks (runtime/clockskew.py)."""
        return f"{self.root}/skewed"

    def skewed(self, instance_id: str) -> str:
        """Ephemeral mark: this instance's clock is past the job's limit."""
        return f"{self.skewed_root}/{instance_id}"

    @property
    def trigger_root(self) -> str:
        """Parent of run-now requests."""
        return f"{self.root}/trigger"

    def trigger(self, instance_id: str) -> str:
        """Run-now request for one instance (a one-off job's catch-up)."""
        return f"{self.trigger_root}/{instance_id}"

    @property
    def runnow_root(self) -> str:
        """Parent of the operators' run-now requests (coordination/runnow.py)."""
        return f"{self.root}/runnow"

    def runnow(self, request: str) -> str:
        """One run-now request of the job."""
        return f"{self.runnow_root}/{request}"

    def runnow_item(self, request: str, item: int) -> str:
        """The record of ``item`` for ``request``: started or skipped."""
        return f"{self.runnow(request)}/{item}"

    @property
    def fired_root(self) -> str:
        """Parent of the last-started-fire markers."""
        return f"{self.root}/fired"

    def fired(self, instance_id: str) -> str:
        """Last fire time ``instance_id`` started items for."""
        return f"{self.fired_root}/{instance_id}"

    @property
    def once_root(self) -> str:
        """Parent of cluster-wide-once listener markers."""
        return f"{self.root}/once"

    def once(self, marker: str) -> str:
        """Marker of one cluster-wide-once listener call."""
        return f"{self.once_root}/{marker}"

    @property
    def done(self) -> str:
        """Done marker of a one-off job (coordination/oneoff.py)."""
        return f"{self.root}/done"


def job_paths(job: str) -> JobPaths:
    """Paths of the job named ``job``."""
    return JobPaths(job)


#: per-job subtrees that change at every trigger and that watchers can leave out
#: (their readers re-read the store, polling with a deadline)
HIGH_CHURN = frozenset({"running", "misfire", "once", "fired", "results", "progress"})


def is_high_churn(path: str) -> bool:
    """Whether ``path`` is ``/jobs/{job}/running``, ``misfire``, ``once``, ``fired``,
    ``results`` or ``progress`` itself, or ``/control/clock`` (rewritten at every clock
    sample), or ``/checkpoints`` (rewritten by running items, read only by the runs
    that resume them).
    The runtime's namespace watch excludes these subtrees: on ZooKeeper that saves
    reading every running mark on every instance at every trigger. ``/audit`` is
    excluded too: no instance reads it, and a resync would otherwise read every
    job's audit trail on every instance."""
    if path in (f"{CONTROL}/clock", AUDIT, CHECKPOINTS):
        return True
    parsed = parse_job_path(path)
    return parsed is not None and len(parsed[1]) == 1 and parsed[1][0] in HIGH_CHURN


def parse_job_path(path: str) -> tuple[str, list[str]] | None:
    """Split ``/jobs/{job}/rest...`` into (job, rest segments); None for other paths."""
    if not path.startswith(JOBS + "/"):
        return None
    segs = path[len(JOBS) + 1 :].split("/")
    return segs[0], segs[1:]


# ---- parsing: path -> typed node ------------------------------------------------------
#
# The runtime, the operations API and tools read the tree through parse(): one place
# knows the layout both ways. A name that fits no known node is an Unknown node, never
# an exception: a stray node (an operator's typo, a newer version's node) must not crash
# an event handler.


@dataclass(frozen=True)
class InstanceNode:
    """``/instances/{instance}``."""

    instance: str


@dataclass(frozen=True)
class ShutdownNode:
    """``/control/shutdown/{instance}``."""

    instance: str


@dataclass(frozen=True)
class JobNode:
    """A node of one job's subtree: ``kind`` names it (``config``, ``member``, ``leader``,
    ``sharding``, ``necessary``, ``removed``, ``done``, ``running``, ``failover``, ``misfire``,
    ``disabled_job``,
    ``disabled_item``, ``disabled_instance``, ``skewed``, ``trigger``, ``once``, ``fired``,
    ``result``, ``progress``, ``runnow`` (a request, ``name`` its id), ``runnow_item``
    (an item's record of a request), or
    ``root`` for ``/jobs/{job}`` and ``subtree`` for a bare parent such as
    ``/jobs/{job}/running``; ``fence`` for a running mark's fence child). ``item`` is
    set for per-item nodes, ``instance`` for per-instance nodes, ``name`` for once
    markers, fence children and bare parents."""

    job: str
    kind: str
    item: int | None = None
    instance: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Unknown:
    """A path that is not part of the layout (or ``/``, ``/jobs``, ``/instances``)."""

    path: str


ParsedNode = InstanceNode | ShutdownNode | JobNode | Unknown

_ITEM_KINDS = {
    "running": "running",
    "misfire": "misfire",
    "results": "result",
    "progress": "progress",
}
_INSTANCE_KINDS = {
    "instances": "member",
    "trigger": "trigger",
    "fired": "fired",
    "skewed": "skewed",
}
_SINGLE_KINDS = {"config", "leader", "sharding", "necessary", "removed", "done"}
_PARENTS = {
    "instances",
    "running",
    "misfire",
    "results",
    "progress",
    "trigger",
    "fired",
    "once",
    "failover",
    "disabled",
    "skewed",
    "runnow",
}


def _item(name: str) -> int | None:
    return int(name) if name.isdigit() and len(name) < 10 else None


def parse(path: str) -> ParsedNode:
    """The node ``path`` names in the layout drawn in the module docstring."""
    segs = path.strip("/").split("/") if path.strip("/") else []
    if len(segs) == 2 and segs[0] == INSTANCES[1:]:
        return InstanceNode(segs[1])
    if len(segs) == 3 and segs[:2] == ["control", "shutdown"]:
        return ShutdownNode(segs[2])
    if len(segs) < 2 or segs[0] != JOBS[1:]:
        return Unknown(path)
    job, rest = segs[1], segs[2:]
    if not rest:
        return JobNode(job, "root")
    head = rest[0]
    if len(rest) == 1:
        if head in _SINGLE_KINDS:
            return JobNode(job, head)
        if head in _PARENTS:
            return JobNode(job, "subtree", name=head)
        return Unknown(path)
    if len(rest) == 2:
        if head in _ITEM_KINDS:
            item = _item(rest[1])
            return Unknown(path) if item is None else JobNode(job, _ITEM_KINDS[head], item=item)
        if head in _INSTANCE_KINDS:
            return JobNode(job, _INSTANCE_KINDS[head], instance=rest[1])
        if head == "once":
            return JobNode(job, "once", name=rest[1])
        if head == "runnow":
            return JobNode(job, "runnow", name=rest[1])
        if head == "disabled" and rest[1] == "job":
            return JobNode(job, "disabled_job")
        if head in ("disabled", "failover"):
            return JobNode(job, "subtree", name=f"{head}/{rest[1]}")
        return Unknown(path)
    if len(rest) == 3:
        if rest[:2] == ["failover", "queue"]:
            item = _item(rest[2])
            return Unknown(path) if item is None else JobNode(job, "failover", item=item)
        if rest[:2] == ["disabled", "items"]:
            item = _item(rest[2])
            return Unknown(path) if item is None else JobNode(job, "disabled_item", item=item)
        if rest[:2] == ["disabled", "instances"]:
            return JobNode(job, "disabled_instance", instance=rest[2])
        if head == "runnow":
            item = _item(rest[2])
            return (
                Unknown(path)
                if item is None
                else JobNode(job, "runnow_item", item=item, name=rest[1])
            )
        if head == "running" and rest[2].startswith(FENCE_PREFIX):
            item = _item(rest[1])
            return Unknown(path) if item is None else JobNode(job, "fence", item=item, name=rest[2])
    return Unknown(path)
