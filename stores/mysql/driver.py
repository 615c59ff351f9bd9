"""aiomysql, imported through here so it works with the PyMySQL the project pins.

aiomysql 0.3.2 does `from pymysql.converters import escape_bytes_prefixed` and calls
it for every `bytes` parameter. PyMySQL 1.2.1 and 1.2.2 no longer define it (the
import fails), and 1.2.3+ define it as a string (every bytes parameter fails with
"'str' object is not callable"). Since 1.2.1 PyMySQL's own `escape_bytes` already
renders the prefixed form (`_binary X'…'`), so it is the exact replacement; older
PyMySQL keeps its own function. Import aiomysql only from this module.
"""

from __future__ import annotations

from typing import Any

import pymysql.converters

if not callable(getattr(pymysql.converters, "escape_bytes_prefixed", None)):
    pymysql.converters.escape_bytes_prefixed = pymysql.converters.escape_bytes  # type: ignore[attr-defined]

import aiomysql


class QuietCursor(aiomysql.Cursor):  # type: ignore[misc]  # aiomysql is untyped
    """A cursor that leaves server warnings on the server.

    `INSERT IGNORE` reports every duplicate id as a warning, by design here; stock
    aiomysql would spend a `SHOW WARNINGS` round trip on each such batch and re-issue
    them as Python warnings. Values are checked before they are written (rows.check),
    so no other warning is expected.
    """

    async def _show_warnings(self, conn: Any) -> None:
        return None


__all__ = ["QuietCursor", "aiomysql"]
