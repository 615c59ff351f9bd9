"""What every console script shares: `--version`, and a quiet end when its reader goes away.

`kiteq-admin bindings list | head -1` closes the pipe after one line; the next write
raises BrokenPipeError. That is the reader's choice, not an error of ours: the script
ends without a traceback, with the status a shell reports for a process SIGPIPE ended.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
import signal
import sys
from collections.abc import Sequence
from typing import Protocol

from kiteq.errors import leaf_error

DISTRIBUTION = "kiteq-py"
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE  # 141, as `yes | head -1` reports under `set -o pipefail`


class Main(Protocol):
    """A console script's `main`: its arguments (sys.argv[1:] when None), then an exit code."""

    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: the installed package's version, e.g. `kiteq-admin 0.1.0`."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version(DISTRIBUTION)}",
        help="print the version and exit",
    )


def closed_pipe_is_quiet(main: Main) -> Main:
    """Run `main`, flushing stdout inside it, so a closed pipe surfaces here and ends quietly."""

    @functools.wraps(main)
    def run(argv: Sequence[str] | None = None) -> int:
        try:
            code = main(argv)
            sys.stdout.flush()
        except (BrokenPipeError, BaseExceptionGroup) as exc:
            if leaf_error(exc, (BrokenPipeError,)) is None:
                raise
            # Python flushes stdout again at exit: point it at /dev/null so that flush succeeds.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return EXIT_CLOSED_PIPE
        return code

    return run
