"""One KiteQ connection as a sans-IO state machine, as h11's `Connection` is for HTTP.

A `Session` sits at one end of one connection, the broker's (`Role.BROKER`) or a
client's (`Role.CLIENT`). Bytes go in with `receive_data`, typed events come out;
frames to send come out as bytes of the methods that make them, and the frames the
protocol itself answers with (heartbeat echoes, refusals) collect in `outgoing`.
It never touches a socket, a clock or a task: the caller owns I/O, time and
concurrency, so every rule below is tested with byte strings.

What it owns:
- **State**: AWAITING_META (nothing proved yet) -> AUTHENTICATING (a ConnMeta arrived,
  the caller is checking it) -> OPEN -> CLOSED. On the broker's side a peer that has
  not authenticated may send one frame, a ConnMeta of at most `pre_auth_max_bytes`:
  anything larger is refused from its header, before a byte of its body is kept.
- **Identity**: once OPEN the session knows the group its peer authenticated as, and
  a message whose header.groupId names another group is refused here, with a store
  ack saying so; no handler ever sees it. Decisions on stored messages (commit,
  rollback) need the store to know whose message it is: `TxDecision` carries the
  session's group for the caller to compare.
- **Requests in flight**: every request this end sends (a delivery, a tx question, a
  client's send) is pending under this session's own opaque, with its deadline. An
  answer is matched here, so an answer on one connection can never complete a request
  of another; `expire` and `close` end the rest.

A peer that breaks these rules raises `SessionError` (a `ProtocolError`) carrying the
reply owed before the connection is closed; the session is CLOSED from then on.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from protocol import kiteq_pb2 as pb
from protocol.commands import MESSAGE_CMDS, Cmd
from protocol.errors import ProtocolError
from protocol.framing import (
    DEFAULT_MAX_BODY,
    Frame,
    FrameDecoder,
    decode_body,
    encode_frame,
    encode_raw_frame,
)
from protocol.wire import ACK_CMDS, WireMessage, decode_ack, decode_message, encode_store_ack

# What a peer may send before it authenticated: a ConnMeta is a group name, a secret
# and an integer, well under 1 KiB; 4 KiB leaves room and keeps 10,000 silent peers
# at 40 MiB of buffers instead of the 20 GiB their 2 MiB frames would claim.
DEFAULT_PRE_AUTH_MAX = 4096
# The longest group name (ConnMeta.groupId, header.groupId) the broker accepts.
MAX_GROUP_LENGTH = 255
# Client-supplied text quoted back in a feedback is cut here.
QUOTE_LIMIT = 128

UNAUTHORIZED = "Unauthorized,Connection broken!"  # KiteQ's own words, which its clients know
AUTH_SUCCEEDED = "Auth Succ"


class Role(enum.Enum):
    BROKER = "broker"
    CLIENT = "client"


class State(enum.Enum):
    AWAITING_META = "awaiting-meta"
    AUTHENTICATING = "authenticating"
    OPEN = "open"
    CLOSED = "closed"


# The commands each end may receive once OPEN; anything else is `Ignored`.
RECEIVES: dict[Role, frozenset[Cmd]] = {
    Role.BROKER: frozenset(
        {
            Cmd.HEARTBEAT,
            Cmd.CONN_META,
            Cmd.DELIVER_ACK,
            Cmd.TX_ACK,
            Cmd.BYTES_MESSAGE,
            Cmd.STRING_MESSAGE,
            Cmd.CANCEL,
        }
    ),
    Role.CLIENT: frozenset(
        {
            Cmd.HEARTBEAT,
            Cmd.CONN_AUTH_ACK,
            Cmd.MESSAGE_STORE_ACK,
            Cmd.TX_ACK,
            Cmd.BYTES_MESSAGE,
            Cmd.STRING_MESSAGE,
        }
    ),
}
# The commands each end may send as requests once open (answered under the same opaque).
# A client's ConnMeta is sent once, by `connect`, and never again.
REQUESTS: dict[Role, frozenset[Cmd]] = {
    Role.BROKER: frozenset({Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE, Cmd.TX_ACK}),
    Role.CLIENT: frozenset({Cmd.HEARTBEAT, Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE, Cmd.CANCEL}),
}
# The commands each end sends without expecting an answer: answers, and KiteQ's one-way
# tx decision (a TxACKPacket with opaque 0).
ONE_WAY: dict[Role, frozenset[Cmd]] = {
    Role.BROKER: frozenset({Cmd.MESSAGE_STORE_ACK, Cmd.CONN_AUTH_ACK, Cmd.HEARTBEAT}),
    Role.CLIENT: frozenset({Cmd.DELIVER_ACK, Cmd.TX_ACK}),
}
# The commands that answer a request of the other end.
ANSWERS: dict[Role, frozenset[Cmd]] = {
    Role.BROKER: frozenset({Cmd.DELIVER_ACK, Cmd.TX_ACK}),
    Role.CLIENT: frozenset({Cmd.CONN_AUTH_ACK, Cmd.MESSAGE_STORE_ACK, Cmd.HEARTBEAT}),
}
# Which requests each answer may settle: a DeliverAck never settles a tx question.
ANSWERED_BY: dict[Cmd, frozenset[Cmd]] = {
    Cmd.DELIVER_ACK: MESSAGE_CMDS,
    Cmd.MESSAGE_STORE_ACK: MESSAGE_CMDS | {Cmd.CANCEL},
    Cmd.TX_ACK: frozenset({Cmd.TX_ACK}),
    Cmd.CONN_AUTH_ACK: frozenset({Cmd.CONN_META}),
    Cmd.HEARTBEAT: frozenset({Cmd.HEARTBEAT}),
}


# Module constants: reading an enum member off its class costs a descriptor call per frame.
_CONN_AUTH_ACK, _TX_ACK, _HEARTBEAT, _CANCEL = Cmd.CONN_AUTH_ACK, Cmd.TX_ACK, Cmd.HEARTBEAT, Cmd.CANCEL


class SessionError(ProtocolError):
    """The peer broke the conversation; `reply` is the frame owed to it before closing."""

    def __init__(self, message: str, *, reply: bytes = b"") -> None:
        super().__init__(message)
        self.reply = reply


# -- events -------------------------------------------------------------------------------
# NamedTuples, but for the three built per message that crosses the wire (MessageReceived,
# Answered, Request): classes with a written-out `__init__`, which mypyc compiles, where a
# NamedTuple's `__new__` stays interpreted (docs/design.md, "compiled modules").


class Hello(NamedTuple):
    """Broker: a peer asks to be `group` (check the secret, then `accept` or `refuse`)."""

    group: str
    secret: str
    warmup_seconds: int


@dataclass(slots=True)
class MessageReceived:
    """Broker: a message to store, sent as this session's own group."""

    opaque: int
    message: WireMessage
    raw: bytes  # the body as received: delivered as is

    def __init__(self, opaque: int, message: WireMessage, raw: bytes) -> None:
        self.opaque = opaque
        self.message = message
        self.raw = raw


