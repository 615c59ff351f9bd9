"""Garbage from many connections at a live broker process: it stays up, its memory stays
bounded, and a well-behaved client on another connection sees no errors throughout."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from kiteq import Binding, Consumer, Message, Producer
from protocol import Cmd, encode_frame, pb
from protocol.framing import HEADER
from tests.helpers import RecordingListener, registry_uri, wait_until
from tests.procs.broker import server_command
from tests.procs.memory import memory_of
from tests.services.ports import free_port, wait_for_port

pytestmark = pytest.mark.faults

FUZZ_CONNECTIONS = 24
FUZZ_SECONDS = 8.0


def auth_frame(rng: random.Random) -> bytes:
    return encode_frame(
        rng.randrange(2**32), Cmd.CONN_META, pb.ConnMeta(groupId=f"fuzz{rng.randrange(9)}", secretKey="")
    )


def garbage_frame(rng: random.Random) -> bytes:
    """One of the ways a peer can be wrong, chosen at random."""
    kind = rng.randrange(7)
    opaque = rng.randrange(2**32)
    if kind == 0:  # valid header, garbage body
        body = rng.randbytes(rng.randrange(200))
        return HEADER.pack(opaque, rng.choice(list(Cmd)), 0, 0, len(body)) + body
    if kind == 1:  # truncated frame
        return encode_frame(opaque, Cmd.HEARTBEAT, pb.HeartBeat(version=1))[: rng.randrange(1, 20)]
    if kind == 2:  # huge length
        return HEADER.pack(opaque, Cmd.BYTES_MESSAGE, 0, 0, 2**31 - 1)
    if kind == 3:  # unknown command
        return HEADER.pack(opaque, rng.choice([0, 7, 0x13, 0xFF]), 0, 0, 0)
    if kind == 4:  # a flood of heartbeats
        return b"".join(encode_frame(opaque + i, Cmd.HEARTBEAT, pb.HeartBeat(version=i)) for i in range(500))
    if kind == 5:  # messages with bad headers
        header = pb.Header(
            messageId=rng.choice(["", "zz", "a" * 32]),
            topic=rng.choice(["", "t"]),
            messageType="x",
            expiredTime=rng.choice([-1, 1]),
            deliverLimit=rng.randrange(-5, 500),
            groupId="fuzz",
            commit=rng.random() < 0.5,
            fly=rng.random() < 0.2,
        )
        return encode_frame(opaque, Cmd.BYTES_MESSAGE, pb.BytesMessage(header=header, body=b"x"))
    return rng.randbytes(rng.randrange(1, 64))  # pure noise


async def fuzz_connection(port: int, seed: int, deadline: float) -> int:
    rng = random.Random(seed)
    sent = 0
    while trio.current_time() < deadline:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.01)
            continue
        try:
            if rng.random() < 0.7:
                await stream.send_all(auth_frame(rng))
            for _ in range(rng.randrange(1, 6)):
                await stream.send_all(garbage_frame(rng))
                sent += 1
            with trio.move_on_after(0.05):
                await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
    return sent


async def test_fuzzed_broker_stays_up_and_serves_others(tmp_path: Path) -> None:
    port = free_port()
    registry = registry_uri(tmp_path)
    proc = subprocess.Popen(
        server_command(f"127.0.0.1:{port}", "memory://", registry, "--log-level", "error"),
        cwd=tmp_path,
        env={**os.environ},
    )
    try:
        await trio.to_thread.run_sync(wait_for_port, port)
        listener = RecordingListener()
        async with (
            Consumer(registry, group="good", bindings=[Binding.direct("t", "x")], listener=listener),
            Producer(registry, group="good-p", topics=["t"]) as producer,
        ):
            await wait_until(lambda: bool(producer.pool.live("t")))
            baseline, _ = memory_of(proc.pid)
            sent_ids: set[str] = set()
            deadline = trio.current_time() + FUZZ_SECONDS
            async with trio.open_nursery() as nursery:
                for seed in range(FUZZ_CONNECTIONS):
                    nursery.start_soon(fuzz_connection, port, seed, deadline)
                while trio.current_time() < deadline:
                    sent_ids.add(await producer.send(Message("t", "x", b"well-behaved")))
                    await trio.sleep(0.01)
            await wait_until(
                lambda: listener.acked_ids >= sent_ids, timeout=30, what="the good consumer to get everything"
            )
            assert proc.poll() is None, "the broker is still running"
            grown = (memory_of(proc.pid)[0] - baseline) // 1024
            assert grown < 100 * 1024, f"broker memory grew by {grown} KiB under fuzzing"
        assert len(sent_ids) > 20, "the well-behaved producer kept sending throughout"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
