"""The MessageStore contract, written against the interface only.

Every store passes this module unchanged (see conftest.STORE_URIS). Tests that
reopen the store check durability and are skipped for stores that promise none.
"""

from __future__ import annotations

import uuid

import trio

from protocol import Cmd
from stores import DeadLetter, DeliveryUpdate, MessageEntity, MessageStore, Stage, StoreStats, open_store


def new_entity(
    topic: str = "trade", message_type: str = "pay-succ", *, commit: bool = True, **fields: object
) -> MessageEntity:
    entity = MessageEntity(
        message_id=uuid.uuid4().hex,
        topic=topic,
        message_type=message_type,
        producer_group="order-svc",
        body=b"body-" + uuid.uuid4().bytes,
        commit=commit,
        created_at=1_000.0,
        next_deliver_at=1_000.0,
    )
    for name, value in fields.items():
        setattr(entity, name, value)
    return entity


async def all_pages(fetch, limit: int = 3) -> list[MessageEntity]:
    items, cursor, seen_cursors = [], None, set()
    while True:
        page = await fetch(cursor, limit)
        assert len(page.items) <= limit
        items.extend(page.items)
        if page.cursor is None:
            return items
        assert page.cursor not in seen_cursors, "a cursor must advance"
        seen_cursors.add(page.cursor)
        cursor = page.cursor


async def reopen(store: MessageStore, uri: str) -> MessageStore:
    await store.close()
    reopened = open_store(uri)
    await reopened.start()
    return reopened


async def test_save_then_get_returns_every_field(store: MessageStore) -> None:
    entity = new_entity(
        expired_time=2_000_000_000,
        deliver_limit=7,
        properties={"k": "v", "ключ": "значение"},
        create_time=123,
        snappy=True,
        kind=Cmd.STRING_MESSAGE,
        body="héllo".encode(),
    )
    assert await store.save(entity) is True
    got = await store.get(entity.message_id)
    assert got == entity


async def test_save_is_idempotent_by_message_id(store: MessageStore) -> None:
    entity = new_entity()
    assert await store.save(entity) is True
    twin = new_entity()
    twin.message_id = entity.message_id
    assert await store.save(twin) is False
    got = await store.get(entity.message_id)
    assert got is not None and got.body == entity.body


async def test_get_unknown_is_none(store: MessageStore) -> None:
    assert await store.get(uuid.uuid4().hex) is None


async def test_paged_entities_are_complete(store: MessageStore) -> None:
    """The broker delivers straight from a page: every field, the body included."""
    due, pending, dead = new_entity(), new_entity(commit=False), new_entity()
    for entity in (due, pending, dead):
        await store.save(entity)
    assert await store.dead_letter(dead.message_id, "expired") is True
    assert (await store.page_due(10_000.0, None, 10)).items == [due]
    assert (await store.page_uncommitted(10_000.0, None, 10)).items == [pending]
    [paged_dead] = (await store.page_dead(None, 10)).items
    assert (paged_dead.body, paged_dead.properties) == (dead.body, dead.properties)


async def test_commit_makes_uncommitted_due(store: MessageStore) -> None:
    entity = new_entity(commit=False, deliver_count=4)
    await store.save(entity)
    assert (await store.page_due(10_000.0, None, 10)).items == []
    assert await store.commit(entity.message_id) is True
    got = await store.get(entity.message_id)
    assert got is not None and got.commit and got.deliver_count == 0
    due = await store.page_due(10_000.0, None, 10)
    assert [e.message_id for e in due.items] == [entity.message_id]
    assert await store.commit(entity.message_id) is True, "committing twice is harmless"
    assert await store.commit(uuid.uuid4().hex) is False


async def test_rollback_deletes_and_blocks_later_commit(store: MessageStore) -> None:
    entity = new_entity(commit=False)
    await store.save(entity)
    assert await store.rollback(entity.message_id) is True
    assert await store.get(entity.message_id) is None
    assert await store.commit(entity.message_id) is False
    assert await store.rollback(entity.message_id) is False


