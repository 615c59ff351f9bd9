"""The delivery and tx rules over an injected clock, with fake peers: no sockets, no real time.

Rounds are driven through their transitions table by table; the dispatcher, the
recover loop and the back-scan run on Trio's autojump clock, with the wall clock the
rules read following it (`trio_wall_clock`), so minutes of retries take milliseconds.
The handlers' store-ack is checked against the same parts: on a store with nothing to
sync, a message's delivery goes out before its ack.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from kiteq.config import DeliveryConfig, TxConfig
from kiteq.registry.bindings import Binding
from kiteq.server.acl import Acl
from kiteq.server.cancel import Cancelled, cancel_scheduled
from kiteq.server.clock import WallClock, trio_wall_clock
from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.delivery.lanes import Delivery
from kiteq.server.delivery.recover import (
    DUE_RESOLUTION,
    MAX_IDLE,
    MIN_GAP,
    SUBMIT_BURST,
    RecoverLoop,
    RecoverSignal,
)
from kiteq.server.delivery.rounds import LEASE_FACTOR, Round, Verdict, first_due
from kiteq.server.events import Events
from kiteq.server.groups import GroupTable
from kiteq.server.handlers import Handlers
from kiteq.server.refusals import RefusalLog
from kiteq.server.routing import Router
from kiteq.server.tx.backscan import TxBackscan
from kiteq.server.tx.checks import TxCheck
from protocol import Cmd, Frame, pb
from protocol.schedule import DELIVER_AT, format_deliver_at
from protocol.session import MessageReceived
from protocol.wire import decode_message
from stores import MessageEntity
from stores.base import Staged, nothing_coming
from stores.memory import MemoryStore
from tests.wire import header

NOW = 1_800_000_000.0

# -- rounds ---------------------------------------------------------------------------------


def entity(**fields: object) -> MessageEntity:
    e = MessageEntity(uuid.uuid4().hex, "t", "x", "p", b"body", expired_time=int(NOW) + 3600)
    for key, value in fields.items():
        setattr(e, key, value)
    return e


@pytest.mark.parametrize(
    ("targets", "steps", "entity_fields", "verdict", "succ", "failed", "count"),
    [
        # Every group acked: finished, one more delivery counted.
        (
            {"a", "b"},
            [("offered", "a"), ("offered", "b"), ("ok", "a"), ("ok", "b")],
            {},
            Verdict.FINISH,
            ("a", "b"),
            (),
            1,
        ),
        # One failed: retried for it, the other is remembered as done.
        (
            {"a", "b"},
            [("offered", "a"), ("offered", "b"), ("ok", "a"), ("fail", "b")],
            {},
            Verdict.RETRY,
            ("a",),
            ("b",),
            1,
        ),
        # The last attempt failed: dead-lettered.
        (
            {"a"},
            [("offered", "a"), ("fail", "a")],
            {"deliver_limit": 3, "deliver_count": 2},
            Verdict.DEAD,
            (),
            ("a",),
            3,
        ),
        # Queued, never sent (group went offline), still leased: due again now.
        (
            {"a"},
            [("offered", "a"), ("returned", "a")],
            {"next_deliver_at": NOW + 10},
            Verdict.REOFFER,
            (),
            (),
            1,
        ),
        # A non-persistent group with nobody online is skipped: nothing else owed, finished.
        ({"a"}, [("skipped", "a")], {}, Verdict.FINISH, ("a",), (), 0),
        # Nothing sent, nothing changed, not leased: the store stays as it is.
        ({"a"}, [], {"next_deliver_at": NOW - 1}, Verdict.UNCHANGED, (), (), 0),
        # Past its expiry: dead-lettered whatever happened.
        ({"a"}, [("offered", "a"), ("ok", "a")], {"expired_time": int(NOW) - 1}, Verdict.DEAD, ("a",), (), 1),
    ],
)
def test_round_transitions(
    targets: set[str],
    steps: list[tuple[str, str]],
    entity_fields: dict[str, object],
    verdict: Verdict,
    succ: tuple[str, ...],
    failed: tuple[str, ...],
    count: int,
) -> None:
    round_ = Round.of(entity(**entity_fields), frozenset(targets))
    for step, group in steps:
        if step in ("ok", "fail"):
            round_.record(group, step == "ok", "" if step == "ok" else "nack")
        else:
            getattr(round_, step)(group)
    assert round_.complete
    outcome = round_.outcome(NOW)
    assert (outcome.verdict, outcome.succ_groups, outcome.fail_groups, outcome.deliver_count) == (
        verdict,
        succ,
        failed,
        count,
    )


@pytest.mark.parametrize(("delivering", "due"), [(True, NOW + LEASE_FACTOR * 5.0), (False, NOW)])
def test_a_fresh_message_is_leased_only_while_it_is_delivered(delivering: bool, due: float) -> None:
    assert first_due(NOW, 5.0, delivering) == due


# -- fake peers -----------------------------------------------------------------------------


@dataclass(eq=False)
class FakePeer:
    """A connection as delivery and the back-scan see it; records what it was sent, when."""

    group: str
    warmup_seconds: float = 0.0
    authenticated_at: float = 0.0
    alive: bool = True
    congested: bool = False
    sent: list[tuple[float, Delivery]] = field(default_factory=list)
    asked: list[tuple[float, TxCheck]] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)

    @property
    def inflight(self) -> int:
        return len(self.sent)

    def deliver(self, delivery: Delivery, timeout: float) -> None:
        self.sent.append((trio.current_time(), delivery))
        self._arrive()

    def ask(self, check: TxCheck, timeout: float) -> None:
        self.asked.append((trio.current_time(), check))
        self._arrive()

    def _arrive(self) -> None:
        self.arrived.set()
        self.arrived = trio.Event()


@dataclass
class Parts:
    store: MemoryStore
    dispatcher: Dispatcher
    recover: RecoverLoop
    backscan: TxBackscan
    groups: GroupTable
    events: Events
    clock: WallClock


def wire(delivery: DeliveryConfig, bindings: list[Binding], tx: TxConfig | None = None) -> Parts:
    """Dispatcher, recover loop and back-scan wired as the broker wires them (not started)."""
    clock = trio_wall_clock(NOW)
    store, router, groups, events = MemoryStore(), Router(), GroupTable(), Events()
    router.update(bindings)
    signal = RecoverSignal(clock)
    dispatcher = Dispatcher(
        store,
        router,
        groups,
        delivery,
        events,
        clock=clock,
        on_capacity=signal.wake,
        on_retry=signal.retry_at,
    )
    dispatcher.sync_lanes(bindings)
    recover = RecoverLoop(store, dispatcher, delivery, signal)
    backscan = TxBackscan(store, groups, tx or TxConfig(), events, clock=clock)
    return Parts(store, dispatcher, recover, backscan, groups, events, clock)


@pytest.fixture
async def parts(autojump_clock: trio.testing.MockClock) -> AsyncIterator[Parts]:
    """The parts, running on the autojump clock."""
    wired = wire(
        DeliveryConfig(retry_base=0.2, retry_max=1.0, retry_jitter="none", recover_interval=0.1),
        [Binding.direct("t", "x", group="c")],
        TxConfig(tx_scan_interval=1.0, tx_check_after=2.0, tx_check_max=3),
    )
    async with wired.store, trio.open_nursery() as nursery:
        await nursery.start(wired.dispatcher.run)
        nursery.start_soon(wired.recover.run)
        nursery.start_soon(wired.backscan.run)
        yield wired
        nursery.cancel_scope.cancel()


async def stored(parts: Parts, **fields: object) -> MessageEntity:
    message = entity(created_at=parts.clock(), next_deliver_at=parts.clock(), **fields)
    await parts.store.save(message)
    return message


async def next_delivery(peer: FakePeer, count: int) -> tuple[float, Delivery]:
    while len(peer.sent) < count:
        await peer.arrived.wait()
    return peer.sent[count - 1]


# -- the dispatcher and the recover loop --------------------------------------------------


async def test_a_retry_runs_on_time_however_long_the_loop_idled(
    parts: Parts, autojump_clock: trio.testing.MockClock
) -> None:
    """An idle recover loop waits longer and longer; a scheduled retry must still run on time."""
    peer = FakePeer("c")
    parts.groups.add(peer)
    await trio.sleep(10 * MAX_IDLE)  # empty passes: the loop's idle wait has grown to MAX_IDLE
    message = await stored(parts)
    parts.dispatcher.submit(message)
    first_at, first = await next_delivery(peer, 1)
    first.resolve(False, "nack")
    second_at, second = await next_delivery(peer, 2)
    assert second.round.entity.deliver_count == 1
    assert 0.2 <= second_at - first_at <= 0.2 + DUE_RESOLUTION + MIN_GAP, second_at - first_at
    second.resolve(True)
    while await parts.store.get(message.message_id) is not None:
        await trio.sleep(0.01)
    assert parts.events.total("finished") == 1


async def test_backoff_grows_then_the_message_is_dead_lettered(
    parts: Parts, autojump_clock: trio.testing.MockClock
) -> None:
    peer = FakePeer("c")
    parts.groups.add(peer)
    message = await stored(parts, deliver_limit=4)
    parts.dispatcher.submit(message)
    times = []
    for attempt in range(1, 5):
        at, delivery = await next_delivery(peer, attempt)
        times.append(at)
        delivery.resolve(False, "nack")
    while parts.events.total("dead_lettered") == 0:
        await trio.sleep(0.01)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(times)]
    assert gaps == [0.2, 0.4, 0.8], "retry_base doubling, no jitter"
    dead = await parts.store.get(message.message_id)
    assert dead is not None and dead.dead and dead.dead_reason == "deliver-limit"


async def test_a_persistent_groups_messages_wait_for_it_to_come_online(
    parts: Parts, autojump_clock: trio.testing.MockClock
) -> None:
    message = await stored(parts)
    assert not parts.dispatcher.submit(message), "nobody online: not sent"
    await trio.sleep(60)
    assert parts.events.total("dropped") == 0
    peer = FakePeer("c")
    parts.groups.add(peer)
    parts.recover.signal.wake()  # as the broker does when a connection authenticates
    _, delivery = await next_delivery(peer, 1)
    assert delivery.round.message_id == message.message_id


# -- the back-scan ----------------------------------------------------------------------------


async def test_an_undecided_transaction_is_asked_each_scan_then_dead_lettered(
    parts: Parts, autojump_clock: trio.testing.MockClock
) -> None:
    producer, consumer = FakePeer("p"), FakePeer("c")
    parts.groups.add(producer)
    parts.groups.add(consumer)
    message = await stored(parts, commit=False)
    while len(producer.asked) < 3:
        await producer.arrived.wait()
        producer.asked[-1][1].resolve(True, "unknown")
    gaps = [round(b[0] - a[0]) for a, b in itertools.pairwise(producer.asked)]
    assert gaps == [1, 1], "once per tx_scan_interval"
    while parts.events.total("dead_lettered") == 0:
        await trio.sleep(0.1)
    dead = await parts.store.get(message.message_id)
    assert dead is not None and dead.dead_reason == "tx-unresolved"
    assert consumer.sent == [], "an uncommitted message is never delivered"
    assert parts.backscan.scans >= 3


async def test_no_question_counts_while_no_producer_is_connected(
    parts: Parts, autojump_clock: trio.testing.MockClock
) -> None:
    message = await stored(parts, commit=False)
    await trio.sleep(100)  # a hundred scans with nobody to ask
    assert parts.backscan.scans >= 90
    waiting = await parts.store.get(message.message_id)
    assert waiting is not None and waiting.deliver_count == 0 and not waiting.dead
    assert parts.backscan.waiting == {"p": 1}
    producer = FakePeer("p")
    parts.groups.add(producer)
    connected_at = trio.current_time()
    parts.backscan.producer_connected("p")  # as the broker does when it authenticates
    await producer.arrived.wait()
    assert trio.current_time() - connected_at < 0.01, "asked at once, not at the next interval"
    asked = await parts.store.get(message.message_id)
    assert asked is not None and asked.deliver_count == 1


async def test_an_offline_groups_backlog_is_parked_not_paged(
    parts: Parts, autojump_clock: trio.testing.MockClock
) -> None:
    """While the only group of a topic is offline, its messages are neither submitted nor paged."""
    fresh = [entity(created_at=parts.clock()) for _ in range(50)]
    assert parts.dispatcher.admit(fresh, parts.clock()) == [False] * 50, "nobody to deliver to: not submitted"
    assert all(e.next_deliver_at == parts.clock() for e in fresh), "stored due, under a parked topic"
    await parts.store.save_many(fresh)
    paged: list[str] = []
    page_due = parts.store.page_due

    async def counting_page_due(*args: object, **kwargs: object) -> object:
        page = await page_due(*args, **kwargs)  # type: ignore[arg-type]
        paged.extend(e.message_id for e in page.items)
        return page

    parts.store.page_due = counting_page_due  # type: ignore[method-assign]
    parts.recover.signal.wake()
    passes = parts.recover.passes
    await trio.sleep(300)
    assert parts.recover.passes > passes and paged == [], "passes ran and walked none of the backlog"
    assert parts.dispatcher.parked_topics() == {"t"}
    peer = FakePeer("c")
    parts.groups.add(peer)
    parts.recover.signal.wake()  # as the broker does when a consumer authenticates
    await next_delivery(peer, 50)
    assert {d.round.message_id for _, d in peer.sent} == {e.message_id for e in fresh}
    assert parts.dispatcher.parked_topics() == frozenset()


async def test_a_pass_stops_where_nothing_places_and_the_next_resumes_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A full lane (a slow group) makes a pass cost one unplaceable page, not the whole backlog."""
    # A second, empty lane: not every lane is full, so only the new rule can stop a pass.
    bindings = [Binding.direct("t", "x", group="slow", watermark=1), Binding.direct("u", "x", group="other")]
    wired = wire(DeliveryConfig(lane_capacity=2, recover_page=10), bindings)
    store, dispatcher, recover, groups = wired.store, wired.dispatcher, wired.recover, wired.groups
    groups.add(FakePeer("slow"))  # never answers: its lane fills and stays full
    async with store, trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        await trio.testing.wait_all_tasks_blocked()  # the pumps wait for deliveries
        await store.save_many([entity(created_at=NOW, next_deliver_at=NOW) for _ in range(100)])
        pages: list[object] = []
        page_due = store.page_due

        async def counting(*args: object, **kwargs: object) -> object:
            pages.append(args[1])  # the cursor each page starts after
            return await page_due(*args, **kwargs)  # type: ignore[arg-type]

        store.page_due = counting  # type: ignore[method-assign]
        placed = await recover.run_pass()
        assert placed == 3, (
            "one goes out at once (Lane.take_slot_now), the lane holds two; the rest cannot be placed"
        )
        assert len(pages) == 3, "the third page placed nothing: the pass stopped"
        await recover.run_pass()
        assert pages[3] is not None and pages[3] > pages[2], "the next pass resumed after it"
        nursery.cancel_scope.cancel()


