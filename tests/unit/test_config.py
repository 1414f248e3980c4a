"""JobConfig: defaults, every validation rule, JSON round trip, YAML and TOML files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shardkeeper.config import (
    MIN_INTERVAL_SECONDS,
    JobConfig,
    load_job_configs,
    make_job_config,
    parse_item_parameters,
)
from shardkeeper.errors import ConfigError, JobConfigError


def job(**overrides: Any) -> dict[str, Any]:
    """A valid interval job's fields, with overrides."""
    fields: dict[str, Any] = {"name": "order-sync", "interval": 30, "sharding_total_count": 3}
    fields.update(overrides)
    return fields


def refused(**overrides: Any) -> str:
    """The JobConfigError message for a job with these overrides (which must be invalid)."""
    with pytest.raises(JobConfigError) as info:
        JobConfig.parse(**job(**overrides))
    return str(info.value)


def test_defaults_follow_elasticjob() -> None:
    """Unset fields take the documented defaults."""
    c = JobConfig.parse(name="j", cron="0 * * * *", sharding_total_count=1)
    assert c.interval is None
    assert c.time_zone == "UTC"
    assert c.sharding_item_parameters == {}
    assert c.job_parameter == ""
    assert c.monitor_execution is True
    assert c.failover is False
    assert c.misfire is True
    assert c.max_time_diff_seconds == -1
    assert c.reconcile_interval == 600
    assert c.sharding_strategy == "average"
    assert c.error_handler == "log"
    assert c.listeners == ()
    assert c.max_threads == 0
    assert c.description == ""
    assert c.props == {}
    assert c.disabled is False
    assert c.overwrite is False
    assert c.job_class is None
    assert c.sharding_wait_timeout == 5
    assert c.execution_wait_timeout == 5


def test_frozen() -> None:
    """A config cannot be changed after it is built."""
    c = JobConfig.parse(**job())
    with pytest.raises(ValidationError):
        setattr(c, "name", "other")  # noqa: B010 - the assignment is the point


def test_direct_construction_raises_value_error() -> None:
    """JobConfig(...) itself raises a ValueError subclass (code written against pydantic's
    ValidationError, a ValueError too, keeps working)."""
    with pytest.raises(ValueError):
        JobConfig(**job(sharding_total_count=0))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"name": "bad-count", "sharding_total_count": -3},
            "invalid job 'bad-count': sharding_total_count=-3: Input should be greater than 0",
        ),
        (
            {"sharding_total_cont": 3},
            "unknown field 'sharding_total_cont' (did you mean 'sharding_total_count'?)",
        ),
        ({"cron": "* * * * * * *"}, "invalid cron expression '* * * * * * *': it has 7 fields"),
        ({"cron": "0 0 * * mon-fry"}, "day-of-week value 'fry' is not valid"),
    ],
)
def test_direct_construction_gives_the_friendly_error(
    changes: dict[str, Any], message: str
) -> None:
    """``JobConfig(...)``, the README's way, reports what ``JobConfig.parse`` reports: one
    line naming the job, the field and the value, no pydantic boilerplate (newcomer
    review 2026-12, step 4.3: it was pydantic's raw text with its links)."""
    data = job(**changes)
    if "sharding_total_cont" in changes:
        data.pop("sharding_total_count")
    with pytest.raises(JobConfigError) as direct:
        JobConfig(**data)
    with pytest.raises(JobConfigError) as parsed:
        JobConfig.parse(**data)
    assert str(direct.value) == str(parsed.value)
    assert message in str(direct.value)
    for noise in ("[type=", "input_value", "errors.pydantic.dev", "\n"):
        assert noise not in str(direct.value)
    # one line, and no pydantic traceback chained under it
    assert "\n" not in str(direct.value) and direct.value.__suppress_context__


def test_model_validate_keeps_pydantics_per_field_errors() -> None:
    """Only the direct call is friendly: ``model_validate`` (what the console form and
    ``parse`` build on) and a model holding a JobConfig keep pydantic's errors, one per
    field, not one opaque error of the whole."""
    from pydantic import BaseModel

    bad = job(sharding_total_count=0, interval=-1)
    with pytest.raises(ValidationError) as exc:
        JobConfig.model_validate(bad)
    assert {e["loc"] for e in exc.value.errors()} == {("sharding_total_count",), ("interval",)}

    class Holder(BaseModel):
        config: JobConfig

    with pytest.raises(ValidationError) as nested:
        Holder(config=bad)  # type: ignore[arg-type]  # a dict, validated into a JobConfig
    assert {e["loc"][:2] for e in nested.value.errors()} == {
        ("config", "sharding_total_count"),
        ("config", "interval"),
    }
    assert Holder.model_validate({"config": job()}).config == JobConfig.parse(**job())


