"""The examples run as users run them: as scripts, against a broker, each twice in a row.

A second run must behave like the first: no rolled-back orders from ids the first run
used, no binding left behind that keeps messages for a service that went away, no
temporary directories piling up.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from kiteq import Binding, Consumer
from kiteq.registry import open_registry
from kiteq.server.broker import Broker
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.runner import ROOT
from tests.services.ports import free_port, wait_for_port

EXAMPLES = ROOT / "examples"
DELIVERY_FAST = {"recover_interval": 0.05, "retry_base": 0.05, "retry_jitter": "none"}


def example_env(cwd: Path) -> dict[str, str]:
    """A clean environment; TMPDIR in the test's directory, to see what an example leaves there."""
    return {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TMPDIR": str(cwd)}


def run_example(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=example_env(cwd),
    )


def start_example(name: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=example_env(cwd),
    )


async def finish(process: subprocess.Popen[str], sig: int | None = None) -> tuple[int, str, str]:
    """Optionally signal the example, then wait for it; its exit code and output."""
    if sig is not None:
        process.send_signal(sig)
    try:
        out, err = await trio.to_thread.run_sync(lambda: process.communicate(timeout=30))
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, out, err


def test_an_example_started_here_sees_ctrl_c(tmp_path: Path) -> None:
    """Even when the tests run as a background job, which ignores SIGINT (tests/conftest.py)."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=example_env(tmp_path),
    )
    assert child.stdout.strip() == "True", child.stderr


async def produce(registry: str, count: int, cwd: Path) -> set[str]:
    """Run examples/producer.py; the ids it stored."""
    result = await trio.to_thread.run_sync(
        lambda: run_example("producer.py", "--registry", registry, "--count", str(count), cwd=cwd)
    )
    assert result.returncode == 0, result.stderr
    return {line.split()[-1] for line in result.stdout.splitlines() if line.startswith("stored ")}


async def wait_for_total(broker: Broker, event: str, count: int) -> None:
    await wait_until(lambda: broker.events.total(event) == count, what=f"{count} {event} events")


async def wait_for_acks(listener: RecordingListener, ids: set[str]) -> None:
    await wait_until(lambda: ids <= listener.acked_ids, what=f"acks of {sorted(ids)}")


async def bindings_of(registry: str, group: str) -> list[Binding]:
    async with open_registry(registry) as opened:
        return await opened.list_bindings(group=group)


def test_demo_twice_delivers_every_message_and_removes_its_directory(tmp_path: Path) -> None:
    for _ in range(2):
        result = run_example("demo.py", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "demo done: 10 of 10 messages delivered" in result.stdout
        assert result.stdout.count("delivered to sms-svc") == 10
        assert "removed " in result.stdout
        assert not list(tmp_path.glob("kiteq-demo-*")), "the demo left its temporary directory"


async def test_tx_producer_twice_places_new_orders_each_run(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    database = tmp_path / "orders.sqlite"
    listener = RecordingListener()
    committed: set[str] = set()
    async with (
        running_broker(tmp_path),
        Consumer(
            registry, group="sms-svc", bindings=[Binding.direct("trade", "pay-succ")], listener=listener
        ),
    ):
        stored = await produce(registry, 3, tmp_path)
        orders_seen: list[int] = []
        for run in (1, 2):
            tx = await trio.to_thread.run_sync(
                lambda: run_example(
                    "tx_producer.py",
                    *("--registry", registry, "--database", str(database)),
                    *("--orders", "4", "--fail-every", "2"),
                    cwd=tmp_path,
                )
            )
            assert tx.returncode == 0, tx.stderr
            lines = [line for line in tx.stdout.splitlines() if line.startswith("order ") and ": " in line]
            run_committed = {line.split()[-1] for line in lines if ": COMMIT " in line}
            rolled_back = {line.split()[-1] for line in lines if ": ROLLBACK " in line}
            assert len(run_committed) == 2 and len(rolled_back) == 2, f"run {run}: {tx.stdout}"
            assert "UNIQUE" not in tx.stdout
            numbers = [int(line.split()[1].rstrip(":")) for line in lines if ": COMMIT " in line]
            assert not orders_seen or min(numbers) > max(orders_seen), "a second run reused order ids"
            orders_seen += numbers
            assert f"{2 * run} orders kept in {database}" in tx.stdout
            committed |= run_committed
        await wait_until(
            lambda: listener.acked_ids == stored | committed, what="plain and committed messages"
        )
        await trio.sleep(0.5)  # a rolled-back message delivered late would show up now
        assert len(listener.deliveries) == len(stored | committed)
    rows = sqlite3.connect(database).execute("SELECT message_id FROM orders").fetchall()
    assert {row[0] for row in rows} == committed


async def test_consumer_example_twice_prints_deliveries_and_what_it_leaves(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path) as broker:
        for run in (1, 2):
            process = start_example("consumer.py", "--registry", registry, cwd=tmp_path)
            try:
                await wait_until(lambda: len(broker.groups.peers("sms-svc")) == 1, what="the consumer")
                sent = await produce(registry, 2, tmp_path)
                await wait_for_total(broker, "acked", 2 * run)
            finally:
                code, out, err = await finish(process, signal.SIGINT)
            assert code == 0, err
            assert {line.split()[1] for line in out.splitlines() if line.startswith("received ")} == sent
            assert "kiteq-admin --registry " + registry + " bindings remove --group sms-svc" in out
            await wait_until(lambda: not broker.groups.peers("sms-svc"), what="the consumer to leave")
    assert [b.message_type for b in await bindings_of(registry, "sms-svc")] == ["pay-succ"]


async def test_sync_consumer_example_twice_acks_and_says_what_it_leaves(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path) as broker:
        for _ in range(2):
            process = start_example("sync_consumer.py", "--registry", registry, "--count", "2", cwd=tmp_path)
            try:
                await wait_until(lambda: len(broker.groups.peers("sms-svc")) == 1, what="the consumer")
                await produce(registry, 2, tmp_path)
            finally:
                code, out, err = await finish(process)
            assert code == 0, err
            assert "stopped after acking 2 messages" in out
            assert "bindings remove --group sms-svc --topic trade" in out
            await wait_until(lambda: not broker.groups.peers("sms-svc"), what="the consumer to leave")


async def test_asyncio_service_twice_leaves_no_binding_behind(tmp_path: Path) -> None:
    """A payment sent while the service is away goes to the groups still bound (sms-svc) and
    is finished; with the binding left behind, it would wait for the service's next run."""
    registry = registry_uri(tmp_path)
    receipts, sms = RecordingListener(), RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="audit", bindings=[Binding.direct("trade", "receipt")], listener=receipts),
        Consumer(registry, group="sms-svc", bindings=[Binding.direct("trade", "pay-succ")], listener=sms),
    ):
        for run in (1, 2):
            process = start_example(
                "asyncio_service.py", "--registry", registry, "--count", "2", cwd=tmp_path
            )
            try:
                await wait_until(lambda: len(broker.router.bindings) == 3, what="the service's binding")
                payments = await produce(registry, 2, tmp_path)
                code, out, err = await finish(process)
            finally:
                if process.poll() is None:
                    process.kill()
            assert code == 0, err
            assert "asyncio service done: 2 payments handled; 1 binding of receipt-svc removed" in out
            # Only this run's payments: the one sent while the service was away was not kept for it.
            handled = {line.split()[1] for line in out.splitlines() if line.startswith("handled ")}
            assert handled == payments, f"run {run}"
            assert await bindings_of(registry, "receipt-svc") == []
            await wait_until(lambda: len(broker.router.bindings) == 2, what="the broker to see the unbinding")
            await wait_for_acks(sms, await produce(registry, 1, tmp_path))  # sent while it is away
        await wait_until(lambda: len(receipts.acked) == 4, what="four receipts")


