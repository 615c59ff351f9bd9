"""`kiteq-admin`: the registry, a running broker and offline stores, from the shell.

The command tree is assembled from the modules named in `COMMAND_MODULES` (all in
this package). Each module has `add_parser(subparsers)`, which adds its commands
and sets `func` on each: a callable taking the parsed args, sync or async,
returning None (success) or an exit code. A module that does not exist yet is
skipped — only a ModuleNotFoundError naming that module itself, so a missing
dependency *inside* a module still fails loudly — which lets the command modules
land independently.

The global options (`--registry`, `--admin`, `--token`, `--tls-ca`, `--json`,
`--log-level`) are accepted before the command, after it, or anywhere between: every
parser of the tree has them (`AdminParser`), the top level with the defaults and
every level below without (SUPPRESS), so an option given later overrides one given
earlier and an option not given leaves the value in place.

Exit codes: 0 success, 1 when a command found nothing to act on (e.g. a `dlq redrive`
that matched no dead letter), 2 for a usage error or a KiteQError (a bad address, a
conflict, a missing node, …), printed as `error: <message>` on stderr; 141 when the
reader of stdout went away (`| head`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import trio

from kiteq.cli.console import add_version, closed_pipe_is_quiet
from kiteq.errors import KiteQError
from kiteq.logging import configure_logging

COMMAND_MODULES = ("registry_cmds", "store_cmds", "broker_cmds", "message_cmds")
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


class AdminParser(argparse.ArgumentParser):
    """A parser of kiteq-admin's tree; every one, at every level, accepts the global options.

    argparse reads an option only in the parser of the level where it stands, so
    `kiteq-admin bindings list --json` needs `--json` on `list` as well. Sub-parsers
    are made by `add_subparsers().add_parser`, which builds them with this class.
    """

    def __init__(self, *args: Any, top_level: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        add_global_options(self, top_level)


def add_global_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """The options every command reads; below the top level they default to SUPPRESS."""

    def default(value: object) -> object:
        return value if top_level else argparse.SUPPRESS

    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--registry",
        default=default(DEFAULT_REGISTRY),
        metavar="URI",
        help=f"file:///path/registry.json or zk://host:2181[,host:2181][/chroot] (default {DEFAULT_REGISTRY})",
    )
    group.add_argument(
        "--admin",
        default=default(DEFAULT_ADMIN),
        metavar="URL",
        help=f"a running broker's admin endpoint (default {DEFAULT_ADMIN})",
    )
    group.add_argument(
        "--token",
        default=default(None),
        help="the broker's admin token, for redrive and purge (default: env KITEQ_ADMIN_TOKEN)",
    )
    group.add_argument(
        "--tls-ca",
        default=default(None),
        metavar="PEM",
        help="the CA that signs an https admin endpoint's certificate (the broker's [tls] cert)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print JSON for scripts instead of tables",
    )
    group.add_argument(
        "--log-level",
        default=default("error"),
        choices=("debug", "info", "warning", "error"),
        help="log messages to stderr from this level up (default error; audit events always)",
    )
    if top_level:
        add_version(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = AdminParser(
        prog="kiteq-admin",
        description="Administer KiteQ-py: registry bindings, brokers, stores.",
        top_level=True,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        module.add_parser(subparsers)
    return parser


@closed_pipe_is_quiet
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    configure_logging(args.log_level)
    func = args.func
    try:
        result = trio.run(func, args) if inspect.iscoroutinefunction(func) else func(args)
    except BrokenPipeError:
        raise  # the reader of stdout went away: `closed_pipe_is_quiet` ends quietly
    except (KiteQError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return EXIT_OK if result is None else int(result)
