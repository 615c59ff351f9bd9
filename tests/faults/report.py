"""The fault table of issue 9: each fault test records what it proved.

`record()` appends one JSON line to the file named by KITEQ_FAULT_REPORT (when set),
so repeated runs of the fault suite can be summed into a table of fault, runs,
messages, lost and duplicate deliveries.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable

from kiteq import Message


def duplicates(deliveries: Iterable[Message]) -> int:
    """Deliveries beyond the first of each message."""
    return sum(n - 1 for n in Counter(m.message_id for m in deliveries).values())


def record(fault: str, messages: int, lost: int, duplicate_deliveries: int) -> None:
    path = os.environ.get("KITEQ_FAULT_REPORT")
    if path:
        line = {"fault": fault, "messages": messages, "lost": lost, "duplicates": duplicate_deliveries}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")
