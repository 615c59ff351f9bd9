"""`zk://h1:2181,h2:2181[/chroot][?session_timeout=10&connect_timeout=10]`, parsed without I/O."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from kiteq.errors import RegistryError

DEFAULT_PORT = 2181
DEFAULT_SESSION_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 10.0
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]/]+)(?::(\d+))?")  # host, [v6] or either with :port


def parse_zk_uri(uri: str) -> tuple[str, str, dict[str, float]]:
    """`zk://h1:2181,h2/chroot?session_timeout=10` -> ("h1:2181,h2:2181", "/chroot", {...})."""
    parts = urlsplit(uri)
    if parts.scheme != "zk" or not parts.netloc:
        raise RegistryError(f"bad ZooKeeper URI {uri!r}: use zk://host:2181[,host:2181][/chroot]")
    hosts = []
    for item in parts.netloc.split(","):
        match = _HOST_PORT.fullmatch(item.strip())
        port = int(match.group(2) or DEFAULT_PORT) if match else 0
        if match is None or not 0 < port < 65536:
            raise RegistryError(f"bad ZooKeeper address {item!r} in {uri!r}: use host:port")
        hosts.append(f"{match.group(1)}:{port}")
    chroot = parts.path.rstrip("/")
    if chroot and any(not part for part in chroot.split("/")[1:]):
        raise RegistryError(f"bad ZooKeeper chroot {parts.path!r} in {uri!r}: use /name[/name…]")
    options: dict[str, float] = {}
    for key, values in parse_qs(parts.query).items():
        if key not in ("session_timeout", "connect_timeout"):
            raise RegistryError(f"unknown option {key!r} in {uri!r}: use session_timeout or connect_timeout")
        try:
            options[key] = float(values[-1])
        except ValueError:
            raise RegistryError(f"option {key!r} in {uri!r} must be a number of seconds") from None
        if options[key] <= 0:
            raise RegistryError(f"option {key!r} in {uri!r} must be positive")
    return ",".join(hosts), chroot, options