async def test_rollback_of_committed_message_is_refused(store: MessageStore) -> None:
    entity = new_entity(commit=True)
    await store.save(entity)
    assert await store.rollback(entity.message_id) is False
    assert await store.get(entity.message_id) is not None


async def test_update_delivery_records_state(store: MessageStore) -> None:
    entity = new_entity()
    await store.save(entity)
    assert await store.update_delivery(entity.message_id, ["a", "b"], ["c"], 3, 5_000.0) is True
    got = await store.get(entity.message_id)
    assert got is not None
    assert set(got.succ_groups) == {"a", "b"}
    assert list(got.fail_groups) == ["c"]
    assert got.deliver_count == 3
    assert got.next_deliver_at == 5_000.0
    assert await store.update_delivery(uuid.uuid4().hex, [], [], 1, 1.0) is False


async def test_update_delivery_many_answers_each_update_like_update_delivery(store: MessageStore) -> None:
    retried, reoffered = new_entity(), new_entity()
    for entity in (retried, reoffered):
        await store.save(entity)
    answers = await store.update_delivery_many(
        [
            DeliveryUpdate(retried.message_id, ("a",), ("b",), 2, 1_234.5),
            DeliveryUpdate(uuid.uuid4().hex, (), (), 1, 1.0),
            DeliveryUpdate(reoffered.message_id, ("a", "c"), (), 1, 99.0),
        ]
    )
    assert answers == [True, False, True]
    states = []
    for entity in (retried, reoffered):
        got = await store.get(entity.message_id)
        assert got is not None
        states.append((set(got.succ_groups), list(got.fail_groups), got.deliver_count, got.next_deliver_at))
    assert states == [({"a"}, ["b"], 2, 1_234.5), ({"a", "c"}, [], 1, 99.0)]
    due = await all_pages(lambda after, limit: store.page_due(100.0, after, limit))
    assert [e.message_id for e in due] == [reoffered.message_id], "each due at its own time"
    assert await store.update_delivery_many([]) == []


async def test_page_due_respects_time_state_and_limit(store: MessageStore) -> None:
    due = [new_entity(next_deliver_at=100.0 + i) for i in range(7)]
    later = new_entity(next_deliver_at=9_999.0)
    uncommitted = new_entity(commit=False, next_deliver_at=0.0)
    dead = new_entity(next_deliver_at=0.0)
    for entity in [*due, later, uncommitted, dead]:
        await store.save(entity)
    await store.dead_letter(dead.message_id, "expired")
    items = await all_pages(lambda after, limit: store.page_due(500.0, after, limit))
    assert sorted(e.message_id for e in items) == sorted(e.message_id for e in due)
    finished = due[0]
    await store.finish(finished.message_id)
    items = await all_pages(lambda after, limit: store.page_due(500.0, after, limit))
    assert finished.message_id not in {e.message_id for e in items}
    assert len(items) == 6


async def test_page_due_passes_over_skipped_ids(store: MessageStore) -> None:
    due = [new_entity(next_deliver_at=100.0 + i) for i in range(5)]
    for entity in due:
        await store.save(entity)
    on_their_way = {due[1].message_id, due[3].message_id}
    items = await all_pages(lambda after, limit: store.page_due(500.0, after, limit, on_their_way), limit=2)
    assert sorted(e.message_id for e in items) == sorted(
        e.message_id for e in due if e.message_id not in on_their_way
    )


async def test_dead_letters_record_their_final_deliver_count_groups_and_time(store: MessageStore) -> None:
    first, second = new_entity(next_deliver_at=0.0), new_entity(next_deliver_at=0.0)
    for entity in (first, second):
        await store.save(entity)
    letters = [
        DeadLetter(first.message_id, "deliver-limit", 3, ("a",), ("b",), 1234.5),
        DeadLetter(second.message_id, "expired", 1, (), ("b",), 1235.0),
        DeadLetter("0" * 32, "expired", 1, (), (), 1235.0),
    ]
    assert await store.dead_letter_many(letters) == [True, True, False]
    dead = await store.get(first.message_id)
    assert dead is not None and dead.dead and dead.dead_reason == "deliver-limit"
    assert (dead.deliver_count, dead.succ_groups, dead.fail_groups, dead.next_deliver_at) == (
        3,
        ("a",),
        ("b",),
        1234.5,
    )
    listed = await all_pages(lambda after, limit: store.page_dead(after, limit))
    assert sorted(e.message_id for e in listed) == sorted([first.message_id, second.message_id])
    assert (await store.page_due(10_000.0, None, 10)).items == []


