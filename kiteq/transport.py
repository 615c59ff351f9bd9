"""A framed byte stream: the I/O edge of a connection, around its sans-IO Session.

Two lanes go out: *control* frames (auth, store acks, heartbeat replies, questions)
and *bulk* frames (deliveries). Control frames always go first, and a send takes at
most `BULK_SEND_BYTES` of bulk. A send that finds the socket full and, once it may go
on, control frames queued meanwhile, stops at the end of the bulk frame it is in: the
rest of its bulk goes back to the head of the lane, behind them. So a consumer that
reads slowly gets its heartbeat replies behind what its socket holds and one frame,
not behind a whole send's worth (which at 200 KB/s was over a second). What bulk waits
is the owner's to bound (`bulk_bytes`, the back-pressure signal); `on_sent` tells the
owner which bulk frames left for the socket, so a delivery's timeout starts when it was
really sent.

Both the broker's and the clients' connections use it: bytes read go to the owner
(which feeds its `protocol.Session`), encoded frames go out through the outbox. Writes never block the
caller: frames go into an outbox that one writer task flushes with a single
`send_all` per wake-up, so a burst of acks or deliveries costs one syscall, not one
per frame (the cost on loopback is per send, not per byte). The outbox is bounded
in bytes; a peer that stops reading past that bound is disconnected rather than
allowed to grow our memory.

Under load, one send per wake-up can still be one send per frame: a store-ack goes
out, the next request comes in alone. So while the owner expects more frames
(`expect_more`, the owner's say: on the broker, a connection's messages being stored or
deliveries awaiting answers; in a client, requesters an answer woke that have not run
yet) and only control frames wait, the writer first lets every task that is ready to
run now take its turn — readers handling a read's worth of frames, handlers finishing a
save — and then sends everything they queued in one call. Bulk frames do not wait for
that: the broker's pump queues deliveries in bursts already, and the tasks ready beside
it are mostly the broker's bookkeeping (outcomes to store, pages to read), so waiting
for them kept the consumer idle while the broker worked, and the two took turns instead
of overlapping (measured: draining a backlog went 1.4x faster without that wait). It
never waits on a timer: what coalesces is only what was queued at the same moment.

On an idle path the writer is not woken at all. A control frame queued while nothing
else is (no frame waiting, the writer not sending, the owner expecting no more) is
written to the socket at once, from the caller's task, unless the caller says more
follow before it yields (`send(data, at_once=False)`): then they go in one write.
Waking the writer costs two turns of the event loop, which under load a whole batch
shares and on an idle path one frame pays for alone: with a producer awaiting each
store-ack, saving them here and in the store took 6-42 % off the broker's CPU per
message (four runs in turns). Whatever the socket does not take goes to the head of the
outbox, for the writer. Bulk frames go through the writer, which bounds how much of them
a control frame can find ahead of it (a slow reader's heartbeat replies came about a
tenth later when idle deliveries went straight to its socket) and starts their timeouts
as it hands them over. One exception: once `EAGER_BULK_BYTES` of bulk is queued while the
writer is idle and no control frame waits, the task queuing it writes it itself, without
waiting (the writer then starts their timeouts on its next turn, and sends what the socket
did not take). The broker pushes a producer's burst to its consumers in one turn of its
loop; written only after the turn, the consumer sat idle while the broker worked and then
got it all at once (memory store, unthrottled: p99 5.8-5.9 ms against 3.7-4.5 written
early, file store 2.8-3.1 against 2.2-2.7, rounds in turns). A socket the writer is
waiting on is full, so a slow reader gets nothing early. Over TLS every frame goes
through the writer: the TLS stream is Trio's to drive.

The writer, too, writes a plain socket directly, and waits (`wait_writable`) only when
the socket is full. Trio's `send_all` yields once more after a send that did not wait,
a turn of the event loop per flush that an idle path paid for each delivery; the
writer instead yields before sending on when more is queued, so it never keeps the
others from running. Reads from a plain socket are direct too (`_receive`), with the
checkpoints Trio's `receive_some` has. A read over TLS takes, besides the record Trio's
`receive_some` returns, every record Trio has already received whole (`_received_records`):
frames the peer wrote one at a time come in one read once they queue, as they do from a
plain socket.
"""

