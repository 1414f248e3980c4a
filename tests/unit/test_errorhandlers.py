"""Error handlers: log with traceback, ignore, re-raise, and resolution by name or path."""

from __future__ import annotations

import logging

import pytest

from shardkeeper.errorhandlers import (
    ignore_error,
    log_error,
    raise_error,
    resolve_error_handler,
)
from shardkeeper.errors import JobConfigError


def failure() -> ValueError:
    """An exception with a traceback, as a failed item would raise it."""
    try:
        raise ValueError("bad row 7")
    except ValueError as exc:
        return exc


def test_log_logs_error_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """The log handler writes one ERROR record with the job, item and traceback."""
    with caplog.at_level(logging.ERROR, logger="shardkeeper.job"):
        log_error("order-sync", 3, failure())
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "'order-sync'" in record.getMessage()
    assert "item 3" in record.getMessage()
    assert record.exc_info is not None
    assert "bad row 7" in caplog.text
    assert "Traceback" in caplog.text


def test_ignore_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The ignore handler neither logs nor raises."""
    with caplog.at_level(logging.DEBUG):
        ignore_error("j", 0, failure())
    assert caplog.records == []


def test_raise_reraises_the_same_exception() -> None:
    """The raise handler re-raises the very exception object."""
    exc = failure()
    with pytest.raises(ValueError) as info:
        raise_error("j", 0, exc)
    assert info.value is exc


def test_resolve_builtins() -> None:
    """The three names resolve to the built-in handlers."""
    assert resolve_error_handler("log") is log_error
    assert resolve_error_handler("ignore") is ignore_error
    assert resolve_error_handler("raise") is raise_error


def custom_handler(job_name: str, item: int, exc: BaseException) -> None:
    """A user-supplied handler."""


def test_resolve_import_path() -> None:
    """An import path resolves to the callable it names."""
    assert resolve_error_handler(f"{__name__}:custom_handler") is custom_handler
    assert resolve_error_handler(f"{__name__}.custom_handler") is custom_handler


NOT_CALLABLE = "a string"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("throw", "valid choices are log, ignore, raise"),
        ("nowhere_mod_xyz:handler", "cannot import module 'nowhere_mod_xyz'"),
        (f"{__name__}:missing", "has no attribute 'missing'"),
        (f"{__name__}:NOT_CALLABLE", "not callable"),
    ],
)
def test_resolve_errors(value: str, fragment: str) -> None:
    """Unusable handlers are refused naming the value and what is wrong."""
    with pytest.raises(JobConfigError) as info:
        resolve_error_handler(value)
    assert repr(value) in str(info.value)
    assert fragment in str(info.value)
