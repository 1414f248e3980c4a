"""Import paths in configuration: checking their form eagerly, resolving them lazily.

It also holds :func:`needs_extra`, which turns the import of an optional dependency
(an extra of the package: ``shardkeeper[metrics]``, ``[http]``, ...) that is not
installed into one line naming the extra to install.

A configuration names user code (a sharding strategy, an error handler, a listener,
the job class) by an import path, in one of two forms:

* ``package.module:attr`` or ``package.module:Outer.attr`` (the colon separates the
  module from the attribute path, so nested attributes work), or
* ``package.module.attr`` (the last dotted part is the attribute).

The form is checked when the configuration is built, but the object is imported only
when it is needed: a process that only inspects or edits a job's configuration (the
CLI, an operator's console) does not have to be able to import the job's code.
"""

from __future__ import annotations

import importlib
import logging
import re
import sysconfig
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardkeeper.errors import ConfigError, JobConfigError

__all__ = ["EXTRAS", "import_object", "is_import_path", "needs_extra", "where_raised"]

log = logging.getLogger(__name__)

#: each extra of the package and the top-level modules it provides (pyproject.toml's
#: [project.optional-dependencies]; tests/test_packaging.py checks the two agree)
EXTRAS: dict[str, tuple[str, ...]] = {
    "cli": ("typer", "rich", "yaml"),
    "history": ("sqlalchemy",),
    "metrics": ("prometheus_client",),
    "http": ("httpx",),
    "etcd": ("etcd3", "grpc", "google"),
    "postgres": ("psycopg",),
    "console": ("fastapi", "uvicorn", "jinja2", "multipart"),
    "otel": ("opentelemetry",),
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_COLON_FORM = re.compile(rf"^{_DOTTED}:{_DOTTED}$")
_DOT_FORM = re.compile(rf"^{_IDENT}(?:\.{_IDENT})+$")


def is_import_path(value: str) -> bool:
    """True when ``value`` has the form ``module:attr`` or ``module.attr``."""
    return bool(_COLON_FORM.match(value) or _DOT_FORM.match(value))


def import_object(path: str, what: str) -> object:
    """Import the object named by ``path``; errors name ``what`` it was for and why.

    Raises :class:`~shardkeeper.errors.JobConfigError` when the path is malformed, the
    module cannot be imported (not found, a syntax error, or its code raised), or the
    attribute does not exist.
    """
    if not is_import_path(path):
        raise JobConfigError(
            f"{what} {path!r} is not an import path; expected 'package.module:attr' "
            "or 'package.module.attr'"
        )
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    try:
        obj: object = importlib.import_module(module_name)
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else "unknown place"
        raise JobConfigError(
            f"{what} {path!r}: module {module_name!r} has a syntax error ({exc.msg}; {where})"
        ) from exc
    except JobConfigError:
        raise  # e.g. the module builds an invalid JobConfig: that message says it all
    except Exception as exc:
        # The whole traceback at debug level; the one error line names the innermost
        # place in the user's code (a helper module's line, not importlib's), so that
        # nobody has to re-run the import by hand to find it.
        log.debug("importing module %r failed", module_name, exc_info=exc)
        place = where_raised(exc)
        at = f"; {place}" if place else ""
        if isinstance(exc, ImportError):
            raise JobConfigError(
                f"{what} {path!r}: cannot import module {module_name!r} ({exc}{at})"
            ) from exc
        # The module's own top-level code failed: the user's error, reported as one
        # line (the cause stays chained for a debugger).
        raise JobConfigError(
            f"{what} {path!r}: importing module {module_name!r} failed "
            f"({type(exc).__name__}: {exc}{at})"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise JobConfigError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    return obj


def _dirs(*keys: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(str(Path(paths[k]).resolve()) + "/" for k in keys if k in paths)


def where_raised(exc: BaseException) -> str | None:
    """``"/srv/app/helper.py, line 3"`` (``", in connect"`` inside a function): the
    innermost frame of ``exc``'s traceback in the user's code, or None when it has none.

    Frames of the import machinery (``<frozen importlib._bootstrap>``), of the
    standard library (``os.environ[...]`` raises in ``os.py``) and of shardkeeper are
    not the user's; a frame in an installed package (site-packages) counts only when
    no frame outside one does (the job's own package may be installed there).
    """
    ours = str(Path(__file__).resolve().parent) + "/"
    stdlib = _dirs("stdlib", "platstdlib")
    site = _dirs("purelib", "platlib")  # (may lie inside stdlib's directory)
    frames = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith("<"):
            continue
        resolved = str(Path(frame.filename).resolve())
        in_site = resolved.startswith(site)
        if resolved.startswith(ours) or (resolved.startswith(stdlib) and not in_site):
            continue
        frames.append((frame, in_site))
    own = [f for f, in_site in frames if not in_site] or [f for f, _ in frames]
    if not own:
        return None
    last = own[-1]
    inside = f", in {last.name}" if last.name != "<module>" else ""
    return f"{last.filename}, line {last.lineno}{inside}"


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Import an optional dependency inside the block; name ``extra`` if it is missing.

    ``with needs_extra("metrics", "metrics_port"): import prometheus_client`` raises
    :class:`~shardkeeper.errors.ConfigError` ("metrics_port needs the 'metrics' extra
    (prometheus_client is not installed): pip install 'shardkeeper[metrics]'") when
    the module, or one the extra brings, is not installed. Any other ImportError (a
    module of the extra that is broken, a bug of ours) passes through unchanged.
    """
    provides = EXTRAS.get(extra)
    if provides is None:
        raise ValueError(f"unknown extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    try:
        yield
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in provides:
            raise
        raise ConfigError(
            f"{what} needs the {extra!r} extra ({exc.name} is not installed): "
            f"pip install 'shardkeeper[{extra}]'"
        ) from None
