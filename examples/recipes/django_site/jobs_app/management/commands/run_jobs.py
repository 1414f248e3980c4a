"""``manage.py run_jobs``: run the jobs of ``settings.SHARDKEEPER`` until SIGTERM.

A process of its own next to the web server (``manage.py runserver``, gunicorn,
uwsgi): the jobs run with Django set up (models, settings) but not inside the web
workers. SIGTERM/SIGINT stop gracefully; a second signal stops at once.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from shardkeeper import Runtime, ShardedJob

__all__ = ["Command"]


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    """Run the sharded jobs listed in ``settings.SHARDKEEPER["JOBS"]``."""

    help = "Run the shardkeeper jobs of settings.SHARDKEEPER until SIGTERM/SIGINT."

    def add_arguments(self, parser: CommandParser) -> None:
        """``--grace`` overrides ``settings.SHARDKEEPER["GRACE"]``."""
        parser.add_argument("--grace", type=float, default=None, help="seconds of grace")

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the runtime, add each job, run until stopped."""
        conf: dict[str, Any] = getattr(settings, "SHARDKEEPER", {})
        jobs = conf.get("JOBS") or []
        if not jobs:
            raise CommandError(
                'settings.SHARDKEEPER["JOBS"] is empty: list job classes as "module:Class"'
            )
        grace = options["grace"] if options["grace"] is not None else conf.get("GRACE", 30.0)
        runtime = Runtime(
            conf.get("REGISTRY"),  # None: the SHARDKEEPER_REGISTRY environment variable
            worker_threads=int(conf.get("WORKER_THREADS", 8)),
            shutdown_grace=float(grace),
            labels={"app": "django"},
        )
        for path in jobs:
            runtime.add_job(_job_class(path))
        self.stdout.write(f"shardkeeper instance {runtime.instance_id}: running {jobs}")
        runtime.run_forever()  # installs SIGTERM/SIGINT handlers: this is the main thread
        self.stdout.write("stopped")


def _job_class(path: str) -> type[ShardedJob]:
    """The class a ``"module:Class"`` entry names; CommandError if it is not one."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise CommandError(f"job {path!r}: expected 'module:Class'")
    try:
        obj = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"job {path!r} cannot be imported: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, ShardedJob)):
        raise CommandError(f"job {path!r} is {obj!r}, not a ShardedJob subclass")
    return obj
