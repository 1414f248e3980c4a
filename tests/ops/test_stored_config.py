"""The stored config's two writers, and repairing a corrupt one (both backends).

Issue 15, finding 6: a corrupt stored config could not be repaired with the tools.
Issue 9, section 5: an instance's ``overwrite=True`` silently undid an operator's
``config set``. The policy (docs/configuration.md, "Who writes the stored config"):
``overwrite`` replaces what an instance wrote and a corrupt document, and keeps an
operator's edit unless the code's value of that field changed since the edit.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import JobConfigError, JobConflictError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

JOB = "cfg"
P = JobPaths(JOB)
NEVER = "0 0 1 1 *"
CORRUPT = b'{"name": "cfg", "cron": "0 0 1 1 *", "sharding_total_count": "many"'


def code_config(**changes: object) -> JobConfig:
    fields: dict[str, object] = {
        "name": JOB,
        "cron": NEVER,
        "sharding_total_count": 4,
        "description": "from code",
    }
    return JobConfig.parse(**{**fields, **changes})


class _Job(ShardedJob):
    def __init__(self) -> None:
        self.ran: list[int] = []
        self.lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.ran.append(ctx.item)


def test_operator_edit_survives_an_overwrite_start(
    store: CoordinationStore, caplog: pytest.LogCaptureFixture
) -> None:
    """config set, then an instance starting with overwrite=True and the same code:
    the operator's fields stay, with a WARNING naming them; the other fields follow
    the code."""
    configs = ConfigService(store, P)
    configs.sync(code_config())
    Operations(store).update_config(JOB, sharding_total_count=6, job_parameter="ops")
    stored = configs.read()
    assert stored is not None and stored.writer == "operator"
    assert stored.edits == {"sharding_total_count": {"code": 4}, "job_parameter": {"code": ""}}

    with caplog.at_level(logging.WARNING, logger="shardkeeper.coordination.config_service"):
        effective, count_changed = configs.sync(code_config(overwrite=True, description="new text"))
    assert effective.sharding_total_count == 6 and effective.job_parameter == "ops"
    assert effective.description == "new text"  # not an operator edit: the code wins
    assert not count_changed
    assert configs.load() == effective
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "kept the operator's edits of job_parameter, sharding_total_count" in warning
    assert "sharding_total_count=6" in warning

    # a restart with the same code keeps them again (the edit is still newer)
    again, _ = configs.sync(code_config(overwrite=True, description="new text"))
    assert again.sharding_total_count == 6


def test_code_change_after_the_edit_wins(
    store: CoordinationStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment that changes a field the operator edited is newer than the edit:
    its value is written, with a WARNING; the other edits stay."""
    configs = ConfigService(store, P)
    configs.sync(code_config())
    Operations(store).update_config(JOB, sharding_total_count=6, job_parameter="ops")
    with caplog.at_level(logging.WARNING, logger="shardkeeper.coordination.config_service"):
        effective, count_changed = configs.sync(code_config(overwrite=True, sharding_total_count=8))
    assert effective.sharding_total_count == 8 and effective.job_parameter == "ops"
    assert count_changed
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "replaced the operator's edits of sharding_total_count" in messages
    assert "kept the operator's edits of job_parameter" in messages
    stored = configs.read()
    assert stored is not None and set(stored.edits) == {"job_parameter"}


def test_overwrite_replaces_what_an_instance_wrote(store: CoordinationStore) -> None:
    """No operator edit: overwrite=True writes the code's config as before."""
    configs = ConfigService(store, P)
    configs.sync(code_config())
    effective, count_changed = configs.sync(code_config(overwrite=True, sharding_total_count=5))
    assert effective.sharding_total_count == 5 and count_changed
    stored = configs.read()
    assert stored is not None and stored.writer == "instance" and stored.edits == {}
    # without overwrite, the stored config is used
    used, _ = configs.sync(code_config(sharding_total_count=9))
    assert used.sharding_total_count == 5


def test_setting_a_field_back_to_the_codes_value_ends_the_edit(store: CoordinationStore) -> None:
    configs = ConfigService(store, P)
    configs.sync(code_config())
    ops = Operations(store)
    ops.update_config(JOB, sharding_total_count=6)
    ops.update_config(JOB, sharding_total_count=4)
    stored = configs.read()
    assert stored is not None and stored.edits == {}
    effective, _ = configs.sync(code_config(overwrite=True, sharding_total_count=7))
    assert effective.sharding_total_count == 7


