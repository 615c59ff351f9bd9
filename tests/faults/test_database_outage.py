"""The MySQL master stopped or crashed under load (issue 9): the broker stays up, nothing acked is lost.

A broker subprocess on the MySQL store takes a steady stream from a producer that
resends what failed (as a correct producer does) while the master goes away for a few
seconds and comes back. The producer must see failures during the outage, never a
false success; afterwards every store-acked message reaches the bound group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kiteq import Binding, Consumer, Message, Producer
from stores.mysql import init_schema
from tests.faults.report import duplicates, record
from tests.faults.resend import send_until_stored
from tests.helpers import RecordingListener, registry_uri, wait_until
from tests.procs.broker import BrokerProcess
from tests.services.mariadb import MariaDBPair

pytestmark = [pytest.mark.faults, pytest.mark.mysql]

MESSAGES = 400
OUTAGE_AT = 150
OUTAGE = 3.0
FAST = ("--retry-base", "0.1", "--deliver-timeout", "2")


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_master_outage_under_load_loses_nothing_acked(
    tmp_path: Path, mariadb: MariaDBPair, how: str
) -> None:
    uri = mariadb.uri(mariadb.new_database())
    await init_schema(uri)
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(tmp_path, registry, store=uri, extra=FAST)
    await broker.start()
    listener = RecordingListener()
    acked: list[str] = []
    failures = 0

    async def outage() -> None:
        await trio.to_thread.run_sync(getattr(mariadb.master, how))
        await trio.sleep(OUTAGE)
        await trio.to_thread.run_sync(mariadb.master.start)

    try:
        async with (
            Consumer(registry, group="ledger", bindings=[Binding.fanout("pay")], listener=listener),
            Producer(registry, group="shop", topics=["pay"], send_timeout=2) as producer,
            trio.open_nursery() as nursery,
        ):
            await broker.wait_bindings(1)
            for i in range(MESSAGES):
                if i == OUTAGE_AT:
                    nursery.start_soon(outage)
                    await trio.sleep(0.5)
                message = Message("pay", "ok", f"order {i}".encode())
                failures += await send_until_stored(producer, message)
                acked.append(message.message_id)
            await wait_until(
                lambda: set(acked) <= listener.acked_ids,
                timeout=60,
                what="every store-acked message acked by the group",
            )
            assert broker.process is not None and broker.process.poll() is None, "the broker stayed up"
    finally:
        await broker.stop()
    assert failures > 0, "the producer was told about the outage"
    extra = duplicates(listener.deliveries)
    record(f"MariaDB master {how} + start", len(acked), len(set(acked) - listener.acked_ids), extra)
    assert extra <= 50, f"{extra} duplicate deliveries is more than the outage explains"
