"""Pieces shared by the cluster tests: broker child processes and batch sends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kiteq import Message, Producer

ROOT = Path(__file__).resolve().parents[3]
TOPIC = "t"


def start_broker_process(
    tmp_path: Path, port: int, store: str, registry: str, *, server: str = ""
) -> subprocess.Popen[bytes]:
    """`python -m kiteq.cli.server` on a fixed port, logging to tmp_path/broker-<port>.log.

    `server` is more TOML lines for its [server] table.
    """
    config = tmp_path / f"broker-{port}.toml"
    config.write_text(
        f'[server]\nbind = "127.0.0.1:{port}"\nadmin_bind = ""\nstore = "{store}"\n'
        f'registry = "{registry}"\ntopics = ["{TOPIC}"]\n{server}'
        "[delivery]\nrecover_interval = 0.1\nretry_base = 0.1\n"
    )
    with open(tmp_path / f"broker-{port}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "kiteq.cli.server", "--config", str(config)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


async def send_batch(producer: Producer, message_type: str, count: int) -> set[str]:
    """Send `count` messages at once; every one must be stored. Their ids."""
    results = await producer.send_many([Message(TOPIC, message_type, b"m") for _ in range(count)])
    failed = [r.error for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {count} sends failed: {failed[0]}"
    return {r.message_id for r in results}
