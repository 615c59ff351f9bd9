"""`mysql://user:pass@master:3306/db?replica=host:3306&shards=16` -> a typed `MySQLConfig`.

Every option can be given in the query string or as a keyword of `open_store` (the
keyword wins); the broker passes `broker=<its address>` that way. Unknown options are
refused so a typo does not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from stores.errors import StoreConfigError

DEFAULT_PORT = 3306
_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class MySQLConfig:
    """What the MySQL store needs to know; defaults are the documented URI defaults.

    `shards` is fixed when the schema is created (stored in `kite_meta`); `broker` is
    the owner id written on every row this store saves (empty: one broker, or brokers
    that share all rows). Batches are bounded both by count and by bytes so one
    statement stays well under MariaDB's default 16 MiB `max_allowed_packet`.
    """

    master: Endpoint
    database: str
    user: str
    password: str = ""
    replica: Endpoint | None = None
    shards: int = 16
    replica_max_lag: float = 5.0
    broker: str = ""
    timeout: float = 3.0
    connect_timeout: float = 1.0
    pool_size: int = 16
    save_batch: int = 256
    update_batch: int = 256
    batch_bytes: int = 4 * 1024 * 1024
    flushers: int = 1

    def redacted(self) -> str:
        """The URI without the password, for logs and error messages."""
        query = f"?replica={self.replica}&shards={self.shards}" if self.replica else f"?shards={self.shards}"
        return f"mysql://{self.user}@{self.master}/{self.database}{query}"


_INT_OPTIONS = {
    "shards": (1, 1024),
    "pool_size": (2, 1000),
    "save_batch": (1, 10_000),
    "update_batch": (1, 10_000),
    "batch_bytes": (1024, 1 << 30),
    "flushers": (1, 64),
}
_FLOAT_OPTIONS = {
    "replica_max_lag": (0.0, 86_400.0),
    "timeout": (0.01, 3_600.0),
    "connect_timeout": (0.01, 600.0),
}


def parse_endpoint(text: str, what: str) -> Endpoint:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StoreConfigError(f"bad {what} address {text!r}: use host:port, e.g. 127.0.0.1:3306")
    return Endpoint(host, int(port))


def _coerce(name: str, value: object) -> object:
    low: float
    high: float
    if name in _INT_OPTIONS:
        low, high = _INT_OPTIONS[name]
        try:
            number: float = int(str(value))
        except ValueError:
            raise StoreConfigError(f"mysql store option {name}={value!r} is not an integer") from None
    elif name in _FLOAT_OPTIONS:
        low, high = _FLOAT_OPTIONS[name]
        try:
            number = float(str(value))
        except ValueError:
            raise StoreConfigError(f"mysql store option {name}={value!r} is not a number") from None
    elif name == "replica":
        return parse_endpoint(str(value), "replica") if value else None
    elif name == "broker":
        if len(str(value)) > 255:
            raise StoreConfigError(f"mysql store option broker={value!r} is longer than 255 characters")
        return str(value)
    else:
        known = ", ".join(sorted([*_INT_OPTIONS, *_FLOAT_OPTIONS, "replica", "broker"]))
        raise StoreConfigError(f"unknown mysql store option {name!r}; known options: {known}")
    if not low <= number <= high:
        raise StoreConfigError(f"mysql store option {name}={value!r} is out of range [{low}, {high}]")
    return number


def parse_uri(uri: str, **options: object) -> MySQLConfig:
    """Parse the URI and keyword options; StoreConfigError names whatever is wrong."""
    parts = urlsplit(uri)
    if parts.scheme != "mysql":
        raise StoreConfigError(f"not a mysql:// URI: {uri!r}")
    if not parts.hostname or not parts.username:
        raise StoreConfigError(
            "the mysql URI needs a user and a master host: mysql://user:pass@master:3306/db"
        )
    database = parts.path.lstrip("/")
    if not _NAME.match(database):
        raise StoreConfigError(f"bad database name {database!r} in the mysql URI: use letters, digits and _")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise StoreConfigError(f"bad master port in {uri!r}") from None
    values: dict[str, object] = {key: vals[-1] for key, vals in parse_qs(parts.query).items()}
    values.update(options)
    fields = {name: _coerce(name, value) for name, value in values.items()}
    config = MySQLConfig(
        master=Endpoint(parts.hostname, port),
        database=database,
        user=unquote(parts.username),
        password=unquote(parts.password or ""),
    )
    return dataclasses.replace(config, **fields)  # type: ignore[arg-type]