def test_job_config_error_is_a_config_error() -> None:
    """parse() raises the project's ConfigError, so callers need one except clause."""
    with pytest.raises(ConfigError):
        JobConfig.parse(**job(sharding_total_count=0))
    with pytest.raises(JobConfigError):
        make_job_config(**job(sharding_total_count=0))


# -- name ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "Job_1.x-y", "x" * 100, "..a"])
def test_valid_names(name: str) -> None:
    """Names of 1-100 characters of [A-Za-z0-9._-] are accepted."""
    assert JobConfig.parse(**job(name=name)).name == name


@pytest.mark.parametrize("name", ["", "a b", "a/b", "x" * 101, "ä", ".", ".."])
def test_invalid_names(name: str) -> None:
    """Other names are refused, quoting the name and the allowed characters."""
    message = refused(name=name)
    assert repr(name) in message
    assert "1-100 characters" in message


@pytest.mark.parametrize("name", ["tiny\n", "tiny\r\n", "\ntiny", "ti\nny"])
def test_names_with_a_line_break_are_refused(name: str) -> None:
    """A name with a newline (even a trailing one, which ``$`` would let through) is
    refused here, naming the repr of the value, not later as an invalid store path."""
    message = refused(name=name)
    assert f"job name {name!r} is invalid" in message


def test_name_is_required() -> None:
    """A job without a name is refused naming the field."""
    with pytest.raises(JobConfigError, match="name is required"):
        JobConfig.parse(interval=1, sharding_total_count=1)


# -- cron / interval / time zone -------------------------------------------------------


@pytest.mark.parametrize(
    "cron",
    ["*/5 * * * *", "0 0 9 * * mon-fri", "0/5 * * * * ?", "30 2 1 * *", "0 0 * * 0,7"],
)
def test_valid_cron(cron: str) -> None:
    """5-field and 6-field (seconds first) expressions are accepted."""
    c = JobConfig.parse(**job(interval=None, cron=cron))
    assert c.cron == cron
    assert c.describe_trigger() == f"cron {cron!r} (UTC)"


def test_cron_whitespace_is_normalised() -> None:
    """Extra spaces in a cron expression are collapsed, so equal schedules compare equal."""
    assert JobConfig.parse(**job(interval=None, cron=" */5  *\t* * * ")).cron == "*/5 * * * *"


@pytest.mark.parametrize(
    ("cron", "fragment"),
    [
        ("* * *", "3 fields; expected 5"),
        ("* * * * * * *", "7 fields"),
        ("61 * * * *", "61"),
        ("x * * * *", '"x"'),
        ("0 0 1 * 1", "both day-of-month"),
        ("0 0 * * 8", "day-of-week value '8'"),
        ("0 0 30 2 *", "can never fire"),
        ("0 0 31 4,6,9,11 *", "can never fire"),
    ],
)
def test_invalid_cron(cron: str, fragment: str) -> None:
    """A bad cron expression is refused quoting it and saying what is wrong."""
    message = refused(interval=None, cron=cron)
    assert f"cron {cron!r}" in message or repr(cron) in message
    assert fragment in message


@pytest.mark.parametrize(
    ("fields", "word"),
    [({"interval": None}, "neither"), ({"cron": "* * * * *"}, "both")],
)
def test_exactly_one_of_cron_and_interval(fields: dict[str, Any], word: str) -> None:
    """Neither or both of cron and interval is refused."""
    message = refused(**fields)
    assert "exactly one of cron, interval and at" in message
    assert word in message


@pytest.mark.parametrize("interval", [0, -1, float("nan"), float("inf")])
def test_invalid_interval(interval: float) -> None:
    """An interval must be a finite number of seconds > 0."""
    message = refused(interval=interval)
    assert f"interval={interval!r}" in message


def test_fractional_interval() -> None:
    """Intervals may be fractions of a second."""
    c = JobConfig.parse(**job(interval=0.5))
    assert c.interval == 0.5
    assert c.describe_trigger() == "every 0.5s"


def test_leap_day_cron_is_accepted() -> None:
    """29 February exists every four years: the cron can fire, so it is valid."""
    assert JobConfig.parse(**job(interval=None, cron="0 0 29 2 *")).cron == "0 0 29 2 *"


