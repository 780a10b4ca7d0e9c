"""Waiting for many processes with one thread, without polling each of them.

One ``ProcessWatch`` thread per Python process serves every local executor. On Linux each watched
process is a pidfd in one epoll set, so an exit wakes the thread at once and the cost of a wake-up
does not grow with the number of running processes. Elsewhere it falls back to checking its own
children a few times a second.

The watch also keeps deadlines (a time limit's end) on a ``Clock``, and sleeps on the wake-up
helper of ``psij._wakeup``. The KILL that follows a cancel's TERM is handed to a keeper of the
process (:meth:`ProcessWatch.terminate`; the caller says how to have one), which outlives the
process; the watch's timers send it only when no keeper can be had; reaping and signalling a
group are the process layer's (``psij.executors._process``). What to do when a process ends
is not its business: it hands ``(pid, wait status)`` to the callback given at registration,
which must be quick (the executor queues the real work on its own worker). It also reads the
keepers' answers to the starts they were sent (``local._keeper_client.Start``: a pid, or why
the job could not start), which come on the same pipe as the exits, before them: it follows
each job started from then on and calls the start's callback, then has the keeper sent what
was queued meanwhile. When a keeper dies, the jobs it was running are killed (no one would
see them end) and reported ended with no wait status. It imports nothing of the local
executor's package: what it needs of a keeper is handed to it.

It must not run user code, open job files or set job states.
"""

import os
import selectors
import threading
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from psij._clock import Clock, MonotonicClock, wall_time
from psij._lazylog import LazyLogger
from psij._wakeup import Timers, Wakeup, timer_delay
from psij.executors._process import (
    SIGKILL,
    SIGTERM,
    exit_code_of,
    group_has_live_members,
    killpg,
    reap_use,
    signal_name,
    signal_reaped_group,
    start_time,
)

if TYPE_CHECKING:  # the keeper's client (sockets, subprocess) loads only with a keeper
    from psij.executors.local._keeper_client import Failure, Keeper, Start

__all__ = [
    "WATCH",
    "ExitHandler",
    "ProcessWatch",
    "exit_code_of",
    "group_has_live_members",
    "killpg",
    "signal_name",
    "signal_reaped_group",
    "timer_delay",
]

logger = LazyLogger(__name__)
_SPIN_CLOCK = MonotonicClock()  # the pause after an error guards the CPU, not a rule: never manual

ExitHandler = Callable[[int, Optional[int]], None]
"""Called with (pid, raw wait status or None when the process was not our child)."""
if TYPE_CHECKING:  # only in annotations: "Keeper" in a subscript would be compiled on import
    KeeperSource = Callable[[], Optional[Keeper]]
    """Gives a keeper to send a later KILL (None when none can be had); the local
    executor's."""

_HAS_PIDFD = hasattr(os, "pidfd_open")


class _Watched:
    __slots__ = ("child", "fd", "keeper", "on_exit", "pid", "start")

    def __init__(self, pid: int, fd: Optional[int], child: bool, on_exit: ExitHandler,
                 keeper: "Optional[Keeper]" = None, start: str = "") -> None:
        self.pid = pid
        self.fd = fd
        self.child = child
        self.on_exit = on_exit
        self.keeper = keeper  # the keeper whose child it is, which reaps it and reports
        self.start = start  # its kernel start time, when the keeper said it


class _Feed:
    """The exit reports of one keeper, read on the watch thread."""

    __slots__ = ("buffer", "keeper")

    def __init__(self, keeper: "Keeper") -> None:
        self.keeper = keeper
        self.buffer = b""


