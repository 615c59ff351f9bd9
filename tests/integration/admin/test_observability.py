"""The admin endpoint under a known workload: /metrics, /stats, the token, `kiteq-admin top`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from kiteq import Binding, Consumer, Message, Producer
from kiteq.cli.admin.broker_cmds import top_rows
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.integration.admin.workload import HOLD, HeldListener, PoisonListener

ROOT = Path(__file__).resolve().parents[3]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition, keyed by (sample name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_a_known_workload(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    one, two, poisoned = RecordingListener(), RecordingListener(), PoisonListener()
    async with (
        running_broker(tmp_path, delivery=HOLD) as broker,
        running_broker(tmp_path / "other") as other,
        Consumer(registry, group="g1", bindings=[Binding.direct("t", "x")], listener=one),
        Consumer(registry, group="g2", bindings=[Binding.direct("t", "x")], listener=two),
        Consumer(registry, group="bad", bindings=[Binding.direct("p", "x")], listener=poisoned),
        httpx.AsyncClient(base_url=f"http://{broker.admin_address}") as admin,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 3)
        async with Producer(registry, group="p", topics=["t", "p"]) as producer:
            await producer.send_many([Message("t", "x", b"m") for _ in range(20)])
            await producer.send(Message("p", "x", b"poison", deliver_limit=2))
            await wait_until(lambda: len(one.acked) == 20 and len(two.acked) == 20, what="both groups")
            await wait_until(lambda: broker.events.total("dead_lettered") == 1, what="the dead letter")
            await wait_until(lambda: broker.events.total("finished") == 20, what="finished rounds")
            response = await admin.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    found = samples(response.text)
    assert value(found, "kiteq_messages_stored_total", topic="t", group="") == 20
    assert value(found, "kiteq_messages_stored_total", topic="p", group="") == 1
    for group in ("g1", "g2"):
        assert value(found, "kiteq_messages_delivered_total", topic="t", group=group) == 20
        assert value(found, "kiteq_messages_acked_total", topic="t", group=group) == 20
        assert value(found, "kiteq_delivery_ack_seconds_count", group=group) == 20
        assert value(found, "kiteq_end_to_end_seconds_count", group=group) == 20
        assert value(found, "kiteq_delivery_ack_seconds_bucket", group=group, le="+Inf") == 20
        assert value(found, "kiteq_delivery_ack_seconds_sum", group=group) > 0
    assert value(found, "kiteq_messages_nacked_total", topic="p", group="bad") == 2
    assert value(found, "kiteq_messages_dead_lettered_total", topic="p", group="") == 1
    assert value(found, "kiteq_messages_finished_total", topic="t", group="") == 20
    assert value(found, "kiteq_store_save_seconds_count") == 21
    assert value(found, "kiteq_dead_letters", reason="deliver-limit") == 1
    assert value(found, "kiteq_backlog", topic="t") == 0
    assert value(found, "kiteq_connections") == 4  # three consumers and the producer
    assert value(found, "kiteq_group_connections", group="g1") == 1
    assert value(found, "kiteq_registry_connected") == 1
    assert value(found, "kiteq_inflight", group="g1", topic="t") == 0
    assert value(found, "process_cpu_seconds_total") > 0

    # A second broker in the same process has a registry of its own.
    assert not other.events.counts
    async with running_broker(tmp_path / "third") as third, httpx.AsyncClient() as client:
        fresh = samples((await client.get(f"http://{third.admin_address}/metrics")).text)
    assert value(fresh, "kiteq_messages_stored_total", topic="t", group="") == 0


async def test_stats_shows_in_flight_backlog_and_dead_letters(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    held, poisoned = HeldListener(), PoisonListener()
    async with (
        running_broker(tmp_path, delivery=HOLD) as broker,
        Consumer(
            registry, group="slow", bindings=[Binding.direct("t", "x", watermark=2)], listener=held
        ) as slow,
        Consumer(registry, group="bad", bindings=[Binding.direct("p", "x")], listener=poisoned),
        Producer(registry, group="p", topics=["t", "p"]) as producer,
        httpx.AsyncClient(base_url=f"http://{broker.admin_address}") as admin,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 2)
        await producer.send_many([Message("t", "x", b"m") for _ in range(5)])
        await producer.send(Message("p", "x", b"poison", deliver_limit=2))
        await wait_until(lambda: held.received == 2, what="two held deliveries")
        await wait_until(lambda: broker.events.total("dead_lettered") == 1, what="the dead letter")
        stats = (await admin.get("/stats")).json()
        held.release()
        await wait_until(lambda: slow.acked == 5, what="the released group")

    assert stats["uptime"] > 0 and stats["started_at"] <= stats["started_at"] + stats["uptime"]
    assert stats["connections"] == {
        "total": 3,
        "unauthenticated": 0,
        "by_group": {"slow": 1, "bad": 1, "p": 1},
    }
    assert stats["security"] == {"auth": "open", "tls": False, "refusals": {}, "denied_bindings": []}
    assert stats["registry"]["connected"] is True and stats["registry"]["state"] == "CONNECTED"
    slow_row = stats["groups"]["slow"]
    assert (slow_row["inflight"], slow_row["backlog"]) == (2, 5)
    # The other three wait in the lane; one of them may already sit in its pump, off the queue.
    assert slow_row["queued"] in (2, 3)
    assert slow_row["topics"] == ["t"] and slow_row["events"] == {"delivered": 2}
    assert stats["groups"]["bad"]["events"] == {"delivered": 2, "nacked": 2}
    assert stats["topics"]["t"]["backlog"] == 5 and stats["topics"]["t"]["inflight"] == 2
    assert stats["topics"]["t"]["events"]["stored"] == 5
    assert [lane for lane in stats["lanes"] if lane["group"] == "slow"] == [
        {
            "group": "slow",
            "topic": "t",
            "message_type": "x",
            "watermark": 2,
            "inflight": 2,
            "queued": slow_row["queued"],
        }
    ]
    assert stats["dead_letters"] == {"total": 1, "by_reason": {"deliver-limit": 1}}
    assert stats["store"]["kind"] == "memory" and stats["store"]["backlog_by_topic"] == {"t": 5}
    assert stats["events"]["stored"] == 6 and stats["events"]["dead_lettered"] == 1


async def test_mutating_routes_need_the_admin_token(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path, server={"admin_token": "s3cret"}) as broker,
        httpx.AsyncClient(base_url=f"http://{broker.admin_address}") as admin,
    ):
        everything = {"all": True}
        for route in ("/dlq/redrive", "/dlq/purge"):
            assert (await admin.post(route, json=everything)).status_code == 401
            wrong = await admin.post(route, json=everything, headers={"Authorization": "Bearer guess"})
            assert wrong.status_code == 401 and "admin_token" in wrong.json()["error"]
            token = {"Authorization": "Bearer s3cret"}
            assert (await admin.post(route, json=everything, headers=token)).status_code == 200
            # A form post (no CORS preflight) is refused even with the token.
            form = await admin.post(
                route, content=b'{"all": true}', headers={**token, "Content-Type": "text/plain"}
            )
            assert form.status_code == 415
        assert (await admin.get("/stats")).status_code == 200
        assert (await admin.get("/dlq")).status_code == 200
        assert (await admin.get("/dlq", params={"limit": "x"})).status_code == 400

        url = f"http://{broker.admin_address}"
        refused = await admin_cli("--admin", url, "dlq", "purge", "--all")
        assert refused.returncode == 2 and "(401)" in refused.stderr
        allowed = await admin_cli("--admin", url, "dlq", "purge", "--all", "--token", "s3cret")
        assert allowed.returncode == 0 and allowed.stdout.strip() == "purge: 0 message(s)"


async def test_dashboard_files_are_served(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path) as broker,
        httpx.AsyncClient(base_url=f"http://{broker.admin_address}") as admin,
    ):
        page = await admin.get("/")
        script = await admin.get("/static/dashboard.js")
        style = await admin.get("/static/dashboard.css")
        missing = [
            await admin.get(path) for path in ("/static/nope.js", "/static/..%2fapp.py", "/static/app.py")
        ]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="/static/dashboard.js"' in page.text
    assert script.status_code == 200 and "/stats" in script.text
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert [r.status_code for r in missing] == [404, 404, 404]


async def admin_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m kiteq.cli.admin …` as a user runs it, while this test's broker keeps serving."""
    return await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "kiteq.cli.admin", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    )


