"""What a ZooKeeper watcher pays for changes in a subtree its watch excludes.

The runtime watches its whole namespace with one persistent recursive watch and
excludes the running marks (``coordination.paths.is_high_churn``), which change by the
thousand at every fire of a big job. ZooKeeper cannot leave a subtree out of a
recursive watch: it still sends a notification per change there, and the watching
process reads it. This measures that price: a churn client creates and deletes
``--items`` running marks ``--rounds`` times (in multis of 2,500, like a fire's start
and completion) on a fresh single ZooKeeper server, while a store in this process
watches ``/`` with the runtime's exclusion (``--mode watch``) or watches nothing
(``--mode none``). Prints one JSON line: the CPU seconds of this process and of the
server during the churn, the changes made, and the events the watch delivered
(0: the exclusion held).

Run from the repository root (not part of ``make bench``; about 20 s a mode)::

    .venv/bin/python -m bench.watch_cost --mode none
    .venv/bin/python -m bench.watch_cost --mode watch
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from kazoo.client import KazooClient

from shardkeeper.coordination.paths import is_high_churn
from shardkeeper.registry import open_store
from shardkeeper.registry.base import WatchEvent
from shardkeeper.testing.servers.zookeeper import ZooKeeperCluster

#: a running mark's size, as the runtime writes them
MARK = (
    b'{"instance":"vm@12345@abcdef","fire":1796403484.0,"execution_id":"bulk@1796403484000#1234"}'
)
#: operations per multi of the churn client (a fire's start of 2,500 items)
CHUNK = 2500


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, items: int, rounds: int) -> dict[str, object]:
    """One run (module docstring)."""
    events: list[WatchEvent] = []
    with ZooKeeperCluster(size=1, base_dir=tempfile.mkdtemp(), heap_mb=512) as zk:
        store = open_store(zk.url("bench", session_timeout=10, operation_timeout=5))
        store.start()
        raw = KazooClient(hosts=zk.hosts_string, timeout=30)
        raw.start(30)
        try:
            store.put("/jobs/bulk/config", b"{}")
            # the store's namespace is a chroot of its name (registry/zookeeper/transport.py)
            root = "/bench"
            running = f"{root}/jobs/bulk/running"
            raw.ensure_path(running)
            if mode == "watch":
                store.watch("/", events.append, exclude=is_high_churn)
            time.sleep(1.0)  # the watch's first read and the parent's listing settle
            pid = zk.member_status(0).pid
            assert pid is not None, "the server is not running"
            own0, srv0, t0 = _own_cpu(), _server_cpu(pid), time.monotonic()
            for _ in range(rounds):
                for lo in range(0, items, CHUNK):
                    tx = raw.transaction()
                    for i in range(lo, min(items, lo + CHUNK)):
                        tx.create(f"{running}/{i}", MARK)
                    tx.commit()
                for lo in range(0, items, CHUNK):
                    tx = raw.transaction()
                    for i in range(lo, min(items, lo + CHUNK)):
                        tx.delete(f"{running}/{i}")
                    tx.commit()
            time.sleep(2.0)  # the last notifications are read
            return {
                "mode": mode,
                "changes": 2 * items * rounds,
                "seconds": round(time.monotonic() - t0, 2),
                "process_cpu_s": round(_own_cpu() - own0, 2),
                "server_cpu_s": round(_server_cpu(pid) - srv0, 2),
                "events_delivered": len(events),
            }
        finally:
            raw.stop()
            raw.close()
            store.close()


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("none", "watch"), default="watch")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(measure(args.mode, args.items, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
