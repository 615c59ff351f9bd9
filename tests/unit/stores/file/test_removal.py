"""Deleting store files a step at a time (`layout.remove`, `layout.release`): freeing a big
file's blocks at once holds up every synced write of the store behind it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stores.file import layout

SIZE = 5 * layout.REMOVE_STEP + 123


def big_file(path: Path) -> Path:
    path.write_bytes(b"x" * SIZE)
    return path


def recorded_truncations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    truncate = os.ftruncate

    def recording(fd: int, length: int) -> None:
        sizes.append(length)
        truncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", recording)
    return sizes


def test_remove_frees_a_file_a_step_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = recorded_truncations(monkeypatch)
    layout.remove(big_file(tmp_path / "0000000001.log"))
    assert sizes == [SIZE - step * layout.REMOVE_STEP for step in range(1, 6)]
    assert list(tmp_path.iterdir()) == [], "neither the file nor its .tmp name is left"


def test_removing_a_missing_file_is_fine(tmp_path: Path) -> None:
    layout.remove(tmp_path / "0000000001.log")


def test_a_removal_cut_short_leaves_a_leftover_that_recovery_deletes(tmp_path: Path) -> None:
    log = big_file(tmp_path / "0000000001.log")
    os.rename(log, log.with_name(log.name + ".tmp"))  # what a crash right after the rename leaves
    listing = layout.list_files(tmp_path)
    assert listing.logs == [] and listing.temporary == [tmp_path / "0000000001.log.tmp"]


def test_release_closes_an_unlinked_file_on_a_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = recorded_truncations(monkeypatch)
    path = big_file(tmp_path / "0000000003.seg")
    fd = os.open(path, os.O_RDWR)
    path.unlink()
    thread = layout.release(fd)
    assert thread is not None and thread.name == "kiteq-store-free"
    thread.join(10)
    assert sizes == [SIZE - step * layout.REMOVE_STEP for step in range(1, 6)]
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


def test_release_of_a_read_only_descriptor_still_closes_it(tmp_path: Path) -> None:
    path = big_file(tmp_path / "0000000003.seg")
    fd = os.open(path, os.O_RDONLY)
    path.unlink()
    thread = layout.release(fd)
    assert thread is not None
    thread.join(10)
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_small_file_is_closed_at_once_without_a_thread(tmp_path: Path) -> None:
    path = tmp_path / "0000000003.seg"
    path.write_bytes(b"x" * 8192)
    fd = os.open(path, os.O_RDWR)
    path.unlink()
    assert layout.release(fd) is None
    with pytest.raises(OSError):
        os.fstat(fd)
