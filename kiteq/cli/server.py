"""`kiteq-server`: run a broker. Defaults need nothing else: a file store and a file
registry under ./data. SIGTERM and SIGINT stop it cleanly."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any, get_origin

import structlog
import trio

from kiteq.cli.console import add_version, closed_pipe_is_quiet
from kiteq.config import BrokerConfig, load_config, table_keys
from kiteq.errors import KiteQError, leaf_error
from kiteq.gc_tuning import tune_gc
from kiteq.logging import configure_logging
from kiteq.malloc_tuning import fix_mmap_threshold
from kiteq.server.broker import Broker

log = structlog.get_logger(__name__)

# Sections made of keys too generic to be flags alone (`--cert`, `--key`): their flags carry
# the section's name, as do keys that two sections share.
PREFIXED = ("tls",)

FILE_ONLY = (
    "[auth], [acl.GROUP] and the secret keys ({secrets}) are read from --config only: "
    "a command line shows in `ps` and in shell history."
)


def config_flags() -> list[tuple[str, str, dataclasses.Field[Any], Any]]:
    """(flag, section, key, type) for every key of the config's tables but the secret ones."""
    keys = table_keys()
    shared = {name for name, count in Counter(key.name for _, key, _ in keys).items() if count > 1}
    return [
        (
            (f"{section}-" if section in PREFIXED or key.name in shared else "")
            + key.metadata.get("flag", key.name).replace("_", "-"),
            section,
            key,
            kind,
        )
        for section, key, kind in keys
        if not key.metadata.get("secret")
    ]


def build_parser() -> argparse.ArgumentParser:
    """`--config`, then one flag per key, grouped by section; each flag overrides the file."""
    secrets = ", ".join(
        f"[{section}] {key.name}" for section, key, _ in table_keys() if key.metadata.get("secret")
    )
    parser = argparse.ArgumentParser(
        prog="kiteq-server",
        usage="%(prog)s [--config FILE] [--KEY VALUE ...]",
        description=__doc__,
        epilog=FILE_ONLY.format(secrets=secrets),
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML file (see README); flags override it"
    )
    add_version(parser)
    defaults = BrokerConfig()
    for section, flags in groupby(config_flags(), key=itemgetter(1)):
        group = parser.add_argument_group(f"[{section}]")
        for flag, _, key, kind in flags:
            default = json.dumps(getattr(getattr(defaults, section), key.name))
            options: dict[str, Any] = {
                "dest": f"{section}.{key.name}",
                "help": f"{key.metadata['doc']} (default: {default})".replace("%", "%%"),
            }
            if kind is bool:
                options["action"] = argparse.BooleanOptionalAction
            elif get_origin(kind) is list:
                options.update(action="append", metavar=flag.upper())
            elif "choices" in key.metadata:
                options.update(choices=key.metadata["choices"])
            else:
                options.update(type=kind, metavar=kind.__name__.upper())
            group.add_argument(f"--{flag}", **options)
    return parser


def config_from_argv(argv: Sequence[str] | None) -> BrokerConfig:
    """Defaults, then the --config file, then the flags given; ConfigError names a bad key."""
    args = build_parser().parse_args(argv)
    overrides: dict[str, dict[str, Any]] = defaultdict(dict)
    for dest, value in vars(args).items():
        section, dot, key = dest.partition(".")
        if dot:
            overrides[section][key] = value
    return load_config(args.config, overrides)


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


@closed_pipe_is_quiet
def main(argv: Sequence[str] | None = None) -> int:
    """Run a broker until SIGTERM or SIGINT; 2 and one line on stderr if it cannot start."""
    try:
        config = config_from_argv(argv)
        configure_logging(config.server.log_level, config.server.log_format)
        tune_gc()
        fix_mmap_threshold()
        trio.run(serve, Broker(config))
    except (KiteQError, OSError, BaseExceptionGroup) as exc:
        error = leaf_error(exc, (KiteQError, OSError))
        if error is None or isinstance(error, BrokenPipeError):
            raise
        print(f"kiteq-server: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