class ProcessWatch:
    """Calls a handler when a watched process ends; sends deadline signals to process groups.

    Its timers run on ``clock`` (the monotonic clock by default); a test that moves a
    ``ManualClock`` calls :meth:`wake` so that the watch looks at its timers again.
    """

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self._lock = threading.Lock()
        self._children: Dict[int, _Watched] = {}  # our children, reaped here
        self._others: Dict[int, _Watched] = {}  # other processes: watched, never reaped
        self._early: Dict[int, Optional[int]] = {}  # kept jobs reported before watch_kept
        # The child whose exit handler runs: (when reaped, CPU seconds, max RSS bytes).
        self._usage: Dict[int, Tuple[float, float, int]] = {}
        self._timers = Timers(clock)  # actions run on the watch thread
        self._thread: Optional[threading.Thread] = None
        self._wakeup: Optional[Wakeup] = None

    def _start(self) -> None:
        # Called with the lock held.
        if self._thread is not None:
            return
        self._wakeup = Wakeup()
        self._thread = threading.Thread(target=self._run, name="psij-process-watch", daemon=True)
        self._thread.start()

    @property
    def clock(self) -> Clock:
        """The clock its timers run on."""
        return self._timers.clock

    def wake(self) -> None:
        """Have the watch thread look at its timers (and, without pidfds, its children) now."""
        wakeup = self._wakeup
        if wakeup is not None:
            wakeup.wake()

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
            assert self._wakeup is not None
            if fd is not None:
                self._wakeup.register(fd, selectors.EVENT_READ, w)
        if fd is None:
            self.wake()
        return True

    def add_feed(self, keeper: "Keeper") -> None:
        """Read ``keeper``'s exit reports (for :meth:`watch_kept`) from now on."""
        with self._lock:
            self._start()
            assert self._wakeup is not None
            self._wakeup.register(keeper.events, selectors.EVENT_READ, _Feed(keeper))

    def watch_kept(self, keeper: "Keeper", pid: int, on_exit: ExitHandler) -> None:
        """Follow ``pid``, a child of ``keeper``: ``on_exit`` gets the status it reports (None
        if the keeper died first). Its group is signalled through the keeper."""
        w = _Watched(pid, None, True, on_exit, keeper)
        with self._lock:
            self._start()
            if pid not in self._early:
                self._children[pid] = w
                return
            status = self._early.pop(pid)
        on_exit(pid, status)

    def call_later(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` on the watch thread after ``delay`` seconds (it must be quick)."""
        with self._lock:
            self._start()
        self._timers.call_later(delay, action)
        self.wake()

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

    def terminate(self, pgid: int, grace: float, canceled: bool = False,
                  keepers: "Optional[KeeperSource]" = None) -> bool:
        """TERM to the process group led by the watched child ``pgid`` now and KILL ``grace``
        seconds later (KILL at once when ``grace`` is 0); False when it was reaped already.
        A keeper's job gets both from its keeper, which outlives this process, so the KILL
        comes even if this process ends first; ``canceled`` has the keeper record its end as
        a cancel. A child of this process gets its TERM from here and its KILL from a keeper
        ``keepers`` gives too (:meth:`kill_later`)."""
        with self._lock:
            w = self._children.get(pgid)
            keeper = None if w is None else w.keeper
        if keeper is not None:
            return keeper.terminate(pgid, grace, canceled)
        if grace <= 0:
            return self.signal_group(pgid, SIGKILL)
        if not self.signal_group(pgid, SIGTERM):
            return False
        self.kill_later(pgid, grace, keepers=keepers)
        return True

    def kill_later(self, pgid: int, grace: float, leader: Optional[int] = None,
                   keepers: "Optional[KeeperSource]" = None) -> None:
        """KILL process group ``pgid`` (led by our watched child, or by ``leader``, a process
        of another) ``grace`` seconds from now, by the keeper ``keepers`` returns (the local
        executor's starts one if needed) so that it comes even if this process ends first;
        on the watch's timers when no keeper can be had (or without pidfds, by which the
        keeper would know the leader)."""
        fd: Optional[int] = None
        if _HAS_PIDFD and keepers is not None:
            with self._lock:  # a watched child's pidfd stays open while it is not reaped
                w = self._children.get(pgid)
                if w is not None and w.fd is not None:
                    fd = os.dup(w.fd)
            if fd is None and leader is not None:
                try:
                    fd = os.pidfd_open(leader)
                except OSError:
                    fd = None
        try:
            if keepers is not None and (
                    fd is not None or (leader is None and pgid not in self._children)):
                keeper = keepers()
                if keeper is not None and keeper.kill_later(pgid, grace, fd):
                    return
        finally:
            if fd is not None:
                os.close(fd)
        self.signal_later(pgid, SIGKILL, grace)

    def signal_group(self, pid: int, signum: int) -> bool:
        """Signal the process group led by ``pid`` if that process is still watched (not reaped).

        Holding the lock while signalling guarantees the id was not reused: a watched child is
        reaped only by this class, under this lock.
        """
        with self._lock:
            return self._signal_child(pid, signum)

    def _signal_child(self, pid: int, signum: int) -> bool:
        # Called with the lock held.
        w = self._children.get(pid)
        if w is not None and w.keeper is not None:
            return w.keeper.signal(pid, signum)  # the keeper knows if it reaped it
        return w is not None and killpg(pid, signum)

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
                _SPIN_CLOCK.sleep(0.01)  # never spin if the error repeats

    def _turn(self) -> None:
        assert self._wakeup is not None
        events = self._wakeup.select(self._next_timeout())
        for action in self._timers.pop_due():
            try:
                action()
            except Exception:
                logger.exception("timed action raised")
        for key, _ in events:
            if isinstance(key.data, _Feed):
                self._read_feed(key.data)
            else:
                self._finish(key.data)
        if not _HAS_PIDFD:
            self._poll_children()

    def _next_timeout(self) -> Optional[float]:
        t = self._timers.next_timeout()
        if not _HAS_PIDFD:
            with self._lock:
                if self._children or self._others:
                    t = 0.05 if t is None else min(t, 0.05)
        return t

    def _finish(self, w: _Watched) -> None:
        status: Optional[int] = None
        with self._lock:
            table = self._children if w.child else self._others
            key = w.pid if w.child else id(w)
            if table.get(key) is not w:
                return
            if w.child:
                ended, status, use = reap_use(w.pid)
                if not ended:
                    return  # still running (spurious wake-up or fallback poll)
                if use is not None:
                    self._usage[w.pid] = (wall_time(), *use)
            del table[key]
            if w.fd is not None:
                assert self._wakeup is not None
                self._wakeup.unregister(w.fd)
                os.close(w.fd)
        try:
            w.on_exit(w.pid, status)
        except Exception:
            logger.exception("exit handler for process %d raised", w.pid)
        finally:
            if w.child:  # kept for its exit handler only
                with self._lock:
                    self._usage.pop(w.pid, None)

    def take_usage(self, pid: int) -> Optional[Tuple[float, float, int]]:
        """The use of child ``pid`` this watch reaped (when it was reaped, its CPU seconds, its
        peak memory in bytes: :func:`reap_use`), once, from its exit handler (it is dropped
        when the handler returns); None if none is kept."""
        with self._lock:
            return self._usage.pop(pid, None)

    def _read_feed(self, feed: _Feed) -> None:
        keeper = feed.keeper
        try:
            data = os.read(keeper.events, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        done: List[Tuple[_Watched, Optional[int]]] = []
        starts: List[Tuple[Start, Optional[int], str, Optional[Failure]]] = []
        with self._lock:
            if not data:  # the keeper is dead: what it did not report will never be
                assert self._wakeup is not None
                self._wakeup.unregister(keeper.events)
                os.close(keeper.events)
                keeper.gone()
                failure = (0, "keeper", f"the keeper process {keeper.pid} ended "
                                        f"({keeper.ended}) before it answered")
                sent, unsent = keeper.take_unanswered()
                starts += [(job, None, "", failure) for job in sent]
                starts += [(job, None, "", (0, "unsent", failure[2])) for job in unsent]
                for pid, kept in list(self._children.items()):
                    if kept.keeper is keeper:
                        del self._children[pid]
                        _kill_orphan(pid, kept.start)
                        done.append((kept, None))
            else:
                lines = (feed.buffer + data).split(b"\n")
                feed.buffer = lines.pop()
                for line in lines:
                    try:
                        if line[:2] == b"s ":
                            job = keeper.answered()
                            _, number, began = line.decode().split()
                            if job is not None:
                                self._children[int(number)] = _Watched(
                                    int(number), None, True, job.on_exit, keeper, began)
                                starts.append((job, int(number), began, None))
                            continue
                        if line[:2] == b"f ":
                            job = keeper.answered()
                            _, errno, what, words = (line.decode(errors="replace") + " "
                                                     ).split(" ", 3)
                            if job is not None:
                                starts.append((job, None, "", (int(errno), what,
                                                               words.strip())))
                            continue
                        report = line.split()
                        pid, code = int(report[0]), int(report[1])
                        if len(report) == 6:  # its use: started, ended, CPU seconds, max RSS
                            keeper.usage[pid] = (float(report[2]), float(report[3]),
                                                 float(report[4]), int(report[5]))
                    except (ValueError, IndexError):  # not a keeper's: skipped, the rest read
                        logger.warning("keeper %d: not a report: %r", keeper.pid, line)
                        continue
                    found = self._children.get(pid)
                    if found is None or found.keeper is not keeper:
                        self._early[pid] = code
                    else:
                        del self._children[pid]
                        done.append((found, code))
        for entry in starts:
            try:
                entry[0].on_start(entry[1], entry[2], entry[3])
            except Exception:
                logger.exception("start handler for process %s raised", entry[1])
        if starts:
            keeper.send_next()
        for w, status in done:
            try:
                w.on_exit(w.pid, status)
            except Exception:
                logger.exception("exit handler for process %d raised", w.pid)

    def _poll_children(self) -> None:
        # Fallback without pidfds: _finish's WNOHANG wait tells whether a child has ended.
        with self._lock:
            watched = [w for w in self._children.values() if w.keeper is None]
            watched += list(self._others.values())
        for w in watched:
            if w.child or not _pid_alive(w.pid):
                self._finish(w)


def _kill_orphan(pid: int, start: str) -> None:
    """KILL the process group of a job whose keeper died: it is nobody's child now, and
    nothing would report its end. Its leader is signalled only while it is the process the
    keeper started (same kernel start time), else what is left of its group."""
    if start and start_time(pid) == start:
        killpg(pid, SIGKILL)
    else:
        signal_reaped_group(pid, SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


WATCH = ProcessWatch()
