"""Bindings: which consumer group receives which messages of a topic.

The JSON form is KiteQ's, field for field, so KiteQ's tooling and clients read ours:
`{"groupId","topic","messageType","bindType","version","watermark","persistent"}`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]

from protocol import BindType
from protocol.errors import KiteQError
from protocol.session import quote

DEFAULT_WATERMARK = 1000
BINDING_VERSION = "1.0.0"
FANOUT_TYPE = "*"


class BindingError(KiteQError):
    """A binding is malformed or conflicts with another one of the same group and topic."""


class PatternError(BindingError):
    """A regex binding's pattern that RE2 cannot compile; `reason` is RE2's own words."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(
            f"invalid regex {quote(pattern)}: {reason} (patterns are RE2 syntax, as in Go's regexp "
            "that KiteQ uses: no backreferences, no look-around)"
        )
        self.pattern = pattern
        self.reason = reason


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print each refusal to stderr; PatternError carries it


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Any:
    """The pattern compiled by RE2, which matches in time linear in the messageType.

    A backtracking engine (Python's `re`) takes exponential time on patterns such as
    `(a+)+`, on the broker's event loop: one binding could stall every connection.
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        text = exc.args[0] if exc.args else b""
        text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
        # RE2 says "<what>: <the offending part of the pattern>"; that part is cut like any client text.
        what, _, part = text.partition(": ")
        raise PatternError(pattern, f"{what}: {quote(part)}" if part else what) from None
    except UnicodeEncodeError as exc:  # a lone surrogate, from JSON's \ud800
        raise PatternError(pattern, f"not encodable as UTF-8: {exc.reason}") from None


@dataclass(frozen=True, slots=True)
class Binding:
    """One subscription of a consumer group to (part of) a topic.

    `watermark` caps the deliveries of this binding in flight to the group at once;
    `persistent` keeps messages for the group while none of its consumers is online
    (otherwise they are skipped for it and logged as `dropped`).

    A regex pattern is checked by `regex` and when the binding is written to a registry
    (`check_conflicts`), not here: what a registry holds must still be readable (listed,
    removed, skipped by the broker) even when RE2 refuses its pattern.
    """

    group: str
    topic: str
    message_type: str
    bind_type: BindType = BindType.DIRECT
    watermark: int = DEFAULT_WATERMARK
    persistent: bool = True
    version: str = BINDING_VERSION

    def __post_init__(self) -> None:
        if not self.topic:
            raise BindingError("a binding needs a topic")
        if self.watermark <= 0:
            raise BindingError(f"watermark must be positive, got {self.watermark}")
        if self.bind_type is BindType.DIRECT and not self.message_type:
            raise BindingError("a direct binding needs a messageType")

    @classmethod
    def direct(
        cls,
        topic: str,
        message_type: str,
        *,
        group: str = "",
        watermark: int = DEFAULT_WATERMARK,
        persistent: bool = True,
    ) -> Binding:
        return cls(group, topic, message_type, BindType.DIRECT, watermark, persistent)

    @classmethod
    def regex(
        cls,
        topic: str,
        pattern: str,
        *,
        group: str = "",
        watermark: int = DEFAULT_WATERMARK,
        persistent: bool = True,
    ) -> Binding:
        """Messages of `topic` whose messageType `pattern` fully matches; PatternError if RE2 refuses it."""
        binding = cls(group, topic, pattern, BindType.REGEX, watermark, persistent)
        binding.check()
        return binding

    @classmethod
    def fanout(
        cls, topic: str, *, group: str = "", watermark: int = DEFAULT_WATERMARK, persistent: bool = True
    ) -> Binding:
        return cls(group, topic, FANOUT_TYPE, BindType.FANOUT, watermark, persistent)

    def with_group(self, group: str) -> Binding:
        return Binding(
            group,
            self.topic,
            self.message_type,
            self.bind_type,
            self.watermark,
            self.persistent,
            self.version,
        )

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a binding: a group has at most one binding per (topic, messageType pattern)."""
        return (self.group, self.topic, self.message_type)

    def check(self) -> None:
        """Raise PatternError if this is a regex binding RE2 cannot compile."""
        if self.bind_type is BindType.REGEX:
            compile_pattern(self.message_type)

    def matches(self, topic: str, message_type: str) -> bool:
        """Raises PatternError for a regex RE2 refuses (`check` tells beforehand)."""
        if topic != self.topic:
            return False
        if self.bind_type is BindType.FANOUT:
            return True
        if self.bind_type is BindType.REGEX:
            return compile_pattern(self.message_type).fullmatch(message_type) is not None
        return message_type == self.message_type

    def conflicts_with(self, other: Binding) -> bool:
        """KiteQ's rule: same group and topic, and the message types they select overlap."""
        if (self.group, self.topic) != (other.group, other.topic) or self.key == other.key:
            return False
        if BindType.FANOUT in (self.bind_type, other.bind_type):
            return True
        if self.bind_type is BindType.REGEX and other.bind_type is BindType.REGEX:
            return True
        return self.matches(other.topic, other.message_type) or other.matches(self.topic, self.message_type)

    def to_json(self) -> dict[str, object]:
        return {
            "groupId": self.group,
            "topic": self.topic,
            "messageType": self.message_type,
            "bindType": int(self.bind_type),
            "version": self.version,
            "watermark": self.watermark,
            "persistent": self.persistent,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Binding:
        try:
            return cls(
                group=str(data["groupId"]),
                topic=str(data["topic"]),
                message_type=str(data.get("messageType", "")),
                bind_type=BindType(int(data.get("bindType", 0))),
                watermark=int(data.get("watermark") or DEFAULT_WATERMARK),
                persistent=bool(data.get("persistent", True)),
                version=str(data.get("version", BINDING_VERSION)),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise BindingError(f"malformed binding {data!r}: {exc}") from None


def encode_bindings(bindings: Iterable[Binding]) -> bytes:
    """The `/kiteq/sub/{topic}/{group}-bind` node's data: a JSON array."""
    return json.dumps([b.to_json() for b in bindings], separators=(",", ":")).encode()


def decode_bindings(data: bytes) -> list[Binding]:
    if not data or not data.strip():
        return []
    try:
        items = json.loads(data)
    except ValueError as exc:
        raise BindingError(f"binding node is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise BindingError("binding node must hold a JSON array")
    return [Binding.from_json(item) for item in items]


def check_conflicts(existing: Iterable[Binding], new: Binding) -> None:
    """Raise PatternError if RE2 refuses `new`, BindingError naming the binding it overlaps with."""
    new.check()
    for binding in existing:
        try:
            overlaps = binding.conflicts_with(new)
        except PatternError as exc:  # one of `existing`, read from a registry anything may write to
            raise BindingError(
                f"group {new.group!r} has regex {quote(exc.pattern)} on topic {new.topic!r}, which RE2 cannot "
                f"compile ({exc.reason}): remove it first (kiteq-admin bindings remove)"
            ) from None
        if overlaps:
            raise BindingError(
                f"binding {new.message_type!r} ({new.bind_type.name.lower()}) of group {new.group!r} on topic "
                f"{new.topic!r} overlaps {binding.message_type!r} ({binding.bind_type.name.lower()}): "
                "remove that one first"
            )


def merge_binding(existing: list[Binding], new: Binding) -> list[Binding]:
    """The group's bindings for a topic with `new` added or replacing its same-key twin."""
    check_conflicts(existing, new)
    return [b for b in existing if b.key != new.key] + [new]
