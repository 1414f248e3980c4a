"""The job page's history says where a failover run came from (newcomer review N12):
the instance it took over from, the checkpoint it resumed from, and for the row of a
dead instance's cut-off run, who reported it; and the config section names an
instance writer as a process (host@pid), not as what reads like a cut-off instance id
(N24)."""

from __future__ import annotations

import re
import time
from typing import Any

from fastapi.testclient import TestClient

from shardkeeper.history import HistoryRecorder
from shardkeeper.observe import ExecutionRecord, Outcome
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from tests.console.conftest import ALICE, JOB, Start, login, wait_leader

DEAD = "host-a@11@aaaaaa"
TAKER = "host-b@22@bbbbbb"
STATE = '{"next": 3}'


def test_history_rows_say_whence(
    client: TestClient, cluster_job: Start, store: CoordinationStore, history_url: str
) -> None:
    ops = Operations(store)
    cluster_job()
    wait_leader(ops)
    now = time.time()
    common: dict[str, Any] = {
        "job": JOB,
        "item": 0,
        "fire_time": now - 10,
        "execution_id": f"{JOB}@1#0",
        "scope": store.identity(),
    }
    recorder = HistoryRecorder(history_url)
    for record in (
        (
            ExecutionRecord(
                **common,
                instance=DEAD,
                started=now - 9,
                ended=now - 5,
                outcome=Outcome.CRASHED,
                error_type="InstanceGone",
                error_message=f"instance {DEAD} left the cluster",
                reported_by=TAKER,
            )
        ),
        (
            ExecutionRecord(
                **common,
                instance=TAKER,
                started=now - 4,
                ended=now - 1,
                outcome=Outcome.OK,
                failover=True,
                taken_over_from=DEAD,
                resumed_from=f"checkpoint 3 of {DEAD} (2026-12-07T02:47:22Z): {STATE}",
            )
        ),
    ):
        recorder.on_execution(record)
    assert recorder.close(timeout=10)
    login(client, ALICE)
    page = re.sub(r"\s+", " ", client.get(f"/jobs/{JOB}").text)
    assert f"taken over from {DEAD}" in page
    assert f"resumed from checkpoint 3 of {DEAD}" in page
    assert f"reported by {TAKER}" in page
    written = page.split('id="config-written"')[1]
    assert "Last written by an instance, process " in written and "(host@pid)" in written
