"""One back-scan question in flight to a producer connection."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stores.entity import MessageEntity


@dataclass(eq=False, slots=True)
class TxCheck:
    """Asked about `entity`; `settle` is called once with how it ended (an answer, a timeout, a loss)."""

    entity: MessageEntity
    settle: Callable[[TxCheck, str], None]
    sent_at: float
    opaque: int = 0

    def resolve(self, ok: bool, reason: str = "") -> None:
        self.settle(self, reason)