async def test_page_due_passes_over_parked_topics(store: MessageStore) -> None:
    """A parked topic's messages (nobody to deliver them to) are not paged until it is unparked."""
    served = [new_entity(topic="served", next_deliver_at=100.0 + i) for i in range(4)]
    parked = [new_entity(topic="offline", next_deliver_at=100.0 + i) for i in range(6)]
    for entity in [*served, *parked]:
        await store.save(entity)
    items = await all_pages(
        lambda after, limit: store.page_due(500.0, after, limit, parked={"offline"}), limit=2
    )
    assert sorted(e.message_id for e in items) == sorted(e.message_id for e in served)
    items = await all_pages(lambda after, limit: store.page_due(500.0, after, limit), limit=3)
    assert len(items) == 10, "unparked, every due message is paged again"


async def test_page_uncommitted_by_age(store: MessageStore) -> None:
    old = [new_entity(commit=False, created_at=100.0) for _ in range(5)]
    young = new_entity(commit=False, created_at=900.0)
    committed = new_entity(commit=True, created_at=100.0)
    for entity in [*old, young, committed]:
        await store.save(entity)
    items = await all_pages(lambda after, limit: store.page_uncommitted(500.0, after, limit), limit=2)
    assert sorted(e.message_id for e in items) == sorted(e.message_id for e in old)


async def test_save_many_answers_each_message_like_save(store: MessageStore) -> None:
    stored = new_entity()
    await store.save(stored)
    fresh = [new_entity() for _ in range(3)]
    twin = new_entity()
    twin.message_id = fresh[0].message_id
    answers = await store.save_many([fresh[0], stored, fresh[1], twin, fresh[2]])
    assert answers == [True, False, True, False, True]
    for entity in fresh:
        assert await store.get(entity.message_id) == entity
    assert await store.save_many([]) == []


async def test_finish_many_answers_each_id_like_finish(store: MessageStore) -> None:
    kept, *done = [new_entity() for _ in range(3)]
    for entity in [kept, *done]:
        await store.save(entity)
    unknown = uuid.uuid4().hex
    answers = await store.finish_many([done[0].message_id, unknown, done[1].message_id])
    assert answers == [True, False, True]
    assert [await store.get(e.message_id) for e in done] == [None, None]
    assert await store.get(kept.message_id) == kept


async def test_finish_forgets(store: MessageStore) -> None:
    entity = new_entity()
    await store.save(entity)
    assert await store.finish(entity.message_id) is True
    assert await store.get(entity.message_id) is None
    assert await store.finish(entity.message_id) is False


async def test_dead_letter_redrive_purge(store: MessageStore) -> None:
    entity = new_entity(commit=False, deliver_count=15)
    other = new_entity()
    await store.save(entity)
    await store.save(other)
    assert await store.dead_letter(entity.message_id, "tx-unresolved") is True
    assert await store.dead_letter(other.message_id, "expired") is True
    dead = await all_pages(store.page_dead, limit=1)
    assert {(e.message_id, e.dead_reason) for e in dead} == {
        (entity.message_id, "tx-unresolved"),
        (other.message_id, "expired"),
    }
    assert (await store.page_due(10_000.0, None, 10)).items == []
    stats = await store.stats()
    assert stats.dead == 2 and stats.dead_by_reason == {"tx-unresolved": 1, "expired": 1}

    assert await store.redrive(entity.message_id) is True
    got = await store.get(entity.message_id)
    assert got is not None and not got.dead and got.commit and got.deliver_count == 0
    assert [e.message_id for e in (await store.page_due(10_000.0, None, 10)).items] == [entity.message_id]
    assert await store.redrive(entity.message_id) is False, "only dead letters are redriven"

    assert await store.purge(entity.message_id) is False, "only dead letters are purged"
    assert await store.purge(other.message_id) is True
    assert await store.get(other.message_id) is None
    assert (await store.page_dead(None, 10)).items == []


