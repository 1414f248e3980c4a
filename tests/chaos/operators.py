"""An operator acting on the chaos cluster during its faults, through the real CLI.

Every action is one ``shardkeeper`` command in a subprocess (the CLI over the ops
layer, src/shardkeeper/ops/), as a person at a terminal would run it while the
fault driver keeps injecting faults:

* ``trigger JOB --param op=N``: run-now with a parameter the checker looks for in the
  executions' ``ctx.params``;
* ``disable JOB --item I`` ... ``enable JOB --item I``;
* ``disable --instance ID`` ... ``enable --instance ID`` (every job it runs);
* ``disable JOB`` ... ``enable JOB``;
* ``config set JOB sharding_total_count=N`` up, and later back down;
* a rolling restart: ``shutdown ID --wait`` of every instance in turn, each replaced
  by a new one (a deployment), while the faults go on.

Each action is logged to the driver's ``events.jsonl`` as an ``op_*`` event: a switch
from the moment its command was started (it may apply before the command returns),
its reversal once its command succeeded, a failed command with its output. The
checker excuses the fires of what the operator switched off for that window only.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ACTIONS", "Operator", "OperatorTarget"]

#: every action, each run at least once (seeded order), then random ones
ACTIONS = (
    "trigger",
    "disable_item",
    "disable_instance",
    "disable_job",
    "count",
    "rolling_restart",
)
#: seconds one CLI command may take (a store member down, a leader election)
CLI_TIMEOUT = 60.0
#: seconds a rolling restart waits for a fault on an instance to end
ROLLING_WAIT = 30.0
#: attempts of a command that undoes a switch (it must not stay switched off)
UNDO_ATTEMPTS = 5


class OperatorTarget(Protocol):
    """What the operator needs from the fault driver."""

    def log(self, kind: str, at: float | None = None, **fields: Any) -> float:
        """Append one event to events.jsonl (at ``at`` or now); returns its time."""
        ...

    def live_ids(self) -> list[str]:
        """The ids of the instances up now (not being faulted or restarted)."""
        ...

    def all_ids(self) -> list[str]:
        """The ids of every live instance (a fault may be acting on some)."""
        ...

    def operator_restart(self, instance_id: str, stop: Callable[[str], bool]) -> bool:
        """Replace one instance: ``stop(id)`` asks it to leave; then wait for its exit
        and start a new one. False when the instance was not available."""
        ...


@dataclass
class Jobs:
    """The jobs the operator acts on (names from the chaos workload)."""

    trigger: Sequence[str]
    item_job: str
    item_count: int
    switch_job: str
    count_job: str
    count_low: int
    count_high: int


class Operator:
    """Runs operator actions (see the module docstring) until :meth:`stop`."""

    def __init__(
        self,
        target: OperatorTarget,
        url: str,
        jobs: Jobs,
        seed: int,
        out: Callable[[str], None],
    ) -> None:
        self.target = target
        self.url = url
        self.jobs = jobs
        self.rng = random.Random(seed)
        self.out = out
        self._stopping = False
        self._sequence = 0
        self._count_high = False
        self.commands = 0
        self.failures = 0
        #: actions that raised (a worker that could not be started, ...)
        self.errors: list[str] = []

    def stop(self) -> None:
        """Ask :meth:`run` to end after the current action (switches are undone)."""
        self._stopping = True

    # -- the CLI ------------------------------------------------------------------

    def cli(self, *args: str) -> tuple[bool, str]:
        """Run one ``shardkeeper`` command; (succeeded, its output)."""
        self.commands += 1
        cmd = [sys.executable, "-m", "shardkeeper.cli", *args, "--registry", self.url]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired as exc:
            self.failures += 1
            return False, f"timed out after {CLI_TIMEOUT:g}s: {exc.stderr!r}"
        text = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            self.failures += 1
        return done.returncode == 0, text

    def _act(self, kind: str, args: Sequence[str]) -> tuple[bool, float]:
        began = time.time()
        ok, text = self.cli(*args)
        if not ok:
            self.target.log("op_failed", at=began, action=kind, args=list(args), output=text[-300:])
        verdict = "ok" if ok else "FAILED"
        self.out(f"  {time.strftime('%H:%M:%S')} operator: {' '.join(args)} -> {verdict}")
        return ok, began

    def _switch(self, kind: str, args: Sequence[str], **fields: Any) -> bool:
        """Run a command that switches something off and log ``kind`` (dated when the
        command began) only once it succeeded: the checkers open an operator window
        for a switch that took effect, never for an intent (a failed command logs
        ``op_failed`` only). The switch is undone afterwards either way (a command
        that timed out may still have taken effect)."""
        ok, began = self._act(kind, args)
        if ok:
            self.target.log(kind, at=began, **fields)
        return ok

    def _undo(self, kind: str, args: Sequence[str], **fields: Any) -> None:
        """Run a command that switches something on again, retried until it worked,
        then log ``kind`` (the end of the excused window)."""
        for _ in range(UNDO_ATTEMPTS):
            ok, _began = self._act(kind, args)
            if ok:
                self.target.log(kind, **fields)
                return
            time.sleep(1.0)  # back-off between attempts of an operator, not a synchronisation
        # never switched on again: the window stays open to the end, the report says so
        self.target.log("op_failed", action=kind, args=list(args), output="gave up")

    def _hold(self) -> None:
        time.sleep(self.rng.uniform(3.0, 8.0))  # how long a switch stays off

    # -- actions ------------------------------------------------------------------

    def op_trigger(self) -> None:
        """Run-now with a parameter the checker must find in ctx.params."""
        job = self.rng.choice(list(self.jobs.trigger))
        self._sequence += 1
        token = f"{self._sequence}-{self.rng.randrange(10**6)}"
        ok, began = self._act("op_trigger", ["trigger", job, "--param", f"op={token}"])
        self.target.log("op_trigger", at=began, job=job, params={"op": token}, ok=ok)

    def op_disable_item(self) -> None:
        """Switch one item off for a few seconds."""
        job, item = self.jobs.item_job, self.rng.randrange(self.jobs.item_count)
        self._switch("op_disable_item", ["disable", job, "--item", str(item)], job=job, item=item)
        self._hold()
        self._undo("op_enable_item", ["enable", job, "--item", str(item)], job=job, item=item)

    def op_disable_instance(self) -> None:
        """Switch one instance off (every job) for a few seconds."""
        live = self.target.live_ids()
        if len(live) < 2:
            return  # keep one instance to run the items
        inst = self.rng.choice(live)
        self._switch("op_disable_instance", ["disable", "--instance", inst], instance=inst)
        self._hold()
        self._undo("op_enable_instance", ["enable", "--instance", inst], instance=inst)

    def op_disable_job(self) -> None:
        """Switch a whole job off for a few seconds."""
        job = self.jobs.switch_job
        self._switch("op_disable_job", ["disable", job], job=job)
        self._hold()
        self._undo("op_enable_job", ["enable", job], job=job)

    def op_count(self) -> None:
        """``config set`` of sharding_total_count: up, and the next time down again."""
        job = self.jobs.count_job
        old, new = (
            (self.jobs.count_high, self.jobs.count_low)
            if self._count_high
            else (self.jobs.count_low, self.jobs.count_high)
        )
        ok, began = self._act("op_count", ["config", "set", job, f"sharding_total_count={new}"])
        if ok:
            self._count_high = not self._count_high
            self.target.log("op_count", at=began, job=job, old=old, new=new)

    def op_rolling_restart(self) -> None:
        """``shutdown --wait`` every instance in turn, each replaced by a new one."""
        self.target.log("op_rolling_start")

        def stop(instance_id: str) -> bool:
            ok, _ = self._act("op_shutdown", ["shutdown", instance_id, "--wait", "40"])
            return ok

        restarted: list[str] = []
        for inst in self.target.live_ids():
            # an instance a fault is acting on is restarted once the fault is over;
            # one the fault driver replaced meanwhile is already gone
            deadline = time.monotonic() + ROLLING_WAIT
            while not self.target.operator_restart(inst, stop):
                if time.monotonic() > deadline or inst not in self.target.all_ids():
                    break
                time.sleep(0.5)  # an operator waiting for a fault to end: polling
            else:
                restarted.append(inst)
        self.target.log("op_rolling_end", restarted=restarted)

    def restore(self) -> None:
        """Put the count back to its low value (the final state the checker judges)."""
        if self._count_high:
            self.op_count()

    def run(self, until: float) -> None:
        """Act until ``until`` (wall clock) or :meth:`stop`: every action once in a
        seeded order, then random ones (no second rolling restart), a pause between."""
        order = list(ACTIONS)
        self.rng.shuffle(order)
        time.sleep(self.rng.uniform(2.0, 6.0))  # the operator arrives during the faults
        while not self._stopping and time.time() < until:
            kind = order.pop(0) if order else self.rng.choice(ACTIONS[:-1])
            try:
                getattr(self, f"op_{kind}")()
            except Exception as exc:  # recorded and reported; the operator goes on
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:400])
                self.target.log("op_error", action=kind, error=self.errors[-1])
            time.sleep(self.rng.uniform(4.0, 10.0))  # between an operator's actions
        self.restore()
