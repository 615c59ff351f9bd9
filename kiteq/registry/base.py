"""The registry interface: where brokers, producers and bindings are found.

Same tree as KiteQ (see docs/design.md "Registry" and docs/registry.md):
  /kiteq/server/{topic}/{host:port}        brokers serving a topic (ephemeral)
  /kiteq/pub/{topic}/{group}/{host:port}   producers (ephemeral)
  /kiteq/sub/{topic}/{group}-bind          a group's bindings for a topic (persistent JSON)
plus one subtree of KiteQ-py's own, which KiteQ's Go clients never read:
  /kiteq/admin/{host:port}                 a broker's admin endpoint URL (ephemeral)

Watches are long-running coroutines that the caller starts in its own nursery;
they call `on_change` with the full current value (never a diff) once at start and
after every change, so a caller that missed events still ends up right.
When the backend is unreachable, watches keep quiet and `connected` turns False;
callers keep working on the last value they received.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable

import trio

from kiteq.registry.bindings import Binding
from stores.resource import AsyncResource

BindingsCallback = Callable[[list[Binding]], None]
ServersCallback = Callable[[list[str]], None]


class Registry(AsyncResource):
    """Where brokers, producers and bindings are found; `async with` starts and closes it."""

    uri: str = ""

    @property
    @abstractmethod
    def connected(self) -> bool:
        """Whether the backend is reachable right now."""

    @abstractmethod
    async def start(self) -> None:
        """Connect to the backend; raise RegistryError if it cannot be reached."""

    @abstractmethod
    async def close(self) -> None:
        """Withdraw what this process registered (ephemeral nodes) and disconnect."""

    @abstractmethod
    async def register_server(self, address: str, topics: Iterable[str]) -> None:
        """Announce a broker for exactly these topics (replacing its previous set)."""

    @abstractmethod
    async def unregister_server(self, address: str) -> None: ...

    @abstractmethod
    async def list_servers(self, topic: str | None = None) -> dict[str, list[str]]:
        """topic -> broker addresses."""

    @abstractmethod
    async def register_admin(self, address: str, url: str) -> None:
        """Announce the admin endpoint (`http[s]://host:port`) of the broker at client `address`.

        It lives as long as this process's registrations do (an ephemeral node, a file
        heartbeat) and is withdrawn on `close`, so tools reach every running broker.
        """

    @abstractmethod
    async def list_admins(self) -> dict[str, str]:
        """Broker client address -> admin endpoint URL, for the running brokers that have one."""

    @abstractmethod
    async def register_producer(self, address: str, group: str, topics: Iterable[str]) -> None: ...

    @abstractmethod
    async def list_producers(self) -> dict[str, dict[str, list[str]]]:
        """topic -> group -> producer addresses."""

    @abstractmethod
    async def put_bindings(self, group: str, topic: str, bindings: list[Binding]) -> None:
        """Replace the group's bindings for a topic (what a consumer does at start)."""

    @abstractmethod
    async def add_binding(self, binding: Binding) -> None:
        """Add or replace one binding; raise BindingError on a conflict."""

    @abstractmethod
    async def remove_binding(self, group: str, topic: str, message_type: str | None = None) -> int:
        """Remove one binding (or all of the group's on the topic); the number removed."""

    @abstractmethod
    async def list_bindings(self, topic: str | None = None, group: str | None = None) -> list[Binding]: ...

    @abstractmethod
    async def watch_bindings(
        self, on_change: BindingsCallback, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Call on_change(all bindings) now and on every change; runs until cancelled."""

    @abstractmethod
    async def watch_servers(
        self,
        topic: str,
        on_change: ServersCallback,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call on_change(broker addresses of topic) now and on every change; runs until cancelled."""
