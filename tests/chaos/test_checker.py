"""The chaos history checker on synthetic histories (no servers, fast)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.checker import (
    Event,
    Execution,
    History,
    Params,
    Snapshot,
    check,
    load_history,
    percentile,
)

T0 = 1_000_000.0  # a whole number of periods: fire times are k * period
PARAMS = Params(count=2, period=1.0, session_timeout=2.0, pre=0.5, slack=1.0)
A, B, C = "host@1@a", "host@2@b", "host@3@c"


@dataclass
class Builder:
    """A two-item job: item 0 on A and item 1 on B, every second, from T0 to T0+30."""

    executions: list[Execution] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)

    def run(
        self,
        instance: str,
        item: int,
        fire: float,
        start: float | None = None,
        end: float | None = None,
        *,
        valid: bool = True,
        failover: bool = False,
        ended: bool = True,
    ) -> Execution:
        """Add one execution (start defaults to fire + 0.01, end to start + 0.3)."""
        s = fire + 0.01 if start is None else start
        e = s + 0.3 if end is None else end
        ex = Execution(
            instance=instance,
            item=item,
            fire=fire,
            token=0,
            execution_id=f"job@{round(fire * 1000)}#{item}",
            failover=failover,
            misfire=False,
            start=s,
            end=e if ended else None,
            valid=valid if ended else None,
            until=e if ended else math.inf,
        )
        self.executions.append(ex)
        return ex

    def event(self, t: float, kind: str, instance: str = "", member: int = -1) -> None:
        """Add one driver event."""
        self.events.append(Event(t=t, kind=kind, instance=instance, member=member))

    def steady(self, skip: set[tuple[float, int]] = frozenset()) -> None:  # type: ignore[assignment]
        """Every (fire, item) from T0 to T0+30 on its owner, except ``skip``."""
        for k in range(31):
            for item, owner in ((0, A), (1, B)):
                if (T0 + k, item) not in skip:
                    self.run(owner, item, T0 + k)

    def frame(self, live: tuple[str, ...] = (A, B)) -> None:
        """Ups at T0, quiet at T0+24, clean snapshots, stop at T0+31."""
        self.event(T0 - 0.5, "up", A)
        self.event(T0 - 0.4, "up", B)
        self.event(T0 + 24, "quiet")
        for n in range(12):
            self.snap(T0 + 24 + n * 0.5, live)
        self.event(T0 + 31, "stop")

    def snap(
        self,
        t: float,
        live: tuple[str, ...] = (A, B),
        running: dict[int, str] | None = None,
        queued: dict[int, str] | None = None,
    ) -> None:
        """Add a registry snapshot: both items owned by live instances."""
        self.snapshots.append(
            Snapshot(
                t=t,
                owners={0: live[0], 1: live[-1]},
                registered=frozenset(live),
                running=running or {},
                queued=queued or {},
            )
        )

    def history(self) -> History:
        """The history built so far; fencing tokens grow in start order, as the store's
        revisions do when the running marks are created."""
        self.executions.sort(key=lambda e: e.start)
        for n, ex in enumerate(self.executions, start=1):
            ex.token = n
        self.events.sort(key=lambda e: e.t)
        return History(PARAMS, self.executions, self.events, self.snapshots)


def test_clean_history_passes() -> None:
    """A history where every fire of every item ran once, cleanly, is accepted."""
    b = Builder()
    b.steady()
    b.frame()
    report = check(b.history())
    assert report.ok, report.render()
    assert report.stats["covered"] == report.stats["pairs"] > 0
    assert not report.zombie_overlaps and not report.failover_latency
    assert "RESULT: OK" in report.render()


def test_lost_item_is_rejected() -> None:
    """One (fire, item) that never ran, with no fault anywhere near, is lost work."""
    b = Builder()
    b.steady(skip={(T0 + 10, 1)})
    b.frame()
    report = check(b.history())
    assert not report.ok
    assert len(report.lost) == 1 and f"fire {T0 + 10:.3f} item 1" in report.lost[0]
    assert "LOST WORK" in report.render() and "RESULT: FAILED" in report.render()


def test_overlap_is_rejected() -> None:
    """Two valid executions of one item that overlap in time are an overlap."""
    b = Builder()
    b.steady()
    b.run(B, 0, T0 + 10, start=T0 + 10.1)  # A runs item 0 at T0+10.01..10.31 as well
    b.frame()
    report = check(b.history())
    assert not report.ok
    assert len(report.overlaps) == 1 and "item 0" in report.overlaps[0]
    assert not report.zombie_overlaps


def test_zombie_overlap_with_valid_false_is_excused_and_counted() -> None:
    """A frozen instance whose run overlaps the taker's failover run, and which is told
    valid=false at the end, is a zombie: excused, counted, and its items' fires during
    the freeze window are not lost work."""
    b = Builder()
    freeze, thaw = T0 + 10.1, T0 + 14.0
    # A is frozen in the middle of (T0+10, item 0); B takes it over after the session
    # timeout and owns item 0 from the reshard at T0+13 on
    skip = {(T0 + k, 0) for k in range(10, 31)}
    b.steady(skip=skip)
    b.run(A, 0, T0 + 10, start=T0 + 10.01, end=thaw + 0.2, valid=False)
    b.run(B, 0, T0 + 10, start=T0 + 12.2, failover=True)
    for k in range(13, 31):
        b.run(B, 0, T0 + k, start=T0 + k + 0.02)
    b.event(freeze, "freeze", A)
    b.event(thaw, "thaw", A)
    b.frame()
    report = check(b.history())
    assert report.ok, report.render()
    # the zombie overlaps the failover run and B's normal runs at T0+13 and T0+14
    assert len(report.zombie_overlaps) == 3
    assert report.excused.get("freeze of owner") == 2  # T0+11 and T0+12
    assert report.takeover_latency == [T0 + 12.2 - freeze]
    assert "overlaps excused (zombie, valid=false): 3" in report.render()


def test_zombie_that_claims_valid_is_an_overlap() -> None:
    """The same zombie overlap is rejected when the zombie was not fenced (valid=true)."""
    b = Builder()
    b.steady(skip={(T0 + k, 0) for k in range(10, 31)})
    b.run(A, 0, T0 + 10, start=T0 + 10.01, end=T0 + 14.2, valid=True)
    b.run(B, 0, T0 + 10, start=T0 + 12.2, failover=True)
    for k in range(13, 31):
        b.run(B, 0, T0 + k, start=T0 + k + 0.02)
    b.event(T0 + 10.1, "freeze", A)
    b.event(T0 + 14.0, "thaw", A)
    b.frame()
    report = check(b.history())
    assert not report.ok and len(report.overlaps) == 3


def _killed_history(with_failover: bool) -> Builder:
    """A is killed mid-run at T0+10.2; B owns both items from T0+13 on."""
    b = Builder()
    b.steady(skip={(T0 + k, 0) for k in range(10, 31)})
    b.run(A, 0, T0 + 10, ended=False)
    if with_failover:
        b.run(B, 0, T0 + 10, start=T0 + 12.3, failover=True)
    for k in range(13, 31):
        b.run(B, 0, T0 + k, start=T0 + k + 0.02)
    b.event(T0 + 10.2, "kill", A)
    b.event(T0 + 10.2, "down", A)
    b.frame(live=(B,))
    return b


def test_kill_with_failover_passes_and_measures_latency() -> None:
    """An execution interrupted by kill -9 and re-run elsewhere: no loss; the failover
    latency is the time from the kill to the re-run's start."""
    report = check(_killed_history(with_failover=True).history())
    assert report.ok, report.render()
    assert report.failover_latency == [T0 + 12.3 - (T0 + 10.2)]
    assert report.excused.get("kill of owner") == 2
    assert "failover latency after kill -9: n=1" in report.render()


