"""The registry file's pure rules: heartbeat expiry, pruning, registration, the producer bound."""

from __future__ import annotations

import pytest

from kiteq.registry.file_tree import (
    MAX_PRODUCERS,
    Tree,
    beat,
    empty_tree,
    forget,
    is_live,
    prune,
    put_admin,
    put_producer,
    put_server,
    withdraw_admin,
    withdraw_producer,
)

TTL = 30.0


@pytest.mark.parametrize(
    ("beat_at", "now", "live"),
    [
        (100.0, 100.0, True),  # just written
        (100.0, 129.999, True),  # inside the TTL
        (100.0, 130.0, False),  # exactly one TTL old: gone
        (100.0, 1000.0, False),  # long dead
        (100, 110.0, True),  # an int (a hand edit) counts like a float
        (200.0, 100.0, True),  # written "in the future" by a clock a little ahead: live
        (None, 100.0, False),  # no heartbeat (a file from before heartbeats)
        ("100", 100.0, False),  # not a number
        (True, 1.0, False),  # JSON true is not a time
    ],
)
def test_a_heartbeat_holds_for_one_ttl(beat_at: object, now: float, live: bool) -> None:
    assert is_live(beat_at, now, TTL) is live


def tree_with(
    servers: dict[str, list[str]], producers: dict[str, dict[str, list[str]]], beats: dict[str, float]
) -> Tree:
    tree = empty_tree()
    tree.update(servers=servers, producers=producers, heartbeats=beats, bindings={"t": {"g": [{"x": 1}]}})
    return tree


@pytest.mark.parametrize(
    ("beats", "servers", "producers"),
    [
        # every address live: nothing changes
        ({"b1": 95.0, "b2": 95.0, "p1": 95.0, "p2": 95.0},
         {"t1": ["b1", "b2"], "t2": ["b2"]}, {"t1": {"g": ["p1", "p2"]}}),
        # b2 stopped heartbeating: gone from every topic, t2 with it
        ({"b1": 95.0, "b2": 60.0, "p1": 95.0, "p2": 95.0},
         {"t1": ["b1"]}, {"t1": {"g": ["p1", "p2"]}}),
        # p1 never had a heartbeat; p2 expired: the group and the topic go
        ({"b1": 95.0, "b2": 95.0, "p2": 10.0},
         {"t1": ["b1", "b2"], "t2": ["b2"]}, {}),
        # nobody alive: empty tables, bindings untouched
        ({}, {}, {}),
    ],
)  # fmt: skip
def test_prune_keeps_only_live_addresses(
    beats: dict[str, float], servers: dict[str, list[str]], producers: dict[str, dict[str, list[str]]]
) -> None:
    tree = tree_with({"t1": ["b1", "b2"], "t2": ["b2"]}, {"t1": {"g": ["p1", "p2"]}}, beats)
    assert prune(tree, 100.0, TTL) is tree
    assert tree["servers"] == servers
    assert tree["producers"] == producers
    assert tree["heartbeats"] == {a: t for a, t in beats.items() if t > 100.0 - TTL}
    assert tree["bindings"] == {"t": {"g": [{"x": 1}]}}, "bindings are persistent: never pruned"


def test_servers_are_listed_under_exactly_their_topics() -> None:
    tree = empty_tree()
    put_server(tree, "b2", ["t1"])
    put_server(tree, "b1", ["t1", "t2"])
    assert tree["servers"] == {"t1": ["b1", "b2"], "t2": ["b1"]}
    put_server(tree, "b1", ["t1"])
    assert tree["servers"] == {"t1": ["b1", "b2"]}
    put_server(tree, "b1", [])
    assert tree["servers"] == {"t1": ["b2"]}


def test_producers_are_bounded_per_topic_and_group_oldest_dropped_first() -> None:
    tree = empty_tree()
    addresses = [f"p{i}" for i in range(MAX_PRODUCERS + 3)]
    for address in addresses:
        put_producer(tree, address, "g", ["t"])
    put_producer(tree, addresses[-1], "g", ["t"])  # again: not listed twice
    assert tree["producers"]["t"]["g"] == addresses[-MAX_PRODUCERS:]
    withdraw_producer(tree, addresses[-1], "g", ["t", "elsewhere"])
    assert tree["producers"]["t"]["g"] == addresses[-MAX_PRODUCERS:-1]


def test_beat_and_forget() -> None:
    tree = empty_tree()
    beat(tree, ["a", "b"], 10.0)
    beat(tree, ["b"], 20.0)
    assert tree["heartbeats"] == {"a": 10.0, "b": 20.0}
    forget(tree, ["a", "never-there"])
    assert tree["heartbeats"] == {"b": 20.0}


def test_an_admin_endpoint_lives_and_expires_with_its_brokers_heartbeat() -> None:
    tree = empty_tree()
    put_admin(tree, "b1", "http://b1:1")
    put_admin(tree, "b2", "http://b2:1")
    put_admin(tree, "b1", "https://b1:2")  # registered again: the last URL wins
    beat(tree, ["b1"], 95.0)
    beat(tree, ["b2"], 60.0)
    assert prune(tree, 100.0, TTL)["admins"] == {"b1": "https://b1:2"}, "b2's heartbeat expired"
    withdraw_admin(tree, "b1")
    withdraw_admin(tree, "never-there")
    assert tree["admins"] == {}
    assert "admins" in empty_tree(), "a file from before admin endpoints reads as having none"
