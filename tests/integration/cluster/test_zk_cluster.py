"""Broker clusters against a real ZooKeeper (issue 6).

Two brokers, each with its own store, share one registry: clients find both through
`/kiteq/server/{topic}`, bindings written by consumers or by `kiteq-admin` reach both
live, a killed broker drops out (and loses nothing it acked), a ZooKeeper outage does
not stop traffic, and an expired session re-creates the broker's ephemeral node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import trio
from kazoo.client import KazooClient

from kiteq import Binding, Consumer, Message, Producer
from kiteq.errors import SendError
from kiteq.registry import Registry, open_registry
from kiteq.registry.zk import ZooKeeperRegistry, parse_zk_uri
from kiteq.server.broker import Broker
from tests.faults.report import duplicates, record
from tests.helpers import RecordingListener, broker_config, wait_until
from tests.integration.cluster.harness import ROOT, TOPIC, send_batch, start_broker_process
from tests.services.ports import free_port, stop_process, wait_for_port
from tests.services.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

OUTAGE = 20.0  # how long ZooKeeper stays down while traffic flows (issue 6)
KILLED_SESSION_TIMEOUT = 3.0  # the killed broker's session: its node must go within this
EXPIRY_SLACK = 4.0  # ZooKeeper's expiry runs on its tick; allow a noisy machine some room
CLIENTS = ("sms", "mail")


# -- harness ---------------------------------------------------------------------------


def store_uri(tmp_path: Path, name: str) -> str:
    """Each broker's own store: the file store, or memory:// where it is not importable yet."""
    try:
        import stores.file  # noqa: F401
    except ImportError:
        return "memory://"
    return f"file://{tmp_path}/{name}"


@contextlib.asynccontextmanager
async def in_process_brokers(
    tmp_path: Path, zk_uri: str, *stores: str, topics: tuple[str, ...] = (TOPIC,)
) -> AsyncIterator[list[Broker]]:
    """One in-process broker per store name, all registered in `zk_uri`.

    They serve `topics` plus every topic that has a binding (with `topics=()`, only those).
    """
    started: list[Broker] = []
    async with trio.open_nursery() as nursery:
        for name in stores:
            config = broker_config(
                tmp_path,
                store=store_uri(tmp_path, name),
                server={"registry": zk_uri, "topics": list(topics), "admin_bind": ""},
                delivery={"recover_interval": 0.1, "retry_base": 0.1},
            )
            broker = Broker(config)
            await nursery.start(broker.run)
            started.append(broker)
        yield started
        for broker in started:
            broker.stop()


