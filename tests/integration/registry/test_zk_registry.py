"""The ZooKeeper registry against a real ZooKeeper: tree, admin endpoints, watches, outages, sessions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from kazoo.client import KazooClient

from kiteq.errors import RegistryError
from kiteq.registry import Binding, BindingError, open_registry
from kiteq.registry.zk import ZooKeeperRegistry, ZooKeeperUnavailable, parse_zk_uri
from protocol import BindType
from tests.services.ports import free_port
from tests.services.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

BROKER_A = "10.0.0.1:13800"
BROKER_B = "10.0.0.2:13800"
URL_A = "http://10.0.0.1:13801"
URL_B = "https://10.0.0.2:13801"


def zk_registry(uri: str) -> ZooKeeperRegistry:
    registry = open_registry(uri)
    assert isinstance(registry, ZooKeeperRegistry)
    return registry


@pytest.fixture
def raw(zk_uri: str) -> Iterator[tuple[KazooClient, str]]:
    """A plain kazoo client on the server (no chroot) and the test's /chroot/kiteq root."""
    hosts, chroot, _ = parse_zk_uri(zk_uri)
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        yield client, f"{chroot}/kiteq"
    finally:
        client.stop()
        client.close()


async def eventually(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll until `check()` is truthy (async checks are awaited)."""
    with trio.fail_after(timeout):
        while True:
            result = check()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            await trio.sleep(0.05)


class Recorder:
    """Collects every value a watch hands over."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __call__(self, value: Any) -> None:
        self.values.append(value)

    @property
    def last(self) -> Any:
        return self.values[-1]


def keys(bindings: list[Binding]) -> set[tuple[str, str, str]]:
    return {b.key for b in bindings}


# -- start ---------------------------------------------------------------------------------


async def test_start_fails_clearly_when_zookeeper_is_unreachable() -> None:
    registry = zk_registry(f"zk://127.0.0.1:{free_port()}?connect_timeout=1")
    with pytest.raises(ZooKeeperUnavailable, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:\d+ within 1 s"):
        await registry.start()
    assert not registry.connected


# -- servers and producers ------------------------------------------------------------------


async def test_servers_and_producers_are_listed(zk_uri: str) -> None:
    async with zk_registry(zk_uri) as registry:
        assert registry.connected and registry.state == "CONNECTED"
        await registry.register_server(BROKER_A, ["trade", "order"])
        await registry.register_server(BROKER_B, ["trade"])
        assert await registry.list_servers() == {"order": [BROKER_A], "trade": [BROKER_A, BROKER_B]}
        await registry.register_server(BROKER_A, ["trade"])  # re-register replaces the set
        assert await registry.list_servers() == {"trade": [BROKER_A, BROKER_B]}
        assert await registry.list_servers("trade") == {"trade": [BROKER_A, BROKER_B]}
        assert await registry.list_servers("nothing") == {}
        await registry.unregister_server(BROKER_B)
        assert await registry.list_servers() == {"trade": [BROKER_A]}

        await registry.register_producer("10.0.0.9:0", "order-svc", ["trade", "order"])
        await registry.register_producer("10.0.0.8:0", "order-svc", ["trade"])
        assert await registry.list_producers() == {
            "order": {"order-svc": ["10.0.0.9:0"]},
            "trade": {"order-svc": ["10.0.0.8:0", "10.0.0.9:0"]},
        }
        with pytest.raises(RegistryError, match="invalid topic"):
            await registry.register_server(BROKER_A, ["a/b"])


async def test_ephemeral_nodes_vanish_when_the_registry_closes(
    zk_uri: str, raw: tuple[KazooClient, str]
) -> None:
    client, root = raw
    async with zk_registry(zk_uri) as observer:
        broker = zk_registry(zk_uri)
        async with broker:
            await broker.register_server(BROKER_A, ["trade"])
            await broker.register_producer("10.0.0.9:0", "order-svc", ["trade"])
            stat = client.exists(f"{root}/server/trade/{BROKER_A}")
            assert stat is not None and stat.ephemeralOwner == broker.client_id[0]  # type: ignore[index]
            assert await observer.list_servers() == {"trade": [BROKER_A]}
        assert await observer.list_servers() == {}
        await broker.unregister_server(BROKER_A)  # after close: nothing left to do, no error
        assert not broker.connected and broker.state == "CLOSED"
        assert await observer.list_producers() == {}
        assert client.exists(f"{root}/server/trade") is not None  # intermediate nodes stay (persistent)


async def test_admin_endpoints_are_ephemeral_nodes_holding_their_url(
    zk_uri: str, raw: tuple[KazooClient, str]
) -> None:
    client, root = raw
    async with zk_registry(zk_uri) as observer:
        broker = zk_registry(zk_uri)
        async with broker:
            await broker.register_server(BROKER_A, ["trade"])
            await broker.register_admin(BROKER_A, "http://old:1")
            await broker.register_admin(BROKER_A, URL_A)  # registered again: the node holds the new URL
            await broker.register_admin(BROKER_B, URL_B)  # a broker that serves no topic yet
            data, stat = client.get(f"{root}/admin/{BROKER_A}")
            assert data == URL_A.encode() and stat.ephemeralOwner == broker.client_id[0]  # type: ignore[index]
            assert await observer.list_admins() == {BROKER_A: URL_A, BROKER_B: URL_B}
            await broker.unregister_server(BROKER_A)  # its topics go; its admin endpoint goes on close
            assert await observer.list_servers() == {}
            assert await observer.list_admins() == {BROKER_A: URL_A, BROKER_B: URL_B}
        assert await observer.list_admins() == {}, "withdrawn on close"
        assert client.get_children(f"{root}/admin") == []


# -- bindings ------------------------------------------------------------------------


async def test_binding_json_is_kiteqs_format_field_for_field(
    zk_uri: str, raw: tuple[KazooClient, str]
) -> None:
    client, root = raw
    async with zk_registry(zk_uri) as registry:
        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms-svc"))
        await registry.add_binding(
            Binding.regex("trade", "refund-.*", group="sms-svc", watermark=50, persistent=False)
        )
        data, stat = client.get(f"{root}/sub/trade/sms-svc-bind")
        assert stat.ephemeralOwner == 0  # persistent
        assert json.loads(data) == [
            {"groupId": "sms-svc", "topic": "trade", "messageType": "pay-succ", "bindType": 0,
             "version": "1.0.0", "watermark": 1000, "persistent": True},
            {"groupId": "sms-svc", "topic": "trade", "messageType": "refund-.*", "bindType": 1,
             "version": "1.0.0", "watermark": 50, "persistent": False},
        ]  # fmt: skip
        assert list(json.loads(data)[0]) == [
            "groupId", "topic", "messageType", "bindType", "version", "watermark", "persistent"
        ]  # fmt: skip

        # A node written by KiteQ (Go) reads back as the same bindings.
        go_written = b'[{"groupId":"mail","topic":"trade","messageType":"*","bindType":2,"version":"1.0.0",' \
                     b'"watermark":1000,"persistent":true}]'  # fmt: skip
        client.create(f"{root}/sub/trade/mail-bind", go_written)
        assert await registry.list_bindings(group="mail") == [Binding.fanout("trade", group="mail")]


async def test_add_rejects_conflicts_and_replaces_same_key(zk_uri: str) -> None:
    async with zk_registry(zk_uri) as registry:
        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms"))
        with pytest.raises(BindingError, match="overlaps 'pay-succ'"):
            await registry.add_binding(Binding.regex("trade", "pay-.*", group="sms"))
        with pytest.raises(BindingError):
            await registry.add_binding(Binding.fanout("trade", group="sms"))
        await registry.add_binding(Binding.regex("trade", "pay-.*", group="other"))  # another group: fine
        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms", watermark=7))  # replace
        assert await registry.list_bindings(group="sms") == [
            Binding.direct("trade", "pay-succ", group="sms", watermark=7)
        ]


async def test_concurrent_adds_lose_nothing(zk_uri: str) -> None:
    async with zk_registry(zk_uri) as one, zk_registry(zk_uri) as two, trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one.add_binding, Binding.direct("trade", f"a{i}", group="g"))
            nursery.start_soon(two.add_binding, Binding.direct("trade", f"b{i}", group="g"))
    async with zk_registry(zk_uri) as registry:
        assert len(await registry.list_bindings("trade", "g")) == 20


async def test_remove_and_put_bindings(zk_uri: str, raw: tuple[KazooClient, str]) -> None:
    client, root = raw
    async with zk_registry(zk_uri) as registry:
        await registry.put_bindings(
            "sms",
            "trade",
            [Binding.direct("trade", "a"), Binding.direct("trade", "b"), Binding.direct("trade", "c")],
        )
        assert [b.group for b in await registry.list_bindings()] == ["sms"] * 3
        assert await registry.remove_binding("sms", "trade", "a") == 1
        assert await registry.remove_binding("sms", "trade", "a") == 0
        assert await registry.remove_binding("nobody", "trade") == 0
        assert await registry.remove_binding("sms", "trade") == 2
        assert client.exists(f"{root}/sub/trade/sms-bind") is None  # the empty node is deleted
        with pytest.raises(BindingError):
            await registry.put_bindings(
                "sms", "trade", [Binding.fanout("trade"), Binding.direct("trade", "a")]
            )


# -- watches ------------------------------------------------------------------------------


async def test_watch_bindings_sees_every_change(zk_uri: str, raw: tuple[KazooClient, str]) -> None:
    client, root = raw
    seen = Recorder()
    async with zk_registry(zk_uri) as registry, trio.open_nursery() as nursery:
        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms"))
        await nursery.start(registry.watch_bindings, seen)
        assert keys(seen.values[0]) == {("sms", "trade", "pay-succ")}  # the value at start

        await registry.add_binding(Binding.fanout("order", group="audit"))  # new topic, new group
        await eventually(lambda: keys(seen.last) == {("sms", "trade", "pay-succ"), ("audit", "order", "*")})
        await registry.add_binding(
            Binding.direct("trade", "pay-succ", group="sms", watermark=9)
        )  # data change
        await eventually(lambda: {b.watermark for b in seen.last if b.group == "sms"} == {9})
        await registry.remove_binding("sms", "trade", "pay-succ")
        await eventually(lambda: keys(seen.last) == {("audit", "order", "*")})

        # Deleting one group's node must not drop the other groups' bindings (KiteQ's bug).
        await registry.add_binding(Binding.direct("order", "created", group="sms"))
        await eventually(lambda: len(seen.last) == 2)
        count = len(seen.values)
        client.delete(f"{root}/sub/order/sms-bind")
        await eventually(lambda: keys(seen.last) == {("audit", "order", "*")})
        assert all(("audit", "order", "*") in keys(value) for value in seen.values[count:])
        nursery.cancel_scope.cancel()


async def test_watch_servers_sees_brokers_come_and_go(zk_uri: str) -> None:
    seen = Recorder()
    async with zk_registry(zk_uri) as client_side, trio.open_nursery() as nursery:
        await nursery.start(client_side.watch_servers, "trade", seen)
        assert seen.values == [[]]
        async with zk_registry(zk_uri) as broker_a, zk_registry(zk_uri) as broker_b:
            await broker_a.register_server(BROKER_A, ["trade"])
            await broker_b.register_server(BROKER_B, ["order"])
            await eventually(lambda: seen.last == [BROKER_A])
            await broker_b.register_server(BROKER_B, ["order", "trade"])
            await eventually(lambda: seen.last == [BROKER_A, BROKER_B])
            await broker_a.close()
            await eventually(lambda: seen.last == [BROKER_B])
        await eventually(lambda: seen.last == [])
        nursery.cancel_scope.cancel()


# -- outages and sessions -------------------------------------------------------------------


async def test_zookeeper_outage(zookeeper: ZooKeeperServer, zk_uri: str) -> None:
    """ZooKeeper away for a few seconds: cached values, quiet watches, everything back after."""
    seen = Recorder()
    async with zk_registry(zk_uri) as registry, trio.open_nursery() as nursery:
        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms"))
        await registry.register_server(BROKER_A, ["trade"])
        await nursery.start(registry.watch_bindings, seen)
        cached = await registry.list_bindings()
        assert await registry.list_servers() == {"trade": [BROKER_A]}

        bystander = zk_registry(zk_uri)
        await bystander.start()
        await trio.to_thread.run_sync(zookeeper.stop)
        try:
            with trio.fail_after(5):  # closing while ZooKeeper is away does not hang
                await bystander.close()
            await eventually(lambda: not registry.connected, what="disconnect noticed")
            assert registry.state == "SUSPENDED"
            with trio.fail_after(1):  # answered from the cache, without waiting for ZooKeeper
                assert await registry.list_bindings() == cached
                assert await registry.list_servers() == {"trade": [BROKER_A]}
            await registry.register_producer("10.0.0.9:0", "order-svc", ["trade"])  # deferred, not an error
            with pytest.raises(ZooKeeperUnavailable):
                await registry.add_binding(Binding.direct("trade", "other", group="sms"))
            await trio.sleep(1)
            assert len(seen.values) == 1  # quiet while away
        finally:
            await trio.to_thread.run_sync(zookeeper.start)

        await eventually(lambda: registry.connected, what="reconnect")
        async with zk_registry(zk_uri) as other:
            await other.add_binding(Binding.fanout("order", group="audit"))
            await eventually(lambda: ("audit", "order", "*") in keys(seen.last), what="watch re-armed")
            await eventually(other.list_producers, what="deferred producer registered")
            assert await other.list_producers() == {"trade": {"order-svc": ["10.0.0.9:0"]}}
        nursery.cancel_scope.cancel()


async def test_session_expiry_recreates_ephemeral_nodes(zookeeper: ZooKeeperServer, zk_uri: str) -> None:
    seen = Recorder()
    async with (
        zk_registry(zk_uri) as registry,
        zk_registry(zk_uri) as observer,
        trio.open_nursery() as nursery,
    ):
        await registry.register_server(BROKER_A, ["trade", "order"])
        await registry.register_producer("10.0.0.9:0", "order-svc", ["trade"])
        await registry.register_admin(BROKER_A, URL_A)
        await nursery.start(registry.watch_bindings, seen)
        old_session = registry.client_id
        assert old_session is not None

        def expire() -> None:
            """Close the session from another client that shares it: ZooKeeper expires it."""
            thief = KazooClient(hosts=zookeeper.address, client_id=old_session)
            thief.start(timeout=10)
            thief.stop()
            thief.close()

        await trio.to_thread.run_sync(expire)
        await eventually(
            lambda: registry.client_id is not None and registry.client_id[0] != old_session[0],
            what="new session",
        )
        await eventually(lambda: registry.connected)
        await eventually(
            lambda: _both_listed(observer), what="ephemeral nodes re-created under the new session"
        )
        await observer.add_binding(Binding.direct("trade", "pay-succ", group="sms"))
        await eventually(lambda: keys(seen.last) == {("sms", "trade", "pay-succ")}, what="watch re-armed")
        nursery.cancel_scope.cancel()


async def _both_listed(observer: ZooKeeperRegistry) -> bool:
    return (
        await observer.list_servers() == {"order": [BROKER_A], "trade": [BROKER_A]}
        and await observer.list_producers() == {"trade": {"order-svc": ["10.0.0.9:0"]}}
        and await observer.list_admins() == {BROKER_A: URL_A}
    )


async def test_binding_types_round_trip(zk_uri: str) -> None:
    async with zk_registry(zk_uri) as registry:
        for binding in (
            Binding.direct("t", "a", group="g1", watermark=3, persistent=False),
            Binding.regex("t", "b.*", group="g2"),
            Binding.fanout("t", group="g3"),
        ):
            await registry.add_binding(binding)
        found = await registry.list_bindings("t")
        assert [b.bind_type for b in found] == [BindType.DIRECT, BindType.REGEX, BindType.FANOUT]
        assert found[0].watermark == 3 and not found[0].persistent
