"""Symmetric validation of stored job configs (issue 37, review newcomer-2).

What one instance accepts when it stores a config, every other instance accepts
when it reads it, and reads back equal; and what a reader accepts, a writer stores
unchanged. The paths: ``JobConfig`` (construction, ``parse``, ``from_json``),
``Runtime.add_job`` (``job_spec`` records the job class with ``model_copy``, which
does not validate), and the stored document (``encode_document`` /
``decode_document``, what every instance reads).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import (
    OPERATOR,
    ConfigService,
    decode_document,
    encode_document,
)
from shardkeeper.errors import JobConfigError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime.registration import job_spec

NAMES = st.from_regex(r"\A[A-Za-z0-9_-][A-Za-z0-9._-]{0,40}\Z")
TEXT = st.text(max_size=40)
SECONDS = st.floats(min_value=0.1, max_value=3600, allow_nan=False, allow_infinity=False)
CRONS = st.sampled_from(["*/5 * * * *", "0 3 * * 1-5", "*/10 * * * * *", "0 0 1 1 *"])
ZONES = st.sampled_from(["UTC", "Europe/Amsterdam", "America/Sao_Paulo", "Asia/Kolkata"])
TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
IMPORT_PATHS = st.sampled_from(["pkg.mod:Cls", "pkg.mod.Cls", "a:B.C"])


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """Keyword arguments of a valid JobConfig, varied over every kind of field."""
    count = draw(st.integers(min_value=1, max_value=64))
    trigger = draw(st.sampled_from(["cron", "interval", "at"]))
    data: dict[str, Any] = {
        "name": draw(NAMES.filter(lambda n: n not in (".", ".."))),
        "sharding_total_count": count,
        "sharding_item_parameters": draw(
            st.dictionaries(st.integers(min_value=0, max_value=count - 1), TEXT, max_size=5)
        ),
        "job_parameter": draw(TEXT),
        "description": draw(TEXT),
        "props": draw(st.dictionaries(TEXT, TEXT, max_size=3)),
        "time_zone": draw(ZONES),
        "failover": draw(st.booleans()),
        "misfire": draw(st.booleans()),
        "retries": draw(st.integers(min_value=0, max_value=100)),
        "retry_backoff": draw(st.floats(min_value=0, max_value=3600, allow_nan=False)),
        "execution_timeout": draw(st.none() | SECONDS),
        "checkpoint_interval": draw(st.floats(min_value=0, max_value=3600, allow_nan=False)),
        "reconcile_interval": draw(st.floats(min_value=0, max_value=1e6, allow_nan=False)),
        "max_threads": draw(st.integers(min_value=0, max_value=1000)),
        "max_time_diff_seconds": draw(st.sampled_from([-1, 1, 60])),
        "executor": draw(st.sampled_from([None, "thread", "process"])),
        "disabled": draw(st.booleans()),
        "overwrite": draw(st.booleans()),
        "job_class": draw(st.none() | IMPORT_PATHS),
        "listeners": draw(st.lists(IMPORT_PATHS, max_size=2).map(tuple)),
        "sharding_strategy": draw(st.sampled_from(["average", "odevity", "pkg.mod:Strategy"])),
        "alert_email_to": draw(st.sampled_from([(), ("ops@example.org",)])),
    }
    if trigger == "cron":
        data["cron"] = draw(CRONS)
    elif trigger == "interval":
        data["interval"] = draw(SECONDS)
    else:
        data["at"] = draw(TIMES)
    if data["alert_email_to"]:
        data["error_handler"] = "email"
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_what_a_writer_stores_every_reader_reads_back_equal(data: dict[str, Any]) -> None:
    config = JobConfig.parse(**data)
    assert JobConfig.from_json(config.to_json()) == config
    for document in (
        ConfigService.initial_document(config, "host@1"),
        encode_document(config, writer=OPERATOR, by="alice", revision=3),
    ):
        stored = decode_document(document)
        assert stored.error is None, stored.error
        assert stored.config == config
        # and a reader's config, stored again, is the same document's config
        again = decode_document(ConfigService.initial_document(stored.config, "host@2"))
        assert again.config == config


class TopLevel(ShardedJob):
    """A job class another instance can import by ``module:TopLevel``."""

    def execute(self, ctx: ShardingContext) -> None:
        pass


def _class_named(qualname: str) -> type[ShardedJob]:
    cls = type("Job", (TopLevel,), {"__module__": "pkg.jobs"})
    cls.__qualname__ = qualname
    return cls


@pytest.mark.parametrize(
    "qualname",
    ["Job", "Outer.Job", "make.<locals>.Job", "test.<locals>.Outer.Job", "Job-2", "2Job"],
)
def test_the_runtime_records_a_job_class_only_if_every_reader_accepts_it(
    qualname: str,
) -> None:
    """Before: ``add_job`` recorded ``module:func.<locals>.Job`` (model_copy does not
    validate) and the first instance stored it; every later one refused the stored
    config ("is not an import path"). Now the writer refuses exactly what the readers
    refuse, and what it records reads back equal."""
    cls = _class_named(qualname)
    base = JobConfig(name="sym", interval=5, sharding_total_count=2)
    path = f"pkg.jobs:{qualname}"
    try:
        JobConfig(name="sym", interval=5, sharding_total_count=2, job_class=path)
        readers_accept = True
    except JobConfigError:
        readers_accept = False
    try:
        spec = job_spec(cls, base)
    except JobConfigError as exc:
        assert not readers_accept, f"refused a path every reader accepts: {exc}"
        assert qualname in str(exc) and "import" in str(exc)
        if "<locals>" in qualname:
            assert "defined inside the function" in str(exc)
        return
    assert readers_accept, f"stored {path!r}, which every other instance refuses"
    assert spec.config.job_class == path
    stored = decode_document(ConfigService.initial_document(spec.config))
    assert stored.error is None and stored.config == spec.config


def test_a_class_defined_in_a_function_is_refused_with_the_way_out() -> None:
    def make() -> type[ShardedJob]:
        class Local(TopLevel):
            pass

        return Local

    with pytest.raises(JobConfigError) as info:
        job_spec(make(), JobConfig(name="local", interval=5, sharding_total_count=1))
    message = str(info.value)
    assert "is defined inside the function" in message
    assert "no other instance can import it" in message
    assert "job_class=" in message  # the way out: name its import path
    # named by an import path, it is the user's word, stored as given
    spec = job_spec(
        make(), JobConfig(name="local", interval=5, sharding_total_count=1, job_class="m:Local")
    )
    assert spec.config.job_class == "m:Local"


def test_at_keeps_its_microseconds_and_zone_through_the_store() -> None:
    when = datetime(2031, 5, 4, 3, 2, 1, 123456, tzinfo=UTC) + timedelta(hours=0)
    config = JobConfig(name="once", at=when, sharding_total_count=1)
    assert decode_document(ConfigService.initial_document(config)).config == config


@pytest.mark.parametrize(
    "field",
    [
        {"job_parameter": "a\ud800b"},
        {"description": "\udc00"},
        {"props": {"k\ud800": "v"}},
        {"props": {"k": "\ud800"}},
        {"sharding_item_parameters": {0: "x\ud800"}},
        {"alert_webhook_url": "https://hooks.example.com/T/\ud800"},
    ],
    ids=["job_parameter", "description", "props-key", "props-value", "params", "webhook"],
)
def test_text_the_store_cannot_hold_is_refused_when_the_config_is_built(
    field: dict[str, Any],
) -> None:
    """Before: a lone surrogate was accepted by JobConfig, and every write of the
    config then failed with a UnicodeEncodeError (a traceback, at every start)."""
    name = next(iter(field))
    with pytest.raises(JobConfigError) as info:
        JobConfig.parse(name="x", interval=5, sharding_total_count=1, **field)
    message = str(info.value)
    assert f"{name} holds" in message and "lone surrogate" in message
    assert "hooks.example.com" not in message  # a webhook URL may be a secret


#: letters, control characters and surrogates (which st.text leaves out by default)
ANY_TEXT = st.text(alphabet=st.characters(categories=["L", "Cc", "Cs", "Zs"]), max_size=20)


@settings(max_examples=300, deadline=None)
@given(job_parameter=ANY_TEXT, description=ANY_TEXT, prop=ANY_TEXT, param=ANY_TEXT)
@example(job_parameter="\ud800", description="", prop="", param="")
@example(job_parameter="", description="\x00\x1f", prop="\udfff", param="\n")
def test_any_text_is_either_refused_when_built_or_stored_and_read_back_equal(
    job_parameter: str, description: str, prop: str, param: str
) -> None:
    """Whatever the text (control characters, surrogates included): never accepted
    by the writer and then unreadable, or unwritable, by the store."""
    try:
        config = JobConfig.parse(
            name="any",
            interval=5,
            sharding_total_count=2,
            job_parameter=job_parameter,
            description=description,
            props={prop: prop},
            sharding_item_parameters={1: param},
        )
    except JobConfigError:
        return
    stored = decode_document(ConfigService.initial_document(config))
    assert stored.error is None and stored.config == config
