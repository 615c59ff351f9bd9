"""Random operation sequences give the file store the memory store's answers, across reopens.

Tiny segments, a zero-byte cache and a tiny compaction threshold make rotation,
reclamation, disk reads and snapshots happen within a few operations.
"""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import Cmd
from stores import MessageEntity, MessageStore
from stores.file import FileStore
from stores.memory import MemoryStore

IDS = [f"{i:032x}" for i in range(10)]
TIMES = [0.0, 100.0, 500.0, 1_000.0, 5_000.0]
GROUPS = ["a", "b", "c"]

ids = st.sampled_from(IDS)
times = st.sampled_from(TIMES)
group_lists = st.lists(st.sampled_from(GROUPS), max_size=3).map(tuple)
limits = st.integers(1, 4)

entities = st.builds(
    MessageEntity,
    message_id=ids,
    topic=st.sampled_from(["trade", "sms"]),
    message_type=st.sampled_from(["pay", "refund"]),
    producer_group=st.just("order-svc"),
    body=st.binary(max_size=300),
    kind=st.sampled_from([Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE]),
    commit=st.booleans(),
    properties=st.dictionaries(
        st.sampled_from(["k", "é"]),
        st.text(st.characters(exclude_categories=("Cs",)), max_size=5),
        max_size=2,
    ),
    created_at=times,
    deliver_count=st.integers(0, 5),
    next_deliver_at=times,
    succ_groups=group_lists,
    fail_groups=group_lists,
    dead=st.booleans(),
    dead_reason=st.sampled_from(["", "expired"]),
)

operations = st.one_of(
    st.tuples(st.just("save"), entities),
    st.tuples(st.sampled_from(["get", "commit", "rollback", "finish", "redrive", "purge"]), ids),
    st.tuples(st.just("update_delivery"), ids, group_lists, group_lists, st.integers(0, 9), times),
    st.tuples(st.just("dead_letter"), ids, st.sampled_from(["expired", "deliver-limit"])),
    st.tuples(st.just("page_due"), times, limits),
    st.tuples(st.just("page_uncommitted"), times, limits),
    st.tuples(st.just("page_dead"), limits),
    st.tuples(st.just("stats")),
    st.tuples(st.just("reopen")),
)


async def scan(fetch: Any, limit: int) -> list[tuple[list[MessageEntity], bool]]:
    """Every page of a scan: its items and whether it handed out a cursor."""
    pages, cursor = [], None
    while True:
        page = await fetch(cursor, limit)
        pages.append((page.items, page.cursor is not None))
        if page.cursor is None:
            return pages
        cursor = page.cursor


async def perform(store: MessageStore, op: tuple[Any, ...]) -> object:
    name, *args = op
    if name == "save":
        return await store.save(args[0])
    if name == "page_due":
        now, limit = args
        return await scan(lambda after, n: store.page_due(now, after, n), limit)
    if name == "page_uncommitted":
        older_than, limit = args
        return await scan(lambda after, n: store.page_uncommitted(older_than, after, n), limit)
    if name == "page_dead":
        return await scan(store.page_dead, args[0])
    if name == "stats":
        stats = await store.stats()
        return stats.messages, stats.uncommitted, stats.dead, stats.dead_by_reason, stats.backlog_by_topic
    return await getattr(store, name)(*args)


store_options = st.fixed_dictionaries(
    {
        "fsync": st.sampled_from(["never", "never", "batch", "always"]),
        "segment_bytes": st.sampled_from([1024, 2048, 8192]),
        "compact_bytes": st.sampled_from([0, 2048, 1 << 20]),
        "cache_bytes": st.sampled_from([0, 1 << 20]),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operations, min_size=1, max_size=50), options=store_options)
async def test_file_store_answers_like_the_memory_store(
    ops: list[tuple[Any, ...]], options: dict[str, Any]
) -> None:
    model = MemoryStore()
    with tempfile.TemporaryDirectory(prefix="kiteq-model-") as tmp:
        uri = f"file://{tmp}/store"
        store = FileStore.from_uri(uri, **options)
        await store.start()
        try:
            for step, op in enumerate(ops):
                if op[0] == "reopen":
                    await store.close()
                    store = FileStore.from_uri(uri, **options)
                    await store.start()
                    for message_id in IDS:
                        assert await store.get(message_id) == await model.get(message_id), (step, message_id)
                    continue
                expected = await perform(model, op)
                assert await perform(store, op) == expected, (step, op)
        finally:
            await store.close()
