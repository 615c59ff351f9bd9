"""The file registry: the same interface as ZooKeeper's, in one JSON file, watched by polling."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from kiteq.errors import RegistryError
from kiteq.registry import Binding, BindingError, open_registry
from kiteq.registry.file import FileRegistry, FileRegistryOptions, RegistryMissing
from kiteq.registry.file_tree import MAX_PRODUCERS, Tree, prune


def file_registry(path: Path) -> FileRegistry:
    return file_registry_at(f"file://{path}?poll=0.05")


def file_registry_at(uri: str) -> FileRegistry:
    registry = open_registry(uri)
    assert isinstance(registry, FileRegistry)
    return registry


async def wait_for(values: list[Any], expected: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not values or values[-1] != expected:
            await trio.sleep(0.02)


async def test_servers_producers_and_bindings(tmp_path: Path) -> None:
    async with file_registry(tmp_path / "registry.json") as registry:
        await registry.register_server("h1:1", ["trade", "order"])
        await registry.register_server("h1:1", ["trade"])
        await registry.register_server("h2:1", ["trade"])
        assert await registry.list_servers() == {"trade": ["h1:1", "h2:1"]}
        await registry.unregister_server("h1:1")
        assert await registry.list_servers("trade") == {"trade": ["h2:1"]}
        await registry.register_producer("p:1", "order-svc", ["trade"])
        assert await registry.list_producers() == {"trade": {"order-svc": ["p:1"]}}

        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms"))
        with pytest.raises(BindingError):
            await registry.add_binding(Binding.fanout("trade", group="sms"))
        await registry.put_bindings("mail", "trade", [Binding.fanout("trade")])
        assert [b.key for b in await registry.list_bindings("trade")] == [
            ("mail", "trade", "*"),
            ("sms", "trade", "pay-succ"),
        ]
        assert await registry.remove_binding("sms", "trade", "nope") == 0
        assert await registry.remove_binding("sms", "trade") == 1
        assert await registry.list_bindings(group="sms") == []


async def test_watches_poll_for_changes_made_by_others(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    bindings: list[list[Binding]] = []
    servers: list[list[str]] = []
    async with file_registry(path) as watcher, file_registry(path) as writer, trio.open_nursery() as nursery:
        await nursery.start(watcher.watch_bindings, bindings.append)
        await nursery.start(watcher.watch_servers, "trade", servers.append)
        assert bindings == [[]] and servers == [[]]

        binding = Binding.direct("trade", "pay-succ", group="sms")
        await writer.add_binding(binding)
        await wait_for(bindings, [binding])
        await writer.register_server("h1:1", ["trade"])
        await wait_for(servers, ["h1:1"])

        # A broken hand edit keeps the last good value; fixing it is seen.
        good = path.read_text()
        path.write_text("{ not json")
        await trio.sleep(0.2)
        assert bindings[-1] == [binding]
        path.write_text(good)
        await writer.remove_binding("sms", "trade")
        await wait_for(bindings, [])
        nursery.cancel_scope.cancel()


async def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    async with file_registry(path) as one, file_registry(path) as two:
        async with trio.open_nursery() as nursery:
            for i in range(15):
                nursery.start_soon(one.add_binding, Binding.direct("trade", f"a{i}", group="g"))
                nursery.start_soon(two.add_binding, Binding.direct("trade", f"b{i}", group="g"))
                nursery.start_soon(two.register_server, f"h{i}:1", ["trade"])
        async with file_registry(path) as registry:
            assert len(await registry.list_bindings("trade", "g")) == 30
            assert len((await registry.list_servers())["trade"]) == 15


async def test_a_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    for content in ("{ not json", "[1, 2]"):
        path.write_text(content)
        with pytest.raises(RegistryError, match="registry file"):
            await file_registry(path).start()


async def test_producers_are_withdrawn_on_close_and_bounded_per_group(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    async with file_registry(path) as closing:
        await closing.register_producer("clean:1", "order-svc", ["trade"])
        await closing.register_server("b:1", ["trade"])
    async with file_registry(path) as registry:
        assert await registry.list_producers() == {}, "a closed producer withdrew"
        assert await registry.list_servers() == {}, "so did a closed broker"
        assert json.loads(path.read_text())["heartbeats"] == {}
        killed = [f"killed:{i}" for i in range(MAX_PRODUCERS + 10)]  # registered, never closed
        for address in killed:
            await registry.register_producer(address, "order-svc", ["trade"])
        assert (await registry.list_producers())["trade"]["order-svc"] == killed[-MAX_PRODUCERS:]


class Clock:
    """Wall-clock seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_entries_that_stop_heartbeating_expire_and_are_pruned(tmp_path: Path) -> None:
    path, clock = tmp_path / "registry.json", Clock()
    options = FileRegistryOptions(ttl=30.0)
    async with (
        FileRegistry(path, options, clock=clock) as writer,
        FileRegistry(path, options, clock=clock) as reader,
    ):
        await writer.register_server("b:1", ["trade"])
        await writer.register_producer("p:1", "order-svc", ["trade"])
        clock.now += 29.9
        assert await reader.list_servers() == {"trade": ["b:1"]}
        assert await reader.list_producers() == {"trade": {"order-svc": ["p:1"]}}
        clock.now += 0.1  # one TTL without a heartbeat
        assert await reader.list_servers() == {} and await reader.list_producers() == {}
        assert "p:1" in path.read_text(), "readers only ignore expired entries"
        await reader.add_binding(Binding.fanout("trade", group="sms"))  # any write prunes
        tree = json.loads(path.read_text())
        assert (tree["servers"], tree["producers"], tree["heartbeats"]) == ({}, {}, {})
        assert len(tree["bindings"]["trade"]["sms"]) == 1