async def test_stats_counts(store: MessageStore) -> None:
    for _ in range(3):
        await store.save(new_entity(topic="a"))
    await store.save(new_entity(topic="b"))
    await store.save(new_entity(topic="b", commit=False))
    stats = await store.stats()
    assert stats.messages == 5
    assert stats.uncommitted == 1
    assert stats.dead == 0
    assert stats.backlog_by_topic == {"a": 3, "b": 1}


def waiting_counts(stats: StoreStats) -> dict[tuple[str, tuple[str, ...]], int]:
    return {(row.topic, row.acked): row.messages for row in stats.waiting}


def oldest(stats: StoreStats, topic: str, acked: tuple[str, ...]) -> float:
    (row,) = (row for row in stats.waiting if (row.topic, row.acked) == (topic, acked))
    return row.oldest


async def test_stats_count_waiting_messages_by_the_groups_that_acked_them(
    store: MessageStore, store_uri: str
) -> None:
    fresh = new_entity(topic="a", created_at=1_000.25)
    old = new_entity(topic="a", created_at=900.5)
    acked_ab, acked_ba = new_entity(topic="a"), new_entity(topic="a")
    failed = new_entity(topic="b", created_at=950.0)
    dead, uncommitted = new_entity(topic="b"), new_entity(topic="b", commit=False)
    for entity in (fresh, old, acked_ab, acked_ba, failed, dead, uncommitted):
        await store.save(entity)
    await store.update_delivery(acked_ab.message_id, ["g1", "g2"], [], 1, 2_000.0)
    await store.update_delivery(acked_ba.message_id, ["g2", "g1"], ["g3"], 1, 2_000.0)
    await store.update_delivery(failed.message_id, [], ["g1"], 1, 2_000.0)
    await store.dead_letter(dead.message_id, "expired")

    stats = await store.stats()
    assert waiting_counts(stats) == {("a", ()): 2, ("a", ("g1", "g2")): 2, ("b", ()): 1}, (
        "committed, live messages only; the order of groups and the failed ones do not split a key"
    )
    first = oldest(stats, "a", ())
    assert first <= 900.5 < first + 1, "the oldest created_at, to the second"

    await store.finish(old.message_id)
    await store.commit(uncommitted.message_id)
    await store.redrive(dead.message_id)
    assert await store.update_delivery(fresh.message_id, ["g1", "g2"], [], 1, 2_000.0)
    if store.durable:
        store = await reopen(store, store_uri)
    try:
        stats = await store.stats()
        assert waiting_counts(stats) == {("a", ("g1", "g2")): 3, ("b", ()): 3}
        assert oldest(stats, "b", ()) <= 950.0, "a failed group does not make a message any younger"
    finally:
        if store.durable:
            await store.close()


async def test_page_messages_browses_by_topic_and_stage_in_id_order(store: MessageStore) -> None:
    committed = [new_entity(topic="a") for _ in range(4)] + [new_entity(topic="b")]
    uncommitted, dead = new_entity(topic="a", commit=False), new_entity(topic="a")
    for entity in (*committed, uncommitted, dead):
        await store.save(entity)
    await store.dead_letter(dead.message_id, "expired")
    everything = [*committed, uncommitted, dead]

    async def ids(**selection: object) -> list[str]:
        found = await all_pages(lambda after, limit: store.page_messages(after, limit, **selection), limit=2)
        assert all(entity.body for entity in found), "browsed pages carry bodies"
        return [entity.message_id for entity in found]

    assert await ids() == sorted(e.message_id for e in everything)
    assert await ids(topic="a") == sorted(e.message_id for e in everything if e.topic == "a")
    assert await ids(stage=Stage.COMMITTED) == sorted(e.message_id for e in committed)
    assert await ids(topic="a", stage=Stage.COMMITTED) == sorted(e.message_id for e in committed[:4])
    assert await ids(topic="b", stage=Stage.DEAD) == []
    assert await ids(topic="a", stage=Stage.DEAD) == [dead.message_id]
    assert await ids(stage=Stage.UNCOMMITTED) == [uncommitted.message_id]
    assert await ids(topic="nowhere") == []
    (page_of_one,) = (await store.page_messages(None, 1, stage=Stage.DEAD)).items
    assert Stage.of(page_of_one) is Stage.DEAD and page_of_one.dead_reason == "expired"


