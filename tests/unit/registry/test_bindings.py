"""Bindings: matching, KiteQ's conflict rule, and the registry's JSON form."""

from __future__ import annotations

import json

import pytest

from kiteq.registry.bindings import (
    Binding,
    BindingError,
    PatternError,
    check_conflicts,
    decode_bindings,
    encode_bindings,
    merge_binding,
)
from protocol import BindType

# What KiteQ (Go) writes into /kiteq/sub/{topic}/{group}-bind, byte for byte.
GO_NODE = (
    b'[{"groupId":"s-mts-test","topic":"trade","messageType":"pay-succ","bindType":0,"version":"1.0.0",'
    b'"watermark":1000,"persistent":true}]'
)


def test_direct_matches_equal_type_on_its_topic_only() -> None:
    binding = Binding.direct("trade", "pay-succ", group="g")
    assert binding.matches("trade", "pay-succ")
    assert not binding.matches("trade", "pay-succ-2")
    assert not binding.matches("order", "pay-succ")


def test_regex_is_a_full_match() -> None:
    binding = Binding.regex("trade", "pay-.*", group="g")
    assert binding.matches("trade", "pay-succ")
    assert not binding.matches("trade", "x-pay-succ")  # KiteQ's unanchored match would say yes
    assert not Binding.regex("trade", "pay", group="g").matches("trade", "pay-succ")


def test_fanout_matches_everything_of_its_topic() -> None:
    binding = Binding.fanout("trade", group="g")
    assert binding.message_type == "*"
    assert binding.matches("trade", "anything") and not binding.matches("order", "anything")


@pytest.mark.parametrize(
    ("a", "b", "conflict"),
    [
        (Binding.direct("t", "x", group="g"), Binding.direct("t", "y", group="g"), False),
        (
            Binding.direct("t", "x", group="g"),
            Binding.direct("t", "x", group="g", watermark=5),
            False,
        ),  # same key
        (Binding.direct("t", "x", group="g"), Binding.direct("t", "x", group="h"), False),  # other group
        (Binding.direct("t", "x", group="g"), Binding.direct("u", "x", group="g"), False),  # other topic
        (Binding.regex("t", "a.*", group="g"), Binding.regex("t", "b.*", group="g"), True),  # both regex
        (Binding.fanout("t", group="g"), Binding.direct("t", "x", group="g"), True),
        (Binding.direct("t", "x", group="g"), Binding.fanout("t", group="g", watermark=3), True),
        (Binding.regex("t", "pay-.*", group="g"), Binding.direct("t", "pay-succ", group="g"), True),
        (Binding.regex("t", "pay-.*", group="g"), Binding.direct("t", "refund", group="g"), False),
    ],
)
def test_conflict_rule(a: Binding, b: Binding, conflict: bool) -> None:
    assert a.conflicts_with(b) is conflict
    assert b.conflicts_with(a) is conflict


def test_merge_adds_replaces_and_rejects() -> None:
    merged = merge_binding([], Binding.direct("t", "x", group="g"))
    merged = merge_binding(merged, Binding.direct("t", "y", group="g"))
    merged = merge_binding(merged, Binding.direct("t", "x", group="g", watermark=5))
    assert [(b.message_type, b.watermark) for b in merged] == [("y", 1000), ("x", 5)]
    with pytest.raises(BindingError, match="overlaps 'x' \\(direct\\)"):
        merge_binding(merged, Binding.regex("t", "x|z", group="g"))
    with pytest.raises(BindingError):
        check_conflicts(merged, Binding.fanout("t", group="g"))


def test_invalid_bindings_are_refused() -> None:
    with pytest.raises(BindingError, match="invalid regex"):
        Binding.regex("t", "(", group="g")
    with pytest.raises(BindingError, match="watermark"):
        Binding.direct("t", "x", group="g", watermark=0)
    with pytest.raises(BindingError, match="topic"):
        Binding.direct("", "x", group="g")
    with pytest.raises(BindingError, match="messageType"):
        Binding.direct("t", "", group="g")


def test_json_is_kiteqs_format() -> None:
    binding = Binding.regex("trade", "pay-.*", group="sms", watermark=20, persistent=False)
    assert binding.to_json() == {
        "groupId": "sms",
        "topic": "trade",
        "messageType": "pay-.*",
        "bindType": 1,
        "version": "1.0.0",
        "watermark": 20,
        "persistent": False,
    }
    bindings = [binding, Binding.fanout("trade", group="mail"), Binding.direct("trade", "x", group="sms")]
    assert decode_bindings(encode_bindings(bindings)) == bindings
    assert decode_bindings(GO_NODE) == [Binding.direct("trade", "pay-succ", group="s-mts-test")]
    assert encode_bindings(decode_bindings(GO_NODE)) == GO_NODE  # byte for byte, as KiteQ writes it
    assert [b.bind_type for b in bindings] == [BindType.REGEX, BindType.FANOUT, BindType.DIRECT]


def test_decoding_tolerates_kiteqs_sparse_nodes_and_refuses_garbage() -> None:
    assert decode_bindings(b"") == [] and decode_bindings(b"  ") == []
    sparse = decode_bindings(json.dumps([{"groupId": "g", "topic": "t", "messageType": "x"}]).encode())
    assert sparse == [Binding.direct("t", "x", group="g")]  # defaults: direct, 1000, persistent
    for garbage in (
        b"{",
        b'{"groupId": "g"}',
        b'[{"topic": "t"}]',
        b'[{"groupId":"g","topic":"t","bindType":7}]',
    ):
        with pytest.raises(BindingError):
            decode_bindings(garbage)


def test_patterns_are_re2_full_matches_in_linear_time() -> None:
    binding = Binding.regex("t", "(a+)+", group="g")
    # At once: no backtracking. And a full match, not the leftmost alternative's.
    assert binding.matches("t", "a" * 40) and not binding.matches("t", "a" * 40 + "b")
    assert Binding.regex("t", "a|ab", group="g").matches("t", "ab")
    with pytest.raises(PatternError, match=r"invalid escape sequence") as refused:
        Binding.regex("t", r"(a)\1", group="g")
    assert (refused.value.pattern, refused.value.reason) == (r"(a)\1", r"invalid escape sequence: '\\1'")


def test_a_pattern_re2_refuses_is_read_from_a_registry_but_never_written() -> None:
    node = json.dumps([{"groupId": "g", "topic": "t", "messageType": "(a)\\1", "bindType": 1}]).encode()
    [bad] = decode_bindings(node)  # listed and removable, though not routable
    assert bad.message_type == r"(a)\1" and bad.with_group("h").group == "h"
    with pytest.raises(PatternError):
        bad.check()
    with pytest.raises(PatternError):
        merge_binding([], bad)
    with pytest.raises(BindingError, match=r"has regex '\(a\)\\\\1' on topic 't', which RE2 cannot compile"):
        merge_binding([bad], Binding.direct("t", "x", group="g"))
    with pytest.raises(PatternError) as long:
        Binding.regex("t", "(" + "x" * 1000, group="g")
    assert len(long.value.reason) < 200, "RE2 quotes the pattern in its reason: cut like any client text"
