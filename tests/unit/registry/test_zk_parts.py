"""The ZooKeeper registry's pure parts: its URI, KiteQ's paths, and which ephemeral nodes to change."""

from __future__ import annotations

import pytest

from kiteq.errors import RegistryError
from kiteq.registry.zk.ephemerals import Plan, plan
from kiteq.registry.zk.tree import bind_path, node_name, producer_path, server_path
from kiteq.registry.zk.uri import parse_zk_uri

ROOT = "/chroot/kiteq"
SESSION = 0x100
OTHER = 0x200
A, B, C = f"{ROOT}/server/t/a:1", f"{ROOT}/server/t/b:1", f"{ROOT}/server/t/c:1"


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("zk://h", ("h:2181", "", {})),
        ("zk://a:1,b/x/y?session_timeout=3", ("a:1,b:2181", "/x/y", {"session_timeout": 3.0})),
        ("zk://h:2182/x/", ("h:2182", "/x", {})),
        ("zk://[::1]:2183,[::2]", ("[::1]:2183,[::2]:2181", "", {})),
        ("zk://h?connect_timeout=1&connect_timeout=2.5", ("h:2181", "", {"connect_timeout": 2.5})),
    ],
)
def test_uri_parsing(uri: str, parsed: tuple[str, str, dict[str, float]]) -> None:
    assert parse_zk_uri(uri) == parsed


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("file:///x", "bad ZooKeeper URI"),
        ("zk://", "bad ZooKeeper URI"),
        ("zk://h:0", "bad ZooKeeper address"),
        ("zk://h:65536", "bad ZooKeeper address"),
        ("zk://h:p", "bad ZooKeeper address"),
        ("zk://h/a//b", "bad ZooKeeper chroot"),
        ("zk://h?foo=1", "unknown option 'foo'"),
        ("zk://h?session_timeout=soon", "must be a number of seconds"),
        ("zk://h?session_timeout=-1", "must be positive"),
    ],
)
def test_uri_refusals(uri: str, error: str) -> None:
    with pytest.raises(RegistryError, match=error):
        parse_zk_uri(uri)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (server_path(ROOT, "trade", "10.0.0.1:13800"), "/chroot/kiteq/server/trade/10.0.0.1:13800"),
        (producer_path(ROOT, "trade", "sms", "10.0.0.1:5"), "/chroot/kiteq/pub/trade/sms/10.0.0.1:5"),
        (bind_path(ROOT, "trade", "sms"), "/chroot/kiteq/sub/trade/sms-bind"),
        (bind_path("/kiteq", "trade", "sms"), "/kiteq/sub/trade/sms-bind"),
    ],
)
def test_paths_are_kiteqs(path: str, expected: str) -> None:
    assert path == expected


@pytest.mark.parametrize("value", ["", "a/b", ".", ".."])
def test_a_name_is_one_path_component(value: str) -> None:
    with pytest.raises(RegistryError, match="invalid topic"):
        node_name("topic", value)


@pytest.mark.parametrize(
    ("wanted", "withdrawn", "owners", "expected"),
    [
        # Nothing in ZooKeeper yet: create every wanted node, in order.
        ({B, A}, set(), {}, Plan(delete=[], create=[A, B])),
        # Already ours: nothing to do.
        ({A}, set(), {A: SESSION}, Plan(delete=[], create=[])),
        # Left by another session (our previous run): replace it.
        ({A}, set(), {A: OTHER}, Plan(delete=[A], create=[A])),
        # A persistent node in the way (owner 0) is replaced too.
        ({A}, set(), {A: 0}, Plan(delete=[A], create=[A])),
        # Withdrawn and ours: delete; withdrawn but another's or gone: leave it.
        (set(), {A, B, C}, {A: SESSION, B: OTHER}, Plan(delete=[A], create=[])),
        # After a lost session: everything wanted is gone, every withdrawn one too.
        ({A, B}, {C}, {}, Plan(delete=[], create=[A, B])),
        # Withdrawals first, then the nodes to replace.
        ({B}, {A}, {A: SESSION, B: OTHER}, Plan(delete=[A, B], create=[B])),
    ],
)
def test_reconcile_plan(
    wanted: set[str], withdrawn: set[str], owners: dict[str, int], expected: Plan
) -> None:
    assert plan(wanted, withdrawn, owners, SESSION) == expected


def test_without_a_session_nothing_is_ours() -> None:
    assert plan({A}, {B}, {A: SESSION, B: SESSION}, None) == Plan(delete=[A], create=[A])


def test_a_node_of_ours_with_stale_data_is_replaced() -> None:
    # A (ours) was registered again with other data; B (ours) was not; C is withdrawn.
    assert plan({A, B}, {C}, {A: SESSION, B: SESSION, C: SESSION}, SESSION, stale={A}) == Plan(
        delete=[C, A], create=[A]
    )
    # Stale but gone (a lost session): created, nothing to delete.
    assert plan({A}, set(), {}, SESSION, stale={A}) == Plan(delete=[], create=[A])
