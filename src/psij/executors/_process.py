"""The one process layer of the executors that start programs on this machine.

Used by the local executor and by the pilot's tasks (``pilot/_task_process.py``), so that a
program is started, reaped, described and ended the same way by both:

- :class:`Spawner` starts a program as the leader of a new process group, with its directory,
  environment and standard streams, and maps a failure to start to a :class:`LaunchError` with
  the shell's exit code (127 not found, 126 not executable), both through :mod:`psij._spawn`,
  the package's one way to start a process; :func:`open_streams` opens the redirections it is
  given;
- :func:`reap` collects one exited child without blocking, :func:`reap_within` waits a
  little for a few to end, and :func:`reap_later` leaves those that take longer (told to end
  already) to a thread that reaps them when they do, so that none stays a zombie;
  :func:`start_time` tells a process from a later one given the same
  pid;
- :func:`exit_code_of` and :func:`exit_message` turn a wait status into a shell-style code and
  that code into words, :func:`failure_message` adds the end of the program's stderr, read by
  :func:`stderr_excerpt` and worded by :func:`stderr_part` (the batch executors use those two
  as well, so every executor quotes stderr alike);
- :func:`terminate_group` sends TERM to a whole process group now and KILL after a grace
  period, on the timers of the exit watch that reaps the group's leader (so on its clock).

It does not decide what runs or when, starts nothing itself (``psij._spawn`` does), does not
watch processes (``_process_watch`` does) and never sets a job's state.
"""

import os
import signal
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Tuple

from psij import _spawn
from psij._clock import MonotonicClock
from psij._pids import start_time
from psij._spawn import (
    MAX_ARG_STRING,
    NOT_TEXT,
    LaunchError,
    fits_exec,
    start_error_words,
)

__all__ = [
    "MAX_ARG_STRING",
    "NOT_TEXT",
    "SIGKILL",
    "SIGTERM",
    "LaunchError",
    "Spawner",
    "StreamError",
    "exit_code_of",
    "exit_message",
    "failure_message",
    "fits_exec",
    "group_has_live_members",
    "killpg",
    "open_streams",
    "reap",
    "reap_later",
    "reap_within",
    "signal_name",
    "signal_reaped_group",
    "start_error_words",
    "start_time",
    "stderr_excerpt",
    "stderr_part",
    "terminate_group",
]

SIGTERM = 15
SIGKILL = 9
WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
READ = os.O_RDONLY | os.O_CLOEXEC
# A stderr excerpt: the last lines of at most the last bytes of the file.
_STDERR_EXCERPT_BYTES = 4096
_STDERR_EXCERPT_LINES = 10


# -- starting -----------------------------------------------------------------------------------


class StreamError(Exception):
    """A redirection could not be opened: ``which`` is ``stdin``, ``stdout`` or ``stderr``,
    ``path`` the path as given and ``reason`` why, in words."""

    def __init__(self, which: str, path: str, reason: str) -> None:
        super().__init__(f"cannot open {which} {path!r}: {reason}")
        self.which = which
        self.path = path
        self.reason = reason


_OWN_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def own_descriptor(path: str) -> Optional[int]:
    """The descriptor of this process that ``path`` names (``/proc/self/fd/N``,
    ``/proc/<our pid>/fd/N``, ``/dev/fd/N``, ``/dev/stdout``, ...), or None."""
    if path in _OWN_STREAMS:
        return _OWN_STREAMS[path]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if path.startswith(prefix):
            number = path[len(prefix):]
            if number.isascii() and number.isdigit() and len(number) < 10:
                return int(number)
    return None


