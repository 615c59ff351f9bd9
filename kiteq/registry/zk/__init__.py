"""`zk://h1:2181,h2:2181[/chroot][?session_timeout=10]`: the registry in ZooKeeper, KiteQ's tree.

    uri.py         the URI, parsed without I/O
    bridge.py      the kazoo <-> Trio bridge: session state, worker-thread calls, watches
    tree.py        KiteQ's paths, and the reads and writes of its nodes
    ephemerals.py  this process's ephemeral nodes, re-created after a lost session
    registry.py    `ZooKeeperRegistry`, the `Registry` interface over them

See docs/registry.md for the tree and the behaviour under failure.
"""

from kiteq.registry.zk.bridge import ZooKeeperUnavailable
from kiteq.registry.zk.registry import ZooKeeperRegistry
from kiteq.registry.zk.uri import parse_zk_uri

__all__ = ["ZooKeeperRegistry", "ZooKeeperUnavailable", "parse_zk_uri"]
