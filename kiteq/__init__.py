"""KiteQ-py: a transactional push message bus, wire-compatible with KiteQ.

from kiteq import Message, Producer, Consumer, Binding, MessageListener, CheckMessageListener, TxStatus
"""

from kiteq.client import CheckMessageListener, Consumer, Message, MessageListener, Producer, SendResult
from kiteq.errors import AuthError, CancelError, KiteQError, SendError
from kiteq.registry.bindings import Binding
from protocol import TxStatus

__all__ = [
    "AuthError",
    "Binding",
    "CancelError",
    "CheckMessageListener",
    "Consumer",
    "KiteQError",
    "Message",
    "MessageListener",
    "Producer",
    "SendError",
    "SendResult",
    "TxStatus",
]
