"""A delivery round: one attempt to push a message to the groups still owed it.

Pure bookkeeping, no I/O and no clock of its own: what was sent to whom, who answered
what, and — once everyone answered — what the store must record (`Outcome`). The
round changes only through its own transitions (`offered`, `returned`, `skipped`,
`record`); the dispatcher calls them as deliveries are queued, sent and answered.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from kiteq.server.dead_reasons import DeadReason
from protocol import Cmd, pb
from stores.entity import MessageEntity


class Verdict(enum.Enum):
    FINISH = "finish"  # every target group acked: forget the message
    RETRY = "retry"  # some group failed: back off, then deliver to the failed ones again
    REOFFER = "reoffer"  # nothing failed, but some groups were not reached yet: due again now
    DEAD = "dead"  # out of attempts or time: to the dead-letter queue
    UNCHANGED = "unchanged"  # nothing was sent and nothing changed: the store stays as it is


# A fresh message about to be delivered is leased: stored with its next delivery this
# many deliver_timeouts ahead, so the recover loop does not page it while it is on its
# way. Every outcome rewrites that time; only a crash leaves the lease to run out, and
# then the lease's end is when recovery delivers it again.
LEASE_FACTOR = 2.0


def first_due(now: float, deliver_timeout: float, delivering: bool) -> float:
    """When a fresh message is due in the store: after the lease if it is delivered now, else
    now (a lane it routes to is full: it waits in the store, due, for the recover loop)."""
    return now + LEASE_FACTOR * deliver_timeout if delivering else now


@dataclass(slots=True)
class Outcome:
    verdict: Verdict
    succ_groups: tuple[str, ...]
    fail_groups: tuple[str, ...]
    deliver_count: int
    reason: str = ""

    # Written out, as Round's: one per round (docs/design.md, "compiled modules").
    def __init__(
        self,
        verdict: Verdict,
        succ_groups: tuple[str, ...],
        fail_groups: tuple[str, ...],
        deliver_count: int,
        reason: str = "",
    ) -> None:
        self.verdict = verdict
        self.succ_groups = succ_groups
        self.fail_groups = fail_groups
        self.deliver_count = deliver_count
        self.reason = reason


@dataclass(eq=False, slots=True)
class Round:
    entity: MessageEntity
    cmd: Cmd
    body: bytes
    targets: frozenset[str]
    succ: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    dispatched: bool = False

    # Written out: the generated one would stay interpreted (docs/design.md, "compiled
    # modules"), and a round is built for every message delivered.
    def __init__(
        self,
        entity: MessageEntity,
        cmd: Cmd,
        body: bytes,
        targets: frozenset[str],
        succ: set[str] | None = None,
        failed: dict[str, str] | None = None,
        pending: set[str] | None = None,
        dispatched: bool = False,
    ) -> None:
        self.entity = entity
        self.cmd = cmd
        self.body = body
        self.targets = targets
        self.succ = set() if succ is None else succ
        self.failed = {} if failed is None else failed
        self.pending = set() if pending is None else pending
        self.dispatched = dispatched

    @classmethod
    def of(cls, entity: MessageEntity, targets: frozenset[str], sent: bytes = b"") -> Round:
        """A round for `entity`; `sent` is the body as its producer serialized it, when at hand.

        Re-serializing a message costs more than the rest of its delivery. So a fresh
        message goes out as the producer's bytes followed by a second, partial header:
        protobuf parsers merge repeated occurrences of a message field (scalars: last
        wins; repeated: appended), so every client reads the normalised limits and
        times and the deliver count, exactly as if the header had been rebuilt.
        """
        if not targets:
            body = b""  # nothing will be sent
        elif sent:
            body = sent + _header_update(entity)
        else:
            body = entity.wire_bytes(((DELIVER_COUNT_PROPERTY, str(entity.deliver_count + 1)),))
        return cls(entity, entity.kind, body, targets, succ=set(entity.succ_groups))

    @property
    def message_id(self) -> str:
        return self.entity.message_id

    @property
    def complete(self) -> bool:
        return not self.pending

    def offered(self, group: str) -> None:
        """A delivery to `group` is queued: the round waits for its answer."""
        self.pending.add(group)
        self.dispatched = True

    def returned(self, group: str) -> None:
        """A queued delivery to `group` was never sent: the group is owed it again later."""
        self.pending.discard(group)

    def skipped(self, group: str) -> None:
        """`group` is not owed this message: a non-persistent binding with nobody online."""
        self.succ.add(group)

    def record(self, group: str, ok: bool, reason: str = "") -> None:
        """`group` answered: acked, or failed (a nack, a timeout, a lost connection) for `reason`."""
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
                return Outcome(Verdict.DEAD, (), (), count, DeadReason.NO_BINDING)
            return Outcome(Verdict.RETRY, (), (), count, DeadReason.NO_BINDING)
        count = entity.deliver_count + (1 if self.dispatched else 0)
        succ = tuple(sorted(self.succ))
        failed = tuple(sorted(self.failed))
        if entity.is_expired(now):
            return Outcome(Verdict.DEAD, succ, failed, count, DeadReason.EXPIRED)
        if self.targets <= self.succ:
            return Outcome(Verdict.FINISH, succ, (), count)
        if failed:
            if count >= entity.deliver_limit:
                return Outcome(Verdict.DEAD, succ, failed, count, DeadReason.DELIVER_LIMIT)
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