class MessageRefused(NamedTuple):
    """Broker: a message was refused here (already answered in `outgoing`); for the log."""

    message_id: str
    reason: str


@dataclass(slots=True)
class Answered:
    """An answer to a request this end sent; `request` is what `request()` was given."""

    request: Any
    answer: Any  # the decoded answer: DeliverAck, TxACKPacket, ConnAuthAck, MessageStoreAck, HeartBeat

    def __init__(self, request: Any, answer: Any) -> None:
        self.request = request
        self.answer = answer


class TxDecision(NamedTuple):
    """Broker: a producer's commit, rollback or unknown for a message, sent as `group`.

    `question` is the pending tx question it answers, or None when it came unasked
    (KiteQ's clients send their decision after the local transaction with opaque 0).
    """

    message_id: str
    status: int
    group: str
    question: Any


class CancelRequested(NamedTuple):
    """Broker: a producer asks that a scheduled message never be delivered; answer with
    `store_ack(opaque, ...)` (status: cancelled or not, feedback: why not)."""

    opaque: int
    message_id: str
    group: str


@dataclass(slots=True)
class Request:
    """Client: the broker asks something: a delivery (a message cmd) or a tx question."""

    frame: Frame
    body: Any  # a WireMessage for a delivery, else the decoded protobuf message

    def __init__(self, frame: Frame, body: Any) -> None:
        self.frame = frame
        self.body = body


