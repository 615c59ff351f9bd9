"""Authorization: which topics each group may publish to and subscribe to.

From `[acl.GROUP]` tables of topic glob patterns (`fnmatch` syntax: `refund*`,
`trade.?`). A group without a table, or a table without the key, is not restricted
for that action; an empty list allows nothing. Pure: answers are cached per (group,
topic), in a bounded cache since topics come from clients.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from functools import lru_cache

from kiteq.config import AclRule
from kiteq.registry.bindings import Binding

CACHE_SIZE = 4096


class Acl:
    def __init__(self, rules: Mapping[str, AclRule]) -> None:
        self.rules = dict(rules)
        self.may_publish = lru_cache(maxsize=CACHE_SIZE)(self._may_publish)
        self.may_subscribe = lru_cache(maxsize=CACHE_SIZE)(self._may_subscribe)

    @property
    def restricts(self) -> bool:
        return bool(self.rules)

    def _may_publish(self, group: str, topic: str) -> bool:
        rule = self.rules.get(group)
        return rule is None or _allowed(rule.publish, topic)

    def _may_subscribe(self, group: str, topic: str) -> bool:
        rule = self.rules.get(group)
        return rule is None or _allowed(rule.subscribe, topic)

    def split(self, bindings: Iterable[Binding]) -> tuple[list[Binding], list[Binding]]:
        """The bindings the broker serves, and those their group may not subscribe to."""
        allowed: list[Binding] = []
        denied: list[Binding] = []
        for binding in bindings:
            (allowed if self.may_subscribe(binding.group, binding.topic) else denied).append(binding)
        return allowed, denied


def _allowed(patterns: tuple[str, ...] | None, topic: str) -> bool:
    return patterns is None or any(fnmatchcase(topic, pattern) for pattern in patterns)