from __future__ import annotations

import os
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

import structlog
import trio

log = structlog.get_logger(__name__)

READ_SIZE = 256 * 1024
DEFAULT_OUTBOX_LIMIT = 64 * 1024 * 1024
FLUSH_NOW_BYTES = 256 * 1024  # this much queued goes out without letting others add to it
TLS_RECORDS_PER_READ = 128  # records taken over TLS beside the one `receive_some` returns
BULK_SEND_BYTES = 256 * 1024  # bulk taken per send: control frames queued meanwhile go next
EAGER_BULK_BYTES = 32 * 1024  # bulk queued in one turn that the caller writes itself, the writer idle


class OutboxOverflow(Exception):
    """The peer is not reading; its connection is being closed."""


class FramedStream:
    """Frames in, frames out, over one trio stream. Owned by the caller's nursery."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        outbox_limit: int = DEFAULT_OUTBOX_LIMIT,
        expect_more: Callable[[], bool] = lambda: False,
        read_size: int = READ_SIZE,
        on_sent: Callable[[list[object]], None] = lambda tokens: None,
    ) -> None:
        self.stream = stream
        self.read_size = read_size
        self.expect_more = expect_more
        self.on_sent = on_sent
        self.outbox_limit = outbox_limit
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._bulk: deque[tuple[bytes, object]] = deque()
        self.bulk_bytes = 0
        self._sent_early: list[object] = []  # tokens of bulk written by `send_bulk`, for `on_sent`
        self._wakeup = trio.Event()
        self._writing = False
        self._closed = False
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def reads_all_queued(self) -> bool:
        """Whether a read takes everything the peer has sent so far (up to `read_size`).

        True of a plain socket. A read over TLS takes only the records Trio has pulled from
        the socket (64 KiB at a time), so a frame read alone may have more behind it."""
        return _plain_socket(self.stream) is not None

    def send(self, data: bytes, at_once: bool = True) -> None:
        """Queue a control frame; raises OutboxOverflow if the peer stopped reading.

        `at_once=False` leaves it for the writer even on an idle path: the caller is about
        to queue more, and they go out in one write (a pipeline refilling its window)."""
        if self._closed:
            return
        if at_once:
            data = self._unsent_after_idle_write(data)
            if not data:
                return
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._outbox_bytes > self.outbox_limit:
            raise OutboxOverflow(f"peer has {self._outbox_bytes} unread bytes queued")
        self._wakeup.set()

    def send_bulk(self, data: bytes, token: object) -> None:
        """Queue a bulk frame, sent after every control frame; `token` goes to `on_sent` once sent."""
        if self._closed:
            return
        self._bulk.append((data, token))
        self.bulk_bytes += len(data)
        if self.bulk_bytes >= EAGER_BULK_BYTES and not self._outbox and not self._writing:
            self._write_bulk_now()
        self._wakeup.set()

    def _write_bulk_now(self) -> None:
        """Write the bulk queued so far from the caller's task, without waiting: what the
        socket does not take stays for the writer, which also passes what went to `on_sent`."""
        socket = _plain_socket(self.stream)
        if socket is None:
            return
        batch: list[bytes] = []
        tokens = self._take_bulk(batch)
        data = b"".join(batch)
        sent = self._write_at_once(socket, data)
        if sent < len(data):
            tokens = self._requeue_unsent(batch, 0, tokens, sent)
        self._sent_early.extend(tokens)

    def _unsent_after_idle_write(self, data: bytes) -> bytes:
        """On an idle path, write control frame `data` now; what the socket did not take
        (all of it when not idle, over TLS, or on a full or broken socket, which the writer
        then finds out about), to be queued for the writer."""
        if self._outbox or self._bulk or self._writing or self.expect_more():
            return data
        socket = _plain_socket(self.stream)
        if socket is None:
            return data
        return data[self._write_at_once(socket, data) :]

    def _write_at_once(self, socket: trio.socket.SocketType, data: bytes) -> int:
        """Write `data` to the plain `socket` without waiting; the bytes it took (0 from a
        full or broken socket: the writer finds out which)."""
        try:
            sent = os.write(socket.fileno(), data)
        except OSError:  # BlockingIOError included
            return 0
        self.bytes_out += sent
        return sent

    async def write_loop(self) -> None:
        """Flush the outbox until `finish()` was called and all is sent, or the peer goes away."""
        try:
            while True:
                if self._sent_early:
                    sent_early, self._sent_early = self._sent_early, []
                    self.on_sent(sent_early)
                if not self._outbox and not self._bulk:
                    if self._closed:
                        return
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                if not self._bulk and self._outbox_bytes < FLUSH_NOW_BYTES and self.expect_more():
                    await trio.lowlevel.checkpoint()  # the tasks ready now add their frames first
                batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
                first_bulk = len(batch)
                tokens = self._take_bulk(batch)
                data = b"".join(batch)
                self._writing = True
                try:
                    sent, waited = await self._send(data, batch, first_bulk)
                finally:
                    self._writing = False
                self.bytes_out += sent
                if sent < len(data):
                    tokens = self._requeue_unsent(batch, first_bulk, tokens, sent)
                if tokens:
                    self.on_sent(tokens)
                if not waited and (self._outbox or self._bulk):
                    await trio.lowlevel.checkpoint()  # sending on without a pause would starve the others
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._closed = True
            self._outbox.clear()
            self._bulk.clear()
            self.bulk_bytes = 0
            self._sent_early.clear()

    def _take_bulk(self, batch: list[bytes]) -> list[object]:
        """Move up to BULK_SEND_BYTES of bulk frames (at least one) into `batch`; their tokens."""
        bulk = self._bulk
        tokens: list[object] = []
        taken = 0
        while bulk and (not tokens or taken < BULK_SEND_BYTES):
            data, token = bulk.popleft()
            batch.append(data)
            tokens.append(token)
            taken += len(data)
        self.bulk_bytes -= taken
        return tokens

    def _requeue_unsent(
        self, batch: list[bytes], first_bulk: int, tokens: list[object], sent: int
    ) -> list[object]:
        """After a send of `sent` bytes of `batch` (its control frames, those before
        `first_bulk`, all sent), put the bulk frames not sent back at the head of their lane,
        in order, and the rest of one cut short at the head of the outbox, to go on first;
        the tokens of those that went, the one cut short included."""
        stops = _stops(batch, first_bulk)
        end = next(stops)  # where the control frames end
        done = 0
        for frame, frame_end in zip(batch[first_bulk:], stops, strict=True):
            start, end = end, frame_end
            if end > sent:
                if start < sent:
                    rest = frame[sent - start :]
                    self._outbox.insert(0, rest)
                    self._outbox_bytes += len(rest)
                    done += 1
                break
            done += 1
        unsent = batch[first_bulk + done :]
        self._bulk.extendleft(reversed(list(zip(unsent, tokens[done:], strict=True))))
        self.bulk_bytes += sum(len(frame) for frame in unsent)
        return tokens[:done]

    def finish(self) -> None:
        """Accept no more frames; the write loop returns once the outbox is flushed."""
        self._closed = True
        self._wakeup.set()

    async def read_loop(self, on_data: Callable[[bytes | bytearray], Awaitable[None]]) -> None:
        """Hand every read to `on_data` (at most `read_size` bytes, read anew each time).

        Returns at EOF or when the peer resets; whatever `on_data` raises ends it.
        """
        socket = _plain_socket(self.stream)
        tls = _tls_object(self.stream)  # the stream as it is now: the broker's is TLS once shaken hands
        try:
            while True:
                if socket is None:
                    data = await self.stream.receive_some(self.read_size)
                    if data and tls is not None:
                        data += _received_records(tls, self.read_size - len(data))
                else:
                    data = await _receive(socket, self.read_size)
                if not data:
                    return
                self.bytes_in += len(data)
                await on_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def _send(self, data: bytes, batch: list[bytes], first_bulk: int) -> tuple[int, bool]:
        """Send `data`, the frames of `batch` joined; how much was sent, and whether it had to
        wait for the socket.

        To a plain socket it is written directly, and a send the socket takes at once does
        not yield. If it had to wait and control frames were queued meanwhile, it stops at
        the end of the frame it is in, or of the last control frame (bulk frames start at
        `first_bulk`), so they go next.
        """
        socket = _plain_socket(self.stream)
        if socket is None:
            await self.stream.send_all(data)
            return len(data), True
        waited = False
        view = memoryview(data)
        sent = 0
        end = len(data)
        while sent < end:
            try:
                # Assigned, never called inside a slice's bounds: mypyc would call it twice.
                written = os.write(socket.fileno(), view[sent:end])
            except BlockingIOError:
                waited = True
                await trio.lowlevel.wait_writable(socket)
                if self._outbox:
                    end = min(end, next(stop for stop in _stops(batch, first_bulk) if stop >= sent))
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
            sent += written
        return sent, waited


async def _receive(socket: trio.socket.SocketType, size: int) -> bytes:
    """Up to `size` bytes read from a plain socket (b"" at EOF), with `receive_some`'s
    checkpoints: a cancel point before, and a yield (the wait for data, or one that
    cannot lose what was read) after.

    Read directly: Trio's stream and socket wrappers run about a dozen interpreted
    frames per read, 7 % of the broker's event-loop thread end to end."""
    await trio.lowlevel.checkpoint_if_cancelled()
    waited = False
    while True:
        try:
            data = os.read(socket.fileno(), size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(socket)
            waited = True
            continue
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data


def _stops(batch: list[bytes], first_bulk: int) -> Iterator[int]:
    """Where a send of `batch` joined may stop: where its control frames (those before
    `first_bulk`) end, then where each bulk frame does."""
    end = sum(len(frame) for frame in batch[:first_bulk])
    yield end
    for frame in batch[first_bulk:]:
        end += len(frame)
        yield end


def _received_records(tls: ssl.SSLObject, size: int) -> bytes:
    """Up to `size` bytes of the TLS records already received whole, at most
    `TLS_RECORDS_PER_READ` of them, decrypted without waiting or yielding; b"" if none is
    (a partial record stays for the next read).

    Trio's `receive_some` returns one record per call and yields after it: a producer
    writing its sends one at a time had each handled on its own, a read, a save and a
    turn of the event loop per message, even while dozens more had come in (file
    store over TLS, unthrottled: 6,900-7,200 msgs/s, against 8,900-9,700 reading them
    together; paced at 2,000/s, p50 31-62 ms against 3.7-3.9). It reads the stream's
    `ssl.SSLObject` directly, which only the stream's own reader may do: between
    `receive_some` calls, in that reader's task. What the read makes TLS send (a key
    update's answer) goes with the stream's next send or receive. An alert or the
    peer's close_notify stops it; the next `receive_some` reports them as Trio does.
    A record costs about 3 µs to open however small, so the count is bounded too: a peer
    writing 64 KiB of one-byte records would otherwise hold the event loop 8 ms or more.
    """
    parts = []
    for _ in range(TLS_RECORDS_PER_READ):
        if size <= 0:
            break
        try:
            part = tls.read(size)
        except ssl.SSLError:  # SSLWantReadError: no whole record left; other errors are sticky
            break
        if not part:  # close_notify
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _tls_object(stream: trio.abc.Stream) -> ssl.SSLObject | None:
    """The `ssl.SSLObject` of a `trio.SSLStream`, None for any other stream, or for a Trio
    that no longer keeps it where this looks (reads then go one record at a time)."""
    if not isinstance(stream, trio.SSLStream):
        return None
    tls = getattr(stream, "_ssl_object", None)
    return tls if isinstance(tls, ssl.SSLObject) else None


def _plain_socket(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under a plain TCP stream, None over TLS (whose stream Trio must drive)."""
    return stream.socket if type(stream) is trio.SocketStream else None