class Ignored(NamedTuple):
    """A frame that is dropped (unexpected, unparseable, an answer nobody waits for)."""

    cmd: Cmd
    reason: str


Event = Hello | MessageReceived | MessageRefused | Answered | TxDecision | CancelRequested | Request | Ignored


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` as repr quotes it, cut to `limit` characters: safe to echo back or log."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class Session:
    """The protocol state of one connection; see the module docstring."""

    def __init__(
        self,
        role: Role,
        *,
        max_frame_bytes: int = DEFAULT_MAX_BODY,
        pre_auth_max_bytes: int = DEFAULT_PRE_AUTH_MAX,
    ) -> None:
        self.role = role
        self._broker = role is Role.BROKER
        self.state = State.AWAITING_META
        self.group = ""
        self.max_frame_bytes = max_frame_bytes
        # The broker reads small until its peer proved who it is; a client trusts its broker.
        limit = min(pre_auth_max_bytes, max_frame_bytes) if role is Role.BROKER else max_frame_bytes
        self._decoder = FrameDecoder(limit)
        self._held: list[Frame] = []
        self._pending: dict[int, tuple[Any, float, Cmd]] = {}  # opaque -> (request, deadline, cmd)
        self._opaques: Iterator[int] = itertools.cycle(range(1, 2**32))
        self._receives = RECEIVES[role]
        self._plain_answers = ANSWERS[role] - {Cmd.TX_ACK}  # a TX_ACK may also be a decision
        self._requests = REQUESTS[role]
        # Requests carrying a message in flight: on the broker, deliveries, which say how
        # loaded this connection is (it picks the least loaded of a group).
        self.inflight = 0
        self.outgoing: list[bytes] = []

    @property
    def frame_limit(self) -> int:
        """The largest body accepted now: small before authentication."""
        return self._decoder.max_body

    @property
    def buffered(self) -> int:
        """Bytes received and not yet a whole frame, plus frames held until authenticated."""
        return self._decoder.buffered + sum(len(frame.body) for frame in self._held)

    @property
    def pending(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    # -- receiving ------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """Every event the bytes received so far make, in order (h11's receive_data + next_event).

        Raises SessionError (the session is CLOSED) when the peer broke the protocol.
        """
        if self.state is State.CLOSED:
            raise SessionError("the session is closed")
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            raise self._broken(self._framing_message(exc)) from None
        if self.state is not State.OPEN:
            return self._before_open(frames)
        return self._events(frames)

    def check(self) -> None:
        """Raise the framing error the last `receive_data` met after the frames it returned."""
        try:
            self._decoder.check()
        except ProtocolError as exc:
            raise self._broken(self._framing_message(exc)) from None

    def _framing_message(self, exc: ProtocolError) -> str:
        if self.state is State.OPEN or self.role is Role.CLIENT:
            return str(exc)
        return f"{exc} before authentication: send a ConnMeta of at most {self.frame_limit} bytes first"

    def _before_open(self, frames: list[Frame]) -> list[Event]:
        if self.role is Role.CLIENT:
            return self._events(frames)  # the client's own handshake is an ordinary request
        if self.state is State.AUTHENTICATING:
            self._held += frames
            return []
        if not frames:
            return []
        first, rest = frames[0], frames[1:]
        if first.cmd is not Cmd.CONN_META:
            raise self._broken(
                f"{first.cmd.name} before ConnMeta",
                encode_frame(
                    first.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=False, feedback=UNAUTHORIZED)
                ),
            )
        try:
            meta = decode_body(first)
        except ProtocolError as exc:
            reason = f"bad ConnMeta: {exc}"
            raise self._broken(reason, self._auth_ack(first.opaque, False, reason)) from None
        group = meta.groupId  # type: ignore[attr-defined]
        if not group or len(group) > MAX_GROUP_LENGTH:
            reason = f"groupId must be 1 to {MAX_GROUP_LENGTH} characters, got {len(group)}"
            raise self._broken(reason, self._auth_ack(first.opaque, False, reason))
        self.state = State.AUTHENTICATING
        self._meta_opaque = first.opaque
        self.group = group
        self._held = rest
        return [Hello(group, meta.secretKey, max(0, meta.warmingupSec))]  # type: ignore[attr-defined]

    def _events(self, frames: list[Frame]) -> list[Event]:
        """The events of frames received while OPEN. The hot path: answers are matched inline."""
        events: list[Event] = []
        append = events.append
        pending = self._pending
        receives, answers, broker = self._receives, self._plain_answers, self._broker
        for frame in frames:
            cmd = frame.cmd
            if cmd not in receives:
                append(Ignored(cmd, f"{cmd.name} is not sent to the {self.role.value}"))
                continue
            try:
                body: Any
                if cmd in MESSAGE_CMDS:
                    body = decode_message(frame)
                elif cmd in ACK_CMDS:
                    body = decode_ack(frame)
                else:
                    body = decode_body(frame)
            except ProtocolError as exc:
                append(self._undecodable(frame, exc))
                continue
            if cmd in answers:
                entry = pending.get(frame.opaque)
                if entry is None or entry[2] not in ANSWERED_BY[cmd]:
                    append(Ignored(cmd, "answers no request in flight (late, or not ours)"))
                    continue
                del pending[frame.opaque]
                if entry[2] in MESSAGE_CMDS:
                    self.inflight -= 1
                if cmd is _CONN_AUTH_ACK:
                    self.state = State.OPEN if body.status else State.CLOSED
                append(Answered(entry[0], body))
            elif cmd in MESSAGE_CMDS:
                append(self._message(frame, body) if broker else Request(frame, body))
            elif cmd is _TX_ACK:
                append(self._tx_ack(frame, body))
            elif cmd is _HEARTBEAT:  # the client's ping, echoed under its opaque
                self.outgoing.append(encode_frame(frame.opaque, _HEARTBEAT, body))
            elif cmd is _CANCEL:
                append(CancelRequested(frame.opaque, body.header.messageId, self.group))
            else:  # the broker: a ConnMeta once open
                append(self._hello_again(frame, body))
        return events

    def _message(self, frame: Frame, message: WireMessage) -> Event:
        sender = message.group
        if sender == self.group:
            return MessageReceived(frame.opaque, message, frame.body)
        reason = (
            f"header.groupId {quote(sender)} is not this connection's group {quote(self.group)}: "
            "a connection sends only as the group it authenticated as"
        )
        message_id = message.message_id
        self.outgoing.append(self.store_ack(frame.opaque, message_id, False, reason))
        return MessageRefused(message_id, reason)

    def _tx_ack(self, frame: Frame, packet: Any) -> Event:
        if self.role is Role.CLIENT:
            return Request(frame, packet)
        question = self._take(frame.opaque, Cmd.TX_ACK)
        return TxDecision(packet.header.messageId, packet.status, self.group, question)

    def _hello_again(self, frame: Frame, meta: Any) -> Event:
        """A ConnMeta on an open connection: confirmed for the same group, never a new identity."""
        same = meta.groupId == self.group
        feedback = AUTH_SUCCEEDED if same else f"already authenticated as {quote(self.group)}"
        self.outgoing.append(self._auth_ack(frame.opaque, same, feedback))
        return Ignored(Cmd.CONN_META, "repeated" if same else "a second identity on one connection")

    def _undecodable(self, frame: Frame, exc: ProtocolError) -> Event:
        """A body that does not parse: the frame boundaries hold, so answer and go on."""
        if frame.cmd in MESSAGE_CMDS and self.role is Role.BROKER:
            self.outgoing.append(self.store_ack(frame.opaque, "", False, f"bad message: {exc}"))
        return Ignored(frame.cmd, str(exc))

    # -- the broker's verdict on a Hello ----------------------------------------------------

    def accept(self) -> list[Event]:
        """The peer proved its group: answer it, lift the pre-auth limit, and return the events
        of frames that arrived meanwhile."""
        self._expect(State.AUTHENTICATING, "accept")
        self.state = State.OPEN
        self._decoder.max_body = self.max_frame_bytes
        self.outgoing.append(self._auth_ack(self._meta_opaque, True, AUTH_SUCCEEDED))
        held, self._held = self._held, []
        return self._events(held)

    def refuse(self, reason: str) -> bytes:
        """The peer did not prove its group: the answer to send before closing."""
        self._expect(State.AUTHENTICATING, "refuse")
        self.state = State.CLOSED
        self._held = []
        return self._auth_ack(self._meta_opaque, False, reason)

    # -- sending --------------------------------------------------------------------------

    def connect(self, group: str, secret: str, warmup_seconds: int, request: Any, deadline: float) -> bytes:
        """Client: the ConnMeta that opens the session; its ConnAuthAck comes as `Answered`."""
        self._expect(State.AWAITING_META, "connect")
        self.group = group
        self.state = State.AUTHENTICATING
        meta = pb.ConnMeta(groupId=group, secretKey=secret, warmingupSec=warmup_seconds)
        return self._request(Cmd.CONN_META, meta.SerializeToString(), request, deadline)[1]

    def request(self, cmd: Cmd, body: bytes, request: Any, deadline: float) -> tuple[int, bytes]:
        """Send a request (`body` serialized): its opaque and frame; the answer comes as `Answered`."""
        if self.state is not State.OPEN:
            raise ProtocolError(f"cannot send {cmd.name}: the session is {self.state.value}")
        if cmd not in self._requests:
            raise ProtocolError(f"the {self.role.value} does not send {cmd.name} requests")
        return self._request(cmd, body, request, deadline)

    def _request(self, cmd: Cmd, body: bytes, request: Any, deadline: float) -> tuple[int, bytes]:
        opaque = next(self._opaques)
        self._pending[opaque] = (request, deadline, cmd)
        if cmd in MESSAGE_CMDS:
            self.inflight += 1
        return opaque, encode_raw_frame(opaque, cmd, body)

    def send(self, opaque: int, cmd: Cmd, body: bytes) -> bytes:
        """A frame that expects no answer (`body` serialized): an answer under the request's
        opaque, or a one-way decision."""
        if self.state is not State.OPEN:
            raise ProtocolError(f"cannot send {cmd.name}: the session is {self.state.value}")
        if cmd not in ONE_WAY[self.role]:
            raise ProtocolError(f"the {self.role.value} does not send {cmd.name} without a request")
        return encode_raw_frame(opaque, cmd, body)

    def store_ack(self, opaque: int, message_id: str, stored: bool, feedback: str) -> bytes:
        """Broker: the answer to a message, once it is stored (or why not)."""
        return encode_raw_frame(opaque, Cmd.MESSAGE_STORE_ACK, encode_store_ack(message_id, stored, feedback))

    def restart_deadline(self, opaque: int, deadline: float) -> None:
        """Move a pending request's deadline (the broker starts a delivery's when it reached the socket)."""
        entry = self._pending.get(opaque)
        if entry is not None:
            self._pending[opaque] = (entry[0], deadline, entry[2])

    def forget(self, opaque: int) -> None:
        """Stop waiting for an answer (the requester gave up); a late answer is then ignored."""
        if opaque in self._pending:
            self._pop(opaque)

    def expire(self, now: float) -> list[Any]:
        """The requests whose deadline passed, now no longer pending."""
        expired = [opaque for opaque, (_, deadline, _) in self._pending.items() if deadline <= now]
        return [self._pop(opaque) for opaque in expired]

    def close(self) -> list[Any]:
        """The connection is gone: CLOSED, and every request still pending (none will be answered)."""
        self.state = State.CLOSED
        pending, self._pending = self._pending, {}
        self.inflight = 0
        self._held = []
        return [request for request, _, _ in pending.values()]

    # -- internals ------------------------------------------------------------------------

    def _take(self, opaque: int, answer: Cmd) -> Any:
        """The request `answer` settles, or None (none pending under opaque, or of another kind)."""
        entry = self._pending.get(opaque)
        if entry is None or entry[2] not in ANSWERED_BY[answer]:
            return None
        return self._pop(opaque)

    def _pop(self, opaque: int) -> Any:
        request, _, cmd = self._pending.pop(opaque)
        if cmd in MESSAGE_CMDS:
            self.inflight -= 1
        return request

    def _auth_ack(self, opaque: int, status: bool, feedback: str) -> bytes:
        return encode_frame(opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=status, feedback=feedback))

    def _expect(self, state: State, action: str) -> None:
        if self.state is not state:
            raise ProtocolError(f"cannot {action}: the session is {self.state.value}, not {state.value}")

    def _broken(self, message: str, reply: bytes = b"") -> SessionError:
        self.state = State.CLOSED
        self._held = []
        return SessionError(message, reply=reply)
