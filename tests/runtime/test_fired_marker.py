"""The "fired" marker never goes back: a misfire re-run of an older fire, started
after a newer fire, must not tell the leader that the newer fire started nowhere.

600 s chaos run on etcd, seed 1946735743: item 6 of fire 1331 ran on one instance,
then again on another one and a half seconds later, both valid. The start commit
writes the fire it starts into this instance's ``fired`` node, which the leader reads
to decide whether a reshard may still apply to the current fire (``last_started_fire``);
a misfire re-run of an older fire overwrote it with that older fire, the leader saw
the current fire as started nowhere, and its new assignment gave the item to another
instance for the same fire. On the MemoryStore.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import ShardingService
from shardkeeper.registry.memory import MemoryServer, MemoryStore

P = JobPaths("fired")
ME = "host@1@me"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    server = MemoryServer()
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        server.shutdown()


def test_an_older_fire_started_after_a_newer_one_leaves_the_newer_one_marked(
    store: MemoryStore,
) -> None:
    version = store.put(P.sharding, b'{"total": 2}').version
    me = ExecutionService(store, P, ME)
    for item, fire in ((0, 1331.0), (1, 1329.0)):  # the fire, then a misfire re-run
        result = me.start(
            [item],
            fire_time=fire,
            execution_ids={item: f"fired@{fire:.0f}#{item}"},
            assignment_version=version,
            persistent=True,
            monitor=True,
        )
        assert result.marked == (item,)
    leader = ShardingService(store, P, "host@2@leader")
    assert leader.last_started_fire([ME]) == 1331.0
