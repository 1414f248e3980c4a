"""tests/chaos/foldlatency.py on small synthetic run directories (no servers, fast).

The run: job ``chaos`` (4 items every 1 s, work 0.5 s), items 0 and 1 on A, 2 and 3
on B, every run 0.1 s after its fire and 0.5 s long, from T0 + 1 to the stop at
T0 + 100 (checked fires: T0 + 3 .. T0 + 98), except:

* item 1: fires T0 + 20 .. 23 do not run; the run of T0 + 24 (at T0 + 24.1) names
  them in its covers: the pair (T0 + 20, 1) stands 4.1 s after its fire;
* item 2: fires T0 + 30 .. 89 do not run; the run of T0 + 90 (at T0 + 90.1) names
  them: 60.1 s for (T0 + 30, 2), while its owner B runs item 3 every second;
* item 3: fire T0 + 50 skipped (``disabled``) by B inside an item disable;
* item 0: fire T0 + 70 never runs nor is covered (``none``).

And job ``quick`` (a cpu job: work 0 for the checker, 2 items every 2 s on A), every
pair on time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.foldlatency import JobMeasure, main, measure_workdir, read_params

pytestmark = pytest.mark.timeout(60)

T0 = 1_000_000.0  # a whole number of periods of both jobs
A, B = "host@1@a", "host@2@b"
STOP = T0 + 100
#: chaos: work 0.5 + wait 5 + 3 * st 2 + 2 * P 1
BOUND = 13.5

REPORT = """\
chaos etcd: seed 1 (replay with SHARDKEEPER_CHAOS_SEED=1), 100s, 2 instances, 4 items, \
work 0.5s, workdir {workdir}, network faults: on
jobs: chaos (sleep: 4 items every 1s, work 0.5); quick (cpu: 2 items every 2s, work 1.5); \
operator: on
== chaos history check: job chaos ==
params: items=4 period=1s session_timeout=2s pre=0.5s slack=1s wait=5s op=2s
== chaos history check: job quick ==
params: items=2 period=2s session_timeout=2s pre=0.5s slack=1s wait=5s op=2s
"""


class Run:
    """Writes the records of one synthetic run directory."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.token = 0

    def run(
        self,
        job: str,
        instance: str,
        item: int,
        fire: float,
        start: float,
        covers: list[float] | None = None,
    ) -> None:
        """A done run: its start and end records."""
        self.token += 1
        base: dict[str, Any] = {
            "job": job,
            "instance": instance,
            "item": item,
            "fire": fire,
            "token": self.token,
            "execution_id": f"{job}@{fire:.0f}#{item}",
            "failover": False,
            "misfire": False,
            "start": start,
        }
        if covers:
            base["covers"] = covers
        self.records.append({**base, "phase": "start"})
        end = start + 0.5
        self.records.append(
            {**base, "phase": "end", "end": end, "valid": True, "valid_through": end - 0.01}
        )

    def event(self, t: float, kind: str, **fields: Any) -> None:
        """One driver event."""
        self.events.append({"t": t, "kind": kind, **fields})

    def write(self, workdir: Path) -> Path:
        """The run directory: exec-0.jsonl, events.jsonl, report.txt."""
        workdir.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(r, separators=(",", ":")) for r in self.records]
        (workdir / "exec-0.jsonl").write_text("\n".join(lines) + "\n")
        events = sorted(self.events, key=lambda e: float(e["t"]))
        (workdir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        (workdir / "report.txt").write_text(REPORT.format(workdir=workdir))
        return workdir


def sample(workdir: Path, *, owner_busy: bool = True, hold_item2: bool = False) -> Path:
    """The run of the module docstring; ``owner_busy=False``: item 3 runs on A, so B
    writes nothing while item 2 waits; ``hold_item2``: the operator disabled item 2
    from T0 + 29.5 to T0 + 89.5 (its window holds fires T0 + 30 .. T0 + 90)."""
    r = Run()
    r.event(T0, "up", instance=A)
    r.event(T0, "up", instance=B)
    r.event(T0 + 10, "store_kill", member=0, leader=False)  # 20 s before: not listed
    r.event(T0 + 25, "partition", instance=B)
    r.event(T0 + 26, "heal", instance=B)
    r.event(T0 + 49.5, "op_disable_item", job="chaos", item=3)
    r.event(T0 + 50.5, "op_enable_item", job="chaos", item=3)
    if hold_item2:
        r.event(T0 + 29.5, "op_disable_item", job="chaos", item=2)
        r.event(T0 + 89.5, "op_enable_item", job="chaos", item=2)
    r.event(STOP, "stop")
    owner3 = B if owner_busy else A
    for k in range(1, 100):
        fire = T0 + k
        if k != 70:
            r.run("chaos", A, 0, fire, fire + 0.1)
        if k == 24:
            r.run("chaos", A, 1, fire, fire + 0.1, covers=[T0 + 20, T0 + 21, T0 + 22, T0 + 23])
        elif not 20 <= k < 24:
            r.run("chaos", A, 1, fire, fire + 0.1)
        if k == 90:
            r.run("chaos", B, 2, fire, fire + 0.1, covers=[T0 + c for c in range(30, 90)])
        elif not 30 <= k < 90:
            r.run("chaos", B, 2, fire, fire + 0.1)
        if k == 50:
            r.records.append(
                {"phase": "skip", "job": "chaos", "instance": owner3, "item": 3, "fire": fire,
                 "reason": "disabled", "t": fire + 0.01}
            )  # fmt: skip
        else:
            r.run("chaos", owner3, 3, fire, fire + 0.1)
        if k % 2 == 0:
            for item in (0, 1):
                r.run("quick", A, item, fire, fire + 0.2)
    return r.write(workdir)


def by_job(measures: list[JobMeasure]) -> dict[str, JobMeasure]:
    return {m.job: m for m in measures}


def test_params_come_from_the_report(tmp_path: Path) -> None:
    """Each job's params line, and its work only for a kind that works seconds."""
    params = read_params(sample(tmp_path / "run") / "report.txt")
    assert sorted(params) == ["chaos", "quick"]
    chaos, quick = params["chaos"], params["quick"]
    assert (chaos.count, chaos.period, chaos.session_timeout, chaos.work) == (4, 1.0, 2.0, 0.5)
    assert (chaos.pre, chaos.wait_timeout, chaos.operation_timeout) == (0.5, 5.0, 2.0)
    assert (quick.count, quick.period, quick.work) == (2, 2.0, 0.0)  # cpu: no seconds
    assert chaos.stuck_bound == BOUND


def test_pairs_on_time_folded_starved_skipped_and_none(tmp_path: Path) -> None:
    """The latency of each kind of pair, the counts, the max pair and its events."""
    m = by_job(measure_workdir(sample(tmp_path / "run")))["chaos"]
    assert (m.first_fire, m.last_fire) == (T0 + 3, T0 + 98)
    assert m.pairs == 96 * 4
    assert m.skipped == 1  # (T0 + 50, 3): the disabled skip
    assert m.none == 1 and m.none_examples == [f"fire {T0 + 70:.3f} item 0"]
    assert m.no_item == 0 and m.none_implausible == 0
    assert len(m.latencies) == 96 * 4 - 2
    assert m.standing[(T0 + 5, 0)] == pytest.approx(0.1)  # on time
    assert m.standing[(T0 + 20, 1)] == pytest.approx(4.1)  # folded 4 s late
    assert m.standing[(T0 + 23, 1)] == pytest.approx(1.1)
    assert m.standing[(T0 + 30, 2)] == pytest.approx(60.1)  # starved
    assert m.standing[(T0 + 89, 2)] == pytest.approx(1.1)
    assert (T0 + 50, 3) not in m.standing and (T0 + 70, 0) not in m.standing
    assert m.max_latency == pytest.approx(60.1)
    w = m.worst
    assert w is not None
    assert (w.fire, w.item, w.instance, w.run_fire) == (T0 + 30, 2, B, T0 + 90)
    assert w.operator is None
    assert m.worst_before == ["partition host@2@b@-5.00s"]  # not the store_kill 20 s before
    assert m.worst_during == [
        "op_disable_item [job=chaos,item=3]@+19.50s",
        "op_enable_item [job=chaos,item=3]@+20.50s",
    ]
    # every measured pair but (T0 + 51, 3): inside the item disable's window, to the
    # enable + P (T0 + 49.5 .. T0 + 51.5)
    assert len(m.latencies_clean) == len(m.latencies) - 1


def test_starvation_is_the_longest_wait_with_the_owner_writing(tmp_path: Path) -> None:
    """Item 2 waits T0 + 30 .. T0 + 90.1 while B writes item 3's records: counted to
    B's last record before the run that ends it (item 3's end of T0 + 89)."""
    m = by_job(measure_workdir(sample(tmp_path / "run")))["chaos"]
    s = m.starvation
    assert s is not None
    assert (s.item, s.owner, s.start) == (2, B, T0 + 30)
    assert s.end == pytest.approx(T0 + 90.1)
    assert s.alive_until == pytest.approx(T0 + 89.6)
    assert m.starved == pytest.approx(59.6)


def test_a_silent_owner_is_no_starvation(tmp_path: Path) -> None:
    """Item 3 on A instead (its runs and skip): B writes nothing while item 2 waits,
    so that wait is not starvation; the longest is item 1's fold (T0 + 20 .. T0 + 24.1,
    A's last record before the run that ends it: the end of T0 + 23's runs). Item 0's
    none pair waits only until the item's next run (T0 + 71.1): waiting to the stop,
    it counted 29.6 s (A writes until T0 + 99.6)."""
    m = by_job(measure_workdir(sample(tmp_path / "run", owner_busy=False)))["chaos"]
    assert m.max_latency == pytest.approx(60.1)  # the latency does not care
    s = m.starvation
    assert s is not None
    assert (s.item, s.owner, s.start) == (1, A, T0 + 20)
    assert s.end == pytest.approx(T0 + 24.1)
    assert s.alive_until == pytest.approx(T0 + 23.6)
    assert m.starved == pytest.approx(3.6)


def test_a_wait_the_operator_held_is_no_starvation(tmp_path: Path) -> None:
    """Item 2 disabled over its wait: its pairs are still measured (no skip record
    names them) but left out of the latencies outside operator windows and of the
    starvation; the longest span is item 1's fold (T0 + 20 .. T0 + 24.1: to A's last
    record before it, the end of T0 + 23's runs)."""
    m = by_job(measure_workdir(sample(tmp_path / "run", hold_item2=True)))["chaos"]
    assert m.max_latency == pytest.approx(60.1)
    assert max(m.latencies_clean) == pytest.approx(4.1)
    s = m.starvation
    assert s is not None
    assert (s.item, s.owner, s.start) == (1, A, T0 + 20)
    assert s.alive_until == pytest.approx(T0 + 23.6)
    assert m.starved == pytest.approx(3.6)


def test_verdicts_against_the_default_and_a_given_bound(tmp_path: Path) -> None:
    """chaos fails the stuck bound (latency, starvation, a none pair); quick holds."""
    run = sample(tmp_path / "run")
    jobs = by_job(measure_workdir(run))
    chaos, quick = jobs["chaos"], jobs["quick"]
    assert chaos.bound == BOUND
    assert chaos.failures == [
        f"max latency 60.10s > {BOUND:g}s",
        f"starved 59.60s > {BOUND:g}s",
        "1 pair(s) with nothing standing for them",
    ]
    assert chaos.verdict().startswith("VERDICT chaos: FAIL")
    assert quick.failures == [] and quick.verdict().startswith("VERDICT quick: OK")
    assert quick.pairs == 48 * 2 and quick.max_latency == pytest.approx(0.2)
    loose = by_job(measure_workdir(run, bound=100.0))["chaos"]
    assert loose.failures == ["1 pair(s) with nothing standing for them"]


def test_cli_prints_figures_and_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line: one section per run directory, exit status 1 on a failure."""
    run = sample(tmp_path / "run")
    assert main([str(run), "--bound-seconds", "100"]) == 1
    out = capsys.readouterr().out
    assert f"== fold latency: {run} ==" in out
    assert "standing latency p50 0.10s p99 57.10s max 60.10s" in out
    assert "VERDICT quick: OK" in out
    assert "VERDICT chaos: FAIL" in out and "bound 100s" in out