async def test_flask_app_twice_answers_201_to_orders_and_400_to_bad_input(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    port = free_port()
    listener = RecordingListener()
    bad_bodies = [b"[1, 2]", b"not json", b"{}", b'{"order_id": true}', b'{"order_id": 1, "amount": "x"}']
    async with (
        running_broker(tmp_path),
        Consumer(
            registry, group="sms-svc", bindings=[Binding.direct("trade", "pay-succ")], listener=listener
        ),
    ):
        for run in (1, 2):
            process = start_example("flask_app.py", "--registry", registry, "--port", str(port), cwd=tmp_path)
            try:
                await trio.to_thread.run_sync(wait_for_port, port)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    placed = await http.post("/orders", json={"order_id": run, "amount": 100})
                    assert placed.status_code == 201, placed.text
                    for body in bad_bodies:
                        answer = await http.post(
                            "/orders", content=body, headers={"content-type": "application/json"}
                        )
                        assert answer.status_code == 400, (body, answer.text)
                        assert answer.json()["error"], body
                    too_big = await http.post("/orders", content=b" " * 100_000)
                    assert too_big.status_code == 413 and "error" in too_big.json()
            finally:
                code, _, err = await finish(process, signal.SIGINT)
            assert code == 0, err
        await wait_until(lambda: len(listener.acked) == 2, what="the two orders")
    assert sorted(m.properties["order_id"] for m in listener.deliveries) == ["1", "2"]


async def test_idempotent_consumer_twice_counts_each_deposit_once(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    database = tmp_path / "bank.sqlite"
    async with running_broker(tmp_path, delivery=DELIVERY_FAST):
        for run in (1, 2):
            result = await trio.to_thread.run_sync(
                lambda: run_example(
                    "idempotent_consumer.py",
                    *("--registry", registry, "--database", str(database)),
                    *("--send", "5", "--lose-first-ack"),
                    cwd=tmp_path,
                )
            )
            assert result.returncode == 0, result.stderr
            assert f"consuming bank/deposit; balance {15 * (run - 1)}" in result.stdout
            assert (
                f"balance {15 * run} after 10 deliveries of 5 deposits (5 duplicates skipped)"
                in result.stdout
            )
            assert f"left the balance in {database}" in result.stdout
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT balance FROM accounts").fetchone() == (30,)
