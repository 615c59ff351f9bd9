"""Which bindings a message goes to: direct, regex (full match) or fanout."""

from __future__ import annotations

from collections import defaultdict

from kiteq.registry.bindings import Binding


class Router:
    """Bindings indexed by topic, with routes cached per (topic, messageType).

    `update` swaps in a whole new table (what registry watches deliver), so routing
    changes apply to the next message without a restart.
    """

    def __init__(self) -> None:
        self._by_topic: dict[str, list[Binding]] = {}
        self._cache: dict[tuple[str, str], tuple[Binding, ...]] = {}
        self._groups: dict[tuple[str, str], frozenset[str]] = {}
        self.bindings: list[Binding] = []

    def update(self, bindings: list[Binding]) -> None:
        by_topic: dict[str, list[Binding]] = defaultdict(list)
        for binding in bindings:
            by_topic[binding.topic].append(binding)
        self._by_topic = dict(by_topic)
        self._cache = {}
        self._groups = {}
        self.bindings = list(bindings)

    @property
    def topics(self) -> list[str]:
        return sorted(self._by_topic)

    def route(self, topic: str, message_type: str) -> tuple[Binding, ...]:
        """The bindings that take this message: at most one per group (the first that matches)."""
        key = (topic, message_type)
        cached = self._cache.get(key)
        if cached is None:
            chosen: dict[str, Binding] = {}
            for binding in self._by_topic.get(topic, ()):
                if binding.group not in chosen and binding.matches(topic, message_type):
                    chosen[binding.group] = binding
            cached = self._cache[key] = tuple(chosen.values())
        return cached

    def groups(self, topic: str, message_type: str) -> frozenset[str]:
        """The groups `route` picks, as a set (cached the same way)."""
        key = (topic, message_type)
        groups = self._groups.get(key)
        if groups is None:
            groups = self._groups[key] = frozenset(b.group for b in self.route(topic, message_type))
        return groups

    def binding_for(self, group: str, topic: str, message_type: str) -> Binding | None:
        for binding in self.route(topic, message_type):
            if binding.group == group:
                return binding
        return None