def open_streams(directory: str, stdin: Optional[str], stdout: Optional[str],
                 stderr: Optional[str], default: int, opened: List[int]) -> Tuple[int, int, int]:
    """Descriptors for a program's standard streams: each path (relative ones taken from
    ``directory``) opened close-on-exec, stdout and stderr truncated and created 0666 less the
    umask, ``default`` for a stream without a path, one descriptor when stdout and stderr are
    the same path. A path naming one of this process's own descriptors (``/dev/stdout``,
    ``/proc/self/fd/1``) gives the program that descriptor itself, not a new opening: the
    file is not truncated and the program writes where this process would (after what is
    there, in append mode if it is in it). What it opens is appended to ``opened`` (the caller
    closes them after the spawn, or on failure); raises :class:`StreamError`."""
    def open_one(path: str, flags: int, which: str) -> int:
        own = own_descriptor(path)
        try:
            fd = os.dup(own) if own is not None else os.open(os.path.join(directory, path),
                                                             flags, 0o666)
        except OSError as ex:
            raise StreamError(which, path, str(ex.strerror)) from ex
        except UnicodeEncodeError as ex:
            raise StreamError(which, path, NOT_TEXT) from ex
        opened.append(fd)
        return fd

    fd_in = fd_out = fd_err = default
    if stdin is not None:
        fd_in = open_one(stdin, READ, "stdin")
    if stdout is not None:
        fd_out = open_one(stdout, WRITE, "stdout")
    if stderr is not None:
        fd_err = fd_out if stderr == stdout else open_one(stderr, WRITE, "stderr")
    return fd_in, fd_out, fd_err


class Spawner:
    """Starts a program as the leader of a new process group, in its directory, with its
    environment and standard streams, and no other descriptor of this process (by
    :func:`psij._spawn.spawn`).

    ``os.posix_spawn`` costs markedly less than ``subprocess.Popen``, but it can neither change
    directory nor close descriptors that are not close-on-exec. So with ``posix_spawn=True`` it
    is used when the program runs in this process's own working directory and this process
    held no inheritable descriptor above 2 when the spawner was made (Python opens none; one
    could come from whoever started this process); ``Popen`` does everything else.
    """

    def __init__(self, posix_spawn: bool = True) -> None:
        self._posix = posix_spawn and _spawn.posix_spawn_is_safe()

    def spawn(self, argv: List[str], directory: str, env: Dict[str, str], stdin: int,
              stdout: int, stderr: int) -> int:
        """The new process's pid; raises LaunchError saying why it could not start (the
        ``OSError`` or ``UnicodeEncodeError`` that said so is its ``__cause__``)."""
        return _spawn.spawn(argv, directory, env, (stdin, stdout, stderr),
                            posix_spawn=self._posix)

    def on_path(self, name: str, env: Mapping[str, str]) -> str:
        """The first executable ``name`` on the program's own PATH, as Popen would find it."""
        return _spawn.on_path(name, env)


# -- reaping and describing an exit -------------------------------------------------------------


def reap(pid: int) -> Tuple[bool, Optional[int]]:
    """Collect our child ``pid`` if it has exited, without blocking: ``(True, wait status)``,
    ``(True, None)`` when someone else reaped it (its status is lost), ``(False, None)`` while
    it runs."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True, None
    if reaped == 0:
        return False, None
    return True, status


def reap_use(pid: int) -> Tuple[bool, Optional[int], Optional[Tuple[float, int]]]:
    """:func:`reap`, with the resource use of the process reaped: (CPU seconds, user and
    system, of it and the descendants it waited for; its peak resident memory in bytes), or
    None when it was not reaped here."""
    try:
        reaped, status, use = os.wait4(pid, os.WNOHANG)
    except ChildProcessError:
        return True, None, None
    if reaped == 0:
        return False, None, None
    return True, status, (use.ru_utime + use.ru_stime, use.ru_maxrss * _RSS_UNIT)


_RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in KiB but on macOS


def reap_within(pids: Iterable[int], seconds: float, interval: float) -> List[int]:
    """Reap our children ``pids``, looking every ``interval`` seconds, for ``seconds`` at most
    in all (their wait statuses are dropped); those still running then. Measured on the
    monotonic clock whatever clock the caller's rules use: real processes end in real time."""
    clock = MonotonicClock()
    deadline = clock.now() + seconds
    return [pid for pid in pids
            if not clock.poll(partial(_reaped, pid), deadline - clock.now(), interval)]


def reap_later(pids: List[int], then: Optional[Callable[[], object]] = None) -> None:
    """Reap our children ``pids``, told to end already (slow to start on a loaded machine,
    say), on a thread that waits for them, calls ``then`` and ends; with no pid, ``then`` is
    called now. A process that never ends keeps that thread."""
    if not pids:
        if then is not None:
            then()
        return
    threading.Thread(target=_reap_all, args=(pids, then), name="psij-reaper",
                     daemon=True).start()


