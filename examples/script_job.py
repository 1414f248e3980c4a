"""A script job: every item runs an external command with its context as JSON.

:class:`Thumbnailer` runs a tiny Python one-liner per item; any program works (a
shell script, a binary). The context arrives as the last argument and in the
environment variable ``SHARDKEEPER_CONTEXT``; a non-zero exit marks the item
failed, and the output is logged::

    export SHARDKEEPER_REGISTRY=$(shardkeeper registry up --namespace examples)
    python examples/script_job.py
    # or: shardkeeper run examples.script_job:Thumbnailer
"""

from __future__ import annotations

import logging
import os
import sys

from shardkeeper import JobConfig, Runtime, ScriptJob

__all__ = ["COMMAND", "Thumbnailer", "main"]

#: what each item runs: reads the context from the environment, prints one line
COMMAND = [
    sys.executable,
    "-c",
    "import json, os; c = json.loads(os.environ['SHARDKEEPER_CONTEXT']); "
    "print(f\"thumbnails of bucket {c['item_parameter']} (item {c['item']}) "
    "on {c['instance_id']}\")",
]


class Thumbnailer(ScriptJob):
    """Makes the thumbnails of one storage bucket per item (by running COMMAND)."""

    config = JobConfig.parse(
        name="thumbnailer",
        cron="*/10 * * * * *",
        sharding_total_count=3,
        sharding_item_parameters="0=images-a,1=images-b,2=images-c",
        description="example: one external command per item",
        job_class="examples.script_job:Thumbnailer",  # same name as script or via CLI
    )
    command = COMMAND
    # a hung command is killed and the item counts as failed
    timeout = 30.0


def main() -> None:
    """Run Thumbnailer as one instance until SIGTERM or Ctrl-C."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = os.environ.get("SHARDKEEPER_REGISTRY", "").strip()
    if not url:
        sys.exit(
            "set SHARDKEEPER_REGISTRY to a registry URL, e.g. the one "
            "`shardkeeper registry up --namespace examples` prints"
        )
    runtime = Runtime(url, shutdown_grace=35.0)
    runtime.add_job(Thumbnailer)
    runtime.run_forever()


if __name__ == "__main__":
    main()
