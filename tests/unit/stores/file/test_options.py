"""file:// URIs and keyword options of the file store."""

from __future__ import annotations

from pathlib import Path

import pytest

from stores import StoreConfigError, open_store
from stores.file import FileStore, FsyncMode


def test_defaults() -> None:
    store = FileStore.from_uri("file:///var/kiteq/store")
    assert store.directory == Path("/var/kiteq/store")
    options = store.options
    assert (
        options.fsync,
        options.segment_bytes,
        options.repair,
        options.read_only,
        options.write_in_place,
        options.cache_sealed,
    ) == (FsyncMode.BATCH, 64 << 20, False, False, True, False)
    assert not FileStore.from_uri("file:///d?write_in_place=false").options.write_in_place
    assert FileStore.from_uri("file:///d?cache_sealed=true").options.cache_sealed


def test_query_and_keyword_options_keyword_wins() -> None:
    store = open_store("file://./data/store?fsync=never&segment_bytes=8MiB&repair=true", fsync="always")
    assert isinstance(store, FileStore)
    assert store.directory == Path("./data/store")
    assert (store.options.fsync, store.options.segment_bytes, store.options.repair) == (
        FsyncMode.ALWAYS,
        8 << 20,
        True,
    )
    assert FileStore.from_uri("file:///d", segment_bytes=4096, repair=False).options.segment_bytes == 4096
    assert FileStore.from_uri("file:///d?segment_bytes=512k").options.segment_bytes == 512 << 10


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("file:///d?fsync=sometimes", "fsync='sometimes' is not a mode: use always, batch or never"),
        ("file:///d?segment_bytes=big", "segment_bytes='big' is not a size"),
        ("file:///d?segment_bytes=10", "segment_bytes=10 is out of range"),
        ("file:///d?segment_bytes=2GiB", "out of range"),
        ("file:///d?repair=maybe", "repair='maybe' is not a boolean"),
        ("file:///d?write_in_place=sometimes", "write_in_place='sometimes' is not a boolean"),
        ("file:///d?cache_sealed=later", "cache_sealed='later' is not a boolean"),
        ("file:///d?fsnyc=batch", "unknown file store option"),
        ("file://", "names no path"),
    ],
)
def test_bad_options_name_the_option(uri: str, says: str) -> None:
    with pytest.raises(StoreConfigError, match=says.replace("(", r"\(").replace("?", r"\?")):
        FileStore.from_uri(uri)