@pytest.mark.parametrize("interval", [1e-9, 1e-6, 0.05, 0.0999])
def test_interval_below_the_minimum_is_refused(interval: float) -> None:
    """An interval under MIN_INTERVAL_SECONDS is refused naming the value and the
    minimum (1e-6 burned a core; under 0.5 us the scheduler silently used 1 s)."""
    message = refused(interval=interval)
    assert f"interval {interval!r} is too short" in message
    assert f"at least {MIN_INTERVAL_SECONDS:g} seconds" in message


def test_minimum_interval_is_accepted() -> None:
    """Exactly the minimum is valid."""
    assert JobConfig.parse(**job(interval=MIN_INTERVAL_SECONDS)).interval == 0.1


def test_time_zone() -> None:
    """An IANA time zone is accepted and shown with the cron expression."""
    c = JobConfig.parse(**job(interval=None, cron="0 9 * * *", time_zone="Asia/Shanghai"))
    assert c.describe_trigger() == "cron '0 9 * * *' (Asia/Shanghai)"


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "../etc/passwd"])
def test_invalid_time_zone(tz: str) -> None:
    """An unknown time zone is refused quoting it."""
    message = refused(time_zone=tz)
    assert f"unknown time zone {tz!r}" in message


# -- sharding --------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, -3, 100_001])
def test_invalid_total_count(count: int) -> None:
    """sharding_total_count must be 1..100000."""
    assert f"sharding_total_count={count}" in refused(sharding_total_count=count)


def test_total_count_over_the_limit_names_count_and_limit() -> None:
    """A count the store cannot hold is refused naming the count and the limits."""
    message = refused(sharding_total_count=250_000)
    assert "sharding_total_count=250000 is over the limit of 100000 items" in message
    assert "900000 bytes" in message


def test_total_count_bounds() -> None:
    """1 and 100000 are both allowed."""
    assert JobConfig.parse(**job(sharding_total_count=1)).sharding_total_count == 1
    assert JobConfig.parse(**job(sharding_total_count=100_000)).sharding_total_count == 100_000


@pytest.mark.parametrize("field", ["sharding_total_count", "max_threads", "max_time_diff_seconds"])
def test_booleans_are_not_numbers(field: str) -> None:
    """True is refused where a whole number is expected (pydantic would read it as 1)."""
    assert f"{field}: True is a boolean" in refused(**{field: True})


def test_item_parameters_string_form() -> None:
    """The ElasticJob string form '0=a,1=b' is parsed, whitespace trimmed."""
    c = JobConfig.parse(
        **job(sharding_item_parameters=" 0=Beijing, 1 = Shanghai ,2=a=b", sharding_total_count=4)
    )
    assert c.sharding_item_parameters == {0: "Beijing", 1: "Shanghai", 2: "a=b"}
    assert c.item_parameter(0) == "Beijing"
    assert c.item_parameter(2) == "a=b"
    assert c.item_parameter(3) == ""


def test_item_parameters_mapping_form() -> None:
    """A mapping is accepted, with text keys (TOML) and number values (YAML) converted."""
    c = JobConfig.parse(**job(sharding_item_parameters={"1": "x", 0: 7}))
    assert c.sharding_item_parameters == {0: "7", 1: "x"}


def test_item_parameters_empty_string() -> None:
    """An empty string means no parameters."""
    assert JobConfig.parse(**job(sharding_item_parameters="")).sharding_item_parameters == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0=a,1", "entry '1' is not 'item=value'"),
        ("0=a,,1=b", "entry '' is not 'item=value'"),
        ("x=a", "item 'x'"),
        ("-1=a", "item '-1'"),
        ("0=a,0=b", "item 0 is given twice"),
    ],
)
def test_item_parameters_malformed(text: str, fragment: str) -> None:
    """A malformed parameter string is refused naming the string and the bad entry."""
    message = refused(sharding_item_parameters=text)
    assert repr(text) in message
    assert fragment in message


def test_item_parameter_beyond_count() -> None:
    """An item >= sharding_total_count is refused naming the item and the valid range."""
    message = refused(sharding_item_parameters="0=a,3=b", sharding_total_count=3)
    assert "item 3" in message
    assert "0..2" in message


def test_item_parameter_negative_in_mapping() -> None:
    """A negative item in the mapping form is refused."""
    assert "item -1 is negative" in refused(sharding_item_parameters={-1: "a"})


