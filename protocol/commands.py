"""Command bytes, their protobuf bodies, and the wire integers of KiteQ's enums.

Every mapping between a wire number and a Python name lives in this module.
"""

from __future__ import annotations

import enum

from google.protobuf.message import Message as ProtobufMessage

from protocol import kiteq_pb2 as pb


class Cmd(enum.IntEnum):
    """Command type, the fifth byte of a frame header (turbo's cmdType)."""

    HEARTBEAT = 0x01
    CONN_META = 0x02
    CONN_AUTH_ACK = 0x03
    MESSAGE_STORE_ACK = 0x04
    DELIVER_ACK = 0x05
    TX_ACK = 0x06
    BYTES_MESSAGE = 0x11
    STRING_MESSAGE = 0x12
    # KiteQ-py's own: a producer cancels a scheduled message (a TxACKPacket naming it),
    # answered with a MessageStoreAck. KiteQ's brokers do not know it.
    CANCEL = 0x21


BODY_TYPES: dict[Cmd, type[ProtobufMessage]] = {
    Cmd.HEARTBEAT: pb.HeartBeat,
    Cmd.CONN_META: pb.ConnMeta,
    Cmd.CONN_AUTH_ACK: pb.ConnAuthAck,
    Cmd.MESSAGE_STORE_ACK: pb.MessageStoreAck,
    Cmd.DELIVER_ACK: pb.DeliverAck,
    Cmd.TX_ACK: pb.TxACKPacket,
    Cmd.CANCEL: pb.TxACKPacket,
    Cmd.BYTES_MESSAGE: pb.BytesMessage,
    Cmd.STRING_MESSAGE: pb.StringMessage,
}

MESSAGE_CMDS = frozenset({Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE})


class TxStatus(enum.IntEnum):
    """TxACKPacket.status: the broker asks with UNKNOWN, the producer answers."""

    UNKNOWN = 0
    COMMIT = 1
    ROLLBACK = 2


class BindType(enum.IntEnum):
    """The `bindType` integer of a binding in the registry's JSON."""

    DIRECT = 0
    REGEX = 1
    FANOUT = 2
