"""`kiteq-server`: run a broker. Defaults need nothing else: a file store and a file
registry under ./data. SIGTERM and SIGINT stop it cleanly."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import structlog
import trio

from kiteq.config import load_config
from kiteq.errors import KiteQError, leaf_error
from kiteq.gc_tuning import tune_gc
from kiteq.logging import configure_logging
from kiteq.server.broker import Broker

log = structlog.get_logger(__name__)

# flag -> (section, key); each overrides the config file.
FLAGS: dict[str, tuple[str, str]] = {
    "bind": ("server", "bind"),
    "admin_bind": ("server", "admin_bind"),
    "store": ("server", "store"),
    "registry": ("server", "registry"),
    "delivery_log": ("server", "delivery_log"),
    "max_frame_bytes": ("server", "max_frame_bytes"),
    "log_level": ("server", "log_level"),
    "log_format": ("server", "log_format"),
    "adopt_after": ("server", "adopt_after"),
    "deliver_timeout": ("delivery", "deliver_timeout"),
    "retry_base": ("delivery", "retry_base"),
    "retry_max": ("delivery", "retry_max"),
    "tx_scan_interval": ("tx", "tx_scan_interval"),
    "tx_check_after": ("tx", "tx_check_after"),
    "tx_check_max": ("tx", "tx_check_max"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kiteq-server", description=__doc__)
    parser.add_argument("--config", type=Path, help="TOML file (see README); flags override it")
    parser.add_argument("--bind", help="host:port for clients (default 127.0.0.1:13800)")
    parser.add_argument("--admin-bind", help="host:port of the admin HTTP endpoint; '' disables it")
    parser.add_argument(
        "--store", help="memory:// | file://DIR[?fsync=batch] | mysql://user:pass@host:port/db"
    )
    parser.add_argument("--registry", help="file://PATH.json | zk://host:port[,host:port][/chroot]")
    parser.add_argument("--delivery-log", help="write the delivery log (JSON lines) to this path")
    parser.add_argument("--topic", dest="topics", action="append", help="serve this topic (repeatable)")
    parser.add_argument("--max-frame-bytes", type=int)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", choices=["console", "json"])
    parser.add_argument(
        "--adopt-after", type=float, help="take over a dead broker's rows in a shared store after N s"
    )
    parser.add_argument("--deliver-timeout", type=float)
    parser.add_argument("--retry-base", type=float)
    parser.add_argument("--retry-max", type=float)
    parser.add_argument("--tx-scan-interval", type=float)
    parser.add_argument("--tx-check-after", type=float)
    parser.add_argument("--tx-check-max", type=int)
    return parser.parse_args(argv)


async def serve(broker: Broker) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, broker)
        await broker.run()
        nursery.cancel_scope.cancel()


async def _stop_on_signal(broker: Broker) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("broker.stopping", signal=signal.Signals(signum).name)
            broker.stop()
            return


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides: dict[str, dict[str, Any]] = {"server": {}, "delivery": {}, "tx": {}}
    for flag, (section, key) in FLAGS.items():
        overrides[section][key] = getattr(args, flag)
    if args.topics:
        overrides["server"]["topics"] = args.topics
    try:
        config = load_config(args.config, overrides)
        configure_logging(config.server.log_level, config.server.log_format)
        tune_gc()
        trio.run(serve, Broker(config))
    except (KiteQError, OSError, BaseExceptionGroup) as exc:
        error = leaf_error(exc, (KiteQError, OSError))
        if error is None:
            raise
        print(f"kiteq-server: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