async def test_a_pass_that_resumed_goes_round_to_the_start_and_reads_no_more_than_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A drain's passes resume mid-way; what is due before that point is reached in the same
    pass, not a recover interval later, and a page is never larger than the room left."""
    wired = wire(DeliveryConfig(lane_capacity=4, recover_page=10), [Binding.direct("t", "x", group="c")])
    store, dispatcher, recover = wired.store, wired.dispatcher, wired.recover
    wired.groups.add(FakePeer("c"))
    (lane,) = dispatcher.lanes.values()  # no pump runs: the test takes from the lane itself

    def due(first: int, count: int) -> list[MessageEntity]:
        return [entity(message_id=f"{i:032x}", next_deliver_at=NOW) for i in range(first, first + count)]

    limits: list[int] = []
    page_due = store.page_due

    async def recording(*args: object, **kwargs: object) -> object:
        limits.append(args[2])  # type: ignore[arg-type]
        return await page_due(*args, **kwargs)  # type: ignore[arg-type]

    async def taken(count: int) -> list[str]:
        return [(await lane.next()).round.message_id for _ in range(count)]  # type: ignore[union-attr]

    store.page_due = recording  # type: ignore[method-assign]
    async with store:
        await store.save_many(due(10, 6))
        assert await recover.run_pass() == 4 and limits == [4], "one page, as large as the lane's room"
        assert lane.starved and dispatcher.room(10) == 0, "the offer that filled the lane marks it starved"
        assert await taken(4) == [f"{i:032x}" for i in range(10, 14)]
        await store.save_many(due(0, 2))  # due, and before where the next pass resumes
        assert await recover.run_pass() == 4, "the rest of the range, then round to the start"
        assert await taken(4) == [f"{i:032x}" for i in (14, 15, 0, 1)]
        assert limits[1:] == [4, 2], "each page no larger than the room left"


async def test_a_message_cancelled_while_its_page_is_offered_is_never_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A pass offers its page in bursts, yielding between them; a cancel that completes in
    between withdraws the message from the page the pass already holds."""
    page = 4 * SUBMIT_BURST
    wired = wire(DeliveryConfig(recover_page=page), [Binding.direct("t", "x", group="c")])
    store, dispatcher, recover = wired.store, wired.dispatcher, wired.recover
    peer = FakePeer("c")
    wired.groups.add(peer)
    due = NOW - 5
    scheduled = [
        entity(
            message_id=f"{i:032x}",
            created_at=NOW - 10,
            next_deliver_at=due,
            properties={DELIVER_AT: format_deliver_at(due)},
        )
        for i in range(page)
    ]
    last = scheduled[-1].message_id  # paged last: offered in the page's last burst
    outcomes: list[Cancelled] = []
    async with store, trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        await store.save_many(scheduled)
        page_due = store.page_due

        async def cancel_once_read(*args: object, **kwargs: object) -> object:
            read = await page_due(*args, **kwargs)  # type: ignore[arg-type]
            nursery.start_soon(_cancel, last)  # runs at the pass's first yield
            return read

        async def _cancel(message_id: str) -> None:
            outcomes.append(await cancel_scheduled(store, dispatcher, wired.events, message_id, "p"))

        store.page_due = cancel_once_read  # type: ignore[method-assign]
        await recover.run_pass()
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == [Cancelled(True)], "the cancel came before the message's round"
        sent = {delivery.round.message_id for _, delivery in peer.sent}
        assert len(sent) == page - 1 and last not in sent, "every other message went; the cancelled one never"
        assert await store.get(last) is None
        nursery.cancel_scope.cancel()