def test_corrupt_config_is_repaired_by_an_edit(store: CoordinationStore) -> None:
    """config set on a corrupt document keeps its readable fields and fixes the bad
    one; the reshard flag is set (the old count was unreadable)."""
    store.put(P.config, b'{"name":"cfg","cron":"0 0 1 1 *","sharding_total_count":"many"}')
    ops = Operations(store)
    stored = ops.stored_config(JOB)
    assert stored.config is None and stored.error is not None
    assert "sharding_total_count='many'" in stored.error and P.config in stored.error
    with pytest.raises(JobConfigError, match="config replace"):
        ops.get_config(JOB)
    new = ops.update_config(JOB, sharding_total_count=3)
    assert new.sharding_total_count == 3 and new.cron == NEVER
    assert ops.get_config(JOB) == new
    assert store.exists(P.necessary)


def test_corrupt_config_is_replaced_whole_and_enable_needs_no_parse(
    store: CoordinationStore,
) -> None:
    """Not even JSON: replace_config writes a valid one; enable works before that."""
    store.put(P.config, CORRUPT)
    ops = Operations(store)
    ops.disable_job(JOB)
    ops.enable_job(JOB)  # used to fail parsing the config
    assert not store.exists(P.disabled_job)
    new, old = ops.replace_config(JOB, code_config())
    assert old is None and new == code_config()
    assert ops.get_config(JOB) == code_config()
    # The code's values at the time of the repair are unknown: an overwrite start
    # keeps the operator's fields and records the code's values from then on...
    configs = ConfigService(store, P)
    effective, _ = configs.sync(code_config(overwrite=True, description="x"))
    assert effective.description == "from code"
    assert ops.stored_config(JOB).edits == {"description": {"code": "x"}}
    # ...so that a later change of the code's value is newer, and wins
    effective, _ = configs.sync(code_config(overwrite=True, description="y"))
    assert effective.description == "y"
    assert ops.stored_config(JOB).writer == "instance"


def test_instance_refuses_a_corrupt_config_without_overwrite(store: CoordinationStore) -> None:
    store.put(P.config, CORRUPT)
    with pytest.raises(JobConfigError) as info:
        ConfigService(store, P).sync(code_config())
    message = str(info.value)
    assert "is invalid" in message and "overwrite=True" in message


def test_instance_with_overwrite_replaces_a_corrupt_config_and_runs(
    registry_url: str, store: CoordinationStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A real runtime started with overwrite=True over a corrupt config: WARNING
    naming what was wrong, the config is replaced, and the job runs."""
    store.put(P.config, CORRUPT)
    job = _Job()
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(job, code_config(overwrite=True, sharding_total_count=2))
    logger = "shardkeeper.coordination.config_service"
    with caplog.at_level(logging.WARNING, logger=logger), rt, Operations(store) as ops:
        wait_until(lambda: ops.job(JOB).leader, 30, message="no leader")
        assert ops.get_config(JOB).sharding_total_count == 2
        ops.trigger(JOB)
        wait_until(lambda: sorted(job.ran) == [0, 1], 30, message=lambda: f"ran {job.ran}")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("is invalid" in w and "not valid JSON" in w for w in warnings), warnings


def test_stored_document_says_who_wrote_it(store: CoordinationStore) -> None:
    """The document is the config's JSON plus _meta; readers of the config ignore it."""
    ConfigService(store, P).sync(code_config())
    Operations(store).update_config(JOB, description="edited")
    node = store.get(P.config)
    assert node is not None
    doc = json.loads(node.value)
    assert doc["_meta"]["writer"] == "operator" and doc["_meta"]["revision"] == 2
    assert doc["_meta"]["by"].startswith("shardkeeper-ops@")
    assert JobConfig.from_json(node.value).description == "edited"


def test_a_job_class_that_moved_module_is_accepted_another_class_is_not(
    store: CoordinationStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling deploy that moves the job class to another module (same class name)
    runs old and new instances side by side; a different class under the same job
    name is still refused."""
    configs = ConfigService(store, P)
    configs.sync(code_config(job_class="old.place:Reports"))
    with caplog.at_level(logging.INFO, logger="shardkeeper.coordination.config_service"):
        effective, _ = configs.sync(code_config(job_class="new.home.reports:Reports"))
    assert effective.sharding_total_count == 4
    assert "now at new.home.reports:Reports" in caplog.text
    configs.sync(code_config(job_class="old.place.Reports"))  # dotted form, same class
    with pytest.raises(JobConflictError, match=r"already registered by 'old\.place:Reports'"):
        configs.sync(code_config(job_class="old.place:Invoices"))
