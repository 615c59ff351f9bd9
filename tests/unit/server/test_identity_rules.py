"""The pure rules behind identity: admission, authentication, refusal logging, ACLs. Table-driven."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiteq.config import AclRule, load_config
from kiteq.errors import ConfigError
from kiteq.registry.bindings import Binding
from kiteq.server.acl import Acl
from kiteq.server.admission import Admission
from kiteq.server.auth import Authenticator
from kiteq.server.refusals import RefusalCounter

# -- admission ------------------------------------------------------------------------------


def run_admission(admission: Admission, steps: list[tuple[str, str, str]]) -> list[object]:
    """Steps: ("admit", name, address) | ("auth", name, "") | ("close", name, ""); admit's results."""
    results: list[object] = []
    for action, name, address in steps:
        if action == "admit":
            results.append(admission.admit(name, address))
        elif action == "auth":
            admission.authenticated(name)
        else:
            admission.closed(name)
    return results


@pytest.mark.parametrize(
    ("limits", "steps", "expected", "total", "unauthenticated"),
    [
        # Room for all: nobody is evicted.
        ((3, 3, 3), [("admit", "a", "h1"), ("admit", "b", "h1")], [[], []], 2, 2),
        # Total full of unauthenticated peers: the oldest makes room.
        (
            (2, 9, 9),
            [("admit", "a", "h1"), ("admit", "b", "h2"), ("admit", "c", "h3")],
            [[], [], ["a"]],
            2,
            2,
        ),
        # Total full, but the oldest authenticated: the oldest unauthenticated goes instead.
        (
            (2, 9, 9),
            [("admit", "a", "h1"), ("auth", "a", ""), ("admit", "b", "h2"), ("admit", "c", "h3")],
            [[], [], ["b"]],
            2,
            1,
        ),
        # Total full of authenticated connections: the newcomer is refused.
        (
            (2, 9, 9),
            [
                ("admit", "a", "h1"),
                ("auth", "a", ""),
                ("admit", "b", "h1"),
                ("auth", "b", ""),
                ("admit", "c", "h1"),
            ],
            [[], [], None],
            2,
            0,
        ),
        # Unauthenticated cap: the oldest unauthenticated makes room, total untouched.
        (
            (9, 2, 9),
            [("admit", "a", "h1"), ("admit", "b", "h2"), ("admit", "c", "h3")],
            [[], [], ["a"]],
            2,
            2,
        ),
        # Per address: the oldest of that address goes, not the oldest of all.
        (
            (9, 9, 2),
            [("admit", "a", "h1"), ("admit", "b", "h2"), ("admit", "c", "h2"), ("admit", "d", "h2")],
            [[], [], [], ["b"]],
            3,
            3,
        ),
        # Both caps full: the address's oldest is the one victim, and frees a slot of each.
        (
            (9, 3, 2),
            [("admit", "a", "h1"), ("admit", "b", "h2"), ("admit", "c", "h2"), ("admit", "d", "h2")],
            [[], [], [], ["b"]],
            3,
            3,
        ),
        (
            (9, 2, 1),
            [("admit", "a", "h1"), ("admit", "b", "h2"), ("admit", "c", "h2")],
            [[], [], ["b"]],
            2,
            2,
        ),
        # Closing twice, or closing an evicted one, changes nothing.
        (
            (2, 9, 9),
            [("admit", "a", "h1"), ("close", "a", ""), ("close", "a", ""), ("admit", "b", "h1")],
            [[], []],
            1,
            1,
        ),
    ],
)
def test_admission(
    limits: tuple[int, int, int],
    steps: list[tuple[str, str, str]],
    expected: list[object],
    total: int,
    unauthenticated: int,
) -> None:
    admission = Admission(*limits)
    assert run_admission(admission, steps) == expected
    assert (admission.total, admission.unauthenticated) == (total, unauthenticated)


# -- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts", "expected_last"),
    [
        ([("p", "p-secret", "h1")], None),
        ([("p", "wrong", "h1")], "auth.refused"),
        ([("nobody", "x", "h1")], "auth.refused"),
        # The first failure starts a bucket of ten more tries; the twelfth attempt is rate-limited ...
        ([("x", "wrong", "h1")] * 10 + [("x", "x-secret", "h1")], None),
        ([("x", "wrong", "h1")] * 11 + [("x", "x-secret", "h1")], "auth.rate_limited"),
        # ... but not another group from the same address,
        ([("x", "wrong", "h1")] * 11 + [("p", "p-secret", "h1")], None),
        # nor the same group from another address,
        ([("x", "wrong", "h1")] * 11 + [("x", "x-secret", "h2")], None),
        # and names that are no group share one bucket per address, apart from real groups.
        ([(f"made-up-{i}", "x", "h1") for i in range(11)] + [("x", "x-secret", "h1")], None),
        ([(f"made-up-{i}", "x", "h1") for i in range(11)] + [("other", "x", "h1")], "auth.rate_limited"),
    ],
)
def test_authentication(attempts: list[tuple[str, str, str]], expected_last: str | None) -> None:
    auth = Authenticator({"p": "p-secret", "x": "x-secret"})
    verdicts = [auth.check(group, secret, host, now=0.0) for group, secret, host in attempts]
    last = verdicts[-1]
    assert (last.kind if last else None) == expected_last
    assert all("secret" not in (v.reason if v else "") or "wrong secret" in v.reason for v in verdicts if v)


