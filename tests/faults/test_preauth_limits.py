"""Peers that never authenticate cannot take the broker's memory, log or connection slots.

Raw sockets on loopback, as an attacker would use them; the broker is a real
`kiteq-server` process where its memory or its log is what is measured.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from protocol import Cmd, encode_frame, pb
from protocol.framing import HEADER
from tests.helpers import registry_uri, running_broker
from tests.procs.broker import BrokerProcess
from tests.procs.memory import memory_of
from tests.services.ports import wait_for_port
from tests.wire import RawPeer

pytestmark = pytest.mark.faults

MIB = 1024 * 1024
AUTH = '[auth]\np = "p-secret"\nx = "x-secret"\n'


def config_file(tmp_path: Path, extra: str = "") -> tuple[str, ...]:
    path = tmp_path / "kiteq.toml"
    path.write_text(extra + AUTH)
    return ("--config", str(path))


async def start_broker(tmp_path: Path, extra: str = "") -> BrokerProcess:
    broker = BrokerProcess(tmp_path, registry_uri(tmp_path), extra=config_file(tmp_path, extra))
    await broker.start()
    try:
        await trio.to_thread.run_sync(wait_for_port, broker.admin_port)  # serving, store recovered
    except BaseException:
        await broker.kill()  # started, never serving: it must not outlive the test
        raise
    return broker


async def send_ignoring_reset(stream: trio.SocketStream, data: bytes) -> None:
    """Send as much as the broker takes: it may close the connection halfway, as it should."""
    with contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(data)


async def test_unauthenticated_2mib_frames_do_not_grow_the_broker(tmp_path: Path) -> None:
    broker = await start_broker(tmp_path)
    assert broker.process is not None
    try:
        before, _ = memory_of(broker.process.pid)
        announced = HEADER.pack(1, Cmd.CONN_META, 0, 0, 2 * MIB)
        streams = []
        async with trio.open_nursery() as nursery:
            for _ in range(150):
                stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
                streams.append(stream)
                nursery.start_soon(send_ignoring_reset, stream, announced + b"\0" * (2 * MIB - 1))
        closed = [await RawPeer(stream).closed_by_broker() for stream in streams]
        _, peak = memory_of(broker.process.pid)
        assert all(closed), "each was closed at its header"
        assert peak - before < 64 * MIB, f"the broker grew by {(peak - before) / MIB:.1f} MiB at its peak"
        good = await RawPeer.login(broker.address, "p", "p-secret")
        await good.aclose()
        for stream in streams:
            await stream.aclose()
    finally:
        await broker.stop()


@pytest.mark.parametrize("pre_auth", [None, 4 * MIB], ids=["default limit", "limit raised to 4 MiB"])
async def test_refused_huge_handshakes_add_little_to_the_log(tmp_path: Path, pre_auth: int | None) -> None:
    extra = f"[server]\npre_auth_max_bytes = {pre_auth}\n" if pre_auth else ""
    broker = await start_broker(tmp_path, extra)
    try:
        before = broker.log.stat().st_size
        meta = encode_frame(1, Cmd.CONN_META, pb.ConnMeta(groupId="g" * 1_900_000, secretKey="wrong"))
        for _ in range(12):
            peer = await RawPeer.connect(broker.address)
            await send_ignoring_reset(peer.stream, meta)
            assert await peer.closed_by_broker()
        await RawPeer.login(broker.address, "p", "p-secret")  # serving, and its log lines are out
        grown = broker.log.stat().st_size - before
        assert grown < 512 * 1024, f"the log grew by {grown} bytes"
    finally:
        await broker.stop()
    log = broker.log.read_text()
    assert "refus" in log, "the refusals are logged, in bounded volume"
    assert "g" * 1000 not in log


async def slow_peer(address: str, stop: trio.Event, trickle: float) -> None:
    """Slowloris: connect and send a ConnMeta header one byte at a time; reconnect when closed."""
    header = HEADER.pack(1, Cmd.CONN_META, 0, 0, 100)
    while not stop.is_set():
        peer = await RawPeer.connect(address)
        try:
            for byte in header:
                await peer.stream.send_all(bytes([byte]))
                with trio.move_on_after(trickle):
                    await stop.wait()
                if stop.is_set():
                    break
        except trio.BrokenResourceError:
            pass
        finally:
            await peer.aclose()


async def test_slow_unauthenticated_peers_cannot_lock_out_a_good_client(tmp_path: Path) -> None:
    server = {"max_connections": 50, "handshake_timeout": 3.0}
    async with running_broker(tmp_path, auth={"p": "p-secret"}, server=server) as broker:
        stop = trio.Event()
        served = 0
        tries = 40
        async with trio.open_nursery() as nursery:
            for _ in range(55):
                nursery.start_soon(slow_peer, broker.address, stop, 0.2)
            await trio.sleep(1.0)  # let the slow peers fill the table first
            assert broker.admission.unauthenticated >= 45
            for _ in range(tries):
                try:
                    with trio.fail_after(2):
                        good = await RawPeer.login(broker.address, "p", "p-secret")
                        await good.send(7, Cmd.HEARTBEAT, pb.HeartBeat(version=1))
                        await good.receive(Cmd.HEARTBEAT)
                        await good.aclose()
                    served += 1
                except (trio.TooSlowError, EOFError, OSError, trio.BrokenResourceError):
                    pass
                await trio.sleep(0.1)
            stop.set()
        assert served >= 0.9 * tries, f"served {served} of {tries}"
        assert broker.refusals.totals.get("connection.evicted", 0) >= tries * 0.9


async def test_failed_logins_lock_out_that_group_from_that_address_only(tmp_path: Path) -> None:
    async with running_broker(tmp_path, auth={"p": "p-secret", "x": "x-secret"}) as broker:

        async def login(group: str, secret: str) -> pb.ConnAuthAck:
            peer = await RawPeer.connect(broker.address)
            ack = await peer.authenticate(group, secret)
            await peer.aclose()
            return ack

        for _ in range(11):
            assert not (await login("x", "guess")).status
        for _ in range(11):
            assert not (await login("nobody", "guess")).status
        assert (await login("p", "p-secret")).status, "another group from the same address is not locked out"
        locked = await login("x", "x-secret")
        assert not locked.status and "too many failed authentications" in locked.feedback
