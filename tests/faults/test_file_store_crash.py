"""The file store after SIGKILL: nothing acknowledged is lost, torn tails are cut, damage is refused.

The store runs in a child process (tests/faults/file_store_child.py) that reports
what each call returned; the test kills it with SIGKILL, then opens the directory
itself and checks it against those reports, or first damages the files the way a
crash or a bad disk would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from stores import MessageEntity, StoreCorrupted
from stores.file import FileStore, layout, preallocation
from stores.file.records import HEADER_SIZE, Scan

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
State = tuple[str, ...] | None
CHAOS_OPTIONS = {"fsync": "batch", "segment_bytes": 128 << 10, "compact_bytes": 64 << 10}
# Appended segments; a zero-filled one is made from the last of them (`zero_fill`).
FILL_OPTIONS = {"fsync": "batch", "segment_bytes": 16 << 10, "preallocate": False}
AFTER: dict[str, State] = {
    "commit": ("committed",),
    "rollback": None,
    "dead_letter": ("dead", "expired"),
    "redrive": ("committed",),
    "purge": None,
    "finish": None,
}
LAZY = {"finish"}  # returns before it is durable (fsync=batch): a crash may undo it


class Child:
    """A child process working on the store; its stdout, line by line."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._buffer = b""

    async def read_until(self, last: str, timeout: float = 30.0) -> None:
        with trio.fail_after(timeout):
            while last not in self.lines:
                await self._read()

    async def read_for(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            while True:
                await self._read()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        chunk = await self.process.stdout.receive_some()
        if not chunk:
            raise AssertionError(f"the child exited early with {await self.process.wait()}")
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines += [line.decode() for line in complete]

    async def kill(self) -> None:
        """SIGKILL, then keep every complete line it wrote before dying."""
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        assert self.process.stdout is not None
        while chunk := await self.process.stdout.receive_some():
            self._buffer += chunk
        *complete, _torn = self._buffer.split(b"\n")
        self.lines += [line.decode() for line in complete]


async def start_child(directory: Path, mode: str, arg: int, options: dict[str, object]) -> Child:
    env = {**os.environ, "KITEQ_STORE_OPTIONS": json.dumps(options), "PYTHONPATH": str(ROOT)}
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.faults.file_store_child", str(directory), mode, str(arg)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    return Child(process)


def state_of(entity: MessageEntity | None) -> State:
    if entity is None:
        return None
    if entity.dead:
        return ("dead", entity.dead_reason)
    return ("committed",) if entity.commit else ("uncommitted",)


def allowed_states(lines: list[str]) -> dict[str, set[State]]:
    """Every state each id may be in after the kill, from the child's intents and acks."""
    allowed: dict[str, set[State]] = {}
    pending: dict[str, State] = {}
    for line in lines:
        kind, op, message_id, *args = line.split()
        if kind == "intent":
            after = (("committed",) if args[0] == "True" else ("uncommitted",)) if op == "save" else AFTER[op]
            pending[message_id] = after
            allowed.setdefault(message_id, {None}).add(after)  # in flight: done or not
            continue
        assert args == ["1"], f"{line}: the child's calls are all valid"
        if op in LAZY:
            allowed[message_id].add(pending[message_id])
        else:
            allowed[message_id] = {pending[message_id]}
    return allowed


async def check(directory: Path, allowed: dict[str, set[State]]) -> None:
    async with FileStore.from_uri(f"file://{directory}") as store:
        for message_id, states in allowed.items():
            found = state_of(await store.get(message_id))
            assert found in states, f"{message_id} is {found}, expected one of {states}"


async def test_nothing_acknowledged_is_lost_across_sigkills(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    rng = random.Random(7)
    lines: list[str] = []
    for round_ in range(1, 7):
        child = await start_child(directory, "chaos", round_, CHAOS_OPTIONS)
        await child.read_until("ready")
        await child.read_for(rng.uniform(0.3, 1.5))
        await child.kill()
        lines += [line for line in child.lines if line.startswith(("intent", "acked"))]
        await check(directory, allowed_states(lines))
        assert not layout.list_files(directory).temporary, (
            "a segment zero-filled ahead is deleted at the next start"
        )
    assert sum(line.startswith("acked save") for line in lines) > 500, (
        "the children did too little to prove much"
    )


# -- damage a crash or a disk leaves behind --------------------------------------------------


async def crashed_fill(directory: Path, count: int) -> list[str]:
    """Save `count` messages in a child, SIGKILL it once all are acknowledged; their ids."""
    child = await start_child(directory, "fill", count, FILL_OPTIONS)
    await child.read_until("done")
    await child.kill()
    return [line.split()[1] for line in child.lines if line.startswith("saved")]


async def crashed_last_segment(directory: Path) -> tuple[list[str], Path, list[int]]:
    """`crashed_fill` of 40: their ids, the last segment and the offsets of its records."""
    ids = await crashed_fill(directory, 40)
    last = files(directory, "seg")[-1]
    return ids, last, record_offsets(last)


def files(directory: Path, kind: str) -> list[Path]:
    return sorted(directory.glob(f"*.{kind}"))


def record_offsets(path: Path) -> list[int]:
    return [offset for offset, *_ in Scan(path.read_bytes(), layout.HEAD_SIZE)]


def damage(path: Path, offset: int, replacement: bytes | None = None) -> None:
    """Put `replacement` over `path` at `offset`, or flip the byte there."""
    data = bytearray(path.read_bytes())
    if replacement is None:
        data[offset] ^= 0xFF
    else:
        data[offset : offset + len(replacement)] = replacement
    path.write_bytes(bytes(data))


async def present(directory: Path, ids: list[str], **options: object) -> tuple[list[str], dict[str, object]]:
    """The ids the reopened store still has, and its stats details."""
    async with FileStore.from_uri(f"file://{directory}", **options) as store:
        found = [message_id for message_id in ids if await store.get(message_id) is not None]
        return found, (await store.stats()).details


async def test_a_torn_tail_of_the_last_segment_is_truncated(tmp_path: Path) -> None:
    ids, last, offsets = await crashed_last_segment(tmp_path)
    cut = offsets[-1]
    os.truncate(last, cut + HEADER_SIZE + 100)
    found, details = await present(tmp_path, ids)
    assert found == ids[:-1]
    assert details["torn_tails_truncated"] == [f"{last.name}@{cut}"]
    assert last.stat().st_size >= cut, "writes went on from the cut"


@pytest.mark.parametrize("junk", [b"\0" * 5000, os.urandom(700)])
async def test_junk_after_the_last_record_is_truncated(tmp_path: Path, junk: bytes) -> None:
    ids = await crashed_fill(tmp_path, 20)
    last = files(tmp_path, "seg")[-1]
    size = last.stat().st_size
    with last.open("ab") as f:
        f.write(junk)
    found, details = await present(tmp_path, ids)
    assert found == ids
    assert details["torn_tails_truncated"] == [f"{last.name}@{size}"]


async def test_a_torn_tail_of_the_log_loses_only_the_last_op(tmp_path: Path) -> None:
    ids = await crashed_fill(tmp_path, 12)  # ids 0, 3, 6, 9 were saved uncommitted, then committed
    [log_file] = files(tmp_path, "log")
    os.truncate(log_file, log_file.stat().st_size - 3)
    async with FileStore.from_uri(f"file://{tmp_path}") as store:
        committed = [(await store.get(message_id)).commit for message_id in ids]  # type: ignore[union-attr]
    assert [i for i, flag in enumerate(committed) if not flag] == [9]


async def test_damage_mid_segment_refuses_to_start_and_repair_keeps_every_readable_record(
    tmp_path: Path,
) -> None:
    ids, last, offsets = await crashed_last_segment(tmp_path)
    damaged = offsets[len(offsets) // 2]
    damage(last, damaged + HEADER_SIZE + 500)
    with pytest.raises(StoreCorrupted, match=rf"{last.name}: damaged at offset {damaged}: CRC mismatch"):
        await FileStore.from_uri(f"file://{tmp_path}").start()
    lost = ids[len(ids) - len(offsets) + len(offsets) // 2]
    found, details = await present(tmp_path, ids, repair=True)
    assert found == [message_id for message_id in ids if message_id != lost]
    assert details["damage_skipped"] == [f"{last.name}@{damaged}"]
    found, _ = await present(tmp_path, ids)
    assert len(found) == len(ids) - 1, "after a repair the store starts without it"


async def test_a_sealed_segment_with_a_cut_tail_is_damage_not_a_torn_write(tmp_path: Path) -> None:
    await crashed_fill(tmp_path, 40)
    first = files(tmp_path, "seg")[0]
    os.truncate(first, first.stat().st_size - 10)
    with pytest.raises(StoreCorrupted, match=f"{first.name}: damaged at offset .*end of a sealed file"):
        await FileStore.from_uri(f"file://{tmp_path}").start()


async def test_a_last_segment_torn_while_being_created_is_not_damage(tmp_path: Path) -> None:
    """SIGKILL between creating the next segment file and writing its header leaves it empty."""
    ids = await crashed_fill(tmp_path, 40)
    last = files(tmp_path, "seg")[-1]
    torn = last.with_name(last.name.replace(last.stem, f"{int(last.stem) + 1:0{len(last.stem)}d}"))
    torn.write_bytes(b"")
    found, details = await present(tmp_path, ids)
    assert found == ids
    assert details["torn_tails_truncated"] == [f"{torn.name}@0"]


# -- a last segment zero-filled ahead (stores/file/preallocation.py) ---------------------------


def zero_fill(path: Path, size: int) -> int:
    """Make the last segment `path` what a crash leaves of one zero-filled ahead: its header
    of that format, and zeros after its records up to `size`. Where its records end."""
    data = path.read_bytes()
    head = layout.file_head(layout.SEGMENT, int(path.stem), layout.ZERO_FILLED_VERSION)
    path.write_bytes(head + data[len(head) :] + bytes(size - len(data)))
    return len(data)


async def test_the_unused_zeros_of_a_zero_filled_last_segment_are_cut_off_not_torn(tmp_path: Path) -> None:
    ids, last, _ = await crashed_last_segment(tmp_path)
    end = zero_fill(last, 64 << 10)
    found, details = await present(tmp_path, ids)
    assert found == ids
    assert details["torn_tails_truncated"] == []
    assert last.stat().st_size == end


async def test_a_write_torn_in_zero_filled_space_is_cut_off_though_good_records_follow(
    tmp_path: Path,
) -> None:
    """The disk may keep a torn write's sectors in any order: a hole, then its last record."""
    ids, last, offsets = await crashed_last_segment(tmp_path)
    zero_fill(last, 64 << 10)
    damage(last, offsets[-2] + HEADER_SIZE + 10, bytes(512))
    found, details = await present(tmp_path, ids)
    assert found == ids[:-2]
    assert details["torn_tails_truncated"] == [f"{last.name}@{offsets[-2]}"]
    assert last.stat().st_size == offsets[-2]


async def test_damage_before_the_last_write_of_a_zero_filled_segment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, last, offsets = await crashed_last_segment(tmp_path)
    end = zero_fill(last, 64 << 10)
    monkeypatch.setattr(preallocation, "WRITE_SPAN", end - offsets[-3])  # the last three records
    damage(last, offsets[-4] + HEADER_SIZE + 10)
    with pytest.raises(StoreCorrupted, match=rf"{last.name}: damaged at offset {offsets[-4]}: CRC mismatch"):
        await FileStore.from_uri(f"file://{tmp_path}").start()
    found, details = await present(tmp_path, ids, repair=True)
    assert found == [message_id for i, message_id in enumerate(ids) if i != len(ids) - 4]
    assert details["damage_skipped"] == [f"{last.name}@{offsets[-4]}"]


@pytest.mark.parametrize("zero_filled", [False, True])
async def test_acknowledged_data_missing_before_the_snapshots_mark_is_refused(
    tmp_path: Path, zero_filled: bool
) -> None:
    """A snapshot vouches for the data up to its mark: a last segment whose records end
    before it (cut short, or zeros where records were) lost acknowledged messages."""
    async with FileStore.from_uri(f"file://{tmp_path}", **FILL_OPTIONS) as store:
        for _ in range(5):
            await store.save(MessageEntity(os.urandom(16).hex(), "trade", "pay", "order-svc", b"b" * 1000))
    last = files(tmp_path, "seg")[-1]
    offsets = record_offsets(last)
    if zero_filled:
        zero_fill(last, 64 << 10)
        damage(last, offsets[-1], bytes(last.stat().st_size - offsets[-1]))
    else:
        os.truncate(last, offsets[-1])
    with pytest.raises(
        StoreCorrupted, match=rf"{last.name}: damaged at offset {offsets[-1]}: its data ends before"
    ):
        await FileStore.from_uri(f"file://{tmp_path}").start()
