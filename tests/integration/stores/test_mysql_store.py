"""MySQL-store behaviour beyond the shared contract, on a real MariaDB master + replica."""

from __future__ import annotations

import uuid

import pytest
import structlog
import trio

from stores import MessageEntity, MessageStore, StoreError, open_store
from stores.mysql import MySQLStore
from tests.contract.test_store_contract import all_pages, new_entity
from tests.services.mariadb import MariaDBPair

pytestmark = pytest.mark.mysql


def ids(entities: list[MessageEntity]) -> set[str]:
    return {entity.message_id for entity in entities}


async def due_ids(store: MessageStore) -> set[str]:
    return ids(await all_pages(lambda after, limit: store.page_due(10_000.0, after, limit), limit=2))


async def uncommitted_ids(store: MessageStore) -> set[str]:
    return ids(await all_pages(lambda after, limit: store.page_uncommitted(10_000.0, after, limit), limit=2))


async def test_each_broker_pages_its_own_rows_and_adopt_moves_them(mysql_store_uri: str) -> None:
    async with (
        open_store(mysql_store_uri, broker="10.0.0.1:13800") as one,
        open_store(mysql_store_uri, broker="10.0.0.2:13800") as two,
    ):
        assert isinstance(two, MySQLStore)
        mine = [new_entity() for _ in range(3)] + [new_entity(commit=False)]
        theirs = [new_entity() for _ in range(2)] + [new_entity(commit=False)]
        for entity in mine:
            await one.save(entity)
        for entity in theirs:
            await two.save(entity)
        assert await due_ids(one) == {e.message_id for e in mine[:3]}
        assert await due_ids(two) == {e.message_id for e in theirs[:2]}
        assert await uncommitted_ids(one) == {mine[3].message_id}
        got = await two.get(mine[0].message_id)
        assert got is not None and got.broker == "10.0.0.1:13800", "ids are global, owners recorded"
        assert (await one.stats()).messages == 4

        assert await two.adopt("10.0.0.1:13800") == 4
        assert await due_ids(one) == set()
        assert await due_ids(two) == {e.message_id for e in mine[:3] + theirs[:2]}
        assert await uncommitted_ids(two) == {mine[3].message_id, theirs[2].message_id}
        assert await two.adopt("10.0.0.1:13800") == 0, "adopting twice is harmless"
        assert await two.adopt("10.0.0.2:13800") == 0, "a broker never adopts itself"
        assert (await two.stats()).messages == 7


async def test_redrive_makes_the_redriving_broker_the_owner(mysql_store_uri: str) -> None:
    async with (
        open_store(mysql_store_uri, broker="gone:1") as gone,
        open_store(mysql_store_uri, broker="live:1") as live,
    ):
        entity = new_entity()
        await gone.save(entity)
        await gone.dead_letter(entity.message_id, "deliver-limit")
        assert [e.message_id for e in (await live.page_dead(None, 10)).items] == [entity.message_id]
        assert await live.redrive(entity.message_id) is True
        assert await due_ids(live) == {entity.message_id}


async def test_values_the_columns_cannot_hold_are_refused(mysql_store_uri: str) -> None:
    async with open_store(mysql_store_uri) as store:
        for bad in (
            new_entity(topic="t" * 256),
            new_entity(message_id="é" * 8),
            new_entity(deliver_limit=1 << 40),
        ):
            with pytest.raises(StoreError, match="cannot be stored"):
                await store.save(bad)
            assert await store.get(bad.message_id) is None
        fine = new_entity(topic="t" * 255, producer_group="g" * 255, properties={"k" * 300: "ü" * 3000})
        assert await store.save(fine) is True
        assert await store.get(fine.message_id) == fine


@pytest.mark.parametrize("value", [0.1, 1e-300, 1.7976931348623157e308, 1_763_770_000.123456, -0.0, 5e-324])
async def test_times_round_trip_exactly(mysql_store_uri: str, value: float) -> None:
    async with open_store(mysql_store_uri) as store:
        entity = new_entity(next_deliver_at=value, created_at=value)
        await store.save(entity)
        assert await store.get(entity.message_id) == entity
        assert await store.update_delivery(entity.message_id, ["a"], [], 1, value) is True
        got = await store.get(entity.message_id)
        assert got is not None and got.next_deliver_at == value


