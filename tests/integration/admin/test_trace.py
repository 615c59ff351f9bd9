"""Trace and browse on a running broker, and the backlog of a group that went away:
`GET /messages…`, `/stats`, `/metrics` and `kiteq-admin message|stats` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from kiteq import Binding, Consumer, Message, Producer
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.integration.admin.test_observability import samples, value

KITEQ_ADMIN = str(Path(sys.executable).with_name("kiteq-admin"))
MISSING = "0" * 32


async def kiteq_admin(*args: str) -> subprocess.CompletedProcess[str]:
    """The console script, as a user runs it, while this test's broker keeps serving."""
    return await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [KITEQ_ADMIN, *args], capture_output=True, text=True, timeout=60, env=dict(os.environ)
        )
    )


async def test_a_message_is_traced_and_browsed_and_a_group_that_went_away_shows_its_backlog(
    tmp_path: Path,
) -> None:
    registry = registry_uri(tmp_path)
    log = tmp_path / "broker-delivery.log"
    acking = RecordingListener()
    async with running_broker(tmp_path, server={"delivery_log": str(log)}) as broker:
        url = f"http://{broker.admin_address}"
        # A persistent group binds t/x, then its consumer stops for good: t/x messages wait for it.
        async with Consumer(registry, group="gone", bindings=[Binding.direct("t", "x")], listener=acking):
            await wait_until(lambda: len(broker.router.bindings) == 1, what="gone's binding")
        async with (
            Consumer(
                registry,
                group="g1",
                bindings=[Binding.direct("t", "x"), Binding.direct("u", "x")],
                listener=acking,
            ),
            Producer(registry, group="p", topics=["t", "u"]) as producer,
            httpx.AsyncClient(base_url=url) as admin,
        ):
            await wait_until(lambda: len(broker.router.bindings) == 3, what="g1's bindings")
            kept = [Message("t", "x", f"order {n} héllo".encode()) for n in range(3)]
            binary = Message("t", "x", b"\xff\xfe" * 600)
            done = Message("u", "x", b"done")
            for message in (*kept, binary):
                await producer.send(message)
            shown = await kiteq_admin("--admin", url, "message", "show", kept[0].message_id, "--json")

            await producer.send(done)
            await wait_until(lambda: broker.events.total("finished") == 1, what="the u message finished")
            await wait_until(lambda: len(acking.acked) == 5, what="g1 acks all")
            broker.events.delivery_log.flush()  # type: ignore[union-attr]
            finished = (await admin.get(f"/messages/{done.message_id}")).json()
            detail = (await admin.get(f"/messages/{kept[1].message_id}")).json()
            preview = (await admin.get(f"/messages/{binary.message_id}", params={"preview": "16"})).json()
            missing = await admin.get(f"/messages/{MISSING}")
            bad_state = await admin.get("/messages", params={"state": "lost"})
            stats = (await admin.get("/stats")).json()
            metrics = samples((await admin.get("/metrics")).text)
            listed = await kiteq_admin(
                "--admin", url, "--json", "message", "list", "--topic", "t", "--group", "gone"
            )
            none_dead = await kiteq_admin("--admin", url, "message", "list", "--state", "dead")
            paged = await kiteq_admin(
                "--admin", url, "message", "list", "--state", "committed", "--limit", "2"
            )
            table = await kiteq_admin("--admin", url, "stats")
            not_found = await kiteq_admin("--admin", url, "message", "show", MISSING)

    assert shown.returncode == 0, shown.stderr
    first = json.loads(shown.stdout)
    assert first["state"] == "committed" and first["broker"] == url
    assert first["header"]["topic"] == "t" and first["header"]["producer_group"] == "p"
    assert first["body"] == {
        "bytes": len("order 0 héllo".encode()),
        "truncated": False,
        "encoding": "text",
        "text": "order 0 héllo",
    }
    assert first["groups"]["gone"] == {"routed": True, "delivered": False, "acked": False, "failed": False}

    assert detail["state"] == "committed" and detail["deliver_count"] >= 1
    assert detail["groups"]["g1"]["acked"] and not detail["groups"]["gone"]["acked"]
    # Delivery starts while the store syncs, so `delivered` may be logged before `stored` (durable).
    assert "stored" in {e["event"] for e in detail["events"]}
    assert {"delivered", "acked"} <= {e["event"] for e in detail["events"] if e.get("group") == "g1"}
    assert preview["body"]["encoding"] == "base64" and preview["body"]["truncated"]
    assert preview["body"]["bytes"] == 1200 and len(preview["body"]["text"]) == 24  # 16 bytes in base64

    assert finished["state"] == "finished" and finished["groups"]["g1"]["acked"]
    assert finished["events"][-1]["event"] == "finished"
    assert missing.status_code == 404 and "nor in the whole delivery log" in missing.json()["error"]
    assert bad_state.status_code == 400 and "scheduled" in bad_state.json()["error"]

    gone = stats["groups"]["gone"]
    assert (gone["online"], gone["connections"], gone["backlog"]) == (False, 0, 4)
    assert gone["oldest_waiting_age"] is not None and gone["oldest_waiting_age"] >= 0
    assert [(b["topic"], b["message_type"], b["persistent"], b["backlog"]) for b in gone["bindings"]] == [
        ("t", "x", True, 4)
    ]
    assert stats["groups"]["g1"]["backlog"] == 0, "g1 acked everything; the topic still holds 4 for gone"
    assert stats["topics"]["t"]["backlog"] == 4
    assert value(metrics, "kiteq_group_backlog", group="gone", topic="t") == 4
    assert value(metrics, "kiteq_group_backlog", group="g1", topic="t") == 0

    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert sorted(row["message_id"] for row in page["messages"]) == sorted(
        m.message_id for m in (*kept, binary)
    )
    assert page["cursors"] == {url: None}
    assert none_dead.returncode == 0 and none_dead.stdout.strip() == "no message matches"
    assert paged.returncode == 0, paged.stderr
    assert len(paged.stdout.strip().splitlines()) == 1 + 2, "a header and --limit rows"
    lines = {line.split("  ")[0]: line for line in table.stdout.splitlines()}
    assert "online no backlog 4" in lines["binding gone/t/x"], table.stdout
    assert not_found.returncode == 1 and MISSING in not_found.stderr
