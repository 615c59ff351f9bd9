"""Parsing of mysql:// store URIs (no database needed)."""

from __future__ import annotations

import pytest

from stores import StoreConfigError
from stores.mysql import parse_uri
from stores.mysql.uri import Endpoint


def test_full_uri_and_defaults() -> None:
    config = parse_uri("mysql://kite:p%40ss@db1:3307/kiteq?replica=db2:3308")
    assert config.master == Endpoint("db1", 3307)
    assert config.replica == Endpoint("db2", 3308)
    assert (config.database, config.user, config.password) == ("kiteq", "kite", "p@ss")
    assert (config.shards, config.replica_max_lag, config.broker) == (16, 5.0, "")
    assert "p@ss" not in config.redacted() and "db2:3308" in config.redacted()


def test_keyword_options_override_the_query() -> None:
    config = parse_uri("mysql://u@h/db?shards=8&timeout=2", shards=4, broker="10.0.0.1:13800")
    assert (config.shards, config.timeout, config.broker, config.replica) == (4, 2.0, "10.0.0.1:13800", None)
    assert config.master == Endpoint("h", 3306)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("mysql://h/db", "needs a user"),
        ("mysql://u@h/", "bad database name"),
        ("mysql://u@h/my-db", "bad database name"),
        ("mysql://u@h/db?shards=0", "out of range"),
        ("mysql://u@h/db?shards=x", "not an integer"),
        ("mysql://u@h/db?replica_max_lag=soon", "not a number"),
        ("mysql://u@h/db?replica=h:99999", "bad replica address"),
        ("mysql://u@h/db?shard=4", "unknown mysql store option 'shard'"),
        ("postgres://u@h/db", "not a mysql:// URI"),
    ],
)
def test_bad_uris_name_the_problem(uri: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=message):
        parse_uri(uri)
