"""`kiteq-admin store stats|dump|verify`: offline, read-only, refused while a broker has the store."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import trio

import kiteq.cli.admin as admin
from stores import MessageEntity
from stores.file import FileStore, layout
from stores.file.lock import DirectoryLock
from stores.file.records import HEADER_SIZE, Scan


def make_store(directory: Path) -> list[MessageEntity]:
    entities = [
        MessageEntity(
            f"{i:032x}", "trade" if i % 2 else "sms", "pay", "order-svc", f"body {i}".encode(), commit=i != 3
        )
        for i in range(6)
    ]

    async def fill() -> None:
        async with FileStore.from_uri(f"file://{directory}?segment_bytes=1024") as store:
            for entity in entities:
                await store.save(entity)
            await store.dead_letter(entities[4].message_id, "expired")
            await store.finish(entities[5].message_id)

    trio.run(fill)
    return entities[:5]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = admin.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "store", "stats", "--store", f"file://{tmp_path}", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["messages"], data["uncommitted"], data["dead"]) == (4, 1, 1)
    assert data["dead_by_reason"] == {"expired": 1} and data["backlog_by_topic"] == {"sms": 2, "trade": 1}
    assert data["details"]["read_only"] is True and data["details"]["disk_bytes"] > 0
    code, out, _ = run(capsys, "store", "stats", "--store", f"file://{tmp_path}")
    assert code == 0 and "messages (live)" in out and "dead: expired" in out


def test_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entities = make_store(tmp_path)
    code, out, _ = run(capsys, "--json", "store", "dump", "--store", f"file://{tmp_path}", "--bodies")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [line["message_id"] for line in lines] == [e.message_id for e in entities]
    assert [base64.b64decode(line["body_base64"]) for line in lines] == [e.body for e in entities]
    assert (lines[3]["commit"], lines[4]["dead"], lines[4]["dead_reason"]) == (False, True, "expired")
    code, out, _ = run(capsys, "store", "dump", "--store", f"file://{tmp_path}")
    assert code == 0 and out.splitlines()[0].startswith("MESSAGE_ID")
    assert "dead:expired" in out and "uncommitted" in out and "6 bytes" in out


def test_verify_reports_damage_by_file_and_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "store", "verify", "--store", f"file://{tmp_path}")
    assert code == 0 and out.rstrip().endswith("ok")
    first = sorted(tmp_path.glob("*.seg"))[0]
    data = bytearray(first.read_bytes())
    offset = next(iter(Scan(bytes(data), 21)))[0]
    data[offset + HEADER_SIZE + 2] ^= 0xFF
    first.write_bytes(bytes(data))
    code, out, _ = run(capsys, "--json", "store", "verify", "--store", f"file://{tmp_path}")
    report = json.loads(out)
    assert code == 1 and report["damaged"]
    [damaged] = [f for f in report["files"] if f["problems"]]
    assert damaged["name"] == first.name and damaged["problems"][0].startswith(
        f"offset {offset}: CRC mismatch"
    )


def test_a_torn_tail_is_only_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path)
    last = sorted(tmp_path.glob("*.seg"))[-1]
    with last.open("ab") as f:
        f.write(b"torn" * 25)
    code, out, _ = run(capsys, "store", "verify", "--store", f"file://{tmp_path}")
    assert code == 0 and "truncated at the next start" in out


def test_unused_zero_filled_space_is_no_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a crash leaves of segments zero-filled ahead: the last one's unused zeros, the next one."""
    make_store(tmp_path)
    last = sorted(tmp_path.glob("*.seg"))[-1]
    data = last.read_bytes()
    number = int(last.stem)
    last.write_bytes(
        layout.file_head(layout.SEGMENT, number, layout.ZERO_FILLED_VERSION)
        + data[layout.HEAD_SIZE :]
        + bytes(4096)
    )
    following = layout.temporary_of(layout.path_of(tmp_path, layout.SEGMENT, number + 1))
    following.write_bytes(
        layout.file_head(layout.SEGMENT, number + 1, layout.ZERO_FILLED_VERSION) + bytes(4096)
    )
    code, out, _ = run(capsys, "--json", "store", "verify", "--store", f"file://{tmp_path}")
    report = json.loads(out)
    assert code == 0 and not report["damaged"] and report["messages"] == 5
    files = {f["name"]: f for f in report["files"]}
    assert files[last.name]["torn_tail"] == "" and files[last.name]["problems"] == []
    assert files[following.name]["problems"] == ["a segment zero-filled ahead, unused"]


@pytest.mark.parametrize("command", ["stats", "dump", "verify"])
def test_refused_while_a_broker_holds_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    make_store(tmp_path)
    lock = DirectoryLock(tmp_path)
    lock.acquire()
    try:
        code, out, err = run(capsys, "store", command, "--store", f"file://{tmp_path}")
    finally:
        lock.release()
    assert code == 2 and out == ""
    assert err.startswith(f"error: the store {tmp_path} is in use by another process")


def test_other_uris_and_missing_stores_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "store", "stats", "--store", "memory://")
    assert code == 2 and "file stores only" in err
    code, _, err = run(capsys, "store", "dump", "--store", f"file://{tmp_path}/nothing")
    assert code == 2 and "there is no store at" in err
    assert not (tmp_path / "nothing").exists()
