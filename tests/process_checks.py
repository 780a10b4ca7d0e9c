"""Looking at real processes from tests: which members of a process group still run.

A killed process whose parent does not collect it stays a zombie (PID 1 in a container may
never reap orphans), so a zombie counts as gone here.
"""

import os
from typing import List


def live_members(pgid: int) -> List[int]:
    """Processes of group ``pgid`` that are not zombies."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(pid))
    return alive


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def members_left_after(pgid: int, timeout: float) -> List[int]:
    """The live members of group ``pgid`` once it is empty or ``timeout`` seconds passed."""
    import time

    deadline = time.monotonic() + timeout
    while live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return live_members(pgid)
