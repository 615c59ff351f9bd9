"""The client examples run as users run them: scripts against a broker, stopped with Ctrl-C."""

from __future__ import annotations

import importlib.util
import json
import signal
import sqlite3
from pathlib import Path

import httpx
import trio

from kiteq import Binding, Consumer, Message, Producer, sync
from tests.e2e.test_examples import DELIVERY_FAST, EXAMPLES, finish, run_example, start_example
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.services.ports import free_port, wait_for_port


async def send_payments(registry: str, count: int) -> set[str]:
    async with Producer(registry, group="order-svc", topics=["trade"]) as producer:
        results = await producer.send_many([Message("trade", "pay-succ", f"order {i}") for i in range(count)])
    return {r.message_id for r in results if r.ok}


async def test_sync_consumer_example_acks_then_stops_gracefully_on_ctrl_c(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path) as broker:
        process = start_example("sync_consumer.py", "--registry", registry, cwd=tmp_path)
        try:
            await wait_until(lambda: len(broker.groups.peers("sms-svc")) == 1, what="the example consumer")
            await send_payments(registry, 3)
            await wait_until(lambda: broker.events.total("acked") == 3)
        finally:
            code, out, err = await finish(process, signal.SIGINT)
    assert code == 0, err
    assert out.count("received ") == 3
    assert "stopped after acking 3 messages" in out


async def test_flask_app_sends_one_message_per_request(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    port = free_port()
    listener = RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(
            registry, group="sms-svc", bindings=[Binding.direct("trade", "pay-succ")], listener=listener
        ),
    ):
        process = start_example("flask_app.py", "--registry", registry, "--port", str(port), cwd=tmp_path)
        try:
            await trio.to_thread.run_sync(wait_for_port, port)
            answers: list[httpx.Response] = []
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

                async def order(n: int) -> None:
                    answers.append(await http.post("/orders", json={"order_id": n, "amount": 100 * n}))

                async with trio.open_nursery() as nursery:
                    for n in range(20):
                        nursery.start_soon(order, n)
            assert [a.status_code for a in answers] == [201] * 20
            ids = {a.json()["message_id"] for a in answers}
            await wait_until(lambda: listener.acked_ids == ids, what="every order's message")
            assert broker.events.total("stored") == 20
        finally:
            code, _, err = await finish(process, signal.SIGINT)
    assert code == 0, err
    orders = {m.properties["order_id"]: json.loads(m.body) for m in listener.deliveries}
    assert orders == {str(n): {"order_id": n, "amount": 100 * n} for n in range(20)}


async def test_flask_app_answers_503_when_the_message_cannot_be_stored(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("flask_app", EXAMPLES / "flask_app.py")
    assert spec is not None and spec.loader is not None
    flask_app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flask_app)
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path):  # serves no topic: nothing can store `trade` messages

        def post() -> tuple[int, dict[str, str]]:
            with sync.Producer(
                registry, group="order-svc", topics=["trade"], connect_timeout=0.2, send_timeout=0.3
            ) as producer:
                answer = flask_app.create_app(producer).test_client().post("/orders", json={"order_id": 1})
                return answer.status_code, answer.get_json()

        status, body = await trio.to_thread.run_sync(post)
    assert status == 503 and "no broker serving topic 'trade'" in body["error"]


async def test_asyncio_service_handles_payments_and_sends_receipts(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    receipts = RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="audit", bindings=[Binding.direct("trade", "receipt")], listener=receipts),
    ):
        process = start_example("asyncio_service.py", "--registry", registry, "--count", "3", cwd=tmp_path)
        try:
            await wait_until(lambda: len(broker.router.bindings) == 2, what="the asyncio service's binding")
            payments = await send_payments(registry, 3)
            code, out, err = await finish(process)
        finally:
            if process.poll() is None:
                process.kill()
        assert code == 0, err
        await wait_until(lambda: len(receipts.acked) == 3, what="three receipts")
    assert "asyncio service done: 3 payments handled" in out
    assert {m.properties["payment"] for m in receipts.deliveries} == payments
    assert broker.events.total("acked") == 6, "3 payments acked by the service, 3 receipts by audit"


async def test_idempotent_consumer_example_counts_each_deposit_once(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    database = tmp_path / "bank.sqlite"
    async with running_broker(tmp_path, delivery=DELIVERY_FAST) as broker:
        result = await trio.to_thread.run_sync(
            lambda: run_example(
                "idempotent_consumer.py",
                "--registry",
                registry,
                "--database",
                str(database),
                "--send",
                "5",
                "--lose-first-ack",
                cwd=tmp_path,
            )
        )
        assert result.returncode == 0, result.stderr
        assert broker.events.total("nacked") == 5, "every deposit's first ack was lost"
        assert broker.events.total("acked") == 5
    assert "balance 15 after 10 deliveries of 5 deposits (5 duplicates skipped)" in result.stdout
    assert result.stdout.count("applied ") == 5
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT balance FROM accounts").fetchone() == (15,)
        assert db.execute("SELECT count(*) FROM kiteq_processed").fetchone() == (5,)
