"""`[tls]`: mistakes stop the broker at start with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiteq.config import load_config
from kiteq.errors import ConfigError
from kiteq.tls import server_context


def test_a_missing_certificate_file_names_cert_and_key(tmp_path: Path) -> None:
    missing = {"cert": str(tmp_path / "broker.pem"), "key": str(tmp_path / "broker.key")}
    config = load_config(None, {"tls": missing})
    with pytest.raises(ConfigError, match=r"^\[tls\] cert/key: cannot load .*broker\.pem"):
        server_context(config.tls)


def test_require_client_cert_without_a_ca_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^\[tls\] require_client_cert: needs \[tls\] ca"):
        load_config(None, {"tls": {"cert": "broker.pem", "key": "broker.key", "require_client_cert": True}})


def test_tls_is_off_by_default() -> None:
    assert server_context(load_config().tls) is None
