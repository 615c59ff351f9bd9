"""`kiteq-admin`: the registry, a running broker and offline stores, from the shell.

The command tree is assembled from the modules named in `COMMAND_MODULES` (all in
this package). Each module has `add_parser(subparsers)`, which adds its commands
and sets `func` on each: a callable taking the parsed args, sync or async,
returning None (success) or an exit code. A module that does not exist yet is
skipped — only a ModuleNotFoundError naming that module itself, so a missing
dependency *inside* a module still fails loudly — which lets the command modules
land independently.

Exit codes: 0 success, 2 for a usage error or a KiteQError (a bad address, a
conflict, a missing node, …), printed as `error: <message>` on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Sequence
from types import ModuleType

import trio

from kiteq.errors import KiteQError
from kiteq.logging import configure_logging

COMMAND_MODULES = ("registry_cmds", "store_cmds", "broker_cmds")
DEFAULT_REGISTRY = "file://./data/registry.json"
DEFAULT_ADMIN = "http://127.0.0.1:13801"
EXIT_OK = 0
EXIT_ERROR = 2


def _command_modules() -> list[ModuleType]:
    modules = []
    for name in COMMAND_MODULES:
        qualified = f"{__name__}.{name}"
        try:
            modules.append(importlib.import_module(qualified))
        except ModuleNotFoundError as exc:
            if exc.name != qualified:
                raise
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiteq-admin", description="Administer KiteQ-py: registry bindings, brokers, stores."
    )
    parser.add_argument(
        "--registry",
        default=DEFAULT_REGISTRY,
        metavar="URI",
        help=f"file:///path/registry.json or zk://host:2181[,host:2181][/chroot] (default {DEFAULT_REGISTRY})",
    )
    parser.add_argument(
        "--admin",
        default=DEFAULT_ADMIN,
        metavar="URL",
        help=f"a running broker's admin endpoint (default {DEFAULT_ADMIN})",
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA that signs an https admin endpoint's certificate (the broker's [tls] cert)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    parser.add_argument(
        "--log-level",
        default="error",
        choices=("debug", "info", "warning", "error"),
        help="log messages to stderr from this level up (default error)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    configure_logging(args.log_level)
    func = args.func
    try:
        result = trio.run(func, args) if inspect.iscoroutinefunction(func) else func(args)
    except (KiteQError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return EXIT_OK if result is None else int(result)
