"""The frame codec, driven with byte strings: round trips, golden bytes, splits, garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    BODY_TYPES,
    HEADER_SIZE,
    Cmd,
    Frame,
    FrameDecoder,
    ProtocolError,
    decode_body,
    encode_frame,
    pb,
)


def header(message_id: str = "0123456789abcdef0123456789abcdef") -> pb.Header:
    return pb.Header(
        messageId=message_id,
        topic="trade",
        messageType="pay-succ",
        expiredTime=-1,
        deliverLimit=100,
        groupId="order-svc",
        commit=True,
        fly=False,
    )


SAMPLES = {
    Cmd.HEARTBEAT: pb.HeartBeat(version=1_700_000_000),
    Cmd.CONN_META: pb.ConnMeta(groupId="g", secretKey="s", warmingupSec=30),
    Cmd.CONN_AUTH_ACK: pb.ConnAuthAck(status=True, feedback="Auth Succ"),
    Cmd.MESSAGE_STORE_ACK: pb.MessageStoreAck(messageId="m", status=False, feedback="why"),
    Cmd.DELIVER_ACK: pb.DeliverAck(messageId="m", topic="t", messageType="mt", groupId="g", status=True),
    Cmd.TX_ACK: pb.TxACKPacket(header=header(), status=1, feedback="commit"),
    Cmd.CANCEL: pb.TxACKPacket(header=header(), status=2, feedback="cancel"),
    Cmd.BYTES_MESSAGE: pb.BytesMessage(header=header(), body=b"\x00\xffbody"),
    Cmd.STRING_MESSAGE: pb.StringMessage(header=header(), body="héllo"),
}


def test_every_command_has_a_sample_and_a_body_type() -> None:
    assert set(SAMPLES) == set(Cmd) == set(BODY_TYPES)


@pytest.mark.parametrize("cmd", list(Cmd))
def test_round_trip_every_command(cmd: Cmd) -> None:
    data = encode_frame(42, cmd, SAMPLES[cmd])
    [frame] = FrameDecoder().feed(data)
    assert (frame.opaque, frame.cmd) == (42, cmd)
    assert decode_body(frame) == SAMPLES[cmd]


def test_golden_bytes_of_a_heartbeat() -> None:
    # opaque=7, cmd=0x01, version=0, extension=0, body_len=2, body = field 1 varint 5
    assert encode_frame(7, Cmd.HEARTBEAT, pb.HeartBeat(version=5)) == bytes.fromhex(
        "000000070100000000000000000000000000020805"
    )


def test_golden_bytes_of_a_conn_meta() -> None:
    data = encode_frame(1, Cmd.CONN_META, pb.ConnMeta(groupId="g", secretKey="s"))
    assert data[:HEADER_SIZE].hex() == "00000001020000000000000000000000000006"
    assert data[HEADER_SIZE:] == b"\x0a\x01g\x12\x01s"


def test_frames_split_byte_by_byte_and_pipelined() -> None:
    stream = b"".join(encode_frame(i, cmd, SAMPLES[cmd]) for i, cmd in enumerate(Cmd))
    decoder = FrameDecoder()
    frames = [f for byte in stream for f in decoder.feed(bytes([byte]))]
    assert [f.cmd for f in frames] == list(Cmd)
    assert decoder.buffered == 0
    assert [f.cmd for f in FrameDecoder().feed(stream)] == list(Cmd)


def test_oversized_length_is_a_protocol_error_and_sticks() -> None:
    decoder = FrameDecoder(max_body=1024)
    bad = bytes.fromhex("000000091100000000000000000000") + (1025).to_bytes(4, "big")
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decoder.feed(bad)
    with pytest.raises(ProtocolError):
        decoder.feed(encode_frame(1, Cmd.HEARTBEAT, SAMPLES[Cmd.HEARTBEAT]))


def test_frames_before_a_bad_header_are_returned_then_the_error_is_raised() -> None:
    decoder = FrameDecoder()
    good = encode_frame(3, Cmd.HEARTBEAT, SAMPLES[Cmd.HEARTBEAT])
    bad = bytes.fromhex("000000047f0000000000000000000000000000")
    assert [f.opaque for f in decoder.feed(good + bad)] == [3]
    with pytest.raises(ProtocolError, match="unknown command"):
        decoder.check()
    with pytest.raises(ProtocolError):
        decoder.feed(good)


def test_negative_length_and_unknown_command() -> None:
    negative = bytes.fromhex("000000010100000000000000000000ffffffff")
    with pytest.raises(ProtocolError, match="negative"):
        FrameDecoder().feed(negative)
    unknown = bytes.fromhex("000000017f0000000000000000000000000000")
    with pytest.raises(ProtocolError, match="unknown command 0x7f"):
        FrameDecoder().feed(unknown)


def test_undecodable_body_is_recoverable() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_body(Frame(5, Cmd.BYTES_MESSAGE, b"\xff\xff\xff"))
    assert info.value.recoverable and info.value.opaque == 5
    with pytest.raises(ProtocolError, match="required"):
        decode_body(Frame(5, Cmd.DELIVER_ACK, b""))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.lists(st.integers(min_value=1, max_value=64), max_size=40))
def test_random_bytes_give_frames_or_protocol_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_body=2048)
    offset = 0
    try:
        for size in [*cuts, len(data)]:
            for frame in decoder.feed(data[offset : offset + size]):
                assert frame.cmd in Cmd
                try:
                    decode_body(frame)
                except ProtocolError as exc:
                    assert exc.recoverable
            decoder.check()
            offset += size
    except ProtocolError as exc:
        assert not exc.recoverable


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(list(Cmd)), min_size=1, max_size=20), st.integers(min_value=1, max_value=50))
def test_any_split_of_valid_frames_decodes_them_all(cmds: list[Cmd], chunk: int) -> None:
    stream = b"".join(encode_frame(i, cmd, SAMPLES[cmd]) for i, cmd in enumerate(cmds))
    decoder = FrameDecoder()
    frames = [f for i in range(0, len(stream), chunk) for f in decoder.feed(stream[i : i + chunk])]
    assert [(f.opaque, f.cmd) for f in frames] == list(enumerate(cmds))
    # Cut from a read or from what was held over, a body is the same immutable bytes.
    assert [f.body for f in frames] == [SAMPLES[cmd].SerializeToString() for cmd in cmds]
    assert all(type(f.body) is bytes for f in frames)
    assert decoder.buffered == 0
