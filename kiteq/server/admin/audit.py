"""The audit trail of admin mutations: what was changed, how much of it, and from where.

Every mutating admin operation runs inside `audited(...)`, which logs one structlog event
`audit.<action>` when it ends: the selection it was given (client text, quoted and cut as
every client-supplied value in our logs), how many messages it touched, the HTTP client's
address and whether the admin token authenticated it (never the token). An operation that
fails halfway is logged too, at warning, with what it had touched by then: those changes
stay made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog

from protocol.session import quote

log = structlog.get_logger("kiteq.audit")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asked for a mutation: the peer's address, and whether the admin token vouched for it."""

    address: str
    token: bool = False

    @classmethod
    def of(cls, scope: Mapping[str, Any], token: bool) -> Caller:
        """The caller of an ASGI request; `token` says whether an admin token was required and matched."""
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else "unknown"
        return cls(address, token)


# Code that calls the operations directly (an embedding application, a test), not over HTTP.
IN_PROCESS = Caller("in-process")


@dataclass(slots=True)
class Tally:
    """The messages an audited operation has touched so far."""

    messages: int = 0


@contextmanager
def audited(action: str, caller: Caller, selection: Mapping[str, str]) -> Iterator[Tally]:
    """Log `audit.<action>` when the block ends, with the tally it reached; see the module docstring.

    `selection` holds the client's filter; empty values are left out, and none at all is
    logged as `all`.
    """
    tally = Tally()
    fields = {
        "selection": {key: quote(value) for key, value in selection.items() if value} or "all",
        "client": caller.address,
        "auth": "token" if caller.token else "none",
    }
    try:
        yield tally
    except BaseException as exc:
        log.warning(f"audit.{action}", **fields, messages=tally.messages, failed=type(exc).__name__)
        raise
    log.info(f"audit.{action}", **fields, messages=tally.messages)
