"""The demo behind ``make demo``: a local registry, four instances, one kill -9.

``python -m demo --backend zookeeper|etcd [--fast] [--keep-dir]`` starts
a throw-away ZooKeeper (or etcd) server, runs the example job in separate worker
processes (:mod:`demo.worker`), and tells the story of sharding,
resharding and failover from what the workers record and what the registry holds
(:mod:`demo.story`). It ends by itself, leaves no process behind and
exits non-zero when any step of the story did not happen.
"""

from __future__ import annotations

__all__ = ["ITEM_PARAMETERS", "JOB_NAME"]

#: the name of the demo job in the registry
JOB_NAME = "demo-orders"

#: one parameter per item: the city whose orders that item handles
ITEM_PARAMETERS: dict[int, str] = {
    0: "amsterdam",
    1: "berlin",
    2: "cairo",
    3: "delhi",
    4: "lima",
    5: "oslo",
    6: "paris",
    7: "tokyo",
}
