"""A token bucket: `rate` events per second, bursts up to `burst`. Pure, clock passed in."""

from __future__ import annotations


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at: float | None = None

    def try_take(self, now: float) -> bool:
        if self._at is not None:  # a clock stepping back refills nothing
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
