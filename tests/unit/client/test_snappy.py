"""Snappy bodies against golden bytes of the block format, not the library against itself.

Each vector is spelled out from the format's description (google/snappy's
format_description.txt): the uncompressed length as a little-endian varint, then
elements whose tag byte's low two bits say literal (00), copy with a 1-byte offset (01)
or a 2-byte offset (10). Some are golang/snappy's own test cases, the library KiteQ's
Go client compresses with.
"""

from __future__ import annotations

import base64

import pytest

from kiteq.client.compression import CorruptBody, compress, decompress

LITERAL_100 = bytes(range(100))

DECODES = [
    (b"\x00", b""),  # length 0, no element
    (b"\x05" + b"\x10" + b"hello", b"hello"),  # literal, length-1 = 4 in the tag's upper 6 bits
    (b"\x03" + b"\xf0\x02" + b"\xff\xff\xff", b"\xff\xff\xff"),  # literal, length-1 in 1 extra byte (tag 60)
    (b"\x64" + b"\xf0\x63" + LITERAL_100, LITERAL_100),
    # "abcd", then a copy with a 1-byte offset: tag 0b01 | (length-4) << 2, then the offset.
    (b"\x0d" + b"\x0cabcd" + b"\x15\x04", b"abcdabcdabcda"),  # golang/snappy: length 9, offset 4
    (b"\x08" + b"\x0cabcd" + b"\x01\x01", b"abcddddd"),  # overlapping copy: offset 1 repeats the last byte
    # A copy with a 2-byte offset: tag 0b10 | (length-1) << 2, then the offset little-endian.
    (b"\x06" + b"\x0cabcd" + b"\x06\x03\x00", b"abcdbc"),  # golang/snappy: length 2, offset 3
    # A two-byte varint (200 = 0xc8 0x01): "a", three 64-byte copies, then 7 more (1-byte offset).
    (b"\xc8\x01" + b"\x00a" + b"\xfe\x01\x00" * 3 + b"\x0d\x01", b"a" * 200),
]

CORRUPT = [
    b"",  # no length
    b"\xff",  # the varint never ends
    b"\x08" + b"\x0cabcd" + b"\x01\x00",  # offset 0
    b"\x08" + b"\x0cabcd" + b"\x01\x05",  # offset before the start
    b"\x09" + b"\x0cabcd" + b"\x01\x04",  # 8 bytes where 9 were announced
    b"\xff\xff\xff\xff\x0f" + b"\x00a",  # claims 4 GiB from 7 bytes: refused before any allocation
]


@pytest.mark.parametrize(("block", "plain"), DECODES)
def test_golden_blocks_decompress(block: bytes, plain: bytes) -> None:
    assert decompress(block) == plain
    if plain.isascii():  # as a StringMessage's body: base64 of the same block
        assert decompress(base64.b64encode(block).decode()) == plain.decode()


def test_golden_compressed_bytes() -> None:
    # What golang/snappy's Encode writes (its TestWriterGoldenOutput, inside the frame):
    # "A", then copies of 64 and 35 bytes at offset 1.
    assert compress(b"A" * 100) == b"\x64" + b"\x00A" + b"\xfe\x01\x00" + b"\x8a\x01\x00"
    # Nothing repeats: one literal, exactly as the format spells it.
    assert compress(b"hello") == b"\x05\x10hello"
    assert compress(LITERAL_100) == b"\x64\xf0\x63" + LITERAL_100
    assert compress(b"") == b"\x00"


def test_a_string_body_is_base64_of_the_block_of_its_utf8() -> None:
    assert compress("hello") == base64.b64encode(b"\x05\x10hello").decode() == "BRBoZWxsbw=="
    text = "héllo wörld " * 50
    wire = compress(text)
    assert isinstance(wire, str) and wire.isascii() and len(wire) < len(text)
    assert decompress(wire) == text


@pytest.mark.parametrize("block", CORRUPT)
def test_corrupt_blocks_are_refused(block: bytes) -> None:
    with pytest.raises(CorruptBody):
        decompress(block)


@pytest.mark.parametrize(
    "body",
    [
        "not base64!",
        "é",  # not ASCII, so not base64
        base64.b64encode(b"garbage!").decode(),  # base64 of something that is not a block
        base64.b64encode(b"\x02" + b"\x04\xff\xfe").decode(),  # a block, but not UTF-8
    ],
)
def test_corrupt_string_bodies_are_refused(body: str) -> None:
    with pytest.raises(CorruptBody):
        decompress(body)
