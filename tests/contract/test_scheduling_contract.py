"""The scheduling part of the MessageStore contract: delayed messages (`kiteq.deliverAt`),
commit at a due time, cancel, and the wake-up time the broker sleeps until.

Every store passes it unchanged, as the rest of the contract (conftest.STORE_URIS).
"""

from __future__ import annotations

import time

from protocol.schedule import DELIVER_AT, format_deliver_at
from stores import MessageStore
from tests.contract.test_store_contract import all_pages, new_entity, reopen

STORED_AT = 1_000.0


def scheduled(at: float, *, commit: bool = True, topic: str = "trade") -> object:
    """A message stored at STORED_AT asking to be delivered at `at`, as the broker stores it."""
    next_deliver_at = at if commit else STORED_AT + 5.0  # uncommitted: the tx check time
    return new_entity(
        topic,
        commit=commit,
        properties={DELIVER_AT: format_deliver_at(at)},
        next_deliver_at=next_deliver_at,
    )


async def due_ids(store: MessageStore, now: float) -> set[str]:
    found = await all_pages(lambda after, limit: store.page_due(now, after, limit))
    return {entity.message_id for entity in found}


async def test_a_scheduled_message_is_due_at_its_time_and_not_before(store: MessageStore) -> None:
    later, sooner = scheduled(STORED_AT + 3_600), scheduled(STORED_AT + 60)
    ordinary = new_entity()
    for entity in (later, sooner, ordinary):
        assert await store.save(entity)
    assert await due_ids(store, STORED_AT + 1) == {ordinary.message_id}
    assert await due_ids(store, STORED_AT + 60) == {ordinary.message_id, sooner.message_id}
    assert await due_ids(store, STORED_AT + 3_600) == {
        ordinary.message_id,
        sooner.message_id,
        later.message_id,
    }


async def test_next_due_at_is_never_after_the_earliest_waiting_message(store: MessageStore) -> None:
    now = time.time()  # the file store starts with what was due at its opening in its due sets
    assert await store.next_due_at(now) is None
    for at in (now + 7_200, now + 90.25):
        entity = scheduled(at)
        entity.created_at = now
        assert await store.save(entity)
    await due_ids(store, now)  # the broker pages before it asks
    first = await store.next_due_at(now)
    assert first is not None and now < first <= now + 90.25


async def test_stats_count_scheduled_messages_by_topic_and_hour(store: MessageStore) -> None:
    # Times ahead of the wall clock: MySQL counts what is still ahead (a range of its due index).
    hour = (int(time.time() // 3600) + 2) * 3600
    for at, topic in ((hour + 100, "trade"), (hour + 200, "trade"), (hour + 7_300, "user")):
        entity = scheduled(at, topic=topic)
        entity.created_at = time.time()
        assert await store.save(entity)
    assert await store.save(new_entity("trade"))  # not scheduled
    stats = await store.stats()
    assert stats.scheduled_by_topic == {"trade": 2, "user": 1}
    assert stats.scheduled_by_hour == {hour: 2, hour + 7_200: 1}
    assert stats.backlog_by_topic == {"trade": 3, "user": 1}


async def test_a_recorded_round_ends_being_scheduled(store: MessageStore) -> None:
    entity = scheduled(STORED_AT + 10)
    assert await store.save(entity)
    assert await store.update_delivery(entity.message_id, [], ["g"], 1, STORED_AT + 20)
    assert (await store.stats()).scheduled_by_topic == {}
    assert await store.cancel(entity.message_id) is False
    assert await store.get(entity.message_id) is not None


async def test_cancel_deletes_a_scheduled_message_only(store: MessageStore) -> None:
    waiting, ordinary = scheduled(STORED_AT + 600), new_entity()
    for entity in (waiting, ordinary):
        assert await store.save(entity)
    assert await store.cancel(ordinary.message_id) is False
    assert await store.cancel("f" * 32) is False
    assert await store.cancel(waiting.message_id) is True
    assert await store.get(waiting.message_id) is None
    assert await store.cancel(waiting.message_id) is False
    assert await due_ids(store, STORED_AT + 601) == {ordinary.message_id}
    assert (await store.stats()).scheduled_by_topic == {}


async def test_a_past_deliver_at_is_not_scheduled(store: MessageStore) -> None:
    entity = new_entity(properties={DELIVER_AT: format_deliver_at(STORED_AT - 1)})
    assert await store.save(entity)
    assert (await store.stats()).scheduled_by_topic == {}
    assert await store.cancel(entity.message_id) is False


async def test_commit_makes_a_transactional_message_due_at_the_time_given(store: MessageStore) -> None:
    entity = scheduled(STORED_AT + 300, commit=False)
    assert await store.save(entity)
    assert await store.commit(entity.message_id, due_at=STORED_AT + 300)
    got = await store.get(entity.message_id)
    assert got is not None and got.commit and got.next_deliver_at == STORED_AT + 300
    assert await due_ids(store, STORED_AT + 299) == set()
    assert await due_ids(store, STORED_AT + 300) == {entity.message_id}
    # Committing again changes nothing, the time included.
    assert await store.commit(entity.message_id, due_at=STORED_AT + 900)
    again = await store.get(entity.message_id)
    assert again is not None and again.next_deliver_at == STORED_AT + 300


async def test_an_uncommitted_scheduled_message_may_be_cancelled(store: MessageStore) -> None:
    entity = scheduled(STORED_AT + 300, commit=False)
    assert await store.save(entity)
    assert await store.cancel(entity.message_id) is True
    assert await store.commit(entity.message_id) is False


async def test_schedules_survive_a_reopen(store: MessageStore, store_uri: str) -> None:
    base = time.time()
    waiting, committed_later = scheduled(base + 500), scheduled(base + 800, commit=False)
    delivered = scheduled(base + 50)
    for entity in (waiting, committed_later, delivered):
        entity.created_at = base
        assert await store.save(entity)
    assert await store.commit(committed_later.message_id, due_at=base + 800)
    assert await store.update_delivery(delivered.message_id, ["g"], [], 1, base + 60)
    store = await reopen(store, store_uri)
    try:
        if not store.durable:  # it keeps nothing, schedules included, and says so
            assert (await store.stats()).scheduled_by_topic == {}
            return
        assert (await store.stats()).scheduled_by_topic == {"trade": 2}
        assert await due_ids(store, base + 499) == {delivered.message_id}
        assert await due_ids(store, base + 800) == {
            delivered.message_id,
            waiting.message_id,
            committed_later.message_id,
        }
        assert await store.cancel(waiting.message_id) is True
    finally:
        await store.close()
