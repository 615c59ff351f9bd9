"""Who may connect as which group: secrets checked in constant time, failures rate-limited.

Pure: the caller passes the time. Failures are counted per (address, group) for the
groups of `[auth]`, and per address for names that are no group at all, so a peer
guessing at one group, or spraying made-up names, never locks another group out of
the same address (one NAT'd attacker cannot lock out a whole office). The table of
buckets is bounded: the least recently used is forgotten first.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

from kiteq.server.ratelimit import TokenBucket
from protocol.session import quote

FAILURES_PER_SECOND = 1.0
FAILURE_BURST = 10.0
MAX_TRACKED = 4096


class Refusal(NamedTuple):
    kind: str  # "auth.refused" or "auth.rate_limited": what the log calls it
    reason: str  # what the peer is told


class Authenticator:
    def __init__(
        self,
        secrets: Mapping[str, str],
        *,
        rate: float = FAILURES_PER_SECOND,
        burst: float = FAILURE_BURST,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.secrets = dict(secrets)
        self.rate = rate
        self.burst = burst
        self.max_tracked = max_tracked
        self._failures: OrderedDict[tuple[str, str | None], TokenBucket] = OrderedDict()

    @property
    def open(self) -> bool:
        """No `[auth]` table: every group is accepted with any secret."""
        return not self.secrets

    @property
    def tracked(self) -> int:
        return len(self._failures)

    def check(self, group: str, secret: str, host: str, now: float) -> Refusal | None:
        """None when `group` may connect from `host`, else why not (never echoing the secret)."""
        if self.open:
            return None
        expected = self.secrets.get(group)
        key = (host, group if expected is not None else None)
        bucket = self._failures.get(key)
        if bucket is not None:
            self._failures.move_to_end(key)
            if not bucket.try_take(now):
                return Refusal(
                    "auth.rate_limited",
                    f"too many failed authentications for group {quote(group)} from this address; wait and retry",
                )
        if expected is not None and hmac.compare_digest(expected.encode(), secret.encode()):
            return None
        if bucket is None:
            self._failures[key] = TokenBucket(self.rate, self.burst)
            if len(self._failures) > self.max_tracked:
                self._failures.popitem(last=False)
        return Refusal(
            "auth.refused", f"authentication failed for group {quote(group)}: unknown group or wrong secret"
        )
