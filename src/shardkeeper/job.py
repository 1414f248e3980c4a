"""The user-facing job API: subclass a job type and implement its method(s).

* :class:`ShardedJob`: implement ``execute(ctx)`` (plain or ``async def``); it is
  called once per item this instance owns at each trigger.
* :class:`DataflowJob`: implement ``fetch_data(ctx)`` and ``process_data(ctx, data)``;
  with ``streaming = True`` it loops until a fetch returns nothing or the runtime
  asks it to stop (``ctx.should_stop()``: a graceful stop's grace running out,
  fenced off, timed out).
* :class:`ScriptJob`: set ``command``; it runs once per item with the context as
  JSON (last argument and ``SHARDKEEPER_CONTEXT``); a non-zero exit is a failure.

A job class can carry its configuration as the class attribute ``config``
(a :class:`~shardkeeper.config.JobConfig`), or get one when it is added to a runtime.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from shardkeeper.errors import CheckpointFencedError, CheckpointStateError, ShardkeeperError
from shardkeeper.limits import CHECKPOINT_DEFAULT_BYTES

if TYPE_CHECKING:
    from shardkeeper.config import JobConfig
    from shardkeeper.observe import SkipRecord

__all__ = [
    "DataflowJob",
    "ItemState",
    "JobListener",
    "LocalItemState",
    "ScriptFailedError",
    "ScriptJob",
    "ShardedJob",
    "ShardingContext",
    "StopReason",
]

log = logging.getLogger(__name__)


def _always_true() -> bool:
    return True


class StopReason(enum.StrEnum):
    """Why this execution must end (``ctx.stop_reason()``).

    Only these end an execution: a pending reshard does not (the new assignment
    applies from the next fire; the fires before it keep their owners), and neither
    does a failover run of the item of an instance that died.
    """

    SHUTDOWN = "shutdown grace ending"
    """This instance is stopping gracefully and its grace period (``shutdown_grace``)
    ends within ``shutdown_notice`` seconds: checkpoint and return now; the execution
    is still valid (its writes are still this instance's to make). Not said while the
    grace period has time left: a graceful stop lets running items finish. (Its
    value was ``"shutdown"``, said as the stop began.)"""
    FENCED = "fenced"
    """``ctx.is_valid()`` is false: this instance may no longer own the item (another
    may take it over). Write nothing more."""
    TIMEOUT = "timeout"
    """The execution ran past the job's ``execution_timeout``: it is reported timed
    out and is no longer valid. Write nothing more."""


def _no_stop() -> StopReason | None:
    return None


class ItemState(Protocol):
    """What a context's checkpoint and progress calls go to: the runtime's fenced
    writes (shardkeeper/runtime/fire/checkpoints.py), or :class:`LocalItemState` for a
    context built by hand. An executor that runs items elsewhere (another process)
    forwards these four calls to the one its runtime made."""

    def checkpoint(self, state: Any, strict: bool | None) -> bool:
        """Take ``state`` (see :meth:`ShardingContext.checkpoint`)."""
        ...

    def progress(self, done: float, total: float | None, note: str | None) -> None:
        """Take a progress report (see :meth:`ShardingContext.progress`)."""
        ...

    def resume(self) -> tuple[Any, bool, Any]:
        """``(resume_state, resumed, last_state)`` of the execution."""
        ...

    def current(self) -> Any:
        """The execution's latest state (see :attr:`ShardingContext.state`)."""
        ...


class LocalItemState:
    """The state of a context built by hand (tests of a job, a direct call): checks
    and keeps checkpoints and progress in memory, as the runtime would accept them.
    ``resume_state`` and ``last_state`` are the values given here."""

    def __init__(
        self,
        resume_state: Any = None,
        last_state: Any = None,
        *,
        max_bytes: int = CHECKPOINT_DEFAULT_BYTES,
    ) -> None:
        self._resume = resume_state
        self._last = last_state
        self._max = max_bytes
        #: every state accepted, oldest first (as JSON text, decoded on read)
        self.checkpoints: list[Any] = []
        #: every progress report: (done, total, note)
        self.reports: list[tuple[float, float | None, str]] = []
        #: a test sets it to see the job's answer to a refused checkpoint
        self.fenced = False

    def checkpoint(self, state: Any, strict: bool | None) -> bool:
        """Check ``state`` as the runtime does and keep it; False (or
        CheckpointFencedError when ``strict``) once :attr:`fenced` is set."""
        try:
            text = json.dumps(state, separators=(",", ":"), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CheckpointStateError(
                f"checkpoint state of type {type(state).__name__} is not JSON-serialisable ({exc})"
            ) from None
        if len(text.encode()) > self._max:
            raise CheckpointStateError(
                f"checkpoint state is {len(text.encode())} bytes of JSON, over the limit of "
                f"{self._max} bytes (the job's checkpoint_max_bytes)"
            )
        if self.fenced:
            if strict:
                raise CheckpointFencedError("checkpoint refused: the execution is fenced")
            return False
        self.checkpoints.append(json.loads(text))
        return True

    def progress(self, done: float, total: float | None, note: str | None) -> None:
        """Keep the report."""
        self.reports.append((done, total, note or ""))

    def resume(self) -> tuple[Any, bool, Any]:
        """The values given at construction (``resumed`` when a resume state is)."""
        return self._resume, self._resume is not None, self._last

    def current(self) -> Any:
        """The latest state kept, else the resume state, else the last state."""
        if self.checkpoints:
            return self.checkpoints[-1]
        return self._resume if self._resume is not None else self._last


@dataclass(frozen=True)
class ShardingContext:
    """What one call of a job handles: one item of one trigger.

    ``execution_id`` is stable across re-runs of the same (fire time, item) (a
    failover or misfire re-run keeps it): use it as an idempotency key.
    ``fencing_token`` only grows: it is the store revision at which this execution's
    running mark was written; pass it to external systems that can reject writes
    carrying an older token.

    ``is_valid()`` turns false (for good) as soon as this instance can no longer be
    sure it still owns the item: its session was lost or replaced, the store has not
    answered a probe for 0.9 x the session timeout (the session may be expiring
    unseen: a frozen process, a cut link), its membership of the job was removed, or
    the instance is stopping hard. Another instance can only take the item over after
    this session has ended (the requeue is conditional on this instance's membership
    node being gone), so a check of ``is_valid()`` before each external write is
    answered False before a taker can start. It does not read the store: a take-over
    is detected through the session, not by polling the mark, and between two checks
    an execution may still write once; external systems that must reject such late
    writes compare ``fencing_token``.
    """

    job_name: str
    item: int
    item_parameter: str
    sharding_total_count: int
    job_parameter: str
    fire_time: datetime
    instance_id: str
    execution_id: str
    fencing_token: int = 0
    is_failover: bool = False
    is_misfire: bool = False
    props: dict[str, str] = field(default_factory=dict)
    #: one-off parameters of an operator's run-now request (``shardkeeper trigger
    #: JOB --param k=v``), also in a failover re-run of its execution; empty for
    #: scheduled fires and their re-runs
    params: dict[str, str] = field(default_factory=dict)
    #: fire times of this item that no run stood for and this run is the fold of
    #: (misfire on): earlier fires whose owner died, froze or lost its store before
    #: starting them, or that this instance skipped; and, for a misfire re-run, the
    #: later fires that came while the item ran and were folded into it. Oldest
    #: first; at most 100 (the newest).
    covers: tuple[datetime, ...] = ()
    #: how many more fires, older than the first of :attr:`covers`, this run stands
    #: for without listing them (a gap of more than 100 fires); 0 usually
    covered_before: int = 0
    _valid: Callable[[], bool] = field(default=_always_true, repr=False, compare=False)
    _stop: Callable[[], StopReason | None] = field(default=_no_stop, repr=False, compare=False)
    _item_state: ItemState = field(default_factory=LocalItemState, repr=False, compare=False)

    def checkpoint(self, state: Any, *, strict: bool | None = None) -> bool:
        """Save ``state`` (JSON-serialisable, at most the job's ``checkpoint_max_bytes``
        of JSON) as this item's progress: a successor of the same fire (a failover or
        misfire re-run) gets the last one accepted as :attr:`resume_state`.

        The write is one commit conditional on this execution's running mark (its
        fence) and on the store session it began in: once the item was taken over, or
        that session ended, the store refuses it, so a zombie never overwrites its
        successor's state. Returns True when the state was written, or is held to be
        written (calls within the job's ``checkpoint_interval`` of the last write are
        coalesced: the latest is written when the interval is up, and the last one is
        written with the item's completion or hand-off unless the item was taken over
        first); a write that meets a store error is sent again, in this call, until
        the store answers or the execution is fenced (its session may be lost), so
        True is never said of a write whose outcome is unknown; False when it was
        refused (this execution is no longer the item's, or was fenced: stop writing;
        fenced while a write that met a store error was unanswered, that write may
        still land before the session ends, and a successor may resume from it), or
        raises CheckpointFencedError instead with ``strict`` (default: the job's
        ``checkpoint_strict``). CheckpointStateError for a state that is not JSON or
        too large; CheckpointUnavailableError when the job runs without running marks
        (``monitor_execution`` off)."""
        return self._item_state.checkpoint(state, strict)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the item is (``done`` of ``total`` units, a short ``note``):
        ``shardkeeper shards``, the console and the metrics show the percent, rate and
        ETA of running items, and the history keeps the last report of a run that
        failed or was fenced. Coalesced like checkpoints (cheap to call often); never
        raises for a store failure. CheckpointStateError for a negative or non-numeric
        ``done``/``total``."""
        self._item_state.progress(done, total, note)

    @property
    def resume_state(self) -> Any:
        """The last checkpoint accepted from an earlier run of this same fire of the item
        (its run was cut off: an instance died, was fenced or stopped), or None: start
        from the beginning. Read on first use (one store read, failover and misfire
        re-runs only)."""
        return self._item_state.resume()[0]

    @property
    def resumed(self) -> bool:
        """Whether this run resumes an earlier run of the same fire
        (:attr:`resume_state` holds that run's last accepted checkpoint)."""
        return bool(self._item_state.resume()[1])

    @property
    def last_state(self) -> Any:
        """With the job's ``checkpoint_carry`` on: the last checkpoint of the item's
        previous ended run of an earlier fire (a cursor carried across fires); None
        without it, or when there is none."""
        return self._item_state.resume()[2]

    @property
    def state(self) -> Any:
        """The latest state of this run: what it last checkpointed, else
        :attr:`resume_state`, else :attr:`last_state` (a retry attempt of the same
        execution sees what the failed attempt checkpointed)."""
        return self._item_state.current()

    def is_valid(self) -> bool:
        """False once this execution is fenced off (see the class docstring for when)."""
        return self._valid()

    def should_stop(self) -> bool:
        """True when THIS execution must end: the grace period of the instance's
        graceful stop is running out (not as the stop begins: running items may
        finish within the grace), the execution is fenced off, or it timed out
        (:meth:`stop_reason` says which). A pending reshard is no reason: the new
        assignment applies from the next fire.

        An execution that returns without raising after it was told to stop is
        recorded ``interrupted``, not ``ok``, and its item is run again (handed to
        failover when the job has failover on, else at its owner's next fire): return
        early only when the work is not done."""
        return self.stop_reason() is not None

    def stop_reason(self) -> StopReason | None:
        """Why this execution must end (a :class:`StopReason`), or None when it may go
        on. ``timeout`` comes first, then ``fenced`` (a hard stop fences too), then
        ``shutdown grace ending`` (a graceful stop's grace runs out: still valid)."""
        reason = self._stop()
        if reason is StopReason.TIMEOUT:
            return reason
        if not self._valid():
            return StopReason.FENCED
        return reason

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (used by ScriptJob and logs)."""
        return {
            "job_name": self.job_name,
            "item": self.item,
            "item_parameter": self.item_parameter,
            "sharding_total_count": self.sharding_total_count,
            "job_parameter": self.job_parameter,
            "fire_time": self.fire_time.isoformat(),
            "instance_id": self.instance_id,
            "execution_id": self.execution_id,
            "fencing_token": self.fencing_token,
            "is_failover": self.is_failover,
            "is_misfire": self.is_misfire,
            "props": dict(self.props),
            "params": dict(self.params),
            "covers": [t.isoformat() for t in self.covers],
            "covered_before": self.covered_before,
        }


class ShardedJob:
    """Base class of every job. Subclasses implement :meth:`execute`."""

    #: optional configuration carried by the class
    config: ClassVar[JobConfig | None] = None

    def execute(self, ctx: ShardingContext) -> Any:
        """Handle one item. May be ``async def``. An exception marks the item failed
        (the job's error handler decides what else happens); the instance lives on."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute(ctx)")

    def run_item(self, ctx: ShardingContext) -> None:
        """Called by the runtime: runs :meth:`execute`, awaiting it if it is async."""
        _call(self.execute, ctx)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        # one long-lived loop for every async job of the process (see asyncloop)
        from shardkeeper.asyncloop import run_awaitable

        return run_awaitable(result)
    return result


class DataflowJob(ShardedJob):
    """A job that fetches a batch of data for its item and processes it.

    Its fetch position is checkpointed automatically: after each processed round the
    value :meth:`position_after` returns (when not None) is the item's checkpoint,
    and :meth:`fetch_data` reads where to go on from ``ctx.state`` (this run's last
    position, else the one a cut-off run of the same fire reached, else, with
    ``checkpoint_carry``, the previous run's).
    """

    #: keep fetching until a fetch returns nothing (or the runtime asks to stop)
    streaming: ClassVar[bool] = False
    #: upper bound of fetch/process rounds per execution in streaming mode
    max_rounds: ClassVar[int] = 10_000

    def fetch_data(self, ctx: ShardingContext) -> Sequence[Any]:
        """Return the data to process for this item (empty: nothing to do)."""
        raise NotImplementedError(f"{type(self).__name__} must implement fetch_data(ctx)")

    def process_data(self, ctx: ShardingContext, data: Sequence[Any]) -> Any:
        """Process what :meth:`fetch_data` returned."""
        raise NotImplementedError(f"{type(self).__name__} must implement process_data(ctx, data)")

    def position_after(self, ctx: ShardingContext, data: Sequence[Any]) -> Any:
        """The fetch position once ``data`` is processed (JSON-serialisable: the last
        key, an offset, a page token), checkpointed after each round; None (the
        default) checkpoints nothing."""
        return None

    def run_item(self, ctx: ShardingContext) -> None:
        """One fetch/process round, or rounds until empty/stop when streaming; the
        position after each round is checkpointed (:meth:`position_after`)."""
        rounds = 0
        while True:
            data = _call(self.fetch_data, ctx)
            if not data:
                return
            _call(self.process_data, ctx, data)
            position = self.position_after(ctx, data)
            if position is not None and not ctx.checkpoint(position):
                return  # refused: this run was taken over, its successor goes on
            rounds += 1
            if not self.streaming or ctx.should_stop() or rounds >= self.max_rounds:
                return


class ScriptFailedError(ShardkeeperError):
    """A ScriptJob command exited with a non-zero code."""

    def __init__(self, command: Sequence[str], code: int, output: str) -> None:
        self.command = list(command)
        self.code = code
        self.output = output
        tail = output.strip().splitlines()[-5:]
        super().__init__(
            f"script {' '.join(command)!r} exited with code {code}"
            + (": " + " | ".join(tail) if tail else "")
        )


class ScriptJob(ShardedJob):
    """Runs an external command once per item.

    The context is passed as JSON in the last argument and in the environment
    variable ``SHARDKEEPER_CONTEXT``; output (stdout+stderr) is captured and logged.
    """

    #: the command (argv list, or a string split by the shell rules of shlex)
    command: ClassVar[Sequence[str] | str] = ()
    #: seconds before the command is killed (None: no limit)
    timeout: ClassVar[float | None] = None

    def argv(self) -> list[str]:
        """The command as an argv list."""
        import shlex

        cmd = self.command
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ShardkeeperError(f"{type(self).__name__}.command is empty; set the command")
        return argv

    def run_item(self, ctx: ShardingContext) -> None:
        """Run the command; raise ScriptFailedError on a non-zero exit."""
        payload = json.dumps(ctx.to_dict())
        argv = [*self.argv(), payload]
        env = {**os.environ, "SHARDKEEPER_CONTEXT": payload}
        try:
            proc = subprocess.run(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = (exc.output or b"").decode(errors="replace")
            raise ScriptFailedError(argv[:-1], -9, out + "\n(timed out)") from None
        output = proc.stdout.decode(errors="replace")
        self.last_output = output
        if output:
            log.info("script %s item %d output:\n%s", ctx.job_name, ctx.item, output.rstrip())
        if proc.returncode != 0:
            raise ScriptFailedError(argv[:-1], proc.returncode, output)


class JobListener:
    """Hooks around the executions of one trigger on this instance.

    ``before_job``/``after_job`` run on each instance, with the contexts of the
    items it runs for that trigger. Subclass and override what you need. An
    exception in a listener is logged and does not stop the job.
    """

    def before_job(self, contexts: Sequence[ShardingContext]) -> None:
        """Called before this instance runs its items of one trigger."""

    def after_job(self, contexts: Sequence[ShardingContext]) -> None:
        """Called after this instance ran its items of one trigger."""

    def on_skipped(self, event: SkipRecord) -> None:
        """Called when a trigger started nothing on this instance (the job or the
        instance is disabled, the scheduler missed the fire, the store did not answer
        in time, ...): ``event.reason`` says why, ``event.fire_time`` which fire.
        Runs on the job's coordination lane: return quickly."""


class ClusterOnceListener(JobListener):
    """Hooks that run ONCE across the whole cluster for each trigger.

    ``before_all`` runs on the first instance to start the trigger's items;
    ``after_all`` on the instance that completes the last running item of the
    trigger (checked through the registry). Delivery is at-most-once per trigger
    and fire time (per request for a run-now request, whose owners each run their
    part at their own fire time).
    """

    def before_all(self, fire_time: datetime) -> None:
        """Called once per trigger in the cluster, on the first instance to start its
        items, before that instance's own items. NOT a barrier: other instances do not
        wait for it, and their items may run meanwhile (see docs/concepts.md)."""

    def after_all(self, fire_time: datetime) -> None:
        """Called once per trigger, after the last item completes everywhere."""
