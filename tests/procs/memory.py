"""A process's memory, read from /proc; imports nothing heavy, so a measured child can use it."""

from __future__ import annotations

from pathlib import Path


def memory_of(pid: int | str) -> tuple[int, int]:
    """(resident, peak resident) bytes of a process. The peak is VmHWM, which belongs to
    the exec-ed address space (ru_maxrss would count the forking benchmark process's)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
