"""The pilot's run folders: one private folder per running pilot for its tasks' TMPDIRs and
its agents' logs, and the removal of those that killed pilots of the same user left behind.

It never removes a folder of a pilot that still runs, nor one owned by another user.
"""

import os
from pathlib import Path
from typing import Optional

__all__ = ["make_run_dir", "remove_dead_run_dirs", "remove_tree", "temporary_base"]

_RUN_DIR_PREFIX = "psij-pilot-"


def temporary_base() -> Path:
    """Where run folders go by default: ``$TMPDIR`` if it is a folder, else ``/tmp``, else
    what :func:`tempfile.gettempdir` finds (loaded only then)."""
    for candidate in (os.environ.get("TMPDIR"), "/tmp"):
        if candidate and os.path.isdir(candidate):
            return Path(candidate)
    import tempfile

    return Path(tempfile.gettempdir())


def make_run_dir(base: Path) -> Path:
    """A new private folder ``psij-pilot-<pid>-<random>`` under ``base`` for this run."""
    while True:
        path = base / f"{_RUN_DIR_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def _run_dir_pid(name: str) -> Optional[int]:
    """The pid in a run folder's name, or None if it is not a run folder's name."""
    if not name.startswith(_RUN_DIR_PREFIX):
        return None
    pid, dash, _ = name[len(_RUN_DIR_PREFIX):].partition("-")
    return int(pid) if dash and pid.isdigit() and pid.isascii() else None


def remove_dead_run_dirs(base: Path) -> None:
    """Remove the run folders (TMPDIRs, agent logs) that killed pilots of this user left."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    uid = os.getuid()
    for entry in entries:
        pid = _run_dir_pid(entry.name)
        if pid is None:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid or not entry.is_dir():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            remove_tree(Path(entry.path))
        except OSError:
            continue


def remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
