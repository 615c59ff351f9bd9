"""Broker configuration: typed dataclasses, loaded from TOML, overridden by flags.

Every key of `kiteq.toml` (docs/design.md, "Configuration") lives here with its
default and a one-sentence description; kiteq-server makes its flags from them. A bad
value stops the broker at start with a ConfigError naming the key
(`[delivery] retry_base: ...`).
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from kiteq.errors import ConfigError

T = TypeVar("T")


def setting(default: T, doc: str, **metadata: object) -> T:
    """A key with its default and the one sentence `kiteq-server --help` shows for it.

    `metadata` may add `choices` (the values a flag accepts) and `secret=True` (the key is
    read from the file only: a command line shows in `ps` and shell history).
    """
    return field(default=default, metadata={"doc": doc, **metadata})


@dataclass
class ServerConfig:
    """Where the broker listens and keeps its state, connection limits, logging."""

    bind: str = setting("127.0.0.1:13800", "host:port the broker serves clients on.")
    admin_bind: str = setting("127.0.0.1:13801", "host:port of the admin HTTP endpoint; empty disables it.")
    store: str = setting(
        "file://./data/store",
        "Where messages are kept: memory://, file://DIR[?fsync=always|batch|never] or mysql://….",
    )
    registry: str = setting(
        "file://./data/registry.json",
        "Where brokers and clients meet: file://PATH.json or zk://host:port[,host:port][/chroot].",
    )
    delivery_log: str = setting("", "Path of the JSON-lines delivery log (for kiteq-reconcile); empty = off.")
    delivery_log_max_bytes: int = setting(
        64 * 1024 * 1024,
        "Size at which the delivery log rotates: PATH becomes PATH.1, older files shift up to "
        "PATH.5 and the oldest is deleted (at most 6 files).",
    )
    max_frame_bytes: int = setting(2 * 1024 * 1024, "Largest frame the broker reads, in bytes.")
    topics: list[str] = field(
        default_factory=list,
        metadata={
            "doc": "Topics served besides those that have bindings (the flag repeats).",
            "flag": "topic",
        },
    )
    max_connections: int = setting(10_000, "Client connections open at once.")
    max_inflight_per_connection: int = setting(
        4096, "Requests being stored per connection before the broker stops reading it."
    )
    idle_timeout: float = setting(60.0, "Seconds without a frame before a connection is closed.")
    handshake_timeout: float = setting(10.0, "Seconds a new connection has to authenticate.")
    # Before a connection has authenticated it may send one frame, a ConnMeta of at most
    # this many bytes: a peer that has proved nothing gets no megabyte buffers.
    pre_auth_max_bytes: int = setting(
        4096, "Largest frame (the ConnMeta) read before a connection authenticated."
    )
    # Unauthenticated connections, in all and per address. When either is full the oldest
    # unauthenticated one makes room, so a flood of silent peers cannot lock clients out.
    max_unauthenticated: int = setting(1024, "Unauthenticated connections open at once.")
    max_unauthenticated_per_address: int = setting(
        64, "Unauthenticated connections open at once from one address."
    )
    log_level: str = setting(
        "info", "Least severe log level written.", choices=("debug", "info", "warning", "error")
    )
    log_format: str = setting("console", "Log lines for people or for machines.", choices=("console", "json"))
    admin_token: str = setting("", "Bearer token the admin endpoint's mutating routes require.", secret=True)
    history_interval: float = setting(
        5.0, "Seconds between the samples of /stats/history (the dashboard's charts keep one hour)."
    )
    adopt_after: float = setting(
        60.0, "Shared (mysql) store: seconds before taking over a broker gone from the registry."
    )


class Jitter(enum.StrEnum):
    """How a retry's backoff is drawn below its bound (see kiteq/server/delivery/retry.py)."""

    FULL = "full"
    NONE = "none"