def _reap_all(pids: List[int], then: Optional[Callable[[], object]]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped by someone else
    if then is not None:
        then()


def _reaped(pid: int) -> bool:
    return reap(pid)[0]


def exit_code_of(status: Optional[int]) -> Optional[int]:
    """Shell-style exit code from a raw wait status: the code, or 128 + signal number."""
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") \
        else os.WEXITSTATUS(status)


def signal_name(code: Optional[int]) -> Optional[str]:
    """``SIGTERM`` for exit code 143, and so on; None when the code is not a signal's."""
    if code is None or code <= 128:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return None


def exit_message(code: Optional[int]) -> str:
    """A job's shell-style exit code in words: the signal that killed it, or the shell's
    meaning of 126 and 127."""
    sig = signal_name(code)
    if sig is not None:
        return f"the job was killed by {sig} (exit code {code})"
    if code == 127:
        return "the job exited with code 127 (command not found)"
    if code == 126:
        return "the job exited with code 126 (command not executable)"
    return f"the job exited with code {code}"


def stderr_excerpt(path: Path) -> Optional[str]:
    """The last lines (at most 10, from at most the last 4096 bytes) of a stderr file, undecodable
    bytes replaced; None when the file cannot be read or holds only white space."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - _STDERR_EXCERPT_BYTES))
            data = f.read(_STDERR_EXCERPT_BYTES)
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        return None
    return "\n".join(text.rstrip("\n").splitlines()[-_STDERR_EXCERPT_LINES:])


def stderr_part(excerpt: str) -> str:
    """How every executor's failure message quotes a :func:`stderr_excerpt`."""
    return f"last lines of the job's stderr:\n{excerpt}"


def failure_message(code: Optional[int], stderr_path: Optional[Path]) -> str:
    """:func:`exit_message`, followed by the end of the job's stderr file when it has one."""
    msg = exit_message(code)
    tail = None if stderr_path is None else stderr_excerpt(stderr_path)
    if tail is not None:
        msg += f"; {stderr_part(tail)}"
    return msg


# -- ending a process group ---------------------------------------------------------------------


class GroupWatch(Protocol):
    """What :func:`terminate_group` needs of an exit watch (``ProcessWatch``, ``LoopWatch``)."""

    def signal_group(self, pid: int, signum: int) -> bool: ...

    def signal_later(self, pgid: int, signum: int, delay: float) -> None: ...


def terminate_group(watch: GroupWatch, pgid: int, grace: float,
                    leftovers: bool = False) -> bool:
    """TERM to the process group led by ``pgid`` now and KILL ``grace`` seconds later (on the
    watch's timers). Only while ``watch`` has not reaped the leader, unless ``leftovers``: then
    what its group left behind after the leader was reaped is ended too. False when nothing
    was signalled."""
    if watch.signal_group(pgid, SIGTERM) or (leftovers and signal_reaped_group(pgid, SIGTERM)):
        watch.signal_later(pgid, SIGKILL, grace)
        return True
    return False


def signal_reaped_group(pgid: int, signum: int) -> bool:
    """Signal process group ``pgid`` whose leader we started and have reaped.

    The id of a process group cannot be given to a new process while the group has members,
    so if no process has the id ``pgid`` the group is still the one we started (or empty).
    If a process has it, the group is gone and the id reused: nothing is sent.
    """
    try:
        os.kill(pgid, 0)
        return False
    except ProcessLookupError:
        pass
    except OSError:
        return False
    return killpg(pgid, signum)


def killpg(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False if there is no such group (or it is
    not ours to signal)."""
    try:
        os.killpg(pgid, signum)
    except OSError:
        return False
    return True


def group_has_live_members(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie.

    One signal-0 settles the common case (no member at all); only a group that still has
    members (possibly zombies waiting for a parent that never reaps them) is looked up in
    ``/proc``. Where ``/proc`` does not exist, any member counts as live.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            return True
    return False