async def admin(zk_uri: str, *args: str) -> None:
    """Run `kiteq-admin --registry zk_uri ARGS…` as a user would; it must succeed."""
    result = await trio.run_process(
        [sys.executable, "-m", "kiteq.cli.admin", "--registry", zk_uri, *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, f"kiteq-admin {' '.join(args)}: {result.stderr.decode()}"


async def poll(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """`wait_until` for async checks."""
    with trio.move_on_after(timeout):
        while not await check():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def routes(broker: Broker, group: str, message_type: str) -> bool:
    return broker.router.binding_for(group, TOPIC, message_type) is not None


def stored(broker: Broker) -> int:
    return broker.events.counts[("stored", TOPIC, "")]


async def settled(cluster: list[Broker]) -> bool:
    """No delivery round in flight and nothing unfinished in any store."""
    for broker in cluster:
        if broker.dispatcher.rounds or (await broker.store.stats()).messages:
            return False
    return True


async def servers_without(registry: Registry, address: str) -> bool:
    """True once `address` no longer serves TOPIC in the registry."""
    return address not in (await registry.list_servers(TOPIC)).get(TOPIC, [])


def node_owners(zk_uri: str) -> dict[str, int]:
    """Broker address -> session id owning its /kiteq/server/TOPIC node (blocking; run in a thread)."""
    hosts, chroot, _ = parse_zk_uri(zk_uri)
    base = f"{chroot}/kiteq/server/{TOPIC}"
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        owners = {}
        for child in client.get_children(base) if client.exists(base) else []:
            stat = client.exists(f"{base}/{child}")
            if stat is not None:
                owners[child] = stat.ephemeralOwner
        return owners
    finally:
        client.stop()
        client.close()


def expire_session(zk_uri: str, client_id: tuple[int, bytes]) -> None:
    """Force a session to expire: join it from a second client, then close that one."""
    hosts, _, _ = parse_zk_uri(zk_uri)
    intruder = KazooClient(hosts=hosts, client_id=client_id)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


def session_of(broker: Broker) -> int:
    assert isinstance(broker.registry, ZooKeeperRegistry)
    client_id = broker.registry.client_id
    assert client_id is not None
    return client_id[0]


class Traffic:
    """One sender: message after message, each resent (same id) until a broker stores it."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.acked: set[str] = set()
        self.failures = 0
        self.stop = trio.Event()

    async def run(self) -> None:
        while not self.stop.is_set():
            message = Message(TOPIC, "x", b"traffic")
            while True:
                try:
                    await self.producer.send(message)
                    break
                except SendError:
                    self.failures += 1
                    await trio.sleep(0.05)
            self.acked.add(message.message_id)
            await trio.sleep(0.005)


# -- 1. two brokers, two groups, bindings from kiteq-admin --------------------------------


async def test_two_brokers_reach_every_group_and_follow_admin_bindings(tmp_path: Path, zk_uri: str) -> None:
    """Sends spread over both brokers reach both bound groups; `kiteq-admin bindings add`
    starts deliveries to a connected group live, and `bindings remove` stops them."""
    listeners = {group: RecordingListener() for group in (*CLIENTS, "late")}
    async with (
        # No configured topics: the brokers register for TOPIC when the consumers bind it.
        in_process_brokers(tmp_path, zk_uri, "store1", "store2", topics=()) as cluster,
        Consumer(
            zk_uri, group="sms", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["sms"]
        ) as sms,
        Consumer(
            zk_uri, group="mail", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["mail"]
        ) as mail,
        # Connected from the start, but bound (by itself) only to another messageType.
        Consumer(
            zk_uri, group="late", bindings=[Binding.direct(TOPIC, "other")], listener=listeners["late"]
        ) as late,
        Producer(zk_uri, group="p", topics=[TOPIC]) as producer,
    ):
        await wait_until(
            lambda: all(len(c.pool.live(TOPIC)) == 2 for c in (sms, mail, late, producer)),
            timeout=20,
            what="every client connected to both brokers",
        )
        await wait_until(
            lambda: all(
                routes(b, "sms", "x") and routes(b, "mail", "x") and routes(b, "late", "other")
                for b in cluster
            ),
            timeout=20,
            what="both brokers applying the consumers' bindings",
        )

        first = await send_batch(producer, "x", 60)
        await wait_until(
            lambda: all(listeners[g].acked_ids >= first for g in CLIENTS),
            timeout=30,
            what="the first batch at both groups",
        )
        assert all(stored(b) > 0 for b in cluster), "the producer spreads sends over both brokers"
        assert sum(stored(b) for b in cluster) == len(first)
        assert not listeners["late"].deliveries
        await poll(lambda: settled(cluster), timeout=20, what="the first batch finished on both brokers")

        await admin(zk_uri, "bindings", "add", "--group", "late", "--topic", TOPIC, "--direct", "x")
        await wait_until(
            lambda: all(routes(b, "late", "x") for b in cluster),
            timeout=20,
            what="both brokers applying the admin's binding",
        )
        second = await send_batch(producer, "x", 30)
        await wait_until(
            lambda: all(listeners[g].acked_ids >= second for g in (*CLIENTS, "late")),
            timeout=30,
            what="the second batch at all three groups",
        )
        assert not listeners["late"].acked_ids & first, "a new binding takes only new messages"
        await poll(lambda: settled(cluster), timeout=20, what="the second batch finished on both brokers")

        await admin(zk_uri, "bindings", "remove", "--group", "late", "--topic", TOPIC, "--type", "x")
        await wait_until(
            lambda: not any(routes(b, "late", "x") for b in cluster),
            timeout=20,
            what="both brokers dropping the removed binding",
        )
        third = await send_batch(producer, "x", 30)
        await wait_until(
            lambda: all(listeners[g].acked_ids >= third for g in CLIENTS),
            timeout=30,
            what="the third batch at the groups still bound",
        )
        await poll(lambda: settled(cluster), timeout=20, what="the third batch finished without 'late'")
        assert not listeners["late"].acked_ids & third

        # 'late' is still connected and keeps its own binding.
        other = await send_batch(producer, "other", 5)
        await wait_until(lambda: listeners["late"].acked_ids >= other, timeout=20, what="'late' still served")


# -- 2. a broker killed -----------------------------------------------------------------


async def test_killed_broker_drops_out_and_loses_nothing_acked(tmp_path: Path, zk_uri: str) -> None:
    """SIGKILL one of two brokers under traffic: its node goes within the session timeout,
    sends move to the other broker, and after a restart on its file store every acked
    message reaches every group, including one that was offline all along."""
    pytest.importorskip("stores.file", reason="the restart needs a durable store")
    port = free_port()
    killed = f"127.0.0.1:{port}"
    store = f"file://{tmp_path}/store1"
    killed_registry = f"{zk_uri}?session_timeout={KILLED_SESSION_TIMEOUT:g}"
    listeners = {group: RecordingListener() for group in (*CLIENTS, "audit")}
    watcher: Registry = open_registry(zk_uri)
    proc = start_broker_process(tmp_path, port, store, killed_registry)
    try:
        async with watcher:
            # A persistent group with no consumer until the end: its copies stay in the stores.
            await watcher.put_bindings("audit", TOPIC, [Binding.direct(TOPIC, "x")])
            async with (
                in_process_brokers(tmp_path, zk_uri, "store2") as (survivor,),
                Consumer(
                    zk_uri, group="sms", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["sms"]
                ),
                Consumer(
                    zk_uri, group="mail", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["mail"]
                ),
                Producer(zk_uri, group="p", topics=[TOPIC], send_timeout=2.0) as producer,
            ):
                await wait_until(
                    lambda: len(producer.pool.live(TOPIC)) == 2,
                    timeout=30,
                    what="the producer on both brokers",
                )
                traffic = Traffic(producer)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(traffic.run)
                    await wait_until(
                        lambda: len(traffic.acked) - stored(survivor) >= 20,
                        timeout=30,
                        what="the doomed broker storing messages",
                    )

                    proc.send_signal(signal.SIGKILL)
                    killed_at = trio.current_time()
                    await trio.to_thread.run_sync(proc.wait)
                    await poll(
                        lambda: servers_without(watcher, killed),
                        timeout=KILLED_SESSION_TIMEOUT + 15,
                        what="the killed broker's node to disappear",
                    )
                    gone_after = trio.current_time() - killed_at
                    assert gone_after < KILLED_SESSION_TIMEOUT + EXPIRY_SLACK, (
                        f"node went after {gone_after:.1f} s"
                    )

                    await wait_until(
                        lambda: [c.address for c in producer.pool.live(TOPIC)] == [survivor.address],
                        timeout=10,
                        what="the producer dropping the killed broker",
                    )
                    failures, acked = traffic.failures, len(traffic.acked)
                    await wait_until(
                        lambda: len(traffic.acked) >= acked + 50,
                        timeout=30,
                        what="sends through the survivor",
                    )
                    assert traffic.failures == failures, "no send fails once the producer moved over"
                    traffic.stop.set()

                # Restart the killed broker on its store: every acked message reaches every group,
                # 'audit' included, whose copies on the killed broker exist only in its store.
                proc = start_broker_process(tmp_path, port, store, killed_registry)
                await trio.to_thread.run_sync(wait_for_port, port)
                async with Consumer(
                    zk_uri, group="audit", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["audit"]
                ):
                    await wait_until(
                        lambda: all(listeners[g].acked_ids >= traffic.acked for g in listeners),
                        timeout=60,
                        what="every acked message at every group after the restart",
                    )
    finally:
        stop_process(proc)


# -- 3. ZooKeeper away for a while ------------------------------------------------------------


async def test_zookeeper_outage_keeps_traffic_flowing(
    tmp_path: Path, zk_uri: str, zookeeper: ZooKeeperServer
) -> None:
    """ZooKeeper down for OUTAGE seconds: sends and deliveries go on over cached bindings
    and open connections; once it is back the brokers' nodes are there again and a new
    binding takes effect."""
    listeners = {group: RecordingListener() for group in ("sms", "late")}
    async with (
        in_process_brokers(tmp_path, zk_uri, "store1", "store2") as cluster,
        Consumer(
            zk_uri, group="sms", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["sms"]
        ) as sms,
        Consumer(
            zk_uri, group="late", bindings=[Binding.direct(TOPIC, "other")], listener=listeners["late"]
        ) as late,
        Producer(zk_uri, group="p", topics=[TOPIC]) as producer,
    ):
        await wait_until(
            lambda: all(len(c.pool.live(TOPIC)) == 2 for c in (sms, late, producer)),
            timeout=20,
            what="every client connected to both brokers",
        )
        await wait_until(
            lambda: all(routes(b, "sms", "x") for b in cluster), timeout=20, what="the brokers' bindings"
        )
        before = [stored(b) for b in cluster]
        try:
            zookeeper.stop()
            await wait_until(
                lambda: not any(b.registry.connected for b in cluster),
                timeout=20,
                what="the brokers noticing the outage",
            )
            sent: set[str] = set()
            end = trio.current_time() + OUTAGE
            while trio.current_time() < end:
                sent |= await send_batch(producer, "x", 5)
                await trio.sleep(0.25)
            await wait_until(
                lambda: listeners["sms"].acked_ids >= sent, timeout=20, what="deliveries during the outage"
            )
            sms = listeners["sms"]
            record(
                "ZooKeeper stop + start (20 s)",
                len(sent),
                len(sent - sms.acked_ids),
                duplicates(sms.deliveries),
            )
            assert not any(b.registry.connected for b in cluster), "ZooKeeper stayed away throughout"
            assert all(stored(b) > n for b, n in zip(cluster, before, strict=True)), "both brokers took sends"
        finally:
            zookeeper.start()

        await wait_until(
            lambda: all(b.registry.connected for b in cluster), timeout=30, what="the brokers reconnecting"
        )

        # kazoo resumes its sessions (ZooKeeper restored them from its data dir), or, had they
        # expired, the registry re-creates the nodes: either way each broker's live session holds its node.
        async def registered() -> bool:
            owners = await trio.to_thread.run_sync(node_owners, zk_uri)
            return all(owners.get(b.address) == session_of(b) for b in cluster)

        await poll(registered, timeout=20, what="both brokers' nodes held by their live sessions")

        await admin(zk_uri, "bindings", "add", "--group", "late", "--topic", TOPIC, "--direct", "x")
        await wait_until(
            lambda: all(routes(b, "late", "x") for b in cluster), timeout=20, what="the new binding applied"
        )
        after = await send_batch(producer, "x", 20)
        await wait_until(
            lambda: listeners["late"].acked_ids >= after and listeners["sms"].acked_ids >= after,
            timeout=30,
            what="deliveries on the binding added after the outage",
        )


# -- 4. session expiry ------------------------------------------------------------------------


async def test_session_expiry_recreates_the_server_node(tmp_path: Path, zk_uri: str) -> None:
    """A started broker is registered; an expired session takes its ephemeral node, and the
    broker re-creates it under its new session and re-arms its watches, while the clients
    connected before carry on."""
    listeners = {group: RecordingListener() for group in ("sms", "late")}
    async with in_process_brokers(tmp_path, zk_uri, "store1") as (broker,):
        old = session_of(broker)
        assert (await trio.to_thread.run_sync(node_owners, zk_uri)) == {broker.address: old}, (
            "the broker's node exists once run() reports it started"
        )
        async with (
            Consumer(zk_uri, group="sms", bindings=[Binding.direct(TOPIC, "x")], listener=listeners["sms"]),
            Consumer(
                zk_uri, group="late", bindings=[Binding.direct(TOPIC, "other")], listener=listeners["late"]
            ),
            Producer(zk_uri, group="p", topics=[TOPIC]) as producer,
        ):
            await wait_until(lambda: routes(broker, "sms", "x"), timeout=20, what="the consumer's binding")
            assert isinstance(broker.registry, ZooKeeperRegistry)
            client_id = broker.registry.client_id
            assert client_id is not None

            await trio.to_thread.run_sync(expire_session, zk_uri, client_id)

            async def recreated() -> bool:
                owners = await trio.to_thread.run_sync(node_owners, zk_uri)
                return broker.registry.connected and owners.get(broker.address) == session_of(broker) != old

            await poll(recreated, timeout=30, what="the server node re-created under a new session")

            # The bindings watch is armed again on the new session: a binding added now applies.
            await admin(zk_uri, "bindings", "add", "--group", "late", "--topic", TOPIC, "--direct", "x")
            await wait_until(
                lambda: routes(broker, "late", "x"), timeout=20, what="a binding added after expiry"
            )
            await wait_until(
                lambda: len(producer.pool.live(TOPIC)) == 1,
                timeout=20,
                what="the producer back on the broker",
            )
            sent = await send_batch(producer, "x", 10)
            await wait_until(
                lambda: all(listener.acked_ids >= sent for listener in listeners.values()),
                timeout=30,
                what="deliveries after the expiry",
            )
