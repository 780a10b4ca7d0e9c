"""Waiting for many processes with one thread, without polling each of them.

One ``ProcessWatch`` thread per Python process serves every local executor. On Linux each watched
process is a pidfd in one epoll set, so an exit wakes the thread at once and the cost of a wake-up
does not grow with the number of running processes. Elsewhere it falls back to checking its own
children a few times a second.

The watch also keeps deadlines (the KILL that follows a cancel's TERM). What to do when a process
ends is not its business: it hands ``(entry, wait status)`` to the callback given at registration,
which must be quick (the executor queues the real work on its own worker).

It must not run user code, open job files or set job states.
"""

import heapq
import os
import selectors
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from psij._lazylog import LazyLogger

logger = LazyLogger(__name__)

ExitHandler = Callable[[int, Optional[int]], None]
"""Called with (pid, raw wait status or None when the process was not our child)."""

_HAS_PIDFD = hasattr(os, "pidfd_open")


class _Watched:
    __slots__ = ("child", "fd", "on_exit", "pid")

    def __init__(self, pid: int, fd: Optional[int], child: bool, on_exit: ExitHandler) -> None:
        self.pid = pid
        self.fd = fd
        self.child = child
        self.on_exit = on_exit


class ProcessWatch:
    """Calls a handler when a watched process ends; sends deadline signals to process groups."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: Dict[int, _Watched] = {}  # our children, reaped here
        self._others: Dict[int, _Watched] = {}  # other processes: watched, never reaped
        # (monotonic time, sequence number, action); actions run on the watch thread.
        self._deadlines: List[Tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._thread: Optional[threading.Thread] = None
        self._sel: Optional[selectors.BaseSelector] = None
        self._wake_r, self._wake_w = -1, -1

    def _start(self) -> None:
        # Called with the lock held.
        if self._thread is not None:
            return
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="psij-process-watch", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is already pending

    def watch(self, pid: int, on_exit: ExitHandler, child: bool = True) -> bool:
        """Start watching ``pid``; False if it is already gone (and is not our child)."""
        fd: Optional[int] = None
        if _HAS_PIDFD:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                if not child:
                    return False
                # Our child already exited and is a zombie only if not reaped; pidfd_open
                # succeeds on zombies, so this means someone else reaped it.
                on_exit(pid, None)
                return True
        w = _Watched(pid, fd, child, on_exit)
        with self._lock:
            self._start()
            if child:
                self._children[pid] = w
            else:
                self._others[id(w)] = w
            assert self._sel is not None
            if fd is not None:
                self._sel.register(fd, selectors.EVENT_READ, w)
        if fd is None:
            self._wake()
        return True

    def call_later(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` on the watch thread after ``delay`` seconds (it must be quick)."""
        when = time.monotonic() + timer_delay(delay)
        with self._lock:
            self._start()
            self._seq += 1
            heapq.heappush(self._deadlines, (when, self._seq, action))
        self._wake()

    def signal_later(self, pgid: int, signum: int, delay: float) -> None:
        """Send ``signum`` to process group ``pgid`` after ``delay`` s: through its leader if
        that still runs, else to what is left of the group (see :func:`signal_reaped_group`)."""
        def send() -> None:
            with self._lock:  # so that the leader is not reaped between the two tests
                if self._is_child(pgid):
                    self._signal_child(pgid, signum)
                else:
                    signal_reaped_group(pgid, signum)

        self.call_later(delay, send)

    def signal_group(self, pid: int, signum: int) -> bool:
        """Signal the process group led by ``pid`` if that process is still watched (not reaped).

        Holding the lock while signalling guarantees the id was not reused: a watched child is
        reaped only by this class, under this lock.
        """
        with self._lock:
            return self._signal_child(pid, signum)

    def _signal_child(self, pid: int, signum: int) -> bool:
        # Called with the lock held.
        return self._is_child(pid) and killpg(pid, signum)

    def _is_child(self, pid: int) -> bool:
        # Called with the lock held.
        return pid in self._children

    def _run(self) -> None:
        # Nothing may end this loop: every local job of the process depends on it.
        while True:
            try:
                self._turn()
            except Exception:
                logger.exception("the process watch hit an unexpected error; going on")
                time.sleep(0.01)  # never spin if the error repeats

    def _turn(self) -> None:
        assert self._sel is not None
        timeout = self._next_timeout()
        try:
            events = self._sel.select(timeout)
        except InterruptedError:
            return
        now = time.monotonic()
        self._fire_deadlines(now)
        for key, _ in events:
            w = key.data
            if w is None:
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            self._finish(w)
        if not _HAS_PIDFD:
            self._poll_children()

    def _next_timeout(self) -> Optional[float]:
        with self._lock:
            t: Optional[float] = None
            if self._deadlines:
                t = timer_delay(self._deadlines[0][0] - time.monotonic())
            if not _HAS_PIDFD and (self._children or self._others):
                t = 0.05 if t is None else min(t, 0.05)
            return t

    def _fire_deadlines(self, now: float) -> None:
        while True:
            with self._lock:
                if not self._deadlines or self._deadlines[0][0] > now:
                    return
                _, _, action = heapq.heappop(self._deadlines)
            try:
                action()
            except Exception:
                logger.exception("timed action raised")

    def _finish(self, w: _Watched) -> None:
        status: Optional[int] = None
        with self._lock:
            table = self._children if w.child else self._others
            key = w.pid if w.child else id(w)
            if table.get(key) is not w:
                return
            if w.child:
                try:
                    reaped, status = os.waitpid(w.pid, os.WNOHANG)
                    if reaped == 0:
                        return  # still running (spurious wake-up or fallback poll)
                except ChildProcessError:
                    status = None
            del table[key]
            if w.fd is not None:
                assert self._sel is not None
                self._sel.unregister(w.fd)
                os.close(w.fd)
        try:
            w.on_exit(w.pid, status)
        except Exception:
            logger.exception("exit handler for process %d raised", w.pid)

    def _poll_children(self) -> None:
        # Fallback without pidfds: _finish's WNOHANG wait tells whether a child has ended.
        with self._lock:
            watched = list(self._children.values()) + list(self._others.values())
        for w in watched:
            if w.child or not _pid_alive(w.pid):
                self._finish(w)


_LONGEST_WAIT = 86400.0  # a timer further away wakes the loop once a day, harmlessly


def timer_delay(delay: float) -> float:
    """``delay`` made safe for a timer: NaN and negative give 0, more than a day gives a day
    (``select`` refuses timeouts beyond 2**31 ms, and a loop that raised would stop)."""
    if not delay >= 0.0:
        return 0.0
    return delay if delay < _LONGEST_WAIT else _LONGEST_WAIT


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


WATCH = ProcessWatch()
