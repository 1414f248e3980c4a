"""gunicorn settings and hooks of the gunicorn recipe (``gunicorn -c THIS_FILE``).

``post_worker_init`` runs in each worker process after the fork: the worker's
shardkeeper runtime starts there, so every worker is one instance and the job's
items are split between them. ``worker_exit`` runs in the worker as it exits (after
SIGTERM to the master, which passes it on): the runtime stops gracefully there.
Never start a runtime in the master (``on_starting``, ``when_ready`` or at import
under ``--preload``): its threads would not exist in the forked workers.
"""

from __future__ import annotations

import os
from typing import Any

# the grace the runtime gives running items (see jobs.build_runtime) ...
_grace = float(os.environ.get("SHARDKEEPER_GRACE", "10"))
# ... must fit in the time gunicorn gives a worker to exit after SIGTERM
graceful_timeout = int(_grace) + 10
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# gunicorn's control socket (a fixed path per user by default) is not needed here,
# and two servers of one user would fight over it
control_socket_disable = True


def post_worker_init(worker: Any) -> None:
    """Start this worker's shardkeeper instance."""
    from examples.recipes.gunicorn_app import start_runtime

    runtime = start_runtime()
    worker.log.info("worker %s: shardkeeper instance %s", worker.pid, runtime.instance_id)


def worker_exit(server: Any, worker: Any) -> None:
    """Stop this worker's instance gracefully (its items go to the other workers)."""
    from examples.recipes.gunicorn_app import stop_runtime

    instance_id = stop_runtime()
    if instance_id is not None:
        worker.log.info("worker %s: shardkeeper instance %s stopped", worker.pid, instance_id)
