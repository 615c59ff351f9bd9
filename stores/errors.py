"""Errors a store raises; the broker turns them into `status=false` acks."""

from protocol.errors import KiteQError


class StoreError(KiteQError):
    """The store could not do what was asked; nothing it had acknowledged is lost."""


class StoreUnavailable(StoreError):
    """The backing storage is unreachable (disk full, database down); retry later."""


class StoreStalled(StoreUnavailable):
    """The storage has not answered in time (a stalled disk); retry later, the same ids."""


class StoreCorrupted(StoreError):
    """On-disk data failed verification somewhere other than a torn tail."""


class StoreLocked(StoreError):
    """Another process (a running broker) holds the store."""


class StoreConfigError(StoreError):
    """The store URI or its options are invalid."""
