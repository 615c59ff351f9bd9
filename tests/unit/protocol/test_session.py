"""The sans-IO session: states, identity, the pending table and who may send what, as bytes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import HEADER_SIZE, Cmd, ProtocolError, encode_frame, pb
from protocol.framing import HEADER, FrameDecoder
from protocol.session import (
    ONE_WAY,
    REQUESTS,
    Answered,
    Hello,
    Ignored,
    MessageReceived,
    MessageRefused,
    Request,
    Role,
    Session,
    SessionError,
    State,
    TxDecision,
)

ID = "0123456789abcdef0123456789abcdef"


def meta(group: str = "p", secret: str = "s", warmup: int = 0, opaque: int = 1) -> bytes:
    return encode_frame(
        opaque, Cmd.CONN_META, pb.ConnMeta(groupId=group, secretKey=secret, warmingupSec=warmup)
    )


def header(group: str = "p", message_id: str = ID) -> pb.Header:
    return pb.Header(
        messageId=message_id,
        topic="t",
        messageType="x",
        expiredTime=-1,
        deliverLimit=100,
        groupId=group,
        commit=True,
        fly=False,
    )


def message(opaque: int, group: str = "p", message_id: str = ID) -> bytes:
    return encode_frame(
        opaque, Cmd.BYTES_MESSAGE, pb.BytesMessage(header=header(group, message_id), body=b"b")
    )


def deliver_ack(opaque: int, status: bool = True) -> bytes:
    ack = pb.DeliverAck(messageId=ID, topic="t", messageType="x", groupId="p", status=status)
    return encode_frame(opaque, Cmd.DELIVER_ACK, ack)


def tx_ack(opaque: int, status: int, group: str = "p") -> bytes:
    return encode_frame(opaque, Cmd.TX_ACK, pb.TxACKPacket(header=header(group), status=status, feedback=""))


def replies(session: Session) -> list[tuple[int, Cmd, Any]]:
    """What the session answered by itself, decoded."""
    decoder = FrameDecoder()
    frames = decoder.feed(b"".join(session.outgoing))
    session.outgoing.clear()
    out = []
    for frame in frames:
        body = {
            Cmd.CONN_AUTH_ACK: pb.ConnAuthAck,
            Cmd.MESSAGE_STORE_ACK: pb.MessageStoreAck,
            Cmd.HEARTBEAT: pb.HeartBeat,
        }[frame.cmd]()
        body.ParseFromString(frame.body)
        out.append((frame.opaque, frame.cmd, body))
    return out


def open_broker(group: str = "p", **options: int) -> Session:
    session = Session(Role.BROKER, **options)
    assert session.receive_data(meta(group)) == [Hello(group, "s", 0)]
    assert session.accept() == []
    replies(session)
    return session


# -- before authentication ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "expected_error", "reply_feedback"),
    [
        (message(7), "BYTES_MESSAGE before ConnMeta", "Unauthorized,Connection broken!"),
        (
            encode_frame(7, Cmd.HEARTBEAT, pb.HeartBeat(version=1)),
            "HEARTBEAT before ConnMeta",
            "Unauthorized",
        ),
        (HEADER.pack(7, Cmd.CONN_META, 0, 0, 3) + b"\xff\xff\xff", "bad ConnMeta", "bad ConnMeta"),
        (meta(group=""), "groupId must be 1 to 255 characters, got 0", "groupId must be"),
        (meta(group="g" * 256), "groupId must be 1 to 255 characters, got 256", "groupId must be"),
    ],
)
def test_a_broker_session_refuses_anything_but_a_sound_conn_meta_first(
    first: bytes, expected_error: str, reply_feedback: str
) -> None:
    session = Session(Role.BROKER)
    with pytest.raises(SessionError, match=expected_error) as raised:
        session.receive_data(first)
    assert session.state is State.CLOSED
    frame = FrameDecoder().feed(raised.value.reply)[0]
    ack = pb.ConnAuthAck()
    ack.ParseFromString(frame.body)
    assert frame.cmd is Cmd.CONN_AUTH_ACK and not ack.status and reply_feedback in ack.feedback
    with pytest.raises(SessionError, match="closed"):
        session.receive_data(meta())


def test_a_large_frame_before_authentication_is_refused_from_its_header_alone() -> None:
    session = Session(Role.BROKER, pre_auth_max_bytes=4096, max_frame_bytes=2 * 1024 * 1024)
    announced = HEADER.pack(1, Cmd.CONN_META, 0, 0, 2 * 1024 * 1024 - 1)
    with pytest.raises(SessionError, match="exceeds the limit of 4096 bytes before authentication"):
        session.receive_data(announced + b"x" * 1000)
    assert session.buffered <= HEADER_SIZE + 1000 and session.state is State.CLOSED


def test_the_frame_limit_rises_once_authenticated() -> None:
    session = Session(Role.BROKER, pre_auth_max_bytes=4096, max_frame_bytes=65536)
    assert session.frame_limit == 4096
    session.receive_data(meta())
    session.accept()
    assert session.frame_limit == 65536
    big = encode_frame(9, Cmd.BYTES_MESSAGE, pb.BytesMessage(header=header(), body=b"x" * 10_000))
    assert [type(e) for e in session.receive_data(big)] == [MessageReceived]


def test_frames_sent_before_the_verdict_wait_for_it() -> None:
    session = Session(Role.BROKER)
    events = session.receive_data(meta(warmup=-5) + message(2))
    assert events == [Hello("p", "s", 0)] and session.state is State.AUTHENTICATING
    assert session.receive_data(message(3)) == [], "held, not handled, until the group is proved"
    held = session.accept()
    assert [(type(e), e.opaque) for e in held] == [(MessageReceived, 2), (MessageReceived, 3)]  # type: ignore[union-attr]
    assert [(o, c, a.status, a.feedback) for o, c, a in replies(session)] == [
        (1, Cmd.CONN_AUTH_ACK, True, "Auth Succ")
    ]


def test_a_refused_peer_gets_the_reason_and_nothing_it_sent_is_handled() -> None:
    session = Session(Role.BROKER)
    session.receive_data(meta() + message(2))
    ack = pb.ConnAuthAck()
    ack.ParseFromString(session.refuse("wrong secret")[HEADER_SIZE:])
    assert (ack.status, ack.feedback, session.state) == (False, "wrong secret", State.CLOSED)
    with pytest.raises(ProtocolError, match="cannot accept"):
        session.accept()


# -- identity -----------------------------------------------------------------------------


def test_a_message_sent_as_another_group_is_refused_and_never_handled() -> None:
    session = open_broker("x")
    events = session.receive_data(message(5, group="p") + message(6, group="x"))
    assert [type(e) for e in events] == [MessageRefused, MessageReceived]
    [(opaque, cmd, ack)] = replies(session)
    assert (opaque, cmd, ack.status, ack.messageId) == (5, Cmd.MESSAGE_STORE_ACK, False, ID)
    assert "'p'" in ack.feedback and "'x'" in ack.feedback


def test_a_second_conn_meta_never_changes_the_identity() -> None:
    session = open_broker("x")
    assert session.receive_data(meta("x", opaque=4)) == [Ignored(Cmd.CONN_META, "repeated")]
    assert [(a.status, a.feedback) for _, _, a in replies(session)] == [(True, "Auth Succ")]
    session.receive_data(meta("p", opaque=5))
    [(_, _, ack)] = replies(session)
    assert not ack.status and "already authenticated as 'x'" in ack.feedback
    assert session.group == "x"
    assert [type(e) for e in session.receive_data(message(6, group="p"))] == [MessageRefused]


def test_tx_decisions_carry_the_sessions_group_and_the_question_they_answer() -> None:
    session = open_broker("x")
    question = object()
    opaque, _ = session.request(
        Cmd.TX_ACK, pb.TxACKPacket(header=header(), status=0, feedback="").SerializeToString(), question, 10.0
    )
    assert session.receive_data(tx_ack(0, 1, group="p")) == [TxDecision(ID, 1, "x", None)]
    assert session.receive_data(tx_ack(opaque, 2)) == [TxDecision(ID, 2, "x", question)]
    assert session.pending == 0


# -- the pending table --------------------------------------------------------------------


def test_answers_settle_only_requests_of_their_own_kind_sent_on_this_session() -> None:
    session = open_broker()
    delivery, question = object(), object()
    sent, _ = session.request(Cmd.BYTES_MESSAGE, b"", delivery, 5.0)
    asked, _ = session.request(Cmd.TX_ACK, b"", question, 5.0)
    assert session.inflight == 1 and session.pending == 2
    assert [type(e) for e in session.receive_data(deliver_ack(asked))] == [Ignored], (
        "a DeliverAck is no tx answer"
    )
    assert [type(e) for e in session.receive_data(deliver_ack(sent + 1000))] == [Ignored], "no such delivery"
    [answered] = session.receive_data(deliver_ack(sent, status=False))
    assert isinstance(answered, Answered) and answered.request is delivery and not answered.answer.status
    assert session.inflight == 0 and session.pending == 1
    assert [type(e) for e in session.receive_data(deliver_ack(sent))] == [Ignored], "answered once only"


def test_expire_and_close_end_what_is_pending() -> None:
    session = open_broker()
    early, late = object(), object()
    session.request(Cmd.BYTES_MESSAGE, b"", early, 1.0)
    session.request(Cmd.BYTES_MESSAGE, b"", late, 2.0)
    assert session.expire(0.5) == []
    assert session.expire(1.0) == [early] and session.inflight == 1
    assert session.close() == [late] and session.inflight == 0 and session.state is State.CLOSED


def test_the_broker_echoes_heartbeats_under_their_opaque() -> None:
    session = open_broker()
    assert session.receive_data(encode_frame(77, Cmd.HEARTBEAT, pb.HeartBeat(version=123))) == []
    [(opaque, cmd, beat)] = replies(session)
    assert (opaque, cmd, beat.version) == (77, Cmd.HEARTBEAT, 123)


def test_an_unparseable_message_is_answered_and_the_session_goes_on() -> None:
    session = open_broker()
    events = session.receive_data(HEADER.pack(3, Cmd.BYTES_MESSAGE, 0, 0, 2) + b"\xff\xff" + message(4))
    assert [type(e) for e in events] == [Ignored, MessageReceived]
    [(opaque, _, ack)] = replies(session)
    assert opaque == 3 and not ack.status and ack.feedback.startswith("bad message")


# -- the client's side --------------------------------------------------------------------


def test_a_client_session_opens_with_its_auth_ack() -> None:
    session = Session(Role.CLIENT)
    waiter = object()
    with pytest.raises(ProtocolError, match="session is awaiting-meta"):
        session.request(Cmd.HEARTBEAT, b"", object(), 1.0)
    data = session.connect("p", "s", 3, waiter, 5.0)
    [frame] = FrameDecoder().feed(data)
    assert frame.cmd is Cmd.CONN_META and session.state is State.AUTHENTICATING
    ack = encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="Auth Succ"))
    [answered] = session.receive_data(ack)
    assert isinstance(answered, Answered) and answered.request is waiter and session.state is State.OPEN
    delivery = message(900)
    [request] = session.receive_data(delivery + tx_ack(901, 0))[:1]
    assert isinstance(request, Request) and request.frame.opaque == 900


def test_a_refused_client_session_is_closed() -> None:
    session = Session(Role.CLIENT)
    [frame] = FrameDecoder().feed(session.connect("p", "bad", 0, object(), 5.0))
    session.receive_data(
        encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=False, feedback="no"))
    )
    assert session.state is State.CLOSED


ALL_CMDS = list(Cmd)


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("cmd", ALL_CMDS)
def test_who_may_send_what(role: Role, cmd: Cmd) -> None:
    session = open_broker() if role is Role.BROKER else _open_client()
    if cmd in REQUESTS[role]:
        session.request(cmd, b"", object(), 1.0)
    else:
        with pytest.raises(ProtocolError):
            session.request(cmd, b"", object(), 1.0)
    body = pb.HeartBeat(version=1).SerializeToString()
    if cmd in ONE_WAY[role]:
        assert session.send(1, cmd, body)
    else:
        with pytest.raises(ProtocolError, match="does not send"):
            session.send(1, cmd, body)


def _open_client() -> Session:
    session = Session(Role.CLIENT)
    [frame] = FrameDecoder().feed(session.connect("p", "s", 0, object(), 5.0))
    session.receive_data(
        encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback=""))
    )
    return session


# -- properties ---------------------------------------------------------------------------

CONVERSATION = meta("p") + message(2) + deliver_ack(3) + tx_ack(0, 1) + message(4, group="q") + message(5)


def _run(chunks: list[bytes]) -> tuple[list[Any], list[bytes]]:
    session = Session(Role.BROKER)
    events: list[Any] = []
    for chunk in chunks:
        for event in session.receive_data(chunk):
            events.append(event)
            if isinstance(event, Hello):
                events += session.accept()
    return events, session.outgoing


@given(st.lists(st.integers(min_value=1, max_value=len(CONVERSATION) - 1), unique=True).map(sorted))
def test_any_split_of_the_byte_stream_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *cuts, len(CONVERSATION)]
    chunks = [CONVERSATION[a:b] for a, b in itertools.pairwise(bounds)]
    assert _run(chunks) == _run([CONVERSATION])


@settings(max_examples=300)
@given(st.binary(max_size=64 * 1024))
def test_garbage_before_authentication_is_refused_cleanly_and_stays_small(data: bytes) -> None:
    session = Session(Role.BROKER, pre_auth_max_bytes=4096)
    try:
        events = session.receive_data(data)
        session.check()
    except SessionError:
        assert session.state is State.CLOSED
        return
    assert all(isinstance(e, Hello) for e in events)
    if session.state is State.AWAITING_META:
        assert session.buffered < HEADER_SIZE + 4096, "never more than one small frame's worth"
