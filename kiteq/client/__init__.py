"""Producer and Consumer libraries (Trio); `kiteq.sync` wraps them for blocking code."""

from kiteq.client.consumer import Consumer
from kiteq.client.listeners import CheckMessageListener, MessageListener
from kiteq.client.message import Message, new_message_id
from kiteq.client.pipeline import SendPipeline
from kiteq.client.producer import Producer, SendResult

__all__ = [
    "CheckMessageListener",
    "Consumer",
    "Message",
    "MessageListener",
    "Producer",
    "SendPipeline",
    "SendResult",
    "new_message_id",
]
