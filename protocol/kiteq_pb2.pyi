from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HeartBeat(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ConnMeta(_message.Message):
    __slots__ = ("groupId", "secretKey", "warmingupSec")
    GROUPID_FIELD_NUMBER: _ClassVar[int]
    SECRETKEY_FIELD_NUMBER: _ClassVar[int]
    WARMINGUPSEC_FIELD_NUMBER: _ClassVar[int]
    groupId: str
    secretKey: str
    warmingupSec: int
    def __init__(self, groupId: _Optional[str] = ..., secretKey: _Optional[str] = ..., warmingupSec: _Optional[int] = ...) -> None: ...

class ConnAuthAck(_message.Message):
    __slots__ = ("status", "feedback")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    status: bool
    feedback: str
    def __init__(self, status: _Optional[bool] = ..., feedback: _Optional[str] = ...) -> None: ...

class MessageStoreAck(_message.Message):
    __slots__ = ("messageId", "status", "feedback")
    MESSAGEID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    messageId: str
    status: bool
    feedback: str
    def __init__(self, messageId: _Optional[str] = ..., status: _Optional[bool] = ..., feedback: _Optional[str] = ...) -> None: ...

class DeliverAck(_message.Message):
    __slots__ = ("messageId", "topic", "messageType", "groupId", "status", "feedback")
    MESSAGEID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGETYPE_FIELD_NUMBER: _ClassVar[int]
    GROUPID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    messageId: str
    topic: str
    messageType: str
    groupId: str
    status: bool
    feedback: str
    def __init__(self, messageId: _Optional[str] = ..., topic: _Optional[str] = ..., messageType: _Optional[str] = ..., groupId: _Optional[str] = ..., status: _Optional[bool] = ..., feedback: _Optional[str] = ...) -> None: ...

class TxACKPacket(_message.Message):
    __slots__ = ("header", "status", "feedback")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    header: Header
    status: int
    feedback: str
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., status: _Optional[int] = ..., feedback: _Optional[str] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("messageId", "topic", "messageType", "expiredTime", "deliverLimit", "groupId", "commit", "fly", "properties", "createTime", "snappy")
    MESSAGEID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGETYPE_FIELD_NUMBER: _ClassVar[int]
    EXPIREDTIME_FIELD_NUMBER: _ClassVar[int]
    DELIVERLIMIT_FIELD_NUMBER: _ClassVar[int]
    GROUPID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    FLY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    CREATETIME_FIELD_NUMBER: _ClassVar[int]
    SNAPPY_FIELD_NUMBER: _ClassVar[int]
    messageId: str
    topic: str
    messageType: str
    expiredTime: int
    deliverLimit: int
    groupId: str
    commit: bool
    fly: bool
    properties: _containers.RepeatedCompositeFieldContainer[Entry]
    createTime: int
    snappy: bool
    def __init__(self, messageId: _Optional[str] = ..., topic: _Optional[str] = ..., messageType: _Optional[str] = ..., expiredTime: _Optional[int] = ..., deliverLimit: _Optional[int] = ..., groupId: _Optional[str] = ..., commit: _Optional[bool] = ..., fly: _Optional[bool] = ..., properties: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., createTime: _Optional[int] = ..., snappy: _Optional[bool] = ...) -> None: ...

class BytesMessage(_message.Message):
    __slots__ = ("header", "body")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    header: Header
    body: bytes
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., body: _Optional[bytes] = ...) -> None: ...

class StringMessage(_message.Message):
    __slots__ = ("header", "body")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    header: Header
    body: str
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., body: _Optional[str] = ...) -> None: ...
