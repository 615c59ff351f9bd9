"""One error hierarchy, rooted in KiteQError; each message says what to do about it."""

from protocol.errors import KiteQError, ProtocolError
from stores.errors import StoreCorrupted, StoreError, StoreLocked, StoreUnavailable


class ConfigError(KiteQError):
    """A configuration value is missing or invalid; the message names the key."""


class AuthError(KiteQError):
    """The broker refused this client's group or secret."""


class RegistryError(KiteQError):
    """The registry (ZooKeeper or the registry file) cannot be used as asked."""


class TLSError(KiteQError):
    """A TLS handshake failed: an untrusted certificate, a plaintext peer, a bad CA file."""


class ConnectionClosed(KiteQError):
    """The connection to the peer is gone; requests on it failed."""


class SendError(KiteQError):
    """A message was not stored: resend it (same message id, so a duplicate is harmless)."""

    def __init__(self, message: str, *, message_id: str = "") -> None:
        super().__init__(message)
        self.message_id = message_id


def leaf_error(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `kinds` inside `exc`, looking through exception groups.

    Trio nurseries wrap errors in ExceptionGroups; command-line entry points use this
    to print the one error a user can act on instead of a traceback.
    """
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = leaf_error(inner, kinds)
            if found is not None:
                return found
    return None


__all__ = [
    "AuthError",
    "ConfigError",
    "ConnectionClosed",
    "KiteQError",
    "ProtocolError",
    "RegistryError",
    "SendError",
    "StoreCorrupted",
    "StoreError",
    "StoreLocked",
    "StoreUnavailable",
    "TLSError",
    "leaf_error",
]
