"""Registries: where brokers, producers and bindings are found. `open_registry(uri)` picks one."""

from __future__ import annotations

from urllib.parse import urlsplit

from kiteq.errors import RegistryError
from kiteq.registry.base import Registry
from kiteq.registry.bindings import Binding, BindingError


def open_registry(uri: str) -> Registry:
    """Create (not start) the registry named by `uri`: file:///path.json or zk://h:p[,h:p][/chroot]."""
    scheme = urlsplit(uri).scheme
    if scheme == "file":
        from kiteq.registry.file import FileRegistry

        return FileRegistry.from_uri(uri)
    if scheme == "zk":
        from kiteq.registry.zk import ZooKeeperRegistry

        return ZooKeeperRegistry.from_uri(uri)
    raise RegistryError(
        f"unknown registry URI {uri!r}: use file:///path/registry.json or zk://host:2181[/chroot]"
    )


__all__ = ["Binding", "BindingError", "Registry", "open_registry"]
