"""A long import that survives failover: checkpoints, progress and worker processes.

Each item imports one shard of a ledger, batch by batch. After every batch it saves
where it is with ``ctx.checkpoint``: if its instance dies (or is fenced, or stops)
half-way, the instance that takes the item over gets that position as
``ctx.resume_state`` and goes on from there instead of starting again. A zombie (the
old owner, cut off from the store) cannot overwrite it: its checkpoint is refused
once the item was taken over, so it stops writing. With ``checkpoint_carry`` the next
fire starts where the last one ended (``ctx.last_state``): a cursor, with no database
of its own. ``ctx.progress`` shows how far each item is in ``shardkeeper shards`` and
the console.

The items run in worker processes (``executor="process"``): an import that crashes
(a C extension, an out-of-memory kill) ends its worker, not the instance; the item is
recorded ``crashed`` and failed over.

Run it (from the repository root, in two terminals, then ``kill -9`` one of them
while it prints ``importing`` lines, and watch the other resume)::

    export SHARDKEEPER_REGISTRY=$(shardkeeper registry up --namespace examples)
    LEDGER_OUT=/tmp/ledger python examples/checkpointed_job.py

A fire every 20 s imports 5 batches of 2 s per shard: for 10 s of every 20 an import
runs, time enough to kill it by hand. ``LEDGER_BATCHES`` (batches a fire) and
``LEDGER_BATCH_SECONDS`` (seconds a batch) change that. Each imported batch is appended
to ``$LEDGER_OUT/shard-<item>.log``.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from shardkeeper import JobConfig, Runtime, ShardedJob, ShardingContext

__all__ = ["BATCHES_PER_FIRE", "BATCH_SECONDS", "LedgerImport", "main", "out_dir"]

#: batches one fire imports per shard (``LEDGER_BATCHES``)
BATCHES_PER_FIRE = int(os.environ.get("LEDGER_BATCHES") or 5)
#: seconds one batch takes (``LEDGER_BATCH_SECONDS``): long enough to kill by hand
BATCH_SECONDS = float(os.environ.get("LEDGER_BATCH_SECONDS") or 2.0)


def out_dir() -> Path:
    """Where the imported batches are written (``LEDGER_OUT``, else a temp dir)."""
    path = Path(os.environ.get("LEDGER_OUT") or Path(tempfile.gettempdir()) / "ledger")
    path.mkdir(parents=True, exist_ok=True)
    return path


class LedgerImport(ShardedJob):
    """Imports the next batches of one ledger shard per item, resumably."""

    config = JobConfig.parse(
        name="ledger-import",
        # every 20 s: with 5 batches of 2 s an import runs half of the time
        cron="*/20 * * * * *",
        sharding_total_count=2,
        failover=True,
        # the imports run in worker processes: a crash ends the worker, not the instance
        executor="process",
        # the next fire starts where this one ended (ctx.last_state)
        checkpoint_carry=True,
        # at most one checkpoint write a second per item; the last is never lost
        checkpoint_interval=1.0,
        description="example: a resumable import in worker processes",
        job_class="examples.checkpointed_job:LedgerImport",
    )

    def __init__(
        self,
        out: Path | None = None,
        batches: int | None = None,
        batch_seconds: float | None = None,
    ) -> None:
        # Resolved here, in the instance's process: the worker processes get the job
        # as this pickled instance (their environment is the pool's, from its start).
        self.out = out or out_dir()
        self.batches = BATCHES_PER_FIRE if batches is None else batches
        if self.batches < 1:
            raise ValueError(f"batches={self.batches}: give 1 or more (LEDGER_BATCHES)")
        self.batch_seconds = BATCH_SECONDS if batch_seconds is None else batch_seconds
        if not self.batch_seconds >= 0:
            raise ValueError(
                f"batch_seconds={self.batch_seconds}: give 0 or more (LEDGER_BATCH_SECONDS)"
            )

    def execute(self, ctx: ShardingContext) -> None:
        """Import ``batches`` batches from where the shard's import stands."""
        # resume_state: this fire was cut off elsewhere; last_state: where the
        # previous fire ended; neither: the first import of the shard
        where = ctx.resume_state or ctx.last_state or {"next": 0}
        start = int(where["next"])
        if ctx.resumed:
            # this fire's import was cut off elsewhere: finish the fire's batches
            print(f"item {ctx.item}: resuming at batch {start}", flush=True)
            end = -(-start // self.batches) * self.batches
        else:
            end = (start // self.batches + 1) * self.batches
        log_file = self.out / f"shard-{ctx.item}.log"
        for batch in range(start, end):
            if ctx.should_stop():
                return  # grace running out, or fenced: the checkpoint says where to go on
            print(f"item {ctx.item}: importing batch {batch}", flush=True)
            self.import_batch(ctx.item, batch, log_file)
            # one conditional commit (coalesced): refused once the item is not ours
            if not ctx.checkpoint({"next": batch + 1}):
                return  # taken over: the successor goes on from our last checkpoint
            ctx.progress(batch + 1 - start, end - start, note=f"batch {batch}")

    def import_batch(self, item: int, batch: int, log_file: Path) -> None:
        """The work of one batch (here: a pause, and a line in the log)."""
        time.sleep(self.batch_seconds)
        with log_file.open("a") as f:
            f.write(f"{item} {batch}\n")


def main() -> None:
    """Run the job until interrupted (Ctrl-C stops gracefully)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    url = os.environ.get("SHARDKEEPER_REGISTRY")
    if not url:
        sys.exit("set SHARDKEEPER_REGISTRY (shardkeeper registry up prints one)")
    runtime = Runtime(url)
    runtime.add_job(LedgerImport())
    runtime.run_forever()


if __name__ == "__main__":
    main()
