"""A delivery round: one attempt to push a message to the groups still owed it.

Pure bookkeeping, no I/O: what was sent to whom, who answered what, and — once
everyone answered — what the store must record (`Outcome`).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from protocol import Cmd, pb
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
    def of(cls, entity: MessageEntity, targets: frozenset[str], sent: bytes = b"") -> Round:
        """A round for `entity`; `sent` is the body as its producer serialized it, when at hand.

        Re-serializing a message costs more than the rest of its delivery. So a fresh
        message goes out as the producer's bytes followed by a second, partial header:
        protobuf parsers merge repeated occurrences of a message field (scalars: last
        wins; repeated: appended), so every client reads the normalised limits and
        times and the deliver count, exactly as if the header had been rebuilt.
        """
        if sent:
            body = sent + _header_update(entity)
        else:
            wire = entity.to_wire()
            wire.header.properties.add(key=DELIVER_COUNT_PROPERTY, value=str(entity.deliver_count + 1))
            body = wire.SerializeToString()
        return cls(entity, entity.kind, body, targets, succ=set(entity.succ_groups))

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


def _header_update(entity: MessageEntity) -> bytes:
    """What the broker changed in a header as produced: the normalised fields and the deliver count."""
    return _encoded_header_update(
        entity.expired_time, entity.deliver_limit, entity.create_time, entity.deliver_count + 1
    )


@functools.lru_cache(maxsize=256)
def _encoded_header_update(
    expired_time: int, deliver_limit: int, create_time: int, deliver_count: int
) -> bytes:
    """Cached: the messages produced in one second share all four values (times are in seconds)."""
    header = pb.Header(
        expiredTime=expired_time,
        deliverLimit=deliver_limit,
        createTime=create_time,
        properties=[pb.Entry(key=DELIVER_COUNT_PROPERTY, value=str(deliver_count))],
    )
    return pb.BytesMessage(header=header).SerializePartialToString()
