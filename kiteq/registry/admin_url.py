"""The admin endpoint URL a broker registers: pure, no I/O.

Tools (`kiteq-admin message …`) read it from the registry and connect to it from
wherever they run, so a wildcard listening host (`0.0.0.0`, `::`), which names no
machine, is replaced by the host of the broker's client address when that one names
a machine: a broker with `bind = "kiteq:13800"` and `admin_bind = "0.0.0.0:13801"`
registers `http://kiteq:13801`.
"""

from __future__ import annotations

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def admin_url(admin_address: str, broker_address: str, *, tls: bool) -> str:
    """`http[s]://host:port` for the admin endpoint listening on `admin_address` (host:port)."""
    host, _, port = admin_address.rpartition(":")
    broker_host = broker_address.rpartition(":")[0]
    if host in WILDCARD_HOSTS and broker_host not in WILDCARD_HOSTS:
        host = broker_host
    return f"{'https' if tls else 'http'}://{host}:{port}"
