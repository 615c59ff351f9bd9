"""What `kiteq-admin` prints: aligned tables for people, JSON for scripts (`--json`).

Every command module prints through `emit`, so `--json` means the same everywhere
and a table looks the same whichever command made it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

Row = Mapping[str, Any]


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(format_cell(item) for item in value)
    return str(value)


def format_table(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """Rows as left-aligned columns under upper-case headers; columns default to the first row's keys."""
    names = list(columns or (rows[0].keys() if rows else ()))
    cells = [[name.upper() for name in names]]
    cells += [[format_cell(row.get(name)) for name in names] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(names))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def print_json(data: Any, file: TextIO | None = None) -> None:
    print(json.dumps(data, indent=2, default=str), file=file or sys.stdout)


def emit(
    args: argparse.Namespace,
    rows: Sequence[Row],
    *,
    data: Any = None,
    columns: Sequence[str] | None = None,
    empty: str = "nothing found",
) -> None:
    """Print `rows` as a table, or with --json print `data` (the rows when not given).

    `data` lets a command give scripts the full structure (e.g. KiteQ's binding
    JSON) while people get a one-line summary per row; `empty` is said to people
    instead of a table with no rows.
    """
    if args.json:
        print_json(list(rows) if data is None else data)
    elif rows:
        print(format_table(rows, columns))
    else:
        print(empty)


def say(args: argparse.Namespace, message: str, data: Any) -> None:
    """The result of a command that changed something: a sentence, or `data` as JSON."""
    if args.json:
        print_json(data)
    else:
        print(message)