def in_file(path: Path) -> Tree:
    return cast(Tree, json.loads(path.read_text()))


async def heartbeat_written(path: Path, address: str, at: float) -> None:
    """Wait until the file holds `address`'s heartbeat written at `at`.

    On Trio's autojump clock the keep-alive's sleeps pass at once, and so may any
    timeout on that clock while a thread writes the file: the bound is real time.
    """
    deadline = time.monotonic() + 10
    while in_file(path)["heartbeats"].get(address) != at:
        assert time.monotonic() < deadline, f"no heartbeat of {address} at {at}"
        await trio.sleep(1.0)


async def test_a_live_registry_keeps_its_entries_by_heartbeating(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    path, clock = tmp_path / "registry.json", Clock()
    options = FileRegistryOptions(ttl=30.0)
    assert options.refresh == 10.0
    async with (
        FileRegistry(path, options, clock=clock) as live,
        FileRegistry(path, options, clock=clock) as reader,
    ):
        await live.register_producer("p:1", "order-svc", ["trade"])
        for _ in range(5):  # 5 TTLs of wall-clock time, a heartbeat interval at a time
            clock.now += options.refresh
            await heartbeat_written(path, "p:1", clock.now)
            assert await reader.list_producers() == {"trade": {"order-svc": ["p:1"]}}
        # An entry that expired while the process could not write comes back with its next heartbeat.
        clock.now += 10 * options.ttl
        assert prune(in_file(path), clock.now, options.ttl)["producers"] == {}  # no await: no heartbeat yet
        await heartbeat_written(path, "p:1", clock.now)
        assert await reader.list_producers() == {"trade": {"order-svc": ["p:1"]}}


@pytest.mark.parametrize(
    ("query", "poll", "ttl"),
    [("", 0.5, 30.0), ("?poll=0.05", 0.05, 30.0), ("?ttl=3&poll=1", 1.0, 3.0)],
)
def test_uri_options(tmp_path: Path, query: str, poll: float, ttl: float) -> None:
    registry = file_registry_at(f"file://{tmp_path}/r.json{query}")
    assert (registry.options.poll, registry.options.ttl, registry.options.refresh) == (poll, ttl, ttl / 3)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?ttl=0", "ttl='0' must be positive"),
        ("?ttl=-1", "ttl='-1' must be positive"),
        ("?poll=soon", "poll='soon' is not a number of seconds"),
        ("?tll=30", "unknown option(s) tll; known: poll, ttl"),
    ],
)
def test_bad_uri_options_are_named(tmp_path: Path, query: str, message: str) -> None:
    with pytest.raises(RegistryError, match=re.escape(message)):
        file_registry_at(f"file://{tmp_path}/r.json{query}")


async def test_without_create_a_missing_file_is_an_error_and_nothing_is_made(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "registry.jsn"
    with pytest.raises(RegistryMissing, match=f"registry file {path} does not exist"):
        await FileRegistry(path, create=False).start()
    assert not (tmp_path / "missing").exists()
    async with FileRegistry(path) as created:  # create=True, what brokers and clients use
        await created.add_binding(Binding.fanout("t", group="g"))
    async with FileRegistry(path, create=False) as existing:
        assert len(await existing.list_bindings()) == 1


async def test_admin_endpoints_are_listed_kept_alive_expire_and_are_withdrawn_on_close(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    path, clock = tmp_path / "registry.json", Clock()
    options = FileRegistryOptions(ttl=30.0)
    async with FileRegistry(path, options, clock=clock) as reader:
        async with FileRegistry(path, options, clock=clock) as broker:
            await broker.register_server("b:1", ["trade"])
            await broker.register_admin("b:1", "http://b:2")
            await broker.register_admin("c:1", "https://c:2")  # a broker serving no topic yet
            assert await reader.list_admins() == {"b:1": "http://b:2", "c:1": "https://c:2"}
            await broker.unregister_server("b:1")  # its topics go; its admin endpoint stays live
            assert await reader.list_servers() == {}
            assert await reader.list_admins() == {"b:1": "http://b:2", "c:1": "https://c:2"}
            clock.now += 10 * options.ttl  # no heartbeat for a while: gone with the broker
            assert prune(in_file(path), clock.now, options.ttl)["admins"] == {}  # no await: no heartbeat yet
            await heartbeat_written(path, "b:1", clock.now)  # the keep-alive puts them back
            assert await reader.list_admins() == {"b:1": "http://b:2", "c:1": "https://c:2"}
        assert await reader.list_admins() == {}, "withdrawn on close"
        assert in_file(path)["admins"] == {} and in_file(path)["heartbeats"] == {}
