"""``remove JOB`` deletes the job's checkpoints too (``/checkpoints/{job}``, outside
``/jobs/{job}``), and no other job's: on the MemoryStore, ZooKeeper and etcd.

Left behind, a new job of the same name with ``checkpoint_carry`` would start from
the removed job's last states.
"""

from __future__ import annotations

import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import CheckpointDoc, CheckpointReader, ProgressDoc
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.paths import JobPaths, checkpoint_job_root, checkpoint_path
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore

pytestmark = pytest.mark.timeout(60)

NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: no fire during a test
#: a job whose name starts with the removed one's: a delete by key prefix would take it
NEIGHBOUR = "gone2"


@pytest.fixture(params=["memory", "zookeeper", "etcd"], ids=["mem", "zk", "etcd"])
def backend(request: pytest.FixtureRequest) -> str:
    """The in-process reference store and both real ones."""
    return str(request.param)


def _stored_job(store: CoordinationStore, name: str, fire: float) -> None:
    """A job's config, two items' checkpoints of two fires, and a progress report."""
    cfg = JobConfig(name=name, cron=NEVER, sharding_total_count=2)
    store.put(JobPaths(name).config, ConfigService.initial_document(cfg))
    for item in (0, 1):
        for f in (fire - 60, fire):
            doc = CheckpointDoc(
                execution_id=f"{name}@{round(f * 1000)}#{item}",
                fire_time=f,
                instance="host@1@x",
                state_json='{"cursor":7}',
                at=f,
                seq=1,
                ended="ok",
            )
            store.put(checkpoint_path(name, item, f), doc.to_bytes())
    progress = ProgressDoc("e", "host@1@x", fire, 3, 10, "", fire, 0, fire)
    store.put(JobPaths(name).progress(0), progress.to_bytes())


def test_remove_deletes_the_jobs_checkpoints_and_no_others(store: CoordinationStore) -> None:
    fire = float(int(time.time()))
    _stored_job(store, "gone", fire)
    _stored_job(store, NEIGHBOUR, fire)
    assert CheckpointReader(store, JobPaths("gone")).fires(0) == [
        round((fire - 60) * 1000),
        round(fire * 1000),
    ]

    assert Operations(store).remove_job("gone") == []

    assert not store.exists(checkpoint_job_root("gone"))
    assert not store.exists(JobPaths("gone").root)
    gone = CheckpointReader(store, JobPaths("gone"))
    assert gone.fires(0) == [] and gone.read_last(0, fire + 1) is None
    # the neighbour keeps everything
    kept = CheckpointReader(store, JobPaths(NEIGHBOUR))
    for item in (0, 1):
        doc = kept.read(item, fire)
        assert doc is not None and doc.state == {"cursor": 7}
    assert kept.read_progress(0) is not None
    assert [j.name for j in Operations(store).jobs()] == [NEIGHBOUR]
