"""One error hierarchy, rooted in KiteQError; each message says what to do about it."""

import contextlib
import errno
from collections.abc import Iterator

from protocol.errors import KiteQError, ProtocolError
from stores.errors import StoreCorrupted, StoreError, StoreLocked, StoreUnavailable


class ConfigError(KiteQError):
    """A configuration value is missing or invalid; the message names the key."""


class AuthError(KiteQError):
    """The broker refused this client's group or secret."""


class RegistryError(KiteQError):
    """The registry (ZooKeeper or the registry file) cannot be used as asked."""


class AddressInUse(KiteQError):
    """Another process listens on an address the broker was told to listen on."""

    def __init__(self, address: str, key: str) -> None:
        flag = "--" + key.replace("_", "-")
        super().__init__(
            f"cannot listen on {address}: address already in use (another kiteq-server?); "
            f"stop what holds it or choose another host:port with {flag} ([server] {key})"
        )

    @staticmethod
    def is_cause(exc: BaseException) -> bool:
        """Whether `exc`, or an exception group around it, is a bind the OS refused as EADDRINUSE."""
        found = leaf_error(exc, (OSError,))
        return isinstance(found, OSError) and found.errno == errno.EADDRINUSE

    @classmethod
    @contextlib.contextmanager
    def raised_for(cls, address: str, key: str) -> Iterator[None]:
        """Around a bind to `address` (config key `key`): the OS's EADDRINUSE, bare or in an
        exception group, is raised as AddressInUse; anything else passes unchanged."""
        try:
            yield
        except (OSError, BaseExceptionGroup) as exc:
            if cls.is_cause(exc):
                raise cls(address, key) from None
            raise


class TLSError(KiteQError):
    """A TLS handshake failed: an untrusted certificate, a plaintext peer, a bad CA file."""


class ConnectionClosed(KiteQError):
    """The connection to the peer is gone; requests on it failed."""


class SendError(KiteQError):
    """A message was not stored: resend it (same message id, so a duplicate is harmless)."""

    def __init__(self, message: str, *, message_id: str = "") -> None:
        super().__init__(message)
        self.message_id = message_id


class CancelError(KiteQError):
    """A scheduled message was not cancelled; the text says why (too late, not ours, unknown)."""

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
    "AddressInUse",
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
