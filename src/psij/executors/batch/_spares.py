"""Submit commands started ahead of need: spares.

A submit command such as ``sbatch`` spends much of its time before it reads its script: the
dynamic loader maps its libraries and binds their symbols, and it reads the scheduler's
configuration. When the script comes on standard input (``SCRIPT_ON_STDIN``) and the command
line is the same for every job, that part can run before the job is submitted. A *spare* is
the submit command started with the command line, environment and working directory that the
next submission will have, blocked reading its standard input. A submission takes a spare,
writes the script, closes the pipe and reads the answer as from a command started just then,
while one thread per runner starts the next spare.

A spare is used only when everything it took from this process when it started is still the
same: the environment (the one a command started then would inherit, which holds
``os.putenv``'s changes too: :mod:`psij.executors.batch._environ`; or the runner's own), the
working directory, the umask,
the nice value, the resource limits, the user and group ids, and the process itself (a child
made by ``fork`` never uses its parent's spares, and closes its copies of their pipes at once,
so that a spare sees the end of its script when the parent closes the pipe). Otherwise the
spare is killed and the command started afresh. A spare that is killed, or whose input ends
before a whole script was written, submits nothing: its script is empty or cut, and a submit
command refuses an empty script and submits only on the end of its input.

Spares exist only while jobs are submitted one after another: none before the second
submission (a program that submits one job needs none), and those left are killed ``IDLE_S``
seconds after the last submission, by :meth:`SpareCommands.close` (the executor's ``close``),
and when the interpreter exits. When spares are found unfit three times
in a row (a program that changes its environment between submissions), none are started for
``REST_S`` seconds.
"""

import logging
import os
import resource
import subprocess
import threading
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from psij._clock import Clock, MonotonicClock
from psij._spawn import popen
from psij.executors.batch._command import (
    CommandResult,
    InFlight,
    close_pipes,
    finish,
    keep_children,
    kill_group,
    script_bytes,
)
from psij.executors.batch._environ import inherited_bytes

__all__ = ["IDLE_S", "MAX_SPARES", "REST_S", "SpareCommands", "origin"]

logger = logging.getLogger(__name__)

IDLE_S = 10.0  # spares are killed this long after the last submission
REST_S = 60.0  # no spares for this long after they were found unfit three times in a row
MAX_SPARES = 16
_MISFITS_BEFORE_REST = 3

_LIMITS = tuple(getattr(resource, name) for name in (
    "RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK",
    "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_RSS", "RLIMIT_STACK") if hasattr(resource, name))

Origin = Tuple[Any, ...]


def _umask() -> Optional[bytes]:
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # not readable without changing it: spares are not used
    try:
        status = os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)
    start = status.find(b"\nUmask:")
    return status[start + 7:status.find(b"\n", start + 7)].strip() if start >= 0 else None


def _environment() -> Mapping[Any, Any]:
    """What a command started now would inherit (bytes, given to the spare as they are)."""
    return inherited_bytes()


def origin(env: Optional[Mapping[str, str]]) -> Optional[Origin]:
    """What a command started now takes from this process (its environment last), or None
    when some of it cannot be known."""
    umask = _umask()
    if umask is None:
        return None
    try:
        cwd = os.getcwd()
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        limits = tuple(resource.getrlimit(limit) for limit in _LIMITS)
    except OSError:  # the working directory is gone, ...
        return None
    ids = (os.getuid(), os.geteuid(), os.getgid(), os.getegid(), tuple(os.getgroups()))
    return (os.getpid(), cwd, umask, nice, limits, ids,
            _environment() if env is None else env)


class _Spare:
    __slots__ = ("argv", "origin", "proc")

    def __init__(self, proc: "subprocess.Popen[bytes]", argv: Tuple[str, ...],
                 origin: Origin) -> None:
        self.proc = proc
        self.argv = argv
        self.origin = origin


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    """Kill a spare that was given no script (so it submitted nothing) and reap it."""
    kill_group(proc)
    close_pipes(proc)
    proc.wait()


