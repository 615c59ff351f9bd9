"""A delivery round: one attempt to push a message to the groups still owed it.

Pure bookkeeping, no I/O: what was sent to whom, who answered what, and — once
everyone answered — what the store must record (`Outcome`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protocol import Cmd
from stores.entity import MessageEntity


class Verdict(enum.Enum):
    FINISH = "finish"  # every target group acked: forget the message
    RETRY = "retry"  # some group failed: back off, then deliver to the failed ones again
    REOFFER = "reoffer"  # nothing failed, but some groups were not reached yet: due again now
    DEAD = "dead"  # out of attempts or time: to the dead-letter queue
    UNCHANGED = "unchanged"  # nothing was sent and nothing changed: the store stays as it is


@dataclass(slots=True)
class Outcome:
    verdict: Verdict
    succ_groups: tuple[str, ...]
    fail_groups: tuple[str, ...]
    deliver_count: int
    reason: str = ""


@dataclass(eq=False, slots=True)
class Round:
    entity: MessageEntity
    cmd: Cmd
    body: bytes
    targets: frozenset[str]
    succ: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    deferred: bool = False
    dispatched: bool = False

    @classmethod
    def of(cls, entity: MessageEntity, targets: frozenset[str]) -> Round:
        wire = entity.to_wire()
        wire.header.properties.add(key=DELIVER_COUNT_PROPERTY, value=str(entity.deliver_count + 1))
        return cls(entity, entity.kind, wire.SerializeToString(), targets, succ=set(entity.succ_groups))

    @property
    def message_id(self) -> str:
        return self.entity.message_id

    @property
    def complete(self) -> bool:
        return not self.pending

    def record(self, group: str, ok: bool, reason: str = "") -> None:
        self.pending.discard(group)
        if ok:
            self.succ.add(group)
        else:
            self.failed[group] = reason

    def outcome(self, now: float) -> Outcome:
        """What the store must record for this round, once no group is pending."""
        entity = self.entity
        if not self.targets:
            # No binding matches (yet): counts as a failed round, so it ends in the
            # dead-letter queue rather than waiting forever for a subscriber.
            count = entity.deliver_count + 1
            if count >= entity.deliver_limit:
                return Outcome(Verdict.DEAD, (), (), count, "no-binding")
            return Outcome(Verdict.RETRY, (), (), count, "no-binding")
        count = entity.deliver_count + (1 if self.dispatched else 0)
        succ = tuple(sorted(self.succ))
        failed = tuple(sorted(self.failed))
        if entity.is_expired(now):
            return Outcome(Verdict.DEAD, succ, failed, count, "expired")
        if self.targets <= self.succ:
            return Outcome(Verdict.FINISH, succ, (), count)
        if failed:
            if count >= entity.deliver_limit:
                return Outcome(Verdict.DEAD, succ, failed, count, "deliver-limit")
            return Outcome(Verdict.RETRY, succ, failed, count)
        # Not sent anywhere but still leased (a fresh message whose lanes were full or whose
        # groups were offline): due again now, so the recover loop offers it when they free up.
        leased = entity.next_deliver_at > now
        if self.dispatched or set(succ) != set(entity.succ_groups) or leased:
            return Outcome(Verdict.REOFFER, succ, (), count)
        return Outcome(Verdict.UNCHANGED, succ, (), count)


# Deliveries carry their round number as a header property: KiteQ's header has no
# field for it and its clients ignore properties they do not know.
DELIVER_COUNT_PROPERTY = "kiteq.deliverCount"
