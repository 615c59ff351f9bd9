"""A broker on the MySQL store (issue 7): delivery, two-phase commit, restart, `store init`.

The same promises as on the other stores, checked end to end on a real MariaDB master
and replica: retried deliveries, dead letters and redrive; delivered if and only if the
local transaction committed, including answers from the back-scan; and a restarted
broker resuming every unfinished delivery from the database.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from kiteq import Binding, Consumer, Message, Producer, TxStatus
from kiteq.server.broker import Broker
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.runner import ClientProcess
from tests.services.mariadb import MariaDBPair
from tests.services.ports import free_port

pytestmark = pytest.mark.mysql

ROOT = Path(__file__).resolve().parents[3]
DELIVERY_FAST = {"recover_interval": 0.05, "retry_base": 0.1, "retry_max": 0.5, "deliver_timeout": 2.0}
TX_FAST = {"tx_scan_interval": 0.2, "tx_check_after": 0.3, "tx_check_timeout": 1.0}


async def test_delivery_retries_dead_letters_and_redrive(tmp_path: Path, mysql_store_uri: str) -> None:
    registry = registry_uri(tmp_path)
    healed = False
    flaky: set[str] = set()

    def fail(message: Message) -> bool:
        if message.body == b"poison":
            return not healed
        if message.body.startswith(b"flaky") and message.message_id not in flaky:
            flaky.add(message.message_id)
            return True
        return False

    listener = RecordingListener(fail=fail)
    async with (
        running_broker(tmp_path, store=mysql_store_uri, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)
        bodies = [b"flaky %d" % i if i % 5 == 0 else b"m %d" % i for i in range(200)]
        results = await producer.send_many([Message("t", "x", body) for body in bodies])
        assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
        ids = {r.message_id for r in results}
        poison = await producer.send(Message("t", "x", b"poison", deliver_limit=3))

        await wait_until(lambda: listener.acked_ids >= ids, timeout=30, what="every message acked")
        await wait_until(
            lambda: broker.events.total("dead_lettered") == 1, timeout=30, what="the dead letter"
        )
        assert len(flaky) == 40 and all(listener.acked[i] == 1 for i in ids)
        dead = await broker.store.get(poison)
        assert dead is not None and dead.dead and dead.dead_reason == "deliver-limit"

        healed = True
        assert await broker.store.redrive(poison)
        await wait_until(lambda: listener.acked[poison] == 1, timeout=30, what="the redriven message")

        async def drained() -> bool:
            stats = await broker.store.stats()
            return stats.messages == 0 and stats.dead == 0

        with trio.fail_after(30):
            while not await drained():
                await trio.sleep(0.1)


async def test_commit_delivers_rollback_never_and_backscan_decides(
    tmp_path: Path, mysql_store_uri: str
) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, store=mysql_store_uri, tx=TX_FAST, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
        trio.open_nursery() as nursery,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)

        async def commit(message: Message) -> bool:
            return True

        async def roll_back(message: Message) -> bool:
            return False

        committed = Message("t", "x", b"paid")
        rolled = Message("t", "x", b"cancelled")
        assert await producer.send_tx(committed, commit) is TxStatus.COMMIT
        assert await producer.send_tx(rolled, roll_back) is TxStatus.ROLLBACK
        await until_gone(broker, rolled.message_id)  # the decision travels one way: wait for it

        # Producers killed between store ack and decision: the back-scan asks a new one.
        outcomes: dict[str, set[str]] = {}
        for answer in ("commit", "rollback"):
            group = f"pay-{answer}"
            doomed = await nursery.start(
                ClientProcess("tx_producer", "--registry", registry, "--group", group, "--send", "3").run
            )
            await wait_until(lambda p=doomed: len(p.words("stored")) == 3, what="three store acks")
            doomed.kill()
            outcomes[answer] = set(doomed.words("stored"))
            answering = await nursery.start(
                ClientProcess("tx_producer", "--registry", registry, "--group", group, "--answer", answer).run
            )
            await wait_until(
                lambda p=answering, a=answer: set(p.words("checked")) >= outcomes[a],
                timeout=20,
                what=f"checks answered {answer}",
            )
            answering.kill()

        await wait_until(
            lambda: listener.acked_ids >= outcomes["commit"] | {committed.message_id},
            timeout=20,
            what="committed messages delivered",
        )
        for message_id in outcomes["rollback"]:
            await until_gone(broker, message_id)
        await trio.sleep(1.0)  # several back-scans and recover passes
    assert listener.acked_ids == outcomes["commit"] | {committed.message_id}


async def test_restarted_broker_resumes_its_messages(tmp_path: Path, mysql_store_uri: str) -> None:
    registry = registry_uri(tmp_path)
    server = {"bind": f"127.0.0.1:{free_port()}"}
    options = {"store": mysql_store_uri, "server": server, "delivery": DELIVERY_FAST}
    async with running_broker(tmp_path, **options) as broker:
        # A persistent binding whose consumer is offline: the messages wait in the database.
        await broker.registry.put_bindings("late", "t", [Binding.direct("t", "x")])
        await wait_until(lambda: len(broker.router.bindings) == 1)
        async with Producer(registry, group="p", topics=["t"]) as producer:
            results = await producer.send_many([Message("t", "x", b"%d" % i) for i in range(100)])
        ids = {r.message_id for r in results if r.ok}
        assert len(ids) == 100
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, **options),
        Consumer(registry, group="late", bindings=[Binding.direct("t", "x")], listener=listener),
    ):
        await wait_until(
            lambda: listener.acked_ids == ids, timeout=30, what="every message after the restart"
        )


async def test_admin_store_init_creates_the_schema_a_broker_then_opens(
    tmp_path: Path, mariadb_pair: MariaDBPair
) -> None:
    uri = mariadb_pair.uri(mariadb_pair.new_database())
    refused = await admin_cli("store", "init", "--store", "file:///tmp/x")
    assert refused.returncode == 2 and b"only mysql://" in refused.stderr
    for _ in range(2):  # idempotent
        done = await admin_cli("store", "init", "--store", uri, "--json")
        assert done.returncode == 0, done.stderr.decode()
        assert b'"shards": 16' in done.stdout
    async with running_broker(tmp_path, store=uri) as broker:
        assert (await broker.store.stats()).kind == "mysql"


async def until_gone(broker: Broker, message_id: str) -> None:
    with trio.fail_after(10):
        while await broker.store.get(message_id) is not None:
            await trio.sleep(0.05)


async def admin_cli(*args: str) -> trio.CompletedProcess[bytes]:
    return await trio.run_process(
        [sys.executable, "-m", "kiteq.cli.admin", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