def test_parse_item_parameters_function() -> None:
    """parse_item_parameters is usable on its own and raises JobConfigError."""
    assert parse_item_parameters("0=a") == {0: "a"}
    with pytest.raises(JobConfigError, match="'0a'"):
        parse_item_parameters("0a")


def test_item_parameter_out_of_range() -> None:
    """item_parameter() refuses items outside 0..count-1, naming the item and range."""
    c = JobConfig.parse(**job())
    with pytest.raises(ValueError, match=r"item 3 is out of range .* 0\.\.2"):
        c.item_parameter(3)
    with pytest.raises(ValueError, match="item -1"):
        c.item_parameter(-1)


# -- execution switches ----------------------------------------------------------------


def test_failover_requires_monitor_execution() -> None:
    """failover without monitor_execution is refused, saying why."""
    message = refused(failover=True, monitor_execution=False)
    assert "failover=True needs monitor_execution=True" in message
    assert JobConfig.parse(**job(failover=True)).failover is True


@pytest.mark.parametrize("value", [-1, 1, 60])
def test_valid_max_time_diff(value: int) -> None:
    """-1 turns the clock check off; positive values are seconds."""
    assert JobConfig.parse(**job(max_time_diff_seconds=value)).max_time_diff_seconds == value


@pytest.mark.parametrize("value", [0, -2])
def test_invalid_max_time_diff(value: int) -> None:
    """0 and values below -1 are refused, naming the value and the choices."""
    message = refused(max_time_diff_seconds=value)
    assert f"max_time_diff_seconds {value} is invalid" in message
    assert "-1" in message


def test_reconcile_interval() -> None:
    """0 turns reconcile off; a negative interval is refused."""
    assert JobConfig.parse(**job(reconcile_interval=0)).reconcile_interval == 0
    assert "reconcile_interval=-1" in refused(reconcile_interval=-1)


@pytest.mark.parametrize("field", ["sharding_wait_timeout", "execution_wait_timeout"])
@pytest.mark.parametrize("value", [0, -1.5])
def test_wait_timeouts_positive(field: str, value: float) -> None:
    """Coordination waits are always bounded: a timeout must be > 0."""
    assert f"{field}={value!r}" in refused(**{field: value})


def test_max_threads() -> None:
    """max_threads is >= 0, 0 meaning no per-job limit."""
    assert JobConfig.parse(**job(max_threads=0)).max_threads == 0
    assert JobConfig.parse(**job(max_threads=4)).max_threads == 4
    assert "max_threads=-1" in refused(max_threads=-1)


# -- plug-ins by name or import path ---------------------------------------------------


@pytest.mark.parametrize(
    "value", ["average", "odevity", "round_robin", "pkg.mod:strategy", "pkg.mod.strategy"]
)
def test_valid_strategy(value: str) -> None:
    """Built-in names and import paths are accepted (import paths are not imported yet)."""
    assert JobConfig.parse(**job(sharding_strategy=value)).sharding_strategy == value


@pytest.mark.parametrize("value", ["fancy", "Average", "pkg.mod:", "a b", ""])
def test_invalid_strategy(value: str) -> None:
    """Anything else is refused naming the value and the valid choices."""
    message = refused(sharding_strategy=value)
    assert f"unknown sharding strategy {value!r}" in message
    assert "average, odevity, round_robin" in message


@pytest.mark.parametrize("value", ["log", "ignore", "raise", "my.alerts:notify"])
def test_valid_error_handler(value: str) -> None:
    """log, ignore, raise and import paths are accepted."""
    assert JobConfig.parse(**job(error_handler=value)).error_handler == value


def test_invalid_error_handler() -> None:
    """An unknown error handler is refused naming it and the choices."""
    message = refused(error_handler="throw")
    assert "unknown error handler 'throw'" in message
    assert "log, ignore, raise" in message


def test_listeners() -> None:
    """Listeners are import paths, kept in order as a tuple."""
    c = JobConfig.parse(**job(listeners=["a.b:C", "x.y"]))
    assert c.listeners == ("a.b:C", "x.y")
    assert "listener 'not a path'" in refused(listeners=["a.b:C", "not a path"])


def test_job_class() -> None:
    """job_class, when set, must be an import path."""
    assert JobConfig.parse(**job(job_class="app.jobs:Sync")).job_class == "app.jobs:Sync"
    assert "job_class 'Sync job'" in refused(job_class="Sync job")


