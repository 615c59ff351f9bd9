"""The root of every KiteQ-py error, and the one error the wire layer raises.

`KiteQError` lives here, in the lowest layer, so that `protocol` imports nothing of
ours and still shares one hierarchy with the rest; `kiteq.errors` re-exports it.
"""


class KiteQError(Exception):
    """Base class of every error KiteQ-py raises on purpose."""


class ProtocolError(KiteQError):
    """The peer broke the wire protocol; the message says how.

    After a framing error the byte stream can no longer be trusted and the
    connection must be closed. A body that does not parse is reported with
    `recoverable=True`: the frame boundaries are intact, so the caller may answer
    with a failure and keep the connection.
    """

    def __init__(self, message: str, *, opaque: int | None = None, recoverable: bool = False) -> None:
        super().__init__(message)
        self.opaque = opaque
        self.recoverable = recoverable