class SpareCommands:
    """Keeps up to ``count`` spares of the last command line asked for (see the module)."""

    def __init__(self, count: int, env: Optional[Mapping[str, str]] = None,
                 idle: float = IDLE_S, clock: Optional[Clock] = None) -> None:
        if isinstance(count, bool) or not isinstance(count, int) \
                or not 1 <= count <= MAX_SPARES:
            raise ValueError(f"SpareCommands.count: expected a whole number from 1 to "
                             f"{MAX_SPARES}, got {count!r}")
        self.count = count
        self._env: Optional[Dict[str, str]] = dict(env) if env is not None else None
        self._idle = idle
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._cond = threading.Condition()
        self._ready: Deque[_Spare] = deque()
        self._argv: Optional[Tuple[str, ...]] = None  # what spares are made of
        self._last_use = self._clock.now()
        self._misfits = 0
        self._rest_until = 0.0
        self._calls = 0
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._pid = os.getpid()
        keep_children(self)

    def run(self, argv: Tuple[str, ...], timeout: float, stdin: str,
            in_flight: Optional[InFlight] = None) -> Optional[CommandResult]:
        """Run ``argv`` with ``stdin`` by a spare (followed in ``in_flight`` while it runs, see
        :func:`~psij.executors.batch._command.finish`); None when none fits (then the caller
        starts the command itself; a spare of ``argv`` is on its way for the next time)."""
        if os.getpid() != self._pid:
            return None
        spare = self._take(argv)
        if spare is None:
            return None
        if spare.proc.poll() is not None or spare.origin != origin(self._env):
            self._misfit()
            _stop(spare.proc)
            return None
        with self._cond:
            self._misfits = 0
        return finish(spare.proc, argv, script_bytes(stdin), timeout, in_flight)

    def spare_pids(self) -> List[int]:
        """The process ids of the spares waiting now."""
        with self._cond:
            return [spare.proc.pid for spare in self._ready]

    def close(self) -> None:
        """Kill the waiting spares and end the thread that starts them."""
        with self._cond:
            self._closed = True
            stale = list(self._ready)
            self._ready.clear()
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if os.getpid() != self._pid:
            return  # a forked child: the spares are its parent's
        for spare in stale:
            _stop(spare.proc)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # ------------------------------------------------------------------------ internals

    def _take(self, argv: Tuple[str, ...]) -> Optional[_Spare]:
        with self._cond:
            if self._closed:
                return None
            stale: List[_Spare] = []
            if argv != self._argv:
                stale = list(self._ready)
                self._ready.clear()
                self._argv = argv
            spare = self._ready.popleft() if self._ready else None
            self._last_use = self._clock.now()
            self._calls += 1
            if self._calls < 2:
                return None  # a program that submits one job needs no spare
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="psij-submit-spares",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        for old in stale:
            _stop(old.proc)
        return spare

    def _misfit(self) -> None:
        with self._cond:
            self._misfits += 1
            if self._misfits >= _MISFITS_BEFORE_REST:
                self._misfits = 0
                self._rest_until = self._clock.now() + REST_S
                stale = list(self._ready)
                self._ready.clear()
            else:
                stale = []
        for spare in stale:
            _stop(spare.proc)

    def _next(self) -> Optional[Tuple[str, ...]]:
        """Wait until a spare is to be started (its command line) or the thread is to end
        (None; the spares left are then killed)."""
        with self._cond:
            while True:
                now = self._clock.now()
                if self._closed or now - self._last_use >= self._idle:
                    if self._thread is threading.current_thread():
                        self._thread = None
                    stale = list(self._ready)
                    self._ready.clear()
                    break
                if self._argv is not None and len(self._ready) < self.count \
                        and now >= self._rest_until:
                    return self._argv
                wake = self._last_use + self._idle
                if now < self._rest_until:
                    wake = min(wake, self._rest_until)
                self._clock.wait(self._cond, max(0.001, wake - now))
        for spare in stale:
            _stop(spare.proc)
        return None

    def _loop(self) -> None:
        while True:
            argv = self._next()
            if argv is None:
                return
            try:
                self._start(argv)
            except Exception:  # fails only this spare; submissions start their own commands
                logger.exception("starting a spare of %s failed", argv[0])
                with self._cond:
                    self._rest_until = self._clock.now() + REST_S

    def _start(self, argv: Tuple[str, ...]) -> None:
        taken = origin(self._env)
        proc = None
        if taken is not None:
            try:
                proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=taken[-1], cwd=taken[1])
            except OSError as e:
                logger.debug("no spare of %s: %s", argv[0], e)
        with self._cond:
            if taken is None or proc is None:
                self._rest_until = self._clock.now() + REST_S
                return
            if not self._closed and argv == self._argv and self._clock.now() >= self._rest_until:
                self._ready.append(_Spare(proc, argv, taken))
                return
        _stop(proc)

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copies of the spares' pipes, use none."""
        self._closed = True
        self._cond = threading.Condition()
        self._thread = None
        for spare in list(self._ready):
            close_pipes(spare.proc)
        self._ready = deque()
