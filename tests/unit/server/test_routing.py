"""The router: RE2 full matches, a bounded (LRU) route cache, bindings RE2 refuses skipped."""

from __future__ import annotations

import time

from kiteq.registry.bindings import Binding
from kiteq.server.routing import ROUTE_CACHE_SIZE, Router
from protocol import BindType


def test_the_route_cache_stays_bounded_under_many_message_types() -> None:
    router = Router()
    router.update([Binding.regex("t", "pay-.*", group="g"), Binding.fanout("t", group="h")])
    for n in range(100_000):
        assert router.groups("t", f"pay-{n}") == {"g", "h"}
    assert router.cached_routes == ROUTE_CACHE_SIZE
    assert router.stats()["cached_routes"] == ROUTE_CACHE_SIZE


def test_the_route_cache_drops_the_least_recently_used() -> None:
    router = Router(cache_size=2)
    router.update([Binding.direct("t", "x", group="g")])
    first = router.route("t", "x")
    router.route("t", "y")
    assert router.route("t", "x") is first  # used again: now the most recent
    router.route("t", "z")  # evicts y, not x
    assert router.route("t", "x") is first
    assert router.cached_routes == 2


def test_a_pathological_regex_routes_in_linear_time() -> None:
    router = Router()
    router.update([Binding.regex("t", "(a+)+", group="g")])
    started = time.perf_counter()
    assert router.route("t", "a" * 28 + "b") == ()
    assert router.groups("t", "a" * 200) == {"g"}
    assert time.perf_counter() - started < 0.1


def test_a_binding_re2_refuses_is_skipped_and_the_rest_route() -> None:
    bad = Binding("bad", "only-bad", r"(a)\1", BindType.REGEX)  # as read from a registry
    good = Binding.direct("t", "x", group="good")
    router = Router()
    router.update([bad, good])
    assert router.bindings == [good]
    assert [(s.binding, s.reason) for s in router.skipped] == [(bad, r"invalid escape sequence: '\\1'")]
    assert router.route("t", "x") == (good,) and router.route("only-bad", "aa") == ()
    assert router.topics == ["only-bad", "t"], "its topic is still served: messages wait for a fix"
