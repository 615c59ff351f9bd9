"""Validation, routing, backoff, warm-up and round bookkeeping: pure functions, no I/O."""

from __future__ import annotations

import random
import uuid

import pytest
import trio
import trio.testing

from kiteq.client.message import Message
from kiteq.config import DeliveryConfig
from kiteq.registry.bindings import Binding, BindingError, check_conflicts
from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.delivery.lanes import Delivery, Lane
from kiteq.server.delivery.retry import backoff_delay
from kiteq.server.delivery.rounds import Round, Verdict
from kiteq.server.events import Events
from kiteq.server.groups import WARMUP_FLOOR, GroupTable, warmup_weight
from kiteq.server.routing import Router
from kiteq.server.validate import MAX_TTL_SECONDS, InvalidMessage, validate_message
from protocol import Cmd, Frame
from protocol.commands import BODY_TYPES
from protocol.wire import WireMessage, decode_message
from stores import MessageEntity
from stores.entity import entity_from_wire
from stores.memory import MemoryStore
from tests.helpers import start_waiting

NOW = 1_800_000_000.0


def entity(**fields: object) -> MessageEntity:
    e = MessageEntity(uuid.uuid4().hex, "trade", "pay-succ", "order-svc", b"x")
    for k, v in fields.items():
        setattr(e, k, v)
    return e