def test_kill_without_failover_is_lost_work() -> None:
    """An execution interrupted by kill -9 that nobody re-runs is lost work."""
    report = check(_killed_history(with_failover=False).history())
    assert not report.ok
    assert any("started but never completed validly" in x for x in report.lost)


def test_fires_after_the_fault_window_must_run() -> None:
    """Fires of the dead owner's item beyond session timeout + period + slack are lost."""
    b = _killed_history(with_failover=True)
    b.executions = [e for e in b.executions if not (e.item == 0 and e.fire == T0 + 15)]
    report = check(b.history())
    assert not report.ok
    assert len(report.lost) == 1 and f"fire {T0 + 15:.3f} item 0" in report.lost[0]


def test_stuck_running_mark_of_dead_instance_is_rejected() -> None:
    """A running mark naming a dead instance that outlives the quiet deadline is stuck."""
    b = _killed_history(with_failover=True)
    b.snapshots = []
    for n in range(12):
        b.snap(T0 + 24 + n * 0.5, live=(B,), running={0: A})
    report = check(b.history())
    assert not report.ok
    assert report.stuck and "running marks of dead instances" in report.stuck[-1]


def test_registry_clean_in_time_passes() -> None:
    """A failover-queue entry of a dead instance that is gone before the deadline is fine."""
    b = _killed_history(with_failover=True)
    b.snapshots = []
    b.snap(T0 + 24.2, live=(B,), queued={0: A})
    for n in range(1, 12):
        b.snap(T0 + 24 + n * 0.5, live=(B,))
    report = check(b.history())
    assert report.ok, report.render()
    assert report.stats["stuck_clean_after"] == 0.5


