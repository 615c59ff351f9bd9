"""Serving the admin app with hypercorn inside the broker's Trio loop."""

from __future__ import annotations

import ssl
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from kiteq.config import TlsConfig
from kiteq.server.admin.app import AdminApp


async def serve_admin(
    app: AdminApp,
    bind: str,
    tls: TlsConfig,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status.started` with the bound host:port addresses.

    The addresses come without hypercorn's scheme: it is https when `[tls]` is on, and
    callers build URLs with the scheme they need.
    """
    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    if tls.enabled:  # the same certificate as the client port, and the same client CA
        config.certfile = tls.cert
        config.keyfile = tls.key
        if tls.ca:
            config.ca_certs = tls.ca
            config.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    async with trio.open_nursery() as nursery:
        bound: list[str] = await nursery.start(partial(serve, app, config))  # type: ignore[arg-type]
        task_status.started([address.partition("://")[2] for address in bound])
