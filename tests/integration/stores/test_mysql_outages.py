"""The MySQL store while real MariaDB servers stop, crash and come back.

The `mariadb` fixture restarts whatever a test stopped, so later tests find both
servers up and replicating.
"""

from __future__ import annotations

import itertools

import pytest
import structlog
import trio

from stores import MessageStore, StoreError, StoreUnavailable, open_store
from stores.mysql.router import CHECK_EVERY
from tests.contract.test_store_contract import all_pages, new_entity
from tests.services.mariadb import MariaDBPair

pytestmark = pytest.mark.mysql


async def scans_on(store: MessageStore) -> object:
    return (await store.stats()).details["scans_on"]


async def due_ids(store: MessageStore) -> set[str]:
    return {
        e.message_id
        for e in await all_pages(lambda after, limit: store.page_due(10_000.0, after, limit), limit=4)
    }


async def wait_for_scans_on(store: MessageStore, source: str, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while await scans_on(store) != source:
            await trio.sleep(CHECK_EVERY / 4)


async def test_scans_move_to_the_master_while_the_replica_is_down(
    mariadb: MariaDBPair, mysql_store_uri: str
) -> None:
    with structlog.testing.capture_logs() as logs:
        async with open_store(mysql_store_uri) as store:
            saved = {e.message_id for e in [new_entity() for _ in range(10)] if await store.save(e)}
            assert await due_ids(store) == saved
            assert await scans_on(store) == "replica"

            await trio.to_thread.run_sync(mariadb.replica.stop)
            await trio.sleep(CHECK_EVERY)
            assert await due_ids(store) == saved, "scans keep working on the master"
            assert await scans_on(store) == "master"
            later = new_entity()
            await store.save(later)
            saved.add(later.message_id)

            await trio.to_thread.run_sync(mariadb.replica.start)
            await wait_for_scans_on(store, "replica")
            assert await due_ids(store) == saved, "the replica caught up with what was written meanwhile"
    switches = [entry["to"] for entry in logs if entry["event"] == "mysql.scans.switched"]
    assert switches == ["replica", "master", "replica"]


async def test_master_crash_loses_no_acknowledged_save(mariadb: MariaDBPair, mysql_store_uri: str) -> None:
    """SIGKILL the master under 64 saving tasks: every True is stored, every failure is typed."""
    outcomes: dict[str, bool | BaseException] = {}
    failure_seconds: list[float] = []
    entities = (new_entity() for _ in itertools.count())
    async with open_store(mysql_store_uri, timeout=2.0) as store:

        async def saver(stop: trio.Event) -> None:
            while not stop.is_set():
                entity = next(entities)
                started = trio.current_time()
                try:
                    outcomes[entity.message_id] = await store.save(entity)
                except StoreError as exc:
                    outcomes[entity.message_id] = exc
                    failure_seconds.append(trio.current_time() - started)
                    await trio.sleep(0.05)

        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(saver, stop)
            await trio.sleep(1.0)
            await trio.to_thread.run_sync(mariadb.master.kill)
            await trio.sleep(1.0)
            down = new_entity()
            with trio.fail_after(3.0), pytest.raises(StoreUnavailable):
                await store.save(down)
            with pytest.raises(StoreUnavailable):
                await store.get(down.message_id)
            await trio.to_thread.run_sync(mariadb.master.start)
            await trio.sleep(1.0)
            stop.set()

        acked = [message_id for message_id, outcome in outcomes.items() if outcome is True]
        failures = [outcome for outcome in outcomes.values() if not isinstance(outcome, bool)]
        assert len(acked) > 100 and failures, (len(acked), len(failures))
        assert all(isinstance(failure, StoreUnavailable) for failure in failures), {type(f) for f in failures}
        assert False not in outcomes.values(), "no id was saved twice"
        assert max(failure_seconds) <= 3.0, "failures are bounded by the 2 s store timeout"

        after = new_entity()
        assert await store.save(after) is True, "the same store recovers by itself"
        for message_id in acked:
            assert await store.get(message_id) is not None, f"acknowledged {message_id} lost"
        stored = (await store.stats()).messages
        assert len(acked) + 1 <= stored <= len(outcomes) + 1


async def test_hung_master_fails_calls_within_the_timeout(mariadb: MariaDBPair, mysql_store_uri: str) -> None:
    async with open_store(mysql_store_uri, timeout=1.0) as store:
        before = new_entity()
        assert await store.save(before) is True
        mariadb.master.pause()
        try:
            calls = [
                lambda: store.save(new_entity()),
                lambda: store.get(before.message_id),
                lambda: store.commit(before.message_id),
            ]
            for call in calls:
                started = trio.current_time()
                with pytest.raises(StoreUnavailable, match="did not"):
                    await call()
                assert trio.current_time() - started < 2.0, (
                    "bounded by the 1 s timeout (plus scheduling on a busy box)"
                )
        finally:
            mariadb.master.resume()
        after = new_entity()
        assert await store.save(after) is True, "cancelled queries left the pool usable"
        assert await store.get(before.message_id) == before
