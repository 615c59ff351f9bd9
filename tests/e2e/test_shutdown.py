"""SIGTERM: stop accepting, settle or hand back deliveries, flush, exit 0, lose nothing acked."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import trio

from kiteq import Binding, Consumer, Message, Producer
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.broker import server_command
from tests.services.ports import free_port, wait_for_port


def start_broker(tmp_path: Path, port: int, store: str) -> subprocess.Popen[bytes]:
    command = server_command(f"127.0.0.1:{port}", store, registry_uri(tmp_path), "--retry-base", "0.1")
    return subprocess.Popen(command, cwd=tmp_path, env={**os.environ}, stderr=subprocess.PIPE)


async def test_in_process_stop_hands_back_queued_deliveries(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    slow = RecordingListener(delay=0.2)
    async with (
        running_broker(tmp_path, delivery={"recover_interval": 0.05}) as broker,
        Consumer(registry, group="g", bindings=[Binding.direct("t", "x", watermark=2)], listener=slow),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await producer.send_many([Message("t", "x", b"q") for _ in range(20)])
        await wait_until(lambda: len(slow.deliveries) >= 2)
        broker.stop()
        with trio.fail_after(15):
            while broker.connections:
                await trio.sleep(0.05)
        stats = await broker.store.stats()
    assert stats.messages + len(slow.acked) >= 20, "every message is either acked or still in the store"


async def test_sigterm_exits_zero_and_keeps_every_acked_message(tmp_path: Path) -> None:
    port = free_port()
    store = f"file://{tmp_path}/store"
    proc = start_broker(tmp_path, port, store)
    registry = registry_uri(tmp_path)
    await trio.to_thread.run_sync(wait_for_port, port)
    async with Producer(registry, group="p", topics=["t"]) as producer:
        await producer.registry.put_bindings("offline", "t", [Binding.direct("t", "x")])
        await trio.sleep(0.5)
        acked = {
            r.message_id
            for r in await producer.send_many([Message("t", "x", b"keep") for _ in range(200)])
            if r.ok
        }
        proc.send_signal(signal.SIGTERM)
        returncode = await trio.to_thread.run_sync(proc.wait, 30)
    assert returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    assert len(acked) == 200
    listener = RecordingListener()
    restarted = start_broker(tmp_path, port, store)
    try:
        await trio.to_thread.run_sync(wait_for_port, port)
        async with Consumer(
            registry, group="offline", bindings=[Binding.direct("t", "x")], listener=listener
        ):
            await wait_until(
                lambda: listener.acked_ids >= acked, timeout=30, what="every acked message after restart"
            )
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(30)
