"""Snappy bodies (`header.snappy`), byte for byte as KiteQ's Go client writes and reads them.

The Go client compresses with the Snappy *block* format (`snappy.Encode`, not the
framed stream format). A StringMessage's body must stay a string, so it becomes the
standard base64 (padded) of the block. The broker stores and delivers these bytes
untouched: only clients compress and decompress.
"""

from __future__ import annotations

import base64

import cramjam

from protocol.errors import KiteQError

# No valid block holds more than 64 bytes per 3 it takes (a copy with a 2-byte offset,
# the format's best case). A larger length claimed in a block's header is corrupt;
# refusing it before decompressing spares allocating what a 5-byte body may claim (4 GiB).
MAX_EXPANSION = 22


class CorruptBody(KiteQError):
    """A body flagged snappy that does not decompress: bad base64, a corrupt block, or not UTF-8."""


def compress(body: bytes | str) -> bytes | str:
    """The body as the Go client sends it with `header.snappy` set; a str stays a str (base64)."""
    if isinstance(body, str):
        return base64.b64encode(bytes(cramjam.snappy.compress_raw(body.encode()))).decode("ascii")
    return bytes(cramjam.snappy.compress_raw(body))


def decompress(body: bytes | str) -> bytes | str:
    """The body `compress` (or the Go client) was given; raises CorruptBody."""
    try:
        if isinstance(body, str):
            return _inflate(base64.b64decode(body, validate=True)).decode()
        return _inflate(body)
    except ValueError as exc:  # binascii.Error (base64), UnicodeDecodeError, non-ASCII str
        raise CorruptBody(f"snappy body does not decode: {exc}") from None


def _inflate(block: bytes) -> bytes:
    try:
        claimed = cramjam.snappy.decompress_raw_len(block)
        if claimed > MAX_EXPANSION * len(block):
            raise CorruptBody(f"snappy block of {len(block)} bytes claims {claimed} bytes: corrupt")
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise CorruptBody(f"not a snappy block: {exc}") from None
