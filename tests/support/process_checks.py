"""Looking at real processes from tests: which members of a process group still run.

A killed process whose parent does not collect it stays a zombie (PID 1 in a container may
never reap orphans), so a zombie counts as gone here.
"""

import os
from contextlib import contextmanager
from typing import Iterator, List


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


@contextmanager
def without_inheritable_descriptors() -> Iterator[None]:
    """This process without the inheritable descriptors above 2 that whoever started the
    tests may have left it (as posix_spawn needs); made inheritable again afterwards."""
    cleared = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                os.set_inheritable(fd, False)
                cleared.append(fd)
        except OSError:
            pass
    try:
        yield
    finally:
        for fd in cleared:
            try:
                os.set_inheritable(fd, True)
            except OSError:
                pass


def keepers_with(mark: str) -> List[int]:
    """The local jobs' keeper processes whose environment holds ``mark`` (``NAME=value``):
    those a test's children started (with their HOME, say)."""
    wanted = mark.encode() + b"\0"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_keeper.py" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if wanted in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found
