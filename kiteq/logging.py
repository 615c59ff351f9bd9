"""structlog setup: JSON lines for machines, key=value for people, one call at start."""

from __future__ import annotations

import logging
import sys

import structlog
from structlog.typing import EventDict, WrappedLogger

# The longest value a log line carries. Client-supplied names are quoted and cut to 128
# characters where they are logged (`protocol.session.quote`); this is the backstop, so
# no peer can make one line of ours megabytes long. Tracebacks are exempt.
MAX_VALUE_CHARS = 1024


def _clip_long_values(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
    for key, value in event.items():
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS and key != "exception":
            event[key] = f"{value[:MAX_VALUE_CHARS]}... ({len(value)} characters)"
    return event


class _CurrentStderr:
    """Writes to `sys.stderr` as it is at each write, not as it was at configuration.

    Whoever swaps `sys.stderr` (pytest's capture, an embedding app) and later closes
    its stream would otherwise leave every logger writing to a closed file.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", fmt: str = "console") -> None:
    """Route structlog (and stdlib logging of libraries) to stderr at `level`."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _clip_long_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),  # type: ignore[arg-type]
        # Not cached: loggers are created at import time and must follow later
        # configuration (tests, embedding apps); the per-message path does not log.
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
