"""KiteQ's wire protocol, sans-IO: messages, command table, framing, one error type."""

from protocol import kiteq_pb2 as pb
from protocol.commands import BODY_TYPES, MESSAGE_CMDS, BindType, Cmd, TxStatus
from protocol.errors import KiteQError, ProtocolError
from protocol.framing import (
    DEFAULT_MAX_BODY,
    HEADER_SIZE,
    Frame,
    FrameDecoder,
    decode_body,
    encode_frame,
    encode_raw_frame,
)

__all__ = [
    "BODY_TYPES",
    "DEFAULT_MAX_BODY",
    "HEADER_SIZE",
    "MESSAGE_CMDS",
    "BindType",
    "Cmd",
    "Frame",
    "FrameDecoder",
    "KiteQError",
    "ProtocolError",
    "TxStatus",
    "decode_body",
    "encode_frame",
    "encode_raw_frame",
    "pb",
]