@dataclass
class DeliveryConfig:
    """Pushing messages to consumer groups: timeouts, retry backoff, the store scan, lanes."""

    deliver_timeout: float = setting(5.0, "Seconds a consumer has to answer a delivery before it is retried.")
    retry_base: float = setting(
        1.0, "Backoff of the n-th retry: uniform(0, min(retry_max, retry_base * 2^(n-1))) s."
    )
    retry_max: float = setting(300.0, "Longest backoff between retries, in seconds.")
    retry_jitter: Jitter = setting(
        Jitter.FULL,
        "full: a random backoff up to the bound; none: the bound.",
        choices=tuple(jitter.value for jitter in Jitter),
    )
    recover_interval: float = setting(1.0, "Seconds between looks in the store for messages due again.")
    recover_page: int = setting(500, "Most messages read from the store per page of such a look.")
    lane_capacity: int = setting(4096, "Deliveries queued per (topic, group) lane.")
    max_delay: float = setting(
        2 * 365 * 24 * 3600.0,
        "Furthest ahead, in seconds, a message may ask to be delivered (property kiteq.deliverAt).",
    )


@dataclass
class TxConfig:
    """Two-phase commit: when and how often producers are asked about open transactions."""

    tx_scan_interval: float = setting(5.0, "Seconds between scans for uncommitted transactional messages.")
    tx_check_after: float = setting(
        10.0, "Age in seconds at which an uncommitted message's producer group is asked to decide it."
    )
    tx_check_max: int = setting(
        15, "Questions before an undecided message is dead-lettered as tx-unresolved."
    )
    tx_check_inflight: int = setting(64, "Questions in flight per producer group.")
    tx_check_rate: float = setting(500.0, "Questions per second per producer group.")
    tx_check_timeout: float = setting(5.0, "Seconds to wait for a producer's answer to a question.")


@dataclass
class TlsConfig:
    """TLS on the client port and the admin endpoint; off while `cert` is empty."""

    cert: str = setting("", "PEM certificate chain of the broker; setting it turns TLS on.")
    key: str = setting("", "PEM private key of the certificate.")
    ca: str = setting("", "PEM CA that signs client certificates (mutual TLS).")
    require_client_cert: bool = setting(False, "Refuse clients without a certificate signed by the CA.")

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True)
class AclRule:
    """What one group may do: topic glob patterns; None (the key absent) allows every topic."""

    publish: tuple[str, ...] | None = None
    subscribe: tuple[str, ...] | None = None