def test_validation_normalises_like_kiteq() -> None:
    e = entity(deliver_limit=0, expired_time=-1)
    validate_message(e, NOW)
    assert e.deliver_limit == 100
    assert e.expired_time == int(NOW) + MAX_TTL_SECONDS
    assert e.create_time == int(NOW)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"message_id": "not-hex"}, "Invalid MessageId"),
        ({"topic": ""}, "topic must not be empty"),
        ({"message_type": "x" * 300}, "messageType is longer"),
        ({"expired_time": int(NOW) - 5}, "Expired Message"),
        ({"fly": True, "commit": False}, "FLY MUST BE COMMITTED"),
        ({"properties": {str(i): "v" for i in range(100)}}, "more than 64 properties"),
    ],
)
def test_validation_refusals(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        validate_message(entity(**fields), NOW)


def test_routing_direct_regex_fanout_one_binding_per_group() -> None:
    router = Router()
    router.update(
        [
            Binding.direct("trade", "pay-succ", group="sms"),
            Binding.regex("trade", "pay-.*", group="audit"),
            Binding.regex("trade", "pay", group="strict"),
            Binding.fanout("trade", group="all"),
            Binding.direct("other", "pay-succ", group="elsewhere"),
        ]
    )
    assert {b.group for b in router.route("trade", "pay-succ")} == {"sms", "audit", "all"}
    assert {b.group for b in router.route("trade", "refund")} == {"all"}
    assert {b.group for b in router.route("trade", "pay")} == {"strict", "all"}, "regex is a full match"
    assert router.groups("trade", "pay-succ") == frozenset({"sms", "audit", "all"})
    router.update([])
    assert router.route("trade", "pay-succ") == ()
    assert router.groups("trade", "pay-succ") == frozenset(), "an update drops the cached groups too"


def test_binding_conflicts() -> None:
    existing = [Binding.direct("t", "a", group="g")]
    with pytest.raises(BindingError, match="overlaps"):
        check_conflicts(existing, Binding.regex("t", "a|b", group="g"))
    with pytest.raises(BindingError):
        check_conflicts(existing, Binding.fanout("t", group="g"))
    check_conflicts(existing, Binding.direct("t", "b", group="g"))
    check_conflicts(existing, Binding.fanout("t", group="other"))


def test_backoff_doubles_to_the_cap_and_full_jitter_stays_below() -> None:
    assert [backoff_delay(n, 1.0, 300.0, "none") for n in (1, 2, 3, 4, 10, 50)] == [1, 2, 4, 8, 300, 300]
    rng = random.Random(1)
    samples = [backoff_delay(4, 1.0, 300.0, "full", rng) for _ in range(1000)]
    assert min(samples) >= 0 and max(samples) <= 8
    assert 3 < sum(samples) / len(samples) < 5


class FakePeer:
    """A stand-in for a connection in a pure selection test (no I/O involved)."""

    def __init__(self, group: str, inflight: int = 0, warmup: float = 0.0, at: float = NOW) -> None:
        self.group, self.inflight, self.warmup_seconds, self.authenticated_at = group, inflight, warmup, at
        self.alive = True
        self.congested = False


def test_warmup_weight_ramps_linearly_from_the_floor() -> None:
    peer = FakePeer("g", warmup=10.0)
    assert warmup_weight(peer, NOW) == WARMUP_FLOOR
    assert warmup_weight(peer, NOW + 5) == pytest.approx(0.5)
    assert warmup_weight(peer, NOW + 20) == 1.0


def test_pick_prefers_least_loaded_and_discounts_warming_peers() -> None:
    table = GroupTable(random.Random(3))
    busy, idle = FakePeer("g", inflight=5), FakePeer("g", inflight=1)
    table.add(busy)
    table.add(idle)
    assert table.pick("g", NOW) is idle
    warming = FakePeer("g", inflight=0, warmup=100.0, at=NOW)
    table.add(warming)
    picks = [table.pick("g", NOW) for _ in range(2000)]
    share = picks.count(warming) / len(picks)
    assert 0.05 < share < 0.15, f"a warming peer at the 10% floor got {share:.0%} of the picks"
    assert table.pick("g", NOW + 100) is warming, "once warm, the idle peer wins"
    idle.alive = busy.alive = False
    assert table.pick("g", NOW) is warming, "the only live peer is picked even while warming"
    assert table.pick("nobody", NOW) is None


@pytest.mark.parametrize("kind", [Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE])
def test_a_fresh_delivery_reads_as_if_its_header_were_rebuilt(kind: Cmd) -> None:
    """The producer's bytes plus a header update parse to the same message as a full re-encode."""
    body: bytes | str = "payload" if kind is Cmd.STRING_MESSAGE else b"payload"
    sent = Message(
        "trade", "pay-succ", body, group="order-svc", properties={"k": "v"}, expired_time=-1, deliver_limit=0
    ).encode()
    produced = decode_message(Frame(1, kind, sent))
    e = entity_from_wire(produced)
    validate_message(e, NOW)
    assert e.expired_time != produced.expired_time, "the broker normalised a field the bytes still hold"
    fast, slow = Round.of(e, frozenset({"a"}), sent), Round.of(e, frozenset({"a"}))
    assert fast.body != slow.body, "the fast path did not send the producer's bytes"
    fast_wire, slow_wire = BODY_TYPES[kind](), BODY_TYPES[kind]()
    fast_wire.ParseFromString(fast.body)
    slow_wire.ParseFromString(slow.body)
    assert fast_wire == slow_wire
    received = Message.from_wire(decode_message(Frame(2, kind, fast.body)))
    assert (received.deliver_count, received.expired_time, received.deliver_limit) == (1, e.expired_time, 100)
    assert received.properties == {"k": "v"} and received.body == body


@pytest.mark.parametrize("kind", [Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE])
def test_every_header_field_reaches_the_entity_and_the_consumer_by_name(kind: Cmd) -> None:
    """entity_from_wire and Message.from_header pass their fields positionally: pin the order."""
    body: bytes | str = "text" if kind is Cmd.STRING_MESSAGE else b"bytes"
    sent = Message(
        "trade",
        "pay-succ",
        body,
        message_id="0123456789abcdef0123456789abcdef",
        properties={"k": "v", "kiteq.deliverCount": "3"},
        expired_time=1_900_000_001,
        deliver_limit=7,
        fly=True,
        commit=False,
        group="order-svc",
        create_time=1_800_000_002,
        snappy=True,
    )
    header = sent.header()
    e = entity_from_wire(received_by_the_broker(sent))
    assert (e.message_id, e.topic, e.message_type, e.producer_group) == (
        header.messageId,
        header.topic,
        header.messageType,
        header.groupId,
    )
    assert (e.kind, e.body) == (kind, body.encode() if isinstance(body, str) else body)
    assert (e.expired_time, e.deliver_limit, e.commit, e.fly, e.create_time, e.snappy) == (
        1_900_000_001,
        7,
        False,
        True,
        1_800_000_002,
        True,
    )
    assert e.properties == {"k": "v", "kiteq.deliverCount": "3"}
    assert (e.created_at, e.deliver_count, e.succ_groups, e.dead, e.broker) == (0.0, 0, (), False, "")
    received = Message.from_wire(decode_message(Frame(2, kind, e.wire_bytes())))
    assert received.deliver_count == 3 and received.properties == {"k": "v"}
    assert received.ttl is None
    same = ("topic", "message_type", "body", "message_id", "expired_time", "deliver_limit", "fly", "commit")
    for name in (*same, "group", "create_time", "snappy"):
        assert getattr(received, name) == getattr(sent, name), name
    sent.properties = {}
    assert entity_from_wire(received_by_the_broker(sent)).properties == {}


def received_by_the_broker(sent: Message) -> WireMessage:
    return decode_message(Frame(1, sent.cmd, sent.encode()))


def test_round_outcomes() -> None:
    e = entity(deliver_count=0, deliver_limit=3, expired_time=int(NOW) + 100)
    r = Round.of(e, frozenset({"a", "b"}))
    r.pending = {"a", "b"}
    r.dispatched = True
    r.record("a", True)
    r.record("b", False, "nack")
    out = r.outcome(NOW)
    assert (out.verdict, out.succ_groups, out.fail_groups, out.deliver_count) == (
        Verdict.RETRY,
        ("a",),
        ("b",),
        1,
    )
    e.deliver_count = 2
    assert Round.of(e, frozenset({"b"})).outcome(NOW).verdict is Verdict.UNCHANGED
    r2 = Round.of(e, frozenset({"b"}))
    r2.dispatched = True
    r2.record("b", False)
    assert r2.outcome(NOW).verdict is Verdict.DEAD and r2.outcome(NOW).reason == "deliver-limit"
    r3 = Round.of(e, frozenset({"b"}))
    r3.record("b", True)
    assert r3.outcome(NOW).verdict is Verdict.FINISH
    assert r3.outcome(NOW + 1000).reason == "expired"
    assert Round.of(e, frozenset()).outcome(NOW).reason == "no-binding"


def test_admission_reserves_lane_room_for_committed_messages_in_order() -> None:
    bindings = [Binding.direct("trade", "pay-succ", group="sms"), Binding.fanout("trade", group="all")]
    router = Router()
    router.update(bindings)
    online = GroupTable()
    for group in ("sms", "all"):
        online.add(FakePeer(group))  # type: ignore[arg-type]
    dispatcher = Dispatcher(
        MemoryStore(),
        router,
        online,
        DeliveryConfig(lane_capacity=2, deliver_timeout=5.0),
        Events(),
        clock=lambda: NOW,
        on_capacity=lambda: None,
        on_retry=lambda when: None,
    )
    dispatcher.sync_lanes(bindings)
    fresh = [
        entity(),
        entity(commit=False),
        entity(message_type="refund"),
        entity(),
        entity(message_type="refund"),
    ]
    assert dispatcher.admit(fresh, NOW) == [True, True, True, True, False], (
        "the fanout lane holds two; the uncommitted message takes no room; the fourth still goes to"
        " sms, whose lane has room (all stays owed it); the fifth has no lane with room"
    )
    assert [e.next_deliver_at for e in fresh] == [NOW + 10.0] * 4 + [NOW], (
        "leased while on its way; due at once when it waits in the store"
    )
    starved = {lane.group for lane in dispatcher.lanes.values() if lane.starved}
    assert starved == {"all"}


@pytest.mark.parametrize(
    ("capacity", "accepted", "starved"),
    [
        (3, [True, True], False),  # room left: the store owes it nothing yet
        (2, [True, True], True),  # the second offer fills it: wake the recover loop when it frees
        (1, [True, False], True),  # the second is refused
    ],
)
def test_a_lane_is_starved_once_an_offer_fills_it_or_is_refused(
    capacity: int, accepted: list[bool], starved: bool
) -> None:
    lane = Lane(Binding.direct("t", "x", group="g"), capacity=capacity)
    round_ = Round.of(MessageEntity(uuid.uuid4().hex, "t", "x", "p", b"body"), frozenset({"g"}))
    offers = [lane.offer(Delivery(round_, lane, "g", lambda *_: None)) for _ in accepted]
    assert offers == accepted and lane.starved is starved
    assert lane.room == capacity - sum(accepted)


@pytest.mark.parametrize(
    ("pump_waits", "queued", "inflight", "closed", "skips"),
    [
        (True, 0, 0, False, True),  # what the pump would send next, sent at once
        (True, 0, 1, False, True),  # a slot still free under the watermark of 2
        (False, 0, 0, False, False),  # the pump holds a delivery (for a slot, a peer): behind it
        (True, 1, 0, False, False),  # one is queued: behind it, in order
        (True, 0, 2, False, False),  # the watermark is reached: it waits in the queue
        (True, 0, 0, True, False),  # closed: nothing more goes out
    ],
)
async def test_a_delivery_skips_the_queue_only_when_the_pump_would_send_it_next(
    pump_waits: bool, queued: int, inflight: int, closed: bool, skips: bool
) -> None:
    lane = Lane(Binding.direct("t", "x", group="g", watermark=2), capacity=10)
    lane.inflight = inflight
    round_ = Round.of(MessageEntity(uuid.uuid4().hex, "t", "x", "p", b"body"), frozenset({"g"}))
    async with trio.open_nursery() as nursery:
        if pump_waits:
            nursery.start_soon(lane.next)
            await trio.testing.wait_all_tasks_blocked()
        for _ in range(queued):
            assert lane.offer(Delivery(round_, lane, "g", lambda *_: None))
        lane.closed = closed
        assert lane.take_slot_now() is skips
        assert lane.inflight == inflight + skips, "a slot is counted only for a delivery sent at once"
        nursery.cancel_scope.cancel()


async def test_lane_slots_hold_the_watermark_and_a_raised_watermark_frees_the_pump() -> None:
    lane = Lane(Binding.direct("trade", "pay-succ", group="sms", watermark=2), capacity=10)
    await lane.take_slot()
    await lane.take_slot()
    async with trio.open_nursery() as nursery:
        taken = start_waiting(nursery, lane.take_slot)
        await trio.testing.wait_all_tasks_blocked()
        assert not taken.is_set() and lane.inflight == 2, "a third delivery waits at watermark 2"
        lane.free_slot()
        await taken.wait()
        assert lane.inflight == 2
        taken = start_waiting(nursery, lane.take_slot)
        await trio.testing.wait_all_tasks_blocked()
        assert not taken.is_set()
        lane.rebind(Binding.direct("trade", "pay-succ", group="sms", watermark=3))
        await taken.wait()
    assert lane.inflight == 3
