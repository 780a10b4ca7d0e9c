"""Telling processes apart by more than their pid: the kernel's start time of a process, which
differs between two processes that had the same pid one after the other."""

import sys
from typing import Optional

__all__ = ["start_time"]


def start_time(pid: int) -> Optional[str]:
    """The kernel's start time of a process (clock ticks since boot), to tell reused pids apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None if sys.platform.startswith("linux") else "None"
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None
