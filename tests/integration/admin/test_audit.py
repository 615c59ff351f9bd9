"""Admin mutations leave an audit trail in the broker's own log: what, how many, from where.

A `kiteq-server` process with an admin token and JSON logs; dead letters made by a consumer
that nacks; redrive and purge driven over HTTP as `kiteq-admin` does; the broker's stderr
read back line by line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio

from kiteq import Binding, Consumer, Message, Producer
from tests.helpers import registry_uri, wait_until
from tests.integration.admin.workload import PoisonListener
from tests.procs.broker import BrokerProcess

TOKEN = "audit-s3cret-token"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


def audit_lines(log: Path) -> list[dict[str, Any]]:
    """The broker's `audit.*` events, in order (its log holds other JSON lines and maybe a traceback)."""
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and (event := json.loads(line))["event"].startswith("audit."):
            found.append(event)
    return found


async def dead_letter_count(admin: httpx.AsyncClient) -> int:
    return len((await admin.get("/dlq")).json())


async def test_redrive_and_purge_are_audited_with_selection_count_and_caller(tmp_path: Path) -> None:
    config = tmp_path / "kiteq.toml"
    config.write_text(f'[server]\nadmin_token = "{TOKEN}"\n')
    registry = registry_uri(tmp_path)
    extra = ("--config", str(config), "--log-format", "json", "--retry-base", "0.05", "--retry-max", "0.1")
    broker = BrokerProcess(tmp_path, registry, store="memory://", extra=extra)
    await broker.start()
    try:
        async with (
            Consumer(registry, group="bad", bindings=[Binding.direct("p", "x")], listener=PoisonListener()),
            Producer(registry, group="shop", topics=["p"]) as producer,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{broker.admin_port}") as admin,
        ):
            await broker.wait_bindings(1)
            sent = await producer.send_many([Message("p", "x", b"poison", deliver_limit=1) for _ in range(3)])
            first = sent[0].message_id
            with trio.fail_after(20):
                while await dead_letter_count(admin) < 3:
                    await trio.sleep(0.05)

            refused = await admin.post("/dlq/purge", json={"all": True})
            assert refused.status_code == 401
            redriven = await admin.post("/dlq/redrive", json={"message_id": first}, headers=AUTHORIZED)
            assert redriven.json() == {"redriven": 1}
            long_topic = "p" * 300
            nothing = await admin.post("/dlq/purge", json={"topic": long_topic}, headers=AUTHORIZED)
            assert nothing.json() == {"purged": 0}
            # The redriven message is nacked again and back among the dead before the purge.
            await wait_until(lambda: len(audit_lines(broker.log)) == 2, what="two audit lines")
            with trio.fail_after(20):
                while await dead_letter_count(admin) < 3:
                    await trio.sleep(0.05)
            purged = await admin.post("/dlq/purge", json={"all": True}, headers=AUTHORIZED)
            assert purged.json() == {"purged": 3}
            await wait_until(lambda: len(audit_lines(broker.log)) == 3, what="the purge's audit line")
    finally:
        assert await broker.stop() == 0

    redrive, purge_none, purge_all = audit_lines(broker.log)
    assert redrive["event"] == "audit.redrive" and redrive["level"] == "info"
    assert redrive["selection"] == {"message_id": repr(first)}
    assert redrive["messages"] == 1
    assert redrive["auth"] == "token"
    assert redrive["client"].startswith("127.0.0.1:") and int(redrive["client"].rpartition(":")[2]) > 0

    assert purge_none["event"] == "audit.purge" and purge_none["messages"] == 0
    # Client text is cut as everywhere in the logs: 128 characters and the length it had.
    assert purge_none["selection"] == {"topic": f"{'p' * 128!r}... (300 characters)"}

    assert purge_all["event"] == "audit.purge"
    assert (purge_all["selection"], purge_all["messages"], purge_all["auth"]) == ("all", 3, "token")
    # The refused purge changed nothing and is not an audited mutation; the token is never logged.
    assert TOKEN not in broker.log.read_text()
