"""Two brokers on one MySQL database (issue 7): a killed broker's rows are adopted.

Each broker scans only the rows it owns. The victim stores messages for a persistent
group that has no consumer yet, then is SIGKILLed; once ZooKeeper has dropped it and
`adopt_after` has passed, the survivor takes its rows over and delivers every one.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from kiteq import Binding, Consumer, Producer
from kiteq.registry import open_registry
from kiteq.server.broker import Broker
from tests.helpers import RecordingListener, broker_config, wait_until
from tests.integration.cluster.harness import TOPIC, send_batch, start_broker_process
from tests.services.ports import free_port, stop_process, wait_for_port

pytestmark = [pytest.mark.zookeeper, pytest.mark.mysql]

ADOPT_AFTER = 1.0
SESSION_TIMEOUT = 3.0
MESSAGES = 200


async def test_killed_brokers_messages_are_adopted_and_delivered(
    tmp_path: Path, zk_uri: str, mysql_store_uri: str
) -> None:
    port = free_port()
    victim = f"127.0.0.1:{port}"
    proc = start_broker_process(
        tmp_path,
        port,
        mysql_store_uri,
        f"{zk_uri}?session_timeout={SESSION_TIMEOUT:g}",
        server=f"adopt_after = {ADOPT_AFTER}\n",
    )
    listener = RecordingListener()
    watcher = open_registry(zk_uri)
    try:
        async with watcher:
            await watcher.put_bindings("audit", TOPIC, [Binding.direct(TOPIC, "x")])
            await trio.to_thread.run_sync(wait_for_port, port)
            async with Producer(zk_uri, group="p", topics=[TOPIC]) as producer:
                await wait_until(lambda: len(producer.pool.live(TOPIC)) == 1, timeout=30, what="the victim")
                ids = await send_batch(producer, "x", MESSAGES)

            config = broker_config(
                tmp_path,
                store=mysql_store_uri,
                server={"registry": zk_uri, "topics": [TOPIC], "admin_bind": "", "adopt_after": ADOPT_AFTER},
                delivery={"recover_interval": 0.1, "retry_base": 0.1},
            )
            survivor = Broker(config)
            async with trio.open_nursery() as nursery:
                await nursery.start(survivor.run)
                # A live victim keeps its rows, however long past adopt_after.
                await trio.sleep(4 * ADOPT_AFTER)
                assert victim in await survivor.store.owners()

                proc.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(proc.wait)
                async with Consumer(
                    zk_uri, group="audit", bindings=[Binding.direct(TOPIC, "x")], listener=listener
                ):
                    await wait_until(
                        lambda: listener.acked_ids >= ids,
                        timeout=60,
                        what="every message of the killed broker delivered by the survivor",
                    )
                    assert victim not in await survivor.store.owners()
                survivor.stop()
    finally:
        stop_process(proc)
    assert listener.acked_ids == ids
    assert listener.deliveries and all(m.topic == TOPIC for m in listener.deliveries)
