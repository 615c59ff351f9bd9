"""The clients' keyword arguments and their defaults, declared once for kiteq.client and kiteq.sync.

`Producer(registry, group=..., topics=[...])` builds a ProducerOptions from its keywords
(`keyword_options`), so the async and the blocking classes take the same arguments,
with the same defaults, and mypy checks callers' keywords against these fields. The
listeners are type parameters: the blocking clients also take plain functions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Concatenate, Generic, ParamSpec, TypeVar, get_origin

from kiteq.registry import Binding
from kiteq.tls import TlsOption

P = ParamSpec("P")
OptionsT = TypeVar("OptionsT")
SelfT = TypeVar("SelfT")
RegistryT = TypeVar("RegistryT")
L = TypeVar("L")


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """What Producer and Consumer both take."""

    group: str
    secret: str = ""
    connect_timeout: float = 10.0
    delivery_log: str | None = None
    tls: TlsOption = None


@dataclass(frozen=True, kw_only=True)
class ProducerOptions(ClientOptions, Generic[L]):
    """`L`: the check listener's type (kiteq.CheckMessageListener, or what kiteq.sync accepts)."""

    topics: Iterable[str]
    check_listener: L | None = None
    send_timeout: float = 3.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(self.topics))  # read once, even from a generator


@dataclass(frozen=True, kw_only=True)
class ConsumerOptions(ClientOptions, Generic[L]):
    """`L`: the listener's type (kiteq.MessageListener, or what kiteq.sync accepts)."""

    bindings: Iterable[Binding]
    listener: L
    max_concurrency: int = 64
    message_timeout: float | None = None
    warmup_seconds: int = 0
    drain_timeout: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "bindings", tuple(self.bindings))


def keyword_options(
    options: Callable[P, OptionsT],
) -> Callable[
    [Callable[[SelfT, RegistryT, OptionsT], None]], Callable[Concatenate[SelfT, RegistryT, P], None]
]:
    """Turn `__init__(self, registry, options)` into `__init__(self, registry, **options' fields)`."""

    def decorate(
        init: Callable[[SelfT, RegistryT, OptionsT], None],
    ) -> Callable[Concatenate[SelfT, RegistryT, P], None]:
        def __init__(self: SelfT, registry: RegistryT, *args: P.args, **kwargs: P.kwargs) -> None:
            init(self, registry, options(*args, **kwargs))

        # For help() and tools that read signatures at run time: the fields, not **kwargs.
        own = list(inspect.signature(init).parameters.values())[:2]
        fields = inspect.signature(get_origin(options) or options).parameters.values()
        __init__.__signature__ = inspect.Signature([*own, *fields])  # type: ignore[attr-defined]
        return __init__

    return decorate