# -- the store-ack ------------------------------------------------------------------------


@dataclass
class AckedProducer:
    """A producer's connection as the handlers see it; records how many deliveries the
    consumer had been sent when each store-ack went out."""

    consumer: FakePeer
    peer: str = "producer"
    group: str = "p"
    acks: list[tuple[bool, int]] = field(default_factory=list)
    more_on_its_way: bool = False

    def store_ack(self, opaque: int, message_id: str, stored: bool, feedback: str) -> None:
        self.acks.append((stored, len(self.consumer.sent)))

    def busy(self) -> bool:
        return self.more_on_its_way

    def trickling(self, messages: int) -> bool:
        return messages == 1


def sent_message(opaque: int) -> MessageReceived:
    raw = pb.BytesMessage(header=header("p"), body=b"b").SerializeToString()
    return MessageReceived(opaque, decode_message(Frame(opaque, Cmd.BYTES_MESSAGE, raw)), raw)


async def test_on_a_store_with_nothing_to_sync_a_message_is_delivered_before_it_is_acked(
    parts: Parts,
) -> None:
    consumer = FakePeer("c")
    parts.groups.add(consumer)
    handlers = Handlers(
        parts.store, parts.dispatcher, parts.events, Acl({}), RefusalLog(), address="b", clock=parts.clock
    )
    producer = AckedProducer(consumer)
    await handlers.produce(producer, [sent_message(1)])
    assert producer.acks == [(True, 1)], "acked once its delivery had gone out"


