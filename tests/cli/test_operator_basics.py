"""Operator basics of the command line (newcomer review N28): ``trigger JOB --item N``
re-runs only the items named, and ``remove`` asks before it deletes a job (``--yes``
skips the question; with nobody at a terminal it refuses and names ``--yes``). And a
count raise that leaves items without a parameter is warned about, by ``config set``
and in the leader's log (N5).

The commands run in this process (``shardkeeper.cli.main``) against the reference
store on a ``memory://`` server, next to an in-process runtime.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from shardkeeper import cli
from shardkeeper.config import JobConfig
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "tiny"
NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: no spontaneous fire during a test


@pytest.fixture
def backend() -> str:
    return "memory"


@pytest.fixture
def running(registry_url: str, store: CoordinationStore) -> Iterator[RecordingJob]:
    """A runtime running job ``tiny`` (4 items, never fired by its schedule)."""
    job = RecordingJob()
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(
        job,
        JobConfig.parse(
            name=JOB, cron=NEVER, sharding_total_count=4, sharding_item_parameters="0=a,1=b,2=c,3=d"
        ),
    )
    rt.start()
    ops = Operations(store)
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    yield job
    rt.stop_now()


def run_cli(
    capsys: pytest.CaptureFixture[str], registry_url: str, *args: str
) -> tuple[int, str, str]:
    code = cli.main([*args, "--registry", registry_url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_trigger_item_runs_only_the_items_named(
    running: RecordingJob,
    registry_url: str,
    store: CoordinationStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(
        capsys, registry_url, "trigger", JOB, "--item", "2", "--item", "3", "--param", "why=retry"
    )
    assert code == 0, err
    assert out.startswith(f"triggered items 2, 3 of {JOB} on "), out
    running.wait_for(lambda runs: {r.item for r in runs if r.params} == {2, 3}, timeout=20)
    # the request is retired once each item it asked has its record: none is left
    # for items 0 and 1 to run later
    wait_until(lambda: not store.children(f"/jobs/{JOB}/runnow"), message="request left")
    assert sorted(r.item for r in running.runs if r.params) == [2, 3]
    assert all(r.params == {"why": "retry"} for r in running.runs if r.params)


def test_trigger_item_out_of_range_or_with_instance_is_refused(
    running: RecordingJob,
    registry_url: str,
    store: CoordinationStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = run_cli(capsys, registry_url, "trigger", JOB, "--item", "4")
    assert code == 2
    assert "item 4 is out of range" in err and "0..3" in err
    code, _out, err = run_cli(
        capsys, registry_url, "trigger", JOB, "--item", "1", "--instance", "x@1@abc"
    )
    assert code == 2 and "not both" in err
    assert not store.children(f"/jobs/{JOB}/runnow")
    assert not running.runs


def test_remove_without_a_terminal_refuses_and_names_yes(
    running: RecordingJob,
    registry_url: str,
    store: CoordinationStore,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shardkeeper.cli.steer._interactive", lambda: False)
    code, _out, err = run_cli(capsys, registry_url, "remove", JOB, "--force")
    assert code == 2
    assert "--yes" in err and "Traceback" not in err
    assert store.exists(f"/jobs/{JOB}"), "removed without confirmation"
    code, out, err = run_cli(capsys, registry_url, "remove", JOB, "--force", "--yes")
    assert code == 0, err
    assert out.startswith(f"removed job {JOB}")
    assert not store.exists(f"/jobs/{JOB}")


def test_remove_asks_for_the_job_name(
    running: RecordingJob,
    registry_url: str,
    store: CoordinationStore,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shardkeeper.cli.steer._interactive", lambda: True)
    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    code, _out, err = run_cli(capsys, registry_url, "remove", JOB, "--force")
    assert code == 1 and "not removed" in err
    assert store.exists(f"/jobs/{JOB}")
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{JOB}\n"))
    code, out, err = run_cli(capsys, registry_url, "remove", JOB, "--force")
    assert code == 0, err
    assert f"removed job {JOB}" in out
    assert not store.exists(f"/jobs/{JOB}")


def test_parameters_gap_names_the_items_without_one() -> None:
    cfg = JobConfig.parse(
        name=JOB, cron=NEVER, sharding_total_count=7, sharding_item_parameters="0=a,1=b,3=d"
    )
    assert cfg.items_without_parameters() == [2, 4, 5, 6]
    assert "item(s) 2,4-6 of 7 have no parameter" in cfg.parameters_gap()
    # a job that uses no parameters is not warned about
    assert JobConfig.parse(name=JOB, cron=NEVER, sharding_total_count=7).parameters_gap() == ""


def test_count_raise_without_parameters_is_warned(
    running: RecordingJob,
    registry_url: str,
    store: CoordinationStore,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="shardkeeper.runtime.runner.runner")
    code, out, err = run_cli(capsys, registry_url, "config", "set", JOB, "sharding_total_count=6")
    assert code == 0, err
    assert "sharding_total_count 4 -> 6" in out
    assert "warning:" in err and "item(s) 4-5 of 6 have no parameter" in err
    # the leader says it in its log once it adopts the raise
    wait_until(
        lambda: any("4-5 of 6 have no parameter" in r.getMessage() for r in caplog.records),
        timeout=10,
        message="the leader did not warn",
    )
    # a count change that leaves every item a parameter says nothing
    code, _out, err = run_cli(
        capsys,
        registry_url,
        "config",
        "set",
        JOB,
        "sharding_total_count=3",
        "sharding_item_parameters=0=a,1=b,2=c",
    )
    assert code == 0, err
    assert "warning" not in err
