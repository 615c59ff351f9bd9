"""`kiteq-admin message …` with only `--registry`: every broker that registered its admin endpoint
is asked, so a message is found on whichever broker its producer sent it to."""

from __future__ import annotations

import json
from pathlib import Path

from kiteq import Message, Producer
from tests.helpers import registry_uri, running_broker
from tests.integration.admin.test_trace import kiteq_admin

HOUR = 3600.0


async def test_messages_are_traced_listed_and_cancelled_across_the_registrys_brokers(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    # Two brokers on one registry, each serving one topic: a producer sends t1 to the first, t2 to the second.
    async with (
        running_broker(tmp_path, server={"topics": ["t1"]}) as first,
        running_broker(tmp_path, server={"topics": ["t2"]}) as second,
        Producer(registry, group="p", topics=["t1", "t2"]) as producer,
    ):
        urls = {f"http://{first.admin_address}", f"http://{second.admin_address}"}
        # Scheduled an hour ahead: stored, and not delivered while the test runs.
        on_first, on_second = Message("t1", "x", b"one"), Message("t2", "x", b"two")
        await producer.send(on_first, delay=HOUR)
        await producer.send(on_second, delay=HOUR)

        shown = await kiteq_admin("--registry", registry, "message", "show", on_second.message_id, "--json")
        listed = await kiteq_admin("--registry", registry, "message", "list", "--json")
        cancelled = await kiteq_admin("--registry", registry, "message", "cancel", on_second.message_id)
        after = await kiteq_admin("--registry", registry, "message", "list", "--json")

    assert shown.returncode == 0, shown.stderr
    message = json.loads(shown.stdout)
    assert message["broker"] == f"http://{second.admin_address}"
    assert (message["state"], message["header"]["topic"]) == ("scheduled", "t2")

    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert {(row["message_id"], row["broker"]) for row in page["messages"]} == {
        (on_first.message_id, f"http://{first.admin_address}"),
        (on_second.message_id, f"http://{second.admin_address}"),
    }
    assert set(page["cursors"]) == urls, "every registered broker was asked"

    assert cancelled.returncode == 0, cancelled.stderr
    assert f"on http://{second.admin_address}" in cancelled.stdout
    assert after.returncode == 0, after.stderr
    assert [row["message_id"] for row in json.loads(after.stdout)["messages"]] == [on_first.message_id]


async def test_a_registry_without_admin_endpoints_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "registry.json").write_text("{}")
    empty = await kiteq_admin("--registry", registry_uri(tmp_path), "message", "list")
    misspelt = await kiteq_admin("--registry", f"file://{tmp_path}/registry.jsn", "message", "show", "0" * 32)

    assert empty.returncode == 2 and "has registered an admin endpoint" in empty.stderr
    assert "pass --admin URL" in empty.stderr
    assert misspelt.returncode == 2 and "registry.jsn does not exist" in misspelt.stderr