async def test_a_save_asks_its_sender_whether_more_is_on_its_way(parts: Parts) -> None:
    """The file store writes a save on the event loop's thread only while its sender has
    nothing more on its way (docs/file-store.md): the handler hands the store the sender's
    `busy`, for the store to ask at the moment of writing, and whether the read says the
    sender trickles its messages in."""
    asked: list[tuple[bool, bool]] = []
    stage_many = parts.store.stage_many

    async def staged_asking(entities: list[MessageEntity]) -> Staged:
        staged = await stage_many(entities)

        async def durable(*, busy: Callable[[], bool] = nothing_coming, trickling: bool = False) -> None:
            asked.append((busy(), trickling))
            await staged.durable()

        return Staged(staged.saved, durable)

    parts.store.stage_many = staged_asking  # type: ignore[method-assign]
    handlers = Handlers(
        parts.store, parts.dispatcher, parts.events, Acl({}), RefusalLog(), address="b", clock=parts.clock
    )
    producer = AckedProducer(FakePeer("c"))
    await handlers.produce(producer, [sent_message(1)])
    producer.more_on_its_way = True
    await handlers.produce(producer, [sent_message(2)])
    await handlers.produce(producer, [sent_message(3), sent_message(4)])
    # (busy, trickling): the sender's say at the moment of writing, and of the read's size.
    assert asked == [(False, True), (True, True), (True, False)]
    assert [stored for stored, _ in producer.acks] == [True] * 4


