"""When to try a failed delivery again: exponential backoff with full jitter."""

from __future__ import annotations

import random

from kiteq.config import Jitter


def backoff_delay(
    attempt: int, base: float, maximum: float, jitter: Jitter = Jitter.FULL, rng: random.Random | None = None
) -> float:
    """Seconds to wait after the `attempt`-th failed round (1-based).

    The cap doubles per attempt (base, 2·base, 4·base, … up to `maximum`). With "full"
    jitter the wait is uniform in [0, cap] so that consumers recovering from one outage
    are not hit by every retry at once (AWS's "Exponential Backoff and Jitter"); "none"
    waits exactly the cap, for tests and for operators who prefer predictability.
    """
    cap = min(maximum, base * 2.0 ** min(max(attempt - 1, 0), 62))
    if jitter == Jitter.NONE:
        return cap
    return (rng or random).uniform(0.0, cap)
