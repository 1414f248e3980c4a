"""A streaming dataflow job: each item drains its share of a backlog in batches.

:class:`OrderStream` owns 4 partitions of an order backlog (order id % 4 = item).
At each trigger, ``fetch_data`` returns the next batch of the item's pending orders
and ``process_data`` handles it; because ``streaming = True`` the runtime keeps
fetching until a fetch returns nothing, or until it asks the job to stop
(shutdown, a reshard pending, the execution fenced off)::

    export SHARDKEEPER_REGISTRY=$(shardkeeper registry up --namespace examples)
    python examples/dataflow_job.py
    # or: shardkeeper run examples.dataflow_job:OrderStream

The backlog here lives in the process, standing in for a shared table or queue;
with a real one, every instance sees the same orders and the sharding decides
which instance handles which partition.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence

from shardkeeper import DataflowJob, JobConfig, Runtime, ShardingContext

__all__ = ["Backlog", "OrderStream", "main"]

log = logging.getLogger("examples.dataflow_job")


class Backlog:
    """Pending order ids; thread-safe, as items of one instance run in parallel."""

    def __init__(self, orders: int) -> None:
        self._pending = set(range(orders))
        self._lock = threading.Lock()

    def take(self, partition: int, partitions: int, limit: int) -> list[int]:
        """Up to ``limit`` pending orders of one partition (lowest ids first)."""
        with self._lock:
            mine = sorted(o for o in self._pending if o % partitions == partition)
            return mine[:limit]

    def done(self, orders: Sequence[int]) -> None:
        """Mark orders as processed."""
        with self._lock:
            self._pending.difference_update(orders)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)


class OrderStream(DataflowJob):
    """Drains the order backlog, one partition per item, 5 orders per batch."""

    config = JobConfig.parse(
        name="order-stream",
        cron="*/5 * * * * *",
        sharding_total_count=4,
        failover=True,
        description="example: streaming dataflow over 4 partitions",
        job_class="examples.dataflow_job:OrderStream",  # same name as script or via CLI
    )
    streaming = True
    batch_size = 5

    def __init__(self, orders: int = 40) -> None:
        self.backlog = Backlog(orders)
        #: order ids processed by this process, in order (the tests look at it)
        self.processed: list[int] = []

    def fetch_data(self, ctx: ShardingContext) -> list[int]:
        """The next batch of this item's partition (empty when it is drained)."""
        # the job's props can tune it per deployment (see jobs.yaml)
        size = int(ctx.props.get("batch_size", self.batch_size))
        return self.backlog.take(ctx.item, ctx.sharding_total_count, size)

    def process_data(self, ctx: ShardingContext, data: Sequence[int]) -> None:
        """Handle one batch, then mark it done (only while still the owner)."""
        if not ctx.is_valid():
            # fenced off: another instance may own the item now; leave the batch to it
            return
        self.processed.extend(data)
        self.backlog.done(data)
        log.info(
            "item %d: processed orders %s (%d left in the backlog)",
            ctx.item,
            list(data),
            len(self.backlog),
        )


def main() -> None:
    """Run OrderStream as one instance until SIGTERM or Ctrl-C."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = os.environ.get("SHARDKEEPER_REGISTRY", "").strip()
    if not url:
        sys.exit(
            "set SHARDKEEPER_REGISTRY to a registry URL, e.g. the one "
            "`shardkeeper registry up --namespace examples` prints"
        )
    runtime = Runtime(url, shutdown_grace=10.0)
    runtime.add_job(OrderStream)
    runtime.run_forever()


if __name__ == "__main__":
    main()
