"""kiteq-server's allocator setting: glibc's mmap threshold fixed, the operator's kept.

Each case runs in a fresh interpreter, whose threshold nothing has moved yet: it frees an
8 MiB block (which raises a moving threshold to 8 MiB), then allocates 2 MiB and 512 KiB
and reports how much of each glibc mapped on its own (`mallinfo2().hblkhd`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiteq.malloc_tuning import MMAP_THRESHOLD, OPERATOR_SETTING

PROBE = """
import ctypes, json, sys
from kiteq.malloc_tuning import fix_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2

def mapped_by(size):
    before = libc.mallinfo2().hblkhd
    block = bytearray(size)
    return libc.mallinfo2().hblkhd - before

applied = fix_mmap_threshold() if sys.argv[1] == "fix" else None
freed = bytearray(8 << 20)
del freed
print(json.dumps({"applied": applied, "2MiB": mapped_by(2 << 20), "512KiB": mapped_by(512 << 10)}))
"""

pytestmark = pytest.mark.skipif(
    not hasattr(os, "confstr") or "CS_GNU_LIBC_VERSION" not in os.confstr_names,
    reason="glibc's allocator only",
)
ROOT = Path(__file__).resolve().parents[2]


def _probe(mode: str, **env: str) -> dict[str, Any]:
    environ = {key: value for key, value in os.environ.items() if key != OPERATOR_SETTING} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=environ, cwd=ROOT
    )
    return dict(json.loads(done.stdout))


def test_left_alone_the_threshold_follows_a_freed_block_into_the_heap() -> None:
    assert _probe("leave") == {"applied": None, "2MiB": 0, "512KiB": 0}


def test_fixed_the_blocks_above_it_are_mapped_and_those_below_stay_in_the_heap() -> None:
    assert 512 << 10 < MMAP_THRESHOLD < 2 << 20, "the probe's two sizes straddle the threshold"
    probe = _probe("fix")
    assert probe["applied"] is True
    assert probe["2MiB"] >= 2 << 20
    assert probe["512KiB"] == 0


def test_the_operators_own_setting_is_kept() -> None:
    probe = _probe("fix", **{OPERATOR_SETTING: str(16 << 20)})
    assert probe == {"applied": False, "2MiB": 0, "512KiB": 0}
