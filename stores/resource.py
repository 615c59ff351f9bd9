"""What stores and registries share: something started before use and closed after it.

Here, in the lowest layer both may import (`protocol` stays free of it), so
`async with` means the same thing for a store and a registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class AsyncResource(ABC):
    """`async with resource:` starts it and closes it again however the block ends."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @abstractmethod
    async def start(self) -> None:
        """Acquire what the resource needs; raise if it cannot be used."""

    @abstractmethod
    async def close(self) -> None:
        """Release what `start` acquired."""
