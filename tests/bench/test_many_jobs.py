"""The many-jobs bench's pure parts: matching runs to (job, item, fire) pairs, the
warm-up's full fire, the window's first fire, and the report's row. No servers."""

from __future__ import annotations

from typing import Any

import pytest
from bench.many_jobs import (
    Tally,
    describe,
    expected_fires,
    first_measured_fire,
    full_fire,
    job_config,
    tally,
)

from bench import report

pytestmark = pytest.mark.timeout(30)

FIRES = [100.0, 105.0, 110.0]


def run(job: int, item: int, fire: float, late: float = 0.01, **extra: Any) -> dict[str, Any]:
    return {"j": job, "i": item, "f": fire, "s": fire + late, **extra}


def every_pair(jobs: int, fires: list[float], late: float = 0.01) -> list[dict[str, Any]]:
    return [run(j, i, f, late) for j in range(jobs) for i in range(2) for f in fires]


def test_every_pair_ran_once() -> None:
    t = tally(every_pair(3, FIRES, late=0.02), 3, 2, FIRES)
    assert (t.pairs, t.ran, t.folded, t.missing, t.duplicates) == (18, 18, 0, 0, 0)
    assert t.once and t.complete
    assert t.verdict() == "every (fire, item) ran once"
    assert len(t.lateness) == 18 and all(x == pytest.approx(0.02) for x in t.lateness)


def test_fire_times_match_to_the_millisecond() -> None:
    # a fire time read back from a datetime differs in the last bits
    recs = [run(0, i, f + 1e-7) for i in range(2) for f in FIRES]
    t = tally(recs, 1, 2, FIRES)
    assert t.ran == 6 and t.once


def test_a_fire_folded_into_the_next_run_is_covered_not_missing() -> None:
    recs = [r for r in every_pair(2, FIRES) if not (r["j"] == 1 and r["i"] == 0)]
    # job 1 item 0: fire 100 ran, 105 did not, 110's run covers it
    recs += [run(1, 0, 100.0), run(1, 0, 110.0, c=[105.0])]
    t = tally(recs, 2, 2, FIRES)
    assert (t.ran, t.folded, t.covered, t.missing, t.duplicates) == (11, 1, 1, 0, 0)
    assert t.once and t.complete
    assert t.verdict() == "every (fire, item) ran once or was folded once (1 folded)"


def test_a_misfire_rerun_is_the_late_run_of_its_fire() -> None:
    recs = [r for r in every_pair(1, FIRES) if not (r["i"] == 1 and r["f"] == 105.0)]
    # item 1's fire 105 ran late as a misfire re-run that also folds 110
    recs = [r for r in recs if not (r["i"] == 1 and r["f"] == 110.0)]
    recs.append(run(0, 1, 105.0, late=6.0, m=True, c=[110.0]))
    t = tally(recs, 1, 2, FIRES)
    assert t.misfire_reruns == 1
    assert (t.ran, t.folded, t.covered, t.missing) == (5, 1, 1, 0)
    assert max(t.lateness) == pytest.approx(6.0)


def test_missing_and_duplicate_pairs_fail_the_check() -> None:
    recs = every_pair(1, FIRES)
    recs = [r for r in recs if not (r["i"] == 0 and r["f"] == 110.0)]  # never ran
    recs.append(run(0, 1, 100.0, late=0.5))  # ran twice
    recs.append(run(0, 1, 110.0, c=[105.0]))  # 105 ran and is covered: twice too
    t = tally(recs, 1, 2, FIRES)
    assert (t.missing, t.duplicates) == (1, 3)  # (1,100) twice, (1,105) run+cover, (1,110)
    assert not t.once and not t.complete
    assert t.verdict().startswith("CHECK FAILED: 1 (fire, item) pairs never ran")
    # the earliest run's lateness is kept, not the repeat's
    assert sorted(t.lateness)[-1] == pytest.approx(0.01)


def test_runs_outside_the_window_are_ignored_but_their_covers_count() -> None:
    recs = every_pair(1, FIRES)
    recs = [r for r in recs if not (r["i"] == 0 and r["f"] == 110.0)]
    recs += [run(0, 0, 95.0), run(0, 0, 115.0, c=[110.0]), run(5, 0, 100.0)]
    t = tally(recs, 1, 2, FIRES)
    assert (t.pairs, t.ran, t.covered, t.missing) == (6, 5, 1, 0)
    assert len(t.lateness) == 5


def test_full_fire_is_the_first_after_the_join_that_ran_every_pair() -> None:
    recs = every_pair(2, [100.0, 105.0, 110.0])
    recs = [r for r in recs if not (r["j"] == 1 and r["f"] == 105.0)]
    assert full_fire(recs, 4, since=101.0) == 110.0
    assert full_fire(recs, 4, since=99.0) == 100.0
    assert full_fire(recs, 4, since=111.0) is None


def test_window_fires() -> None:
    assert first_measured_fire(101.0, 5.0) == 105.0
    assert first_measured_fire(103.0, 5.0) == 110.0  # 105 is under half an interval away
    assert expected_fires(110.0, 1.0, 3) == [110.0, 111.0, 112.0]
    with pytest.raises(ValueError):
        expected_fires(110.0, 1.0, 0)


def test_cron_trigger_needs_a_whole_divisor_of_a_minute() -> None:
    assert job_config(3, 5.0, "cron").cron == "*/5 * * * * *"
    assert job_config(3, 1.0, "cron").cron == "* * * * * *"
    assert job_config(3, 5.0, "interval").interval == 5.0
    with pytest.raises(ValueError):
        job_config(0, 7.0, "cron")


def test_report_row_and_log_line() -> None:
    sk = tally(every_pair(2, FIRES, late=0.004), 2, 2, FIRES)
    ap = tally(every_pair(2, FIRES, late=0.001), 2, 2, FIRES)
    case: dict[str, Any] = {
        "jobs": 2,
        "interval": 5.0,
        "instants": 3,
        "requests_per_instant": 41.0,
        "server_requests_per_instant": 50.0,
        "shardkeeper": sk.as_dict(),
        "apscheduler": ap.as_dict(),
    }
    failed: dict[str, Any] = {"jobs": 200, "interval": 1.0, "error": "Boom: x"}
    doc = {
        "many_jobs": {
            "benchmark": "many_jobs",
            "quick": True,
            "environment": {},
            "backends": {
                "etcd": {"cases": [case]},
                "zookeeper": {"cases": [failed]},
            },
        }
    }
    text = report.tables(doc)
    assert "### Many jobs due at once" in text
    assert "| etcd | 5 | 2 | 3 | 4.0 / 4.0 / 4.0 | 0 / 12 | 41 (50) | 1.0 / 1.0 | yes |" in text
    assert "| zookeeper | 1 | 200 | Boom: x |" in text
    line = describe("etcd", case)
    assert "folded 0/12" in line and "every (fire, item) ran once" in line
    assert "FAILED Boom: x" in describe("zookeeper", failed)


def test_empty_tally_is_well_formed() -> None:
    t = Tally(0, 0, 0, 0, 0, 0, 0)
    assert t.as_dict()["lateness"] == {"n": 0} and t.once