# -- a delivery's way out -------------------------------------------------------------------


async def staged_in_one_turn(
    handlers: Handlers, producer: AckedProducer, requests: list[MessageReceived]
) -> None:
    """Stage a read as a connection's reader does, checking that it never yields (the
    memory store stages at once): what was sent by then went out in the read's own turn."""
    read = None
    with trio.CancelScope() as scope:
        scope.cancel()  # a checkpoint inside would raise Cancelled
        read = await handlers.stage(producer, requests)
    assert read is not None and not scope.cancelled_caught


async def test_while_its_lane_is_idle_a_message_goes_out_in_the_turn_it_is_staged() -> None:
    """Handed to the pump, a delivery went out a turn of the event loop later, behind
    everything else ready then; sent by the reader that staged it, it goes at once. Once
    one waits in the lane (here for the watermark), the rest queue behind it, in order."""
    wired = wire(DeliveryConfig(deliver_timeout=5.0), [Binding.direct("t", "x", group="c", watermark=1)])
    consumer = FakePeer("c")
    wired.groups.add(consumer)
    handlers = Handlers(
        wired.store, wired.dispatcher, wired.events, Acl({}), RefusalLog(), address="b", clock=wired.clock
    )
    requests = [sent_message(opaque) for opaque in (1, 2, 3)]
    async with wired.store, trio.open_nursery() as nursery:
        await nursery.start(wired.dispatcher.run)
        await trio.testing.wait_all_tasks_blocked()  # the pump waits for a delivery
        await staged_in_one_turn(handlers, AckedProducer(consumer), requests)
        assert len(consumer.sent) == 1, "the first went at once; the watermark of 1 holds the others"
        await trio.testing.wait_all_tasks_blocked()
        assert len(consumer.sent) == 1, "the pump holds the second until a slot frees"
        for count in (2, 3):
            consumer.sent[count - 2][1].resolve(True)
            await next_delivery(consumer, count)
        nursery.cancel_scope.cancel()
    sent_ids = [delivery.round.entity.message_id for _, delivery in consumer.sent]
    assert sent_ids == [request.message.message_id for request in requests]
