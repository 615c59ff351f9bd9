"""The registry file's content and the pure rules over it: no file, no clock, no task.

    {"servers":    {topic: [address, ...]},
     "producers":  {topic: {group: [address, ...]}},
     "bindings":   {topic: {group: [binding JSON, ...]}},
     "admins":     {broker address: admin endpoint URL},
     "heartbeats": {address: unix seconds}}

A file has no sessions to end, so liveness is a timestamp, the file's stand-in for
ZooKeeper's ephemeral nodes: each process refreshes the heartbeat of the brokers and
producers it registered, and an address whose heartbeat is older than the TTL (or
missing) counts as gone, with the admin endpoint registered under it. Readers see
only live entries (`prune` on their copy); writers prune before they write, so the
file does not grow with dead processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Tree = dict[str, Any]

# Producer addresses kept per topic and group, the oldest registration dropped first: a
# bound on the file while expiry has not yet caught up with producers killed in a burst.
MAX_PRODUCERS = 64


def empty_tree() -> Tree:
    return {"servers": {}, "producers": {}, "bindings": {}, "admins": {}, "heartbeats": {}}


def is_live(beat: object, now: float, ttl: float) -> bool:
    """Whether a heartbeat written at `beat` (unix seconds) still holds at `now`.

    Anything but a number (a hand edit, a file from before heartbeats) has expired.
    """
    return isinstance(beat, int | float) and not isinstance(beat, bool) and now - beat < ttl


def prune(tree: Tree, now: float, ttl: float) -> Tree:
    """Drop the brokers, admin endpoints and producers whose heartbeat expired, and those heartbeats.

    In place; the tree is returned for chaining.
    """
    beats = {address: beat for address, beat in tree["heartbeats"].items() if is_live(beat, now, ttl)}
    tree["heartbeats"] = beats
    tree["servers"] = _non_empty(
        {t: [a for a in found if a in beats] for t, found in tree["servers"].items()}
    )
    tree["producers"] = _non_empty(
        {
            topic: _non_empty({g: [a for a in found if a in beats] for g, found in groups.items()})
            for topic, groups in tree["producers"].items()
        }
    )
    tree["admins"] = {address: url for address, url in tree["admins"].items() if address in beats}
    return tree


def _non_empty(table: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if value}


def put_server(tree: Tree, address: str, topics: Iterable[str]) -> None:
    """List the broker at `address` under exactly `topics` (none: unlisted)."""
    wanted = set(topics)
    servers: dict[str, list[str]] = tree["servers"]
    for topic in set(servers) | wanted:
        addresses = [a for a in servers.get(topic, []) if a != address]
        if topic in wanted:
            addresses.append(address)
        if addresses:
            servers[topic] = sorted(addresses)
        else:
            servers.pop(topic, None)


def put_producer(tree: Tree, address: str, group: str, topics: Iterable[str]) -> None:
    """List a producer under each topic, keeping the newest MAX_PRODUCERS per topic and group."""
    for topic in topics:
        addresses = tree["producers"].setdefault(topic, {}).setdefault(group, [])
        if address not in addresses:
            addresses.append(address)
            del addresses[:-MAX_PRODUCERS]


def put_admin(tree: Tree, address: str, url: str) -> None:
    """Record the admin endpoint of the broker at `address` (one per broker, the last one wins)."""
    tree["admins"][address] = url


def withdraw_admin(tree: Tree, address: str) -> None:
    tree["admins"].pop(address, None)


def withdraw_producer(tree: Tree, address: str, group: str, topics: Iterable[str]) -> None:
    for topic in topics:
        addresses = tree["producers"].get(topic, {}).get(group, [])
        if address in addresses:
            addresses.remove(address)


def beat(tree: Tree, addresses: Iterable[str], now: float) -> None:
    """Record that the processes at `addresses` are alive at `now`."""
    tree["heartbeats"].update(dict.fromkeys(addresses, now))


def forget(tree: Tree, addresses: Iterable[str]) -> None:
    """Drop the heartbeats of addresses that withdrew (a clean stop, not an expiry)."""
    for address in addresses:
        tree["heartbeats"].pop(address, None)
