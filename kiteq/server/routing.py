"""Which bindings a message goes to: direct, regex (RE2 full match) or fanout."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import NamedTuple

import structlog

from kiteq.registry.bindings import Binding, PatternError
from protocol.session import quote

log = structlog.get_logger(__name__)

# Routes kept, one per (topic, messageType). Producers choose message types, so an
# unbounded cache grows with every new one; past this many, the least recently used
# route is dropped, and a miss costs one pass over the topic's bindings (regexes
# match in linear time, RE2).
ROUTE_CACHE_SIZE = 4096


class Route(NamedTuple):
    """The bindings a (topic, messageType) goes to, and their groups as a set."""

    bindings: tuple[Binding, ...]
    groups: frozenset[str]


class SkippedBinding(NamedTuple):
    """A binding from the registry that is not routed to: RE2 cannot compile its pattern."""

    binding: Binding
    reason: str


class Router:
    """Bindings indexed by topic, with routes cached (LRU) per (topic, messageType).

    `update` swaps in a whole new table (what registry watches deliver), so routing
    changes apply to the next message without a restart. A regex binding RE2 refuses
    can still reach the registry (written by hand, or by a tool that checks nothing):
    it is skipped, logged once, and listed in `stats`; the others route as usual.
    """

    def __init__(self, cache_size: int = ROUTE_CACHE_SIZE) -> None:
        self.cache_size = cache_size
        self._by_topic: dict[str, list[Binding]] = {}
        self._cache: OrderedDict[tuple[str, str], Route] = OrderedDict()
        self.topics: list[str] = []
        self.bindings: list[Binding] = []
        self.skipped: list[SkippedBinding] = []

    def update(self, bindings: list[Binding]) -> None:
        by_topic: dict[str, list[Binding]] = defaultdict(list)
        usable: list[Binding] = []
        skipped: list[SkippedBinding] = []
        for binding in bindings:
            try:
                binding.check()
            except PatternError as exc:
                skipped.append(SkippedBinding(binding, exc.reason))
                continue
            usable.append(binding)
            by_topic[binding.topic].append(binding)
        self._log_skipped(skipped)
        self._by_topic = dict(by_topic)
        self._cache = OrderedDict()
        # Topics of skipped bindings are served too: their messages are stored and wait
        # (retried as `no-binding`) for the pattern to be fixed, rather than refused.
        self.topics = sorted({binding.topic for binding in bindings})
        self.bindings = usable
        self.skipped = skipped

    def _log_skipped(self, skipped: list[SkippedBinding]) -> None:
        """Warn once per skipped binding, not at every registry change while it stays."""
        known = {entry.binding.key for entry in self.skipped}
        for binding, reason in skipped:
            if binding.key not in known:
                log.warning(
                    "routing.binding_skipped",
                    group=quote(binding.group),
                    topic=quote(binding.topic),
                    pattern=quote(binding.message_type),
                    reason=reason,
                    detail="RE2 cannot compile this regex, so nothing is delivered for it: remove it "
                    "(kiteq-admin bindings remove) and add a valid one",
                )

    @property
    def cached_routes(self) -> int:
        return len(self._cache)

    def route(self, topic: str, message_type: str) -> tuple[Binding, ...]:
        """The bindings that take this message: at most one per group (the first that matches)."""
        return self._route(topic, message_type).bindings

    def groups(self, topic: str, message_type: str) -> frozenset[str]:
        """The groups `route` picks, as a set."""
        return self._route(topic, message_type).groups

    def _route(self, topic: str, message_type: str) -> Route:
        key = (topic, message_type)
        cache = self._cache
        route = cache.get(key)
        if route is not None:
            cache.move_to_end(key)
            return route
        chosen: dict[str, Binding] = {}
        for binding in self._by_topic.get(topic, ()):
            if binding.group not in chosen and binding.matches(topic, message_type):
                chosen[binding.group] = binding
        route = cache[key] = Route(tuple(chosen.values()), frozenset(chosen))
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return route

    def binding_for(self, group: str, topic: str, message_type: str) -> Binding | None:
        for binding in self.route(topic, message_type):
            if binding.group == group:
                return binding
        return None

    def stats(self) -> dict[str, object]:
        """For the broker's /stats: what is routed, what is skipped and why, the cache's fill."""
        return {
            "bindings": len(self.bindings),
            "skipped_bindings": [
                {
                    "group": binding.group,
                    "topic": binding.topic,
                    "message_type": binding.message_type,
                    "reason": reason,
                }
                for binding, reason in self.skipped
            ],
            "cached_routes": self.cached_routes,
            "route_cache_size": self.cache_size,
        }
