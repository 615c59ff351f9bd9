"""Why a message went to the dead-letter queue: the reasons the broker writes, in one place.

The store keeps the reason as text; these are all the values the broker writes, so an
admin filter naming anything else can be refused instead of silently matching nothing.
"""

from __future__ import annotations

import enum


class DeadReason(enum.StrEnum):
    EXPIRED = "expired"  # past its expiredTime at the end of a round
    DELIVER_LIMIT = "deliver-limit"  # a failed round reached its deliverLimit
    NO_BINDING = "no-binding"  # no binding matched until its deliverLimit ran out
    TX_UNRESOLVED = "tx-unresolved"  # the producer never decided, after tx_check_max questions
