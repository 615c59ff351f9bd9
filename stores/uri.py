"""Parsing of the `file://` URIs that stores and the file registry share."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs


def split_file_uri(uri: str) -> tuple[Path, dict[str, str]]:
    """`file://./data/store?fsync=batch` -> (Path('./data/store'), {'fsync': 'batch'}).

    Everything after `file://` up to `?` is the path, so `file://./rel`, `file://rel`
    and `file:///abs` all mean what they look like.
    """
    if not uri.startswith("file://"):
        raise ValueError(f"not a file:// URI: {uri!r}")
    rest = uri[len("file://") :]
    path, _, query = rest.partition("?")
    if not path:
        raise ValueError(f"{uri!r} names no path: use file:///absolute/path or file://./relative/path")
    options = {key: values[-1] for key, values in parse_qs(query).items()}
    return Path(path), options
