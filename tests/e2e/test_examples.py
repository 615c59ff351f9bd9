"""The examples run as users run them: as scripts, against a broker."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import trio

from kiteq import Binding, Consumer
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.runner import ROOT

EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_demo_delivers_every_message(tmp_path: Path) -> None:
    result = run_example("demo.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "demo done: 10 of 10 messages delivered" in result.stdout
    assert result.stdout.count("delivered to sms-svc") == 10


async def test_producer_and_tx_producer_examples_against_a_broker(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path),
        Consumer(
            registry, group="sms-svc", bindings=[Binding.direct("trade", "pay-succ")], listener=listener
        ),
    ):
        plain = await trio.to_thread.run_sync(
            lambda: run_example("producer.py", "--registry", registry, "--count", "3", cwd=tmp_path)
        )
        assert plain.returncode == 0, plain.stderr
        database = tmp_path / "orders.sqlite"
        tx = await trio.to_thread.run_sync(
            lambda: run_example(
                "tx_producer.py",
                "--registry",
                registry,
                "--database",
                str(database),
                "--orders",
                "4",
                "--fail-every",
                "2",
                cwd=tmp_path,
            )
        )
        assert tx.returncode == 0, tx.stderr
        committed = {line.split()[-1] for line in tx.stdout.splitlines() if ": COMMIT " in line}
        rolled_back = {line.split()[-1] for line in tx.stdout.splitlines() if ": ROLLBACK " in line}
        assert len(committed) == 2 and len(rolled_back) == 2
        stored = {line.split()[-1] for line in plain.stdout.splitlines() if line.startswith("stored ")}
        await wait_until(
            lambda: listener.acked_ids == stored | committed, what="plain and committed messages"
        )
        await trio.sleep(0.5)
        assert not rolled_back & {m.message_id for m in listener.deliveries}
    rows = sqlite3.connect(database).execute("SELECT message_id FROM orders").fetchall()
    assert {row[0] for row in rows} == committed


async def test_consumer_example_prints_deliveries(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path) as broker:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(EXAMPLES / "consumer.py"), "--registry", registry],
            stdout=subprocess.PIPE,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        try:
            await wait_until(lambda: len(broker.groups.peers("sms-svc")) == 1, what="the example consumer")
            result = await trio.to_thread.run_sync(
                lambda: run_example("producer.py", "--registry", registry, "--count", "2", cwd=tmp_path)
            )
            assert result.returncode == 0, result.stderr
            await wait_until(lambda: broker.events.total("acked") == 2)
        finally:
            process.kill()
            output = await process.stdout.receive_some(65536) if process.stdout else b""
            await process.wait()
        assert output.count(b"received ") == 2