async def test_top_prints_a_row_per_group_with_rates(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    one, two = RecordingListener(), RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="g1", bindings=[Binding.direct("t", "x")], listener=one),
        Consumer(registry, group="g2", bindings=[Binding.direct("t", "x")], listener=two),
        Producer(registry, group="p", topics=["t"]) as producer,
        trio.open_nursery() as nursery,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 2)

        async def traffic() -> None:
            while True:
                await producer.send(Message("t", "x", b"m"))
                await trio.sleep(0.01)

        nursery.start_soon(traffic)
        url = f"http://{broker.admin_address}"
        shown = await admin_cli("--admin", url, "top", "--iterations", "2", "--interval", "0.5")
        scripted = await admin_cli("--admin", url, "--json", "top", "--once", "--interval", "0.3")
        table = await admin_cli("--admin", url, "stats")
        nursery.cancel_scope.cancel()

    assert shown.returncode == 0, shown.stderr
    frames = [frame for frame in shown.stdout.split("kiteq ") if frame]
    assert len(frames) == 2 and "\x1b[" not in shown.stdout  # no clear-screen when not a terminal
    for frame in frames:
        lines = frame.splitlines()
        assert "registry CONNECTED" in lines[0]
        header = lines[2].split()
        assert header == [
            "GROUP",
            "CONNS",
            "DELIVERED/S",
            "ACKED/S",
            "FAILED/S",
            "INFLIGHT",
            "QUEUED",
            "BACKLOG",
        ]
        groups_table, bindings_table = frame.split("\n\n")[1:3]
        rows = {line.split()[0]: line.split() for line in groups_table.splitlines()[1:]}
        assert set(rows) == {"g1", "g2", "p"}
        bound = [line.split()[:3] for line in bindings_table.splitlines()[1:]]
        assert bound == [["g1", "t", "x"], ["g2", "t", "x"]], frame
        for group in ("g1", "g2"):
            assert rows[group][1] == "1" and float(rows[group][3]) > 5, frame  # ~1 message per 10 ms
    assert scripted.returncode == 0, scripted.stderr
    [line] = scripted.stdout.splitlines()
    by_group = {row["group"]: row for row in json.loads(line)["groups"]}
    assert by_group["g1"]["acked/s"] > 5 and by_group["g2"]["failed/s"] == 0
    assert table.returncode == 0, table.stderr
    lines = {line.split("  ")[0]: line for line in table.stdout.splitlines()}
    assert "registry" in lines and "(CONNECTED)" in lines["registry"]
    assert lines["group g1"].split()[2:4] == ["connections", "1"]
    assert "inflight" in lines["lane g2/t/x"]


def test_top_rates_are_counter_deltas_per_second() -> None:
    def snapshot(uptime: float, acked: int, nacked: int) -> dict[str, Any]:
        events = {"acked": acked, "nacked": nacked, "timeout": 1, "delivered": acked + nacked}
        row = {"connections": 1, "inflight": 3, "queued": 0, "backlog": 7, "events": events}
        return {"uptime": uptime, "groups": {"g": row}}

    [row] = top_rows(snapshot(10.0, 100, 0), snapshot(12.0, 150, 4))
    assert row == {
        "group": "g",
        "conns": 1,
        "delivered/s": 27.0,
        "acked/s": 25.0,
        "failed/s": 2.0,
        "inflight": 3,
        "queued": 0,
        "backlog": 7,
    }
    assert top_rows({"uptime": 1.0, "groups": {}}, snapshot(1.0, 5, 0))[0]["acked/s"] == 0.0