def test_props_scalars_become_text() -> None:
    """props values are text; numbers and booleans from YAML/TOML are kept as written."""
    c = JobConfig.parse(**job(props={"retries": 3, "ratio": 0.5, "dry": True, "who": "me"}))
    assert c.props == {"retries": "3", "ratio": "0.5", "dry": "true", "who": "me"}


def test_unknown_field_suggests_the_right_one() -> None:
    """A misspelt field is refused with a suggestion and the list of fields."""
    message = refused(shardingTotalCount=3)
    assert "unknown field 'shardingTotalCount'" in message
    assert "did you mean 'sharding_total_count'" in message


def test_several_errors_reported_at_once() -> None:
    """Every bad field is named in one message, prefixed by the job name."""
    message = refused(sharding_total_count=0, time_zone="Nowhere/Land")
    assert message.startswith("invalid job 'order-sync': ")
    assert "sharding_total_count=0" in message
    assert "'Nowhere/Land'" in message


# -- JSON ------------------------------------------------------------------------------


def full_config() -> JobConfig:
    """A config with every field away from its default."""
    return JobConfig.parse(
        name="full",
        cron="0/10 * * * * ?",
        time_zone="Europe/Paris",
        sharding_total_count=12,
        sharding_item_parameters="0=zéro,10=ten,2=a=b",
        job_parameter="p",
        monitor_execution=True,
        failover=True,
        misfire=False,
        max_time_diff_seconds=30,
        reconcile_interval=0,
        sharding_strategy="pkg.mod:strategy",
        error_handler="ignore",
        listeners=["a.b:L1", "a.b:L2"],
        max_threads=2,
        description="all fields",
        props={"k": "v", "a": "b"},
        disabled=True,
        overwrite=True,
        job_class="app.jobs:Full",
        sharding_wait_timeout=1.5,
        execution_wait_timeout=2.5,
    )


@pytest.mark.parametrize("config", [full_config(), JobConfig.parse(**job())])
def test_json_round_trip(config: JobConfig) -> None:
    """from_json(to_json(c)) == c, and serialising again gives the same bytes."""
    data = config.to_json()
    assert isinstance(data, bytes)
    back = JobConfig.from_json(data)
    assert back == config
    assert back.to_json() == data
    assert JobConfig.from_json(data.decode()) == config


