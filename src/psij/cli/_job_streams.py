"""The standard streams ``psij run`` gives its job when no ``--stdin/--stdout/--stderr`` names
a file: this command's own.

A stream is given as a path naming this process's descriptor (``/proc/<pid>/fd/N``). The
``local`` executor starting the job directly gives it that descriptor itself (see
``psij.executors._process.open_streams``), so the job writes where this command would: after
what ``make``, a logging script or ``nohup`` already wrote, in append mode if the file is in it.
Any other executor (or ``local`` through a launcher script) would open that path and truncate
such a file; there the job writes into a private file of the executor's work directory instead,
and :class:`OutputCopies` copies it to this command's stream once the job has ended.

Nothing here submits a job or reads the job's status, and it imports no other module of
:mod:`psij.cli`.
"""

import fcntl
import os
import stat
from pathlib import Path
from typing import Dict, Optional, Union

__all__ = ["OutputCopies", "StreamRefused", "inherited_stream_path", "own_stream_path",
           "same_open_file"]

_STREAM_NAMES = {0: "input", 1: "output", 2: "error"}
_STREAM_OPTIONS = {0: "--stdin", 1: "--stdout", 2: "--stderr"}
_CHUNK = 1 << 20


class StreamRefused(Exception):
    """A standard stream the job cannot be given; the message says what to use instead."""


def own_stream_path(fd: int) -> str:
    """A path that opens this process's descriptor ``fd`` from any process of this user.

    ``/dev/stdout`` names the *opener's* descriptor, which is wrong when the executor opens the
    path in a launcher script whose own output is captured; ``/proc/<pid>/fd/<n>`` names ours
    for as long as this process lives, and it waits for the job.
    """
    own = f"/proc/{os.getpid()}/fd/{fd}"
    return own if os.path.exists(own) else f"/dev/fd/{fd}"


def _would_lose_content(fd: int, st: os.stat_result) -> bool:
    """A regular file in append mode or already written to: opening it again truncates it."""
    if not stat.S_ISREG(st.st_mode):
        return False
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND) or \
        os.lseek(fd, 0, os.SEEK_CUR) > 0


def inherited_stream_path(fd: int, copies: Optional["OutputCopies"]) -> str:
    """The path through which the job gets this process's stdin (0), stdout (1) or stderr (2).

    ``copies`` is None when the executor gives the job our descriptor itself; otherwise an
    output file that opening would truncate gets a private copy file from it instead. Raises
    StreamRefused for a stream no job can be given.
    """
    name, option = _STREAM_NAMES[fd], _STREAM_OPTIONS[fd]
    try:
        st = os.fstat(fd)
    except OSError:  # closed: the job gets nothing, as this process has nothing
        return os.devnull
    if stat.S_ISSOCK(st.st_mode):
        raise StreamRefused(f"standard {name} is a socket, which a job cannot open by path; "
                            f"use {option} FILE" +
                            (" or a pipe (psij run ... | cat)" if fd else ""))
    if fd == 0 and os.isatty(fd):
        # The job runs in its own process group: reading the terminal would stop it (SIGTTIN).
        return os.devnull
    if fd > 0 and copies is not None and _would_lose_content(fd, st):
        return copies.path_for(fd)
    return own_stream_path(fd)


def same_open_file(fd_a: int, fd_b: int) -> bool:
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class OutputCopies:
    """Private files (folder 0700, files 0600, in ``work_directory``) that a job writes its
    output to, copied to this process's descriptors by :meth:`copy_back`."""

    def __init__(self, work_directory: Union[str, Path]) -> None:
        self._work = Path(work_directory)
        self._dir: Optional[Path] = None
        self._files: Dict[int, Path] = {}

    def path_for(self, fd: int) -> str:
        if self._dir is None:
            import tempfile  # loaded only when needed: `psij pilot run` keeps its start light

            from psij._private_dirs import ensure_private_dir

            ensure_private_dir(self._work, "work directory")
            self._dir = Path(tempfile.mkdtemp(prefix="psij-run-", dir=self._work))
        path = self._dir / f"fd{fd}"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._files[fd] = path
        return str(path)

    def copy_back(self) -> None:
        """Write each copy file to its descriptor (at that descriptor's place: after what it
        holds), then remove the files. A descriptor that fails stops only its own copy."""
        try:
            for fd, path in self._files.items():
                try:
                    with open(path, "rb") as f:
                        while True:
                            data = f.read(_CHUNK)
                            if not data:
                                break
                            _write_all(fd, data)
                except OSError:
                    pass  # this stream's reader or file is gone: nothing more can be done
        finally:
            self.remove()

    def remove(self) -> None:
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._files.clear()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