@dataclass
class BrokerConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: dict[str, str] = field(default_factory=dict)
    acl: dict[str, AclRule] = field(default_factory=dict)
    tls: TlsConfig = field(default_factory=TlsConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    tx: TxConfig = field(default_factory=TxConfig)

    def validate(self) -> BrokerConfig:
        """Raise ConfigError for the first invalid value, naming its key."""
        for section in ("server", "delivery", "tx", "tls"):
            for f in dataclasses.fields(getattr(self, section)):
                value = getattr(getattr(self, section), f.name)
                if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                    raise ConfigError(f"[{section}] {f.name}: must not be negative, got {value}")
        _check_address("[server] bind", self.server.bind)
        if self.server.admin_bind:
            _check_address("[server] admin_bind", self.server.admin_bind)
        if self.delivery.retry_base <= 0 or self.delivery.retry_max < self.delivery.retry_base:
            raise ConfigError("[delivery] retry_base/retry_max: need 0 < retry_base <= retry_max")
        if self.server.history_interval <= 0:
            raise ConfigError("[server] history_interval: must be positive")
        if self.delivery.deliver_timeout <= 0:
            raise ConfigError("[delivery] deliver_timeout: must be positive")
        if self.delivery.max_delay < 0:
            raise ConfigError("[delivery] max_delay: must be 0 (no delayed messages) or more seconds")
        if self.server.max_frame_bytes < 1024:
            raise ConfigError("[server] max_frame_bytes: must be at least 1024")
        if self.tx.tx_check_max < 1 or self.tx.tx_check_inflight < 1 or self.tx.tx_check_rate <= 0:
            raise ConfigError("[tx] tx_check_max, tx_check_inflight and tx_check_rate must be positive")
        if self.server.pre_auth_max_bytes < 256:
            raise ConfigError("[server] pre_auth_max_bytes: must be at least 256 (a ConnMeta must fit)")
        if self.server.max_unauthenticated < 1 or self.server.max_unauthenticated_per_address < 1:
            raise ConfigError(
                "[server] max_unauthenticated and max_unauthenticated_per_address must be positive"
            )
        for group, secret in self.auth.items():
            if not isinstance(secret, str):
                raise ConfigError(f"[auth] {group}: the secret must be a string")
        if bool(self.tls.cert) != bool(self.tls.key):
            raise ConfigError("[tls] cert and key: set both (PEM files) or neither")
        if self.tls.require_client_cert and not self.tls.ca:
            raise ConfigError(
                "[tls] require_client_cert: needs [tls] ca, the CA that signs client certificates"
            )
        if self.tls.ca and not self.tls.enabled:
            raise ConfigError("[tls] ca: needs [tls] cert and key (the broker's own certificate)")
        return self


def table_keys() -> list[tuple[str, dataclasses.Field[Any], Any]]:
    """(section, key, the key's type) for the sections that are tables of keys: all but [auth], [acl]."""
    return [
        (section, key, hints[key.name])
        for section, kind in get_type_hints(BrokerConfig).items()
        if dataclasses.is_dataclass(kind)
        for hints in [get_type_hints(kind)]
        for key in dataclasses.fields(kind)
    ]


def _check_address(key: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{key}: expected host:port, got {value!r}")


def _apply(target: object, values: dict[str, Any], section: str) -> None:
    known = {f.name: f for f in dataclasses.fields(target)}  # type: ignore[arg-type]
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"[{section}] {key}: unknown key (known: {', '.join(sorted(known))})")
        default = getattr(target, key)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, list):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif isinstance(default, enum.Enum):
            choices = [member.value for member in type(default)]
            if value not in choices:
                raise ConfigError(
                    f"[{section}] {key}: use one of {', '.join(map(repr, choices))}, got {value!r}"
                )
            value = type(default)(value)
            ok = True
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ConfigError(f"[{section}] {key}: expected {type(default).__name__}, got {value!r}")
        setattr(target, key, value)


def _acl_rules(values: object) -> dict[str, AclRule]:
    """[acl.GROUP] tables: `publish` and `subscribe`, each a list of topic glob patterns."""
    if not isinstance(values, dict):
        raise ConfigError("[acl]: must hold one table per group, e.g. [acl.order-svc]")
    rules: dict[str, AclRule] = {}
    for group, table in values.items():
        if not isinstance(table, dict):
            raise ConfigError(f'[acl.{group}]: must be a table, e.g. publish = ["trade"]')
        patterns: dict[str, tuple[str, ...]] = {}
        for key, value in table.items():
            if key not in ("publish", "subscribe"):
                raise ConfigError(f"[acl.{group}] {key}: unknown key (known: publish, subscribe)")
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"[acl.{group}] {key}: expected a list of topic patterns, got {value!r}")
            patterns[key] = tuple(value)
        rules[group] = AclRule(**patterns)
    return rules


def load_config(path: Path | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> BrokerConfig:
    """Defaults, then the TOML file, then `overrides` ({section: {key: value}}) from flags."""
    config = BrokerConfig()
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section, values in data.items():
        if section == "auth":
            if not isinstance(values, dict):
                raise ConfigError('[auth]: must be a table of group = "secret"')
            config.auth.update(values)
        elif section == "acl":
            config.acl.update(_acl_rules(values))
        elif section in ("server", "delivery", "tx", "tls") and isinstance(values, dict):
            _apply(getattr(config, section), values, section)
        else:
            raise ConfigError(f"[{section}]: unknown section (known: server, auth, acl, tls, delivery, tx)")
    for section, values in (overrides or {}).items():
        if section == "acl":
            config.acl.update(_acl_rules(values))
        else:
            _apply(getattr(config, section), {k: v for k, v in values.items() if v is not None}, section)
    return config.validate()
