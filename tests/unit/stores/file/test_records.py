"""TLV framing: what a scan keeps, and how it tells a torn tail from damage in the middle."""

from __future__ import annotations

import pytest

from stores.file import records
from stores.file.records import HEADER_SIZE, RecordType, Scan


def stream(*payloads: bytes) -> tuple[bytes, list[int]]:
    """Records of `payloads` back to back, and the offset of each."""
    data, offsets = b"", []
    for payload in payloads:
        offsets.append(len(data))
        data += records.encode(RecordType.MESSAGE, payload)
    return data, offsets


def payloads_of(scan: Scan) -> list[bytes]:
    return [scan.data[start:end] for _, _, start, end in scan]


def test_scan_yields_every_record_in_order() -> None:
    data, offsets = stream(b"one", b"", b"three" * 100)
    scan = Scan(data)
    assert payloads_of(scan) == [b"one", b"", b"three" * 100]
    assert scan.end == len(data) and scan.damages == []
    assert [offset for offset, *_ in Scan(data)] == offsets


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 2])
def test_a_record_cut_short_is_a_torn_tail(cut: int) -> None:
    data, offsets = stream(b"first", b"second-record")
    scan = Scan(data[: offsets[1] + cut])
    assert payloads_of(scan) == [b"first"]
    assert scan.end == offsets[1]
    [damage] = scan.damages
    assert damage.torn_tail and damage.offset == offsets[1]


@pytest.mark.parametrize("tail", [b"\0" * 4096, b"garbage after the last record", b"\xa7Q" + b"\0" * 20])
def test_junk_after_the_last_record_is_a_torn_tail(tail: bytes) -> None:
    data, _ = stream(b"a", b"b")
    scan = Scan(data + tail)
    assert payloads_of(scan) == [b"a", b"b"]
    assert scan.damages[0].torn_tail and scan.damages[0].offset == len(data)


def test_a_flipped_bit_in_the_last_record_is_a_torn_tail() -> None:
    data, _ = stream(b"a", b"last one")
    damaged = bytearray(data)
    damaged[-1] ^= 0x01
    scan = Scan(bytes(damaged))
    assert payloads_of(scan) == [b"a"]
    assert scan.damages[0].torn_tail and scan.damages[0].reason == "CRC mismatch"


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        (HEADER_SIZE + 1, "CRC mismatch"),
        (9, "length past the end"),
        (0, "bad magic"),
        (6, "unknown record type 0"),
    ],
)
def test_damage_followed_by_good_records_is_not_a_torn_tail(where: int, reason: str) -> None:
    data, offsets = stream(b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10)
    damaged = bytearray(data)
    damaged[offsets[1] + where] = 0 if where == 6 else damaged[offsets[1] + where] ^ 0xFF
    scan = Scan(bytes(damaged))
    assert payloads_of(scan) == [b"a" * 10]
    [damage] = scan.damages
    assert not damage.torn_tail
    assert (damage.offset, damage.resume, damage.reason) == (offsets[1], offsets[2], reason)


def test_skipping_damage_keeps_every_readable_record() -> None:
    data, offsets = stream(*(bytes([i]) * 50 for i in range(6)))
    damaged = bytearray(data)
    damaged[offsets[1] + HEADER_SIZE] ^= 0xFF
    damaged[offsets[4] + HEADER_SIZE] ^= 0xFF
    scan = Scan(bytes(damaged) + b"torn", skip_damage=True)
    assert payloads_of(scan) == [bytes([i]) * 50 for i in (0, 2, 3, 5)]
    assert [(d.offset, d.torn_tail) for d in scan.damages] == [
        (offsets[1], False),
        (offsets[4], False),
        (len(data), True),
    ]


def test_a_magic_inside_a_payload_does_not_fool_the_resync() -> None:
    data, offsets = stream(b"x" * 20, b"\xa7Q" * 40, b"z" * 20)
    damaged = bytearray(data)
    damaged[offsets[0] + HEADER_SIZE] ^= 0xFF
    scan = Scan(bytes(damaged))
    assert payloads_of(scan) == []
    assert scan.damages[0].resume == offsets[1]
    assert payloads_of(Scan(bytes(damaged), skip_damage=True)) == [b"\xa7Q" * 40, b"z" * 20]


def test_check_reports_why() -> None:
    record = records.encode(RecordType.COMMIT, b"payload")
    assert records.check(record, 0, len(record)) == (RecordType.COMMIT, 7)
    assert records.check(record, 0, 5) == "short header"
    assert records.check(record[:-1], 0, len(record) - 1) == "length past the end"


@pytest.mark.parametrize(
    ("data", "start", "expected"),
    [
        (b"", 0, 0),
        (b"abc", 0, 3),
        (b"abc\0\0", 0, 3),
        (b"\0\0\0", 0, 0),
        (b"\0\0\0", 2, 2),
        (b"a\0b" + bytes(3 << 20), 0, 3),  # zeros over several probes
        (b"a" + bytes(1 << 20) + b"b" + bytes(10), 0, (1 << 20) + 2),  # a MiB of zeros inside
        (bytes(5) + b"x" + bytes(5), 0, 6),
    ],
)
def test_zeros_from_finds_where_the_trailing_zeros_begin(data: bytes, start: int, expected: int) -> None:
    assert records.zeros_from(data, start) == expected


def test_a_scan_stops_where_it_is_told() -> None:
    data, offsets = stream(b"a", b"b", b"c")
    scan = Scan(data + bytes(100), stop=offsets[2])
    assert payloads_of(scan) == [b"a", b"b"]
    assert scan.end == offsets[2] and scan.damages == []
