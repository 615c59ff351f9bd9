"""The broker's admin HTTP endpoint, served by hypercorn inside the broker's Trio loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

if TYPE_CHECKING:
    from kiteq.server.broker import Broker


async def serve_admin(
    broker: Broker, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    from kiteq.server.admin.app import AdminApp

    config = Config()
    config.bind = [broker.config.server.admin_bind]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    await serve(AdminApp(broker), config, task_status=task_status)  # type: ignore[arg-type]