def test_the_failure_buckets_refill_and_stay_bounded() -> None:
    auth = Authenticator({"x": "x-secret"}, max_tracked=8)
    for _ in range(11):
        auth.check("x", "wrong", "h1", now=0.0)
    assert auth.check("x", "x-secret", "h1", now=0.5) is not None
    assert auth.check("x", "x-secret", "h1", now=2.0) is None, "one token back per second"
    for host in range(100):
        auth.check("x", "wrong", f"10.0.0.{host}", now=0.0)
    assert auth.tracked == 8


def test_an_open_broker_accepts_any_group() -> None:
    assert Authenticator({}).check("anyone", "", "h", now=0.0) is None


def test_a_long_group_name_is_cut_in_the_reason() -> None:
    refusal = Authenticator({"p": "s"}).check("g" * 10_000, "x", "h", now=0.0)
    assert refusal is not None and len(refusal.reason) < 300 and "(10000 characters)" in refusal.reason


# -- refusal logging ------------------------------------------------------------------------


def test_the_first_refusal_of_each_kind_per_window_is_logged_the_rest_counted() -> None:
    counter = RefusalCounter(window=10.0)
    logged = [
        counter.note(kind, now)
        for kind, now in [("a", 0), ("a", 1), ("b", 1), ("a", 9.9), ("a", 10), ("a", 11)]
    ]
    assert logged == [True, False, True, False, True, False]
    assert counter.take_suppressed() == {"a": 3}
    assert counter.take_suppressed() == {}
    assert dict(counter.totals) == {"a": 5, "b": 1}


# -- ACL ------------------------------------------------------------------------------------


ACL = Acl(
    {
        "order-svc": AclRule(publish=("trade", "refund*")),
        "sms-svc": AclRule(subscribe=("trade",)),
        "locked": AclRule(publish=(), subscribe=()),
    }
)


@pytest.mark.parametrize(
    ("group", "topic", "publish", "subscribe"),
    [
        ("order-svc", "trade", True, True),
        ("order-svc", "refund-eu", True, True),
        ("order-svc", "trades", False, True),
        ("sms-svc", "anything", True, False),
        ("sms-svc", "trade", True, True),
        ("locked", "trade", False, False),
        ("no-table", "trade", True, True),
    ],
)
def test_acl(group: str, topic: str, publish: bool, subscribe: bool) -> None:
    assert (ACL.may_publish(group, topic), ACL.may_subscribe(group, topic)) == (publish, subscribe)


def test_acl_splits_bindings() -> None:
    kept, denied = ACL.split(
        [Binding.direct("trade", "x", group="sms-svc"), Binding.direct("refund", "x", group="sms-svc")]
    )
    assert [b.topic for b in kept] == ["trade"] and [b.topic for b in denied] == ["refund"]


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        ('[acl.p]\npublish = "trade"\n', r"\[acl.p\] publish: expected a list"),
        ("[acl.p]\nconsume = []\n", r"\[acl.p\] consume: unknown key"),
        ('[tls]\ncert = "c.pem"\n', r"\[tls\] cert and key"),
        (
            '[tls]\ncert = "c.pem"\nkey = "k.pem"\nrequire_client_cert = true\n',
            r"require_client_cert: needs \[tls\] ca",
        ),
        ("[server]\npre_auth_max_bytes = 10\n", r"pre_auth_max_bytes: must be at least 256"),
        ("[server]\nmax_unauthenticated = 0\n", r"max_unauthenticated"),
    ],
)
def test_bad_security_config_names_the_key(tmp_path: Path, toml: str, error: str) -> None:
    path = tmp_path / "kiteq.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=error):
        load_config(path)


def test_acl_config_is_read() -> None:
    config = load_config(None, {"acl": {"p": {"publish": ["t*"]}}})
    assert config.acl == {"p": AclRule(publish=("t*",), subscribe=None)}


# -- counters that clients could grow ---------------------------------------------------------


def test_event_counters_stay_bounded_however_many_topics_clients_invent() -> None:
    from kiteq.server.events import MAX_COUNTED_TOPICS, OTHER_TOPICS, Events
    from protocol.logevents import LogEvent
    from stores import MessageEntity

    events = Events()
    for i in range(MAX_COUNTED_TOPICS + 5_000):
        events.emit(LogEvent.STORED, MessageEntity("0" * 32, f"topic-{i}", "x", "p", b""))
    topics = {topic for _, topic, _ in events.counts}
    assert len(topics) == MAX_COUNTED_TOPICS + 1
    assert events.counts[(LogEvent.STORED, OTHER_TOPICS, "")] == 5_000
    assert events.total(LogEvent.STORED) == MAX_COUNTED_TOPICS + 5_000, "nothing is lost from the totals"
