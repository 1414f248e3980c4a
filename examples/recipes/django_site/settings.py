"""Minimal Django settings of the recipe (a real project adds its own).

``SHARDKEEPER`` configures the ``run_jobs`` command: the job classes
(``"module:Class"``), worker threads and grace. The registry URL comes from the
``SHARDKEEPER_REGISTRY`` environment variable unless ``REGISTRY`` is set here.
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "recipe-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = ["examples.recipes.django_site.jobs_app"]
DATABASES: dict[str, Any] = {}
USE_TZ = True

SHARDKEEPER: dict[str, Any] = {
    "JOBS": ["examples.recipes.jobs:Heartbeat"],
    "WORKER_THREADS": 4,
    "GRACE": float(os.environ.get("SHARDKEEPER_GRACE", "10")),
}