def test_store_member_kill_excuses_every_item_briefly() -> None:
    """Fires right after a store member kill may be skipped by any instance (SUSPENDED),
    but not later ones."""
    b = Builder()
    b.steady(skip={(T0 + 10, 0), (T0 + 11, 1), (T0 + 20, 1)})
    b.event(T0 + 9.8, "store_kill", member=1)
    b.event(T0 + 12.0, "store_up", member=1)
    b.frame()
    report = check(b.history())
    assert report.excused.get("store member fault") == 2
    assert len(report.lost) == 1 and f"fire {T0 + 20:.3f} item 1" in report.lost[0]


def test_coalesced_fire_behind_a_delayed_trigger_is_excused() -> None:
    """A fire that comes while the item's earlier fire is still waiting to start (its
    trigger held up by a reshard) is coalesced by the misfire rule: excused, counted."""
    b = Builder()
    b.steady(skip={(T0 + 10, 0), (T0 + 11, 0)})
    b.run(A, 0, T0 + 10, start=T0 + 11.6)  # delayed trigger, then its misfire re-run
    b.frame()
    report = check(b.history())
    assert report.ok, report.render()
    assert report.excused == {"coalesced: earlier fire still pending or running": 1}


def test_token_must_grow_between_runs_of_an_item() -> None:
    """A later execution with a smaller fencing token is reported."""
    b = Builder()
    b.steady()
    b.frame()
    history = b.history()
    late = next(e for e in history.executions if e.item == 1 and e.fire == T0 + 5)
    late.token = 1
    report = check(history)
    assert not report.ok and report.token_order


def test_load_history_reads_the_files(tmp_path: Path) -> None:
    """load_history pairs start/end records, tolerates a torn last line, and uses the
    down event as the end of an interrupted execution."""
    base = {"instance": A, "item": 0, "fire": T0, "token": 7, "execution_id": "j@1#0"}
    lines = [
        {**base, "phase": "start", "start": T0 + 0.01, "failover": False, "misfire": False},
        {**base, "phase": "end", "start": T0 + 0.01, "end": T0 + 0.3, "valid": True},
        {**base, "phase": "start", "fire": T0 + 1, "start": T0 + 1.01, "execution_id": "j@2#0"},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"phase": "end", "inst'
    (tmp_path / "exec-0.jsonl").write_text(text)
    events = [
        {"t": T0 - 1, "kind": "up", "instance": A},
        {"t": T0 + 1.2, "kind": "down", "instance": A},
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    snap = {"t": T0 + 2, "owners": {"0": A}, "registered": [A], "running": {}, "queued": {}}
    (tmp_path / "snapshots.jsonl").write_text(json.dumps(snap) + "\n")
    history = load_history(tmp_path, PARAMS)
    assert [(e.fire, e.end, e.valid) for e in history.executions] == [
        (T0, T0 + 0.3, True),
        (T0 + 1, None, None),
    ]
    assert history.executions[1].until == T0 + 1.2
    assert history.snapshots[0].owners == {0: A}
    assert [e.kind for e in history.events] == ["up", "down"]


def test_percentile_nearest_rank() -> None:
    """p50/p95 use the nearest-rank method."""
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.5) == 10.0
    assert percentile(values, 0.95) == 19.0
    assert math.isnan(percentile([], 0.5))