async def test_state_survives_reopen(store: MessageStore, store_uri: str) -> None:
    if not store.durable:
        await store.save(new_entity())
        store = await reopen(store, store_uri)
        try:
            assert (await store.stats()).messages == 0, "a store that is not durable says so truthfully"
        finally:
            await store.close()
        return
    kept = new_entity()
    delivered = new_entity()
    uncommitted = new_entity(commit=False)
    rolled = new_entity(commit=False)
    finished = new_entity()
    dead = new_entity()
    for entity in [kept, delivered, uncommitted, rolled, finished, dead]:
        await store.save(entity)
    await store.update_delivery(delivered.message_id, ["a"], ["b"], 2, 4_242.0)
    await store.rollback(rolled.message_id)
    await store.finish(finished.message_id)
    await store.dead_letter(dead.message_id, "deliver-limit")
    store = await reopen(store, store_uri)
    try:
        assert await store.get(kept.message_id) == kept
        got = await store.get(delivered.message_id)
        assert got is not None and got.succ_groups == ("a",) and got.deliver_count == 2
        assert got.next_deliver_at == 4_242.0
        got = await store.get(uncommitted.message_id)
        assert got is not None and not got.commit
        assert await store.get(rolled.message_id) is None
        assert await store.get(finished.message_id) is None
        got = await store.get(dead.message_id)
        assert got is not None and got.dead and got.dead_reason == "deliver-limit"
        assert await store.save(kept) is False, "ids stay known after a reopen"
    finally:
        await store.close()


async def test_many_concurrent_saves(store: MessageStore) -> None:
    entities = [new_entity() for _ in range(200)]
    async with trio.open_nursery() as nursery:
        for entity in entities:
            nursery.start_soon(store.save, entity)
    for entity in entities[::17]:
        assert await store.get(entity.message_id) == entity
    assert (await store.stats()).messages == 200


async def test_a_store_that_stages_at_once_never_yields_while_staging(store: MessageStore) -> None:
    """The broker stages in a connection's reader on such a store (`stages_at_once`): a
    checkpoint there would hold up the reader, and its deliveries. Another store stages in
    a task of its own, and may wait."""
    entities = [new_entity() for _ in range(3)]
    if store.stages_at_once:
        staged = None
        with trio.CancelScope() as scope:
            scope.cancel()  # a checkpoint inside would raise Cancelled
            staged = await store.stage_many(entities)
        assert not scope.cancelled_caught and staged is not None
    else:
        staged = await store.stage_many(entities)
    assert staged.saved == [True, True, True]
    await staged.durable()


async def test_staged_messages_are_in_the_state_before_they_are_durable(
    store: MessageStore, store_uri: str
) -> None:
    kept, finished, twin = new_entity(), new_entity(), new_entity()
    twin.message_id = kept.message_id
    staged = await store.stage_many([kept, finished, twin])
    assert staged.saved == [True, True, False], "an id given twice is saved once"
    assert await store.get(kept.message_id) == kept, "readable while it syncs"
    assert await store.finish(finished.message_id), "a round may end before the fsync does"
    await staged.durable()
    if store.durable:
        store = await reopen(store, store_uri)
    try:
        assert await store.get(kept.message_id) == kept
        assert await store.get(finished.message_id) is None
    finally:
        if store.durable:
            await store.close()
