"""Frame encode + decode of a 1 KiB BytesMessage, single core."""

from __future__ import annotations

import time

from benchmarks.harness import Figure, median_of
from protocol import Cmd, FrameDecoder, decode_body, encode_frame, pb


def _sample() -> pb.BytesMessage:
    header = pb.Header(
        messageId="0123456789abcdef0123456789abcdef",
        topic="trade",
        messageType="pay-succ",
        expiredTime=-1,
        deliverLimit=100,
        groupId="order-svc",
        commit=True,
        fly=False,
    )
    return pb.BytesMessage(header=header, body=b"x" * 1024)


def run(quick: bool) -> list[Figure]:
    count = 20_000 if quick else 200_000
    message = _sample()

    def encode_decode() -> float:
        started = time.perf_counter()
        frames = [encode_frame(i, Cmd.BYTES_MESSAGE, message) for i in range(count)]
        stream = b"".join(frames)
        decoder = FrameDecoder()
        decoded = 0
        for offset in range(0, len(stream), 65536):
            for frame in decoder.feed(stream[offset : offset + 65536]):
                decode_body(frame)
                decoded += 1
        assert decoded == count
        return count / (time.perf_counter() - started)

    value, runs = median_of(3, encode_decode)
    return [Figure("codec", "encode+decode 1 KiB BytesMessage", value, "frames/s", {"frames": count}, runs)]