def test_json_is_canonical() -> None:
    """Equal configs built in different ways serialise to identical bytes."""
    a = JobConfig.parse(**job(sharding_item_parameters="1=b,0=a", props={"y": "1", "x": "2"}))
    b = JobConfig.parse(
        **job(props={"x": "2", "y": "1"}, sharding_item_parameters={0: "a", 1: "b"})
    )
    assert a.to_json() == b.to_json()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON list; expected an object"),
        (b'{"name": "x", "interval": 1, "sharding_total_count": 0}', "sharding_total_count=0"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_from_json_errors(data: bytes, fragment: str) -> None:
    """Bad stored bytes raise JobConfigError saying what is wrong."""
    with pytest.raises(JobConfigError) as info:
        JobConfig.from_json(data)
    assert fragment in str(info.value)


# -- files -----------------------------------------------------------------------------

YAML_LIST = """\
- name: order-sync
  cron: "0/5 * * * * ?"
  time_zone: Asia/Shanghai
  sharding_total_count: 3
  sharding_item_parameters: "0=Beijing,1=Shanghai,2=Guangzhou"
  failover: true
- name: cleanup
  interval: 60
  sharding_total_count: 1
  props:
    retries: 3
"""

YAML_MAPPING = """\
jobs:
  - name: report
    cron: "0 2 * * *"
    sharding_total_count: 2
    sharding_item_parameters:
      0: eu
      1: us
"""

TOML_JOBS = """\
[[jobs]]
name = "order-sync"
cron = "0/5 * * * * ?"
sharding_total_count = 3
sharding_item_parameters = "0=Beijing,1=Shanghai,2=Guangzhou"

[[jobs]]
name = "report"
interval = 1.5
sharding_total_count = 2
listeners = ["app.listeners:Audit"]

[jobs.sharding_item_parameters]
0 = "eu"
1 = "us"

[jobs.props]
owner = "ops"
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    """Write a job file and return its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_load_yaml_list(tmp_path: Path) -> None:
    """A YAML list of jobs loads in order with every field."""
    configs = load_job_configs(write(tmp_path, "jobs.yaml", YAML_LIST))
    assert [c.name for c in configs] == ["order-sync", "cleanup"]
    assert configs[0].sharding_item_parameters == {0: "Beijing", 1: "Shanghai", 2: "Guangzhou"}
    assert configs[0].failover is True
    assert configs[0].time_zone == "Asia/Shanghai"
    assert configs[1].interval == 60
    assert configs[1].props == {"retries": "3"}


def test_load_yaml_mapping(tmp_path: Path) -> None:
    """A YAML mapping with a jobs list loads too (here with a .yml suffix)."""
    (config,) = load_job_configs(write(tmp_path, "jobs.yml", YAML_MAPPING))
    assert config.name == "report"
    assert config.sharding_item_parameters == {0: "eu", 1: "us"}


def test_load_toml(tmp_path: Path) -> None:
    """[[jobs]] tables load, with sub-tables for item parameters and props."""
    configs = load_job_configs(str(write(tmp_path, "jobs.toml", TOML_JOBS)))
    assert [c.name for c in configs] == ["order-sync", "report"]
    assert configs[0].cron == "0/5 * * * * ?"
    assert configs[1].interval == 1.5
    assert configs[1].sharding_item_parameters == {0: "eu", 1: "us"}
    assert configs[1].props == {"owner": "ops"}
    assert configs[1].listeners == ("app.listeners:Audit",)


def test_load_empty_files(tmp_path: Path) -> None:
    """An empty file or an empty jobs list has no jobs."""
    assert load_job_configs(write(tmp_path, "empty.yaml", "")) == []
    assert load_job_configs(write(tmp_path, "empty.toml", "")) == []
    assert load_job_configs(write(tmp_path, "none.yaml", "jobs: []\n")) == []


@pytest.mark.parametrize(
    ("name", "text", "fragments"),
    [
        (
            "bad.yaml",
            "- name: good\n  interval: 1\n  sharding_total_count: 1\n"
            "- name: broken\n  interval: 1\n  sharding_total_count: 0\n",
            ["job 'broken' (#2)", "sharding_total_count=0"],
        ),
        ("bad.yaml", "jobs: [\n", ["invalid YAML"]),
        ("bad.toml", "[[jobs]\n", ["invalid TOML"]),
        ("bad.yaml", "jobz: []\n", ["unknown top-level key 'jobz'"]),
        ("bad.yaml", "42\n", ["expected a list of jobs, got a int"]),
        ("bad.yaml", "- just a string\n", ["job #1 is a str"]),
        (
            "bad.yaml",
            "- {name: a, interval: 1, sharding_total_count: 1}\n"
            "- {name: a, cron: '* * * * *', sharding_total_count: 1}\n",
            ["job name 'a' is used by job #1 and job #2"],
        ),
        ("bad.toml", '[[jobs]]\nname = "t"\ninterval = 1\n', ["job 't' (#1)", "required"]),
        ("jobs.json", "[]", ["unknown file type '.json'"]),
    ],
)
def test_load_errors_name_file_and_job(
    tmp_path: Path, name: str, text: str, fragments: list[str]
) -> None:
    """Every file error names the file, and job errors name the job and its position."""
    path = write(tmp_path, name, text)
    with pytest.raises(JobConfigError) as info:
        load_job_configs(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_load_missing_file(tmp_path: Path) -> None:
    """A missing file is a JobConfigError naming it."""
    path = tmp_path / "nope.yaml"
    with pytest.raises(JobConfigError, match="cannot read the job file") as info:
        load_job_configs(path)
    assert str(path) in str(info.value)


DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@pytest.mark.parametrize(("lang", "suffix"), [("yaml", ".yaml"), ("toml", ".toml")])
def test_documented_job_files_load(tmp_path: Path, lang: str, suffix: str) -> None:
    """The job file examples in docs/configuration.md are valid."""
    text = DOCS.read_text(encoding="utf-8")
    block = text.split(f"```{lang}\n", 1)[1].split("```", 1)[0]
    configs = load_job_configs(write(tmp_path, f"example{suffix}", block))
    assert [c.name for c in configs] == ["order-sync", "nightly-report"]


def test_job_error_message_starts_with_the_file(tmp_path: Path) -> None:
    """An invalid job in a file is reported as '<file>: invalid job <name> (#n): ...'."""
    path = write(tmp_path, "jobs.yaml", "- {name: x, interval: 1, sharding_total_count: 0}\n")
    with pytest.raises(JobConfigError) as info:
        load_job_configs(path)
    assert str(info.value).startswith(f"{path}: invalid job 'x' (#1): sharding_total_count=0")