async def test_concurrent_batches_give_each_caller_its_own_answer(mysql_store_uri: str) -> None:
    async with open_store(mysql_store_uri) as store:
        entities = [new_entity() for _ in range(60)]
        twins = [new_entity(message_id=e.message_id) for e in entities[:20]]
        saved: dict[int, bool] = {}

        async def save(number: int, entity: MessageEntity) -> None:
            saved[number] = await store.save(entity)

        async with trio.open_nursery() as nursery:
            for number, entity in enumerate(entities + twins):
                nursery.start_soon(save, number, entity)
        assert sum(saved.values()) == 60, "exactly one of two saves of an id wins"
        for number in range(20):
            assert saved[number] != saved[60 + number]

        unknown = [uuid.uuid4().hex for _ in range(20)]
        updated: dict[str, bool] = {}
        finished: dict[str, bool] = {}

        async def update(message_id: str) -> None:
            updated[message_id] = await store.update_delivery(message_id, ["g"], ["h"], 2, 77.0)

        async def finish(message_id: str) -> None:
            finished[message_id] = await store.finish(message_id)

        async with trio.open_nursery() as nursery:
            for message_id in [e.message_id for e in entities] + unknown:
                nursery.start_soon(update, message_id)
        assert {m for m, ok in updated.items() if ok} == {e.message_id for e in entities}
        got = await store.get(entities[33].message_id)
        assert got is not None and (got.succ_groups, got.fail_groups, got.deliver_count) == (
            ("g",),
            ("h",),
            2,
        )

        async with trio.open_nursery() as nursery:
            for message_id in [e.message_id for e in entities[:30]] + unknown:
                nursery.start_soon(finish, message_id)
        assert {m for m, ok in finished.items() if ok} == {e.message_id for e in entities[:30]}
        assert (await store.stats()).messages == 30
        batches = (await store.stats()).details["batches"]
        assert isinstance(batches, dict) and batches["save"]["largest"] > 1, (
            "concurrent saves share statements"
        )


async def test_cursor_of_another_scan_is_refused(mysql_store_uri: str) -> None:
    async with open_store(mysql_store_uri) as store:
        for _ in range(3):
            await store.save(new_entity())
        page = await store.page_due(10_000.0, None, 1)
        assert page.cursor is not None
        with pytest.raises(StoreError, match="page_dead"):
            await store.page_dead(page.cursor, 1)
        with pytest.raises(StoreError, match="page_due"):
            await store.page_due(10_000.0, "garbage", 1)


async def test_a_master_that_can_lose_acknowledged_saves_is_named_at_start(
    mariadb: MariaDBPair, mysql_store_uri: str
) -> None:
    async with open_store(mysql_store_uri) as durable:
        assert (await durable.stats()).details["durability_weakened"] == [], (
            "the test pair is set up as documented"
        )

    mariadb.master.execute("SET GLOBAL sync_binlog = 0", "SET GLOBAL innodb_flush_log_at_trx_commit = 2")
    try:
        with structlog.testing.capture_logs() as logs:
            async with open_store(mysql_store_uri) as weak:
                assert await weak.save(new_entity()), "a weakened master still takes saves"
                details = (await weak.stats()).details
    finally:
        mariadb.master.execute("SET GLOBAL sync_binlog = 1", "SET GLOBAL innodb_flush_log_at_trx_commit = 1")
    assert details["durability_weakened"] == ["innodb_flush_log_at_trx_commit=2", "sync_binlog=0"]
    warned = {(log["setting"], log["value"]) for log in logs if log["event"] == "mysql.durability_weakened"}
    assert warned == {("innodb_flush_log_at_trx_commit", "2"), ("sync_binlog", "0")}
    assert all(log["log_level"] == "warning" for log in logs if log["event"] == "mysql.durability_weakened")
