"""How much of the event loop's time slow writes in place may take. Pure; the clock is passed in.

A batch written in place (`Writer.flush`) holds up the broker's event loop while it is
written: 0.1-0.3 ms normally. A write longer than `limit` is a slow one, and its time is
charged to a budget that refills at `share` of the wall-clock time, up to `burst`. While
the budget is spent, batches go through the writer thread, until it has refilled. So slow
writes hold up the loop for at most `burst` plus `share` of any stretch of time, plus the
one write that overdrew it: the sporadic hiccups of a busy machine's disk (a 3 ms write
every second or so) cost the fast path nothing, while a disk that has turned slow gets a
write in place once every hundred times its write time (a 10 ms write, once a second).

Before, every slow write paused writes in place for a hundred times as long: in a backlog
of a million sends, 19 hiccups of 2-5 ms sent the batches of about 6 s of its 27 through
the writer thread, which moves about 15 % fewer sends a second.
"""

from __future__ import annotations

# A write in place longer than this is a slow one (a normal one takes 0.1-0.3 ms here).
SLOW_WRITE = 0.002
# Slow writes in place may take this share of the time, beyond the burst.
SHARE = 0.01
# Seconds of slow writes in a row the loop takes before the budget is spent.
BURST = 0.02
# However long a write took (a stall), writes in place resume after this many seconds.
LONGEST_PAUSE = 30.0


class SlowWriteBudget:
    """One store's budget for slow writes in place; used on the Trio thread only."""

    __slots__ = ("_at", "_balance", "burst", "limit", "longest_pause", "share")

    def __init__(
        self,
        limit: float = SLOW_WRITE,
        share: float = SHARE,
        burst: float = BURST,
        longest_pause: float = LONGEST_PAUSE,
    ) -> None:
        self.limit = limit
        self.share = share
        self.burst = burst
        self.longest_pause = longest_pause
        self._balance = burst
        self._at: float | None = None

    def allows(self, now: float) -> bool:
        """Whether a batch may be written in place at `now`."""
        return self._refilled(now) > 0.0

    def charge(self, took: float, now: float) -> float:
        """Account for a write in place of `took` seconds that ended at `now`; the seconds
        writes in place now pause for (0.0 if they do not)."""
        balance = self._refilled(now)
        if took > self.limit:
            balance = max(balance - took, -self.share * self.longest_pause)
        self._balance = balance
        return 0.0 if balance > 0.0 else -balance / self.share

    def _refilled(self, now: float) -> float:
        if self._at is None:
            self._at = now
        elif now > self._at:  # a clock stepping back refills nothing, then or later
            self._balance = min(self.burst, self._balance + (now - self._at) * self.share)
            self._at = now
        return self._balance
