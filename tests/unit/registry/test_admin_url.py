"""The admin endpoint URL a broker registers: a host others can reach, the scheme of its [tls]."""

from __future__ import annotations

import pytest

from kiteq.registry.admin_url import admin_url


@pytest.mark.parametrize(
    ("admin", "broker", "tls", "url"),
    [
        ("127.0.0.1:13801", "127.0.0.1:13800", False, "http://127.0.0.1:13801"),
        ("127.0.0.1:13801", "127.0.0.1:13800", True, "https://127.0.0.1:13801"),
        # A wildcard names no machine: the client address's host does.
        ("0.0.0.0:13801", "kiteq:13800", False, "http://kiteq:13801"),
        ("[::]:13801", "10.0.0.5:13800", True, "https://10.0.0.5:13801"),
        (":13801", "mq1.example:13800", False, "http://mq1.example:13801"),
        # Both wildcards: nothing better to say than what it listens on.
        ("0.0.0.0:13801", "0.0.0.0:13800", False, "http://0.0.0.0:13801"),
        ("[::1]:13801", "[::]:13800", False, "http://[::1]:13801"),
    ],
)
def test_admin_url(admin: str, broker: str, tls: bool, url: str) -> None:
    assert admin_url(admin, broker, tls=tls) == url
