"""This process's side of the local jobs' keeper (``_keeper``, which says what it does).

A process starts its first keeper on its first local job (:func:`keeper_for_job`), and more
while those running are busy, up to one per 2 cores (``PSIJ_LOCAL_KEEPERS`` forces a number:
see :func:`keeper_count`); they serve every local executor of the process, whatever its work
directory. :meth:`Keeper.start` writes a job's request on the keeper's socket before it
returns (with ``send=False`` it is queued, and :meth:`Keeper.send_queued` writes the jobs
queued so in one message: ``submit_many``), so a job ``submit()`` returned for runs even if
this process is killed the next instant: the keeper reads what is on its socket after the
other end closed. It does not wait for the job to start. The keeper answers each
start (its pid, or why it failed) on its events pipe, in order and before that job's exit
report, where the process watch reads them (``ProcessWatch._read_feed``) and hands them to
the :class:`Start`'s callbacks. Other requests (signals, flush) wait for their answer on the
socket. A keeper that ended (killed, say) is reaped and its end told in :attr:`Keeper.ended`;
the next jobs go to the other keepers or to a new one.

It must not run user code (callbacks run where the watch calls them) nor block the watch thread
for long.

If no keeper can be started (no Python executable to run it, or its file is not on disk),
:func:`keeper_for` returns None and the executor starts its jobs itself, as children of this
process.
"""

import marshal
import os
import socket
import struct
import sys
import threading
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Set, Tuple

from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger
from psij._spawn import popen

__all__ = [
    "Failure",
    "Keeper",
    "KeeperGone",
    "Start",
    "drain_keepers",
    "flush_keepers",
    "forget_keepers",
    "keeper_count",
    "keeper_for",
    "keeper_for_job",
]

logger = LazyLogger(__name__)

_HEADER = struct.Struct("!I")
_ANSWER_SECONDS = 120.0
_CLOCK: Clock = MonotonicClock()  # keepers are real processes: they answer in real time
_PROGRAM = str(Path(__file__).with_name("_keeper.py"))
_LAYER = str(Path(__file__).parents[2] / "_spawn.py")  # loaded by the keeper from its file
_LAYER_FAILED = 3  # the keeper's exit code when it cannot (_keeper.LAYER_FAILED)
# Not empty once a keeper could not load the process layer: no other is started then.
_UNUSABLE: List[str] = []
_MAX_FDS = 200  # descriptors passed with one message (the keeper takes up to 253)
_SEND_BUFFER = 4 << 20  # bytes asked for the requests' socket (capped by net.core.wmem_max)
_BUSY = 32  # starts not yet answered before another keeper is started, when one may be

Failure = Tuple[int, str, str]
"""Why a keeper could not start a job: (errno, what: stdin, stdout, stderr, directory, spawn,
keeper, or unsent: the keeper ended before the job was sent to it, so another may start it;
the words saying why)."""


class KeeperGone(Exception):
    """The keeper ended or stopped answering; the executor starts a new one."""


class Start:
    """A job for a keeper to start: the item of its ``spawns`` request, the descriptors it
    passes, and what to call on the watch thread when the keeper answers: ``on_start(pid,
    start, failure)`` (the pid and kernel start time, or None and ``(errno, what, words)``),
    then ``on_exit(pid, wait status or None)`` when it ends. Both must be quick."""

    __slots__ = ("base", "fds", "item", "on_exit", "on_start")

    def __init__(self, item: Tuple[Any, ...], fds: List[int],
                 base: Optional[Tuple[int, Dict[str, str]]],
                 on_start: Callable[[Optional[int], str, Optional[Failure]], None],
                 on_exit: Callable[[int, Optional[int]], None]) -> None:
        self.item = item
        self.fds = fds
        self.base = base
        self.on_start = on_start
        self.on_exit = on_exit


class Keeper:
    """One running keeper: jobs go through :meth:`start` (queued, sent in batches, answered
    on :attr:`events`), other requests through :meth:`signal`, :meth:`terminate`,
    :meth:`kill_later` and :meth:`flush` (one at a time, each waiting for its answer); exit
    reports come on the pipe :attr:`events` (``<pid> <wait status> <started> <ended> <CPU
    seconds> <max RSS bytes>`` lines, the figures kept in :attr:`usage`)."""

    def __init__(self, final_rank: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        events_r, events_w = os.pipe()
        try:
            self.process = popen(
                [sys.executable, "-I", "-S", _PROGRAM, str(theirs.fileno()), str(events_w),
                 str(final_rank)], env=None, pass_fds=(theirs.fileno(), events_w))
        except BaseException:
            ours.close()
            os.close(events_r)
            raise
        finally:
            theirs.close()
            os.close(events_w)
        # The watch reaps nothing of it: it outlives this process by design.
        self.process.returncode = 0
        self.pid = self.process.pid
        self.events = events_r
        self._sock = ours
        # A keeper that stops answering (stopped, swapped out) fails a request, not hangs it.
        ours.settimeout(_ANSWER_SECONDS)
        try:  # room for many starts the keeper has not read yet (as the system allows)
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        except OSError:
            pass
        self._lock = threading.Lock()
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.alive = True
        self.watch: Optional[WatchWithFeeds] = None  # the one its reports go to
        self._queue: List[Start] = []  # not sent yet
        self._unanswered: Deque[Start] = deque()  # sent or queued, in order, not answered
        self._base = 0  # the number of the base environment the keeper has
        self.ended: Optional[str] = None  # how it ended, in words, once it did
        # The use of each job it reported ended, by pid, until its executor takes it (on the
        # watch thread): started and ended (wall clock), CPU seconds, max RSS in bytes.
        self.usage: Dict[int, Tuple[float, float, float, int]] = {}

    def load(self) -> int:
        """Its jobs not started yet (queued, or sent and not answered)."""
        return len(self._unanswered)

    def start(self, job: Start, send: bool = True) -> None:
        """Send ``job`` to the keeper now (with those queued before it), or, with ``send`` False,
        queue it for :meth:`send_queued`; KeeperGone when the keeper has ended (then nothing
        was queued)."""
        with self._lock:
            if not self.alive:
                raise KeeperGone("the keeper has ended")
            self._unanswered.append(job)
            self._queue.append(job)
            if send:
                self._send_queue()
                if not self.alive and self._queue and self._queue[-1] is job:
                    self._queue.pop()  # not sent whole: the caller starts it elsewhere
                    self._unanswered.pop()
                    raise KeeperGone("the keeper stopped taking requests")

    def queued(self) -> int:
        """The jobs queued and not sent yet."""
        return len(self._queue)

    def send_queued(self) -> None:
        """Send the jobs queued (in as few messages as the descriptors they pass allow)."""
        with self._lock:
            if self._queue and self.alive:
                self._send_queue()

    def answered(self) -> Optional[Start]:
        """The job the keeper's next start answer is for (on the watch thread)."""
        try:
            return self._unanswered.popleft()
        except IndexError:
            return None

    def send_next(self) -> None:
        """After answers: send what is queued, if anything (on the watch thread)."""
        if self._queue:
            self.send_queued()

    def take_unanswered(self) -> Tuple[List[Start], List[Start]]:
        """The keeper ended: the jobs it was sent and did not answer (it may have started
        some), and those never sent (another keeper may start them)."""
        with self._lock:
            unsent = self._queue
            sent = list(self._unanswered)[:len(self._unanswered) - len(unsent)]
            self._unanswered.clear()
            self._queue = []
        return sent, unsent

    def _send_queue(self) -> None:
        # With the lock held. When a send fails the keeper is taken for ended: the jobs not
        # sent whole are left queued, so that another keeper (or this process) starts them,
        # and those sent before fail when the keeper's end is seen (its events pipe closes).
        queue, self._queue = self._queue, []
        parts: List[Tuple[bytes, List[int], int]] = []  # (message, descriptors, first job)
        items: List[Tuple[Any, ...]] = []
        fds: List[int] = []

        def close(upto: int) -> None:
            if items:
                parts.append((_message(("spawns", list(items))), list(fds), upto - len(items)))
                items.clear()
                fds.clear()

        for n, job in enumerate(queue):
            base = job.base
            if base is not None and base[0] != self._base:
                close(n)
                parts.append((_message(("env", base[0], base[1])), [], n))
                self._base = base[0]
            if len(fds) + len(job.fds) > _MAX_FDS:
                close(n)
            items.append(job.item)
            fds += job.fds
        close(len(queue))
        for data, passed, first in parts:
            try:
                self._send(data, passed)
            except OSError as ex:
                self.alive = False
                self._queue = queue[first:]
                logger.warning("the local jobs' keeper %d stopped taking requests: %s",
                               self.pid, ex)
                return

    def _send(self, message: bytes, fds: List[int]) -> None:
        sent = socket.send_fds(self._sock, [message], fds) if fds else self._sock.send(message)
        if sent < len(message):
            self._sock.sendall(message[sent:])

    def _ask(self, request: Tuple[Any, ...], fds: List[int]) -> Tuple[Any, ...]:
        data = _message(request)
        with self._lock:
            if not self.alive:
                raise KeeperGone("the keeper has ended")
            if self._queue:  # the jobs queued are started first (a flush covers them)
                self._send_queue()
            try:
                self._send(data, fds)
                return tuple(marshal.loads(self._reply()))
            except (OSError, EOFError, ValueError, struct.error) as ex:
                self.alive = False
                raise KeeperGone(f"the keeper stopped answering: {ex}") from ex

    def _reply(self) -> bytes:
        data = self._sock.recv(4096)
        while True:
            if not data:
                raise EOFError("the keeper closed its socket")
            if len(data) >= _HEADER.size:
                size = _HEADER.unpack_from(data)[0] + _HEADER.size
                if len(data) >= size:
                    return data[_HEADER.size:size]
            more = self._sock.recv(65536)
            data += more if more else b""
            if not more:
                raise EOFError("the keeper closed its socket")

    def signal(self, pgid: int, signum: int) -> bool:
        """Signal the group of a job of this keeper that it has not reaped yet."""
        try:
            return bool(self._ask(("signal", pgid, signum), [])[1])
        except KeeperGone:
            return False

    def terminate(self, pgid: int, grace: float, canceled: bool) -> bool:
        """TERM to the group of a job of this keeper now and KILL after ``grace`` seconds (at
        once for 0), both sent by the keeper, which stays until then even if this process
        ends; ``canceled``: its end is recorded as a cancel. False when the keeper had reaped
        the job already (or is gone)."""
        try:
            reply = self._ask(("terminate", pgid, float(grace), bool(canceled)), [])
        except KeeperGone:
            return False
        return reply[0] == "ok" and bool(reply[1])

    def kill_later(self, pgid: int, grace: float, leader: Optional[int]) -> bool:
        """Have the keeper KILL process group ``pgid``, which is not its own, ``grace``
        seconds from now, even if this process ends first; ``leader`` is a pidfd of the
        group's leader (the keeper gets a copy), by which it knows whether the group id still
        names that group. False when the keeper could not be asked."""
        try:
            reply = self._ask(("kill_later", pgid, float(grace), leader is not None),
                              [] if leader is None else [leader])
        except KeeperGone:
            return False
        return reply[0] == "ok" and bool(reply[1])

    def flush(self) -> None:
        """Wait until the keeper has committed the records of the jobs it started so far."""
        try:
            self._ask(("flush",), [])
        except KeeperGone:
            pass

    def gone(self) -> None:
        """Its exit reports ended: the keeper is dead (its jobs' codes are lost); reaps it
        and says how it ended in :attr:`ended`."""
        with self._lock:
            self.alive = False
            self._sock.close()
        self.ended = _how_it_ended(self.pid)


def _how_it_ended(pid: int) -> str:
    # Its events pipe closed as it exited: it is reaped at once, or in a moment.
    return _CLOCK.poll(partial(_exit_of, pid), 2.0, 0.001) or "ended"


def _exit_of(pid: int) -> Optional[str]:
    """How ``pid`` ended, once reaped; None while it has not."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "ended"
    if not done:
        return None
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def _message(request: Tuple[Any, ...]) -> bytes:
    data = marshal.dumps(request)
    return _HEADER.pack(len(data)) + data


# By process id (a forked child starts its own) and watch.
_KEEPERS: Dict[Tuple[int, int], List[Keeper]] = {}
_KEEPERS_LOCK = threading.Lock()
_FAILED: List[str] = []
_TURN = [0]
_FORCE_KEY = os.fsencode("PSIJ_LOCAL_KEEPERS")
_PID = [os.getpid()]  # this process's (set again in a forked child)
_CORES: List[int] = []  # the cores this process may run on, counted once
_WARNED: Set[Any] = set()  # values of PSIJ_LOCAL_KEEPERS already warned about


def keeper_count() -> Tuple[int, bool]:
    """How many keepers a process may run, and whether that many is forced: the
    ``PSIJ_LOCAL_KEEPERS`` variable (a number from 1 on: that many, jobs spread over them in
    turn), else one per 2 cores this process may run on, started only when those running
    are busy."""
    raw = getattr(os.environ, "_data", None)  # read per job: no decoding of the names
    forced = raw.get(_FORCE_KEY) if isinstance(raw, dict) \
        else os.environ.get("PSIJ_LOCAL_KEEPERS")
    if forced is not None:
        text = os.fsdecode(forced).strip()
        if text.isascii() and text.isdigit() and 0 < int(text) <= 1024:
            return int(text), True
        if forced not in _WARNED:
            _WARNED.add(forced)
            logger.warning("PSIJ_LOCAL_KEEPERS=%r: a whole number from 1 to 1024 is accepted; "
                           "ignored (one keeper per 2 cores)", os.fsdecode(forced))
    if not _CORES:
        try:
            _CORES.append(len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            _CORES.append(os.cpu_count() or 1)
    return max(1, _CORES[0] // 2), False


def keeper_for(final_rank: int, watch: "WatchWithFeeds") -> Optional[Keeper]:
    """A live keeper of this process reporting to ``watch`` (there is one watch, but for
    tests), started if there is none; None if none can be started."""
    keepers = _KEEPERS.get((os.getpid(), id(watch)), ())
    for keeper in keepers:
        if keeper.alive and keeper.watch is watch:
            return keeper
    return _new_keeper(final_rank, watch, 0)


def keeper_for_job(final_rank: int, watch: "WatchWithFeeds") -> Optional[Keeper]:
    """The keeper to start the next job: the least busy one, or a new one when all are busy
    and there may be more (see :func:`keeper_count`); None if none can be started."""
    keepers = _KEEPERS.get((_PID[0], id(watch)), ())
    count, forced = keeper_count()
    if count == 1 and len(keepers) == 1 and keepers[0].alive and keepers[0].watch is watch:
        return keepers[0]
    live = [k for k in keepers if k.alive and k.watch is watch]
    if forced:
        if len(live) < count:
            return _new_keeper(final_rank, watch, count) or (live[0] if live else None)
        _TURN[0] += 1
        return live[_TURN[0] % len(live)]
    best = None
    for keeper in live:
        if best is None or keeper.load() < best.load():
            best = keeper
            if not best.load():
                break
    if best is not None and (best.load() < _BUSY or len(live) >= count):
        return best
    return _new_keeper(final_rank, watch, count) or best


def _new_keeper(final_rank: int, watch: "WatchWithFeeds", most: int) -> Optional[Keeper]:
    """Start a keeper (unless ``most`` are live already, 0: unless one is)."""
    key = (_PID[0], id(watch))
    with _KEEPERS_LOCK:
        live = [k for k in _KEEPERS.get(key, ()) if k.alive and k.watch is watch]
        if len(live) >= max(1, most):
            return min(live, key=Keeper.load)
        if not sys.executable or not os.path.isfile(_PROGRAM) \
                or not os.path.isfile(_LAYER) or _UNUSABLE:  # e.g. run from a zip file
            return None
        try:
            keeper = Keeper(final_rank)
        except OSError as ex:
            if not _FAILED:
                _FAILED.append(str(ex))
                logger.warning("could not start the local jobs' keeper (%s); local jobs are "
                               "started by this process, and a job that ends after it has "
                               "no recorded exit code", ex)
            return None
        if not _answers(keeper):
            return None
        watch.add_feed(keeper)
        keeper.watch = watch  # held: the id in the key is not given to another watch
        _KEEPERS[key] = [*live, keeper]  # a new list: readers take no lock
        return keeper


def _answers(keeper: Keeper) -> bool:
    """Whether a keeper just started answers (one round trip per keeper, not per job); one that
    cannot load the process layer ends at once, and no other is tried."""
    try:
        keeper._ask(("flush",), [])
        return True
    except KeeperGone:
        pass
    keeper.alive = False
    keeper._sock.close()
    for fd in (keeper.events, keeper._devnull):
        os.close(fd)
    try:
        _, status = os.waitpid(keeper.pid, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    except ChildProcessError:
        code = None
    if code == _LAYER_FAILED and not _UNUSABLE:
        _UNUSABLE.append(_LAYER)
        logger.warning("the local jobs' keeper cannot load %s; starting it here, as every "
                       "later local job of this process (a job that ends after this process "
                       "has no recorded exit code)", _LAYER)
    return False


def flush_keepers() -> None:
    """Let this process's keepers commit what they recorded (before reading the records)."""
    pid = os.getpid()
    for (owner, _), keepers in list(_KEEPERS.items()):
        if owner == pid:
            for keeper in keepers:
                if keeper.alive:
                    keeper.flush()


def drain_keepers(timeout: float) -> None:
    """Send the starts this process's keepers have queued and wait (``timeout`` seconds at
    most) until they are answered."""
    deadline = _CLOCK.now() + timeout
    pid = os.getpid()
    for (owner, _), keepers in list(_KEEPERS.items()):
        for keeper in keepers if owner == pid else ():
            keeper.send_next()
            _CLOCK.poll(partial(_answered, keeper), deadline - _CLOCK.now(), 0.002)


def _answered(keeper: "Keeper") -> bool:
    return not keeper.load() or not keeper.alive


def forget_keepers() -> None:
    """In a forked child: the keepers are the parent's (closing its copies of their sockets
    lets them see the parent's end); the child starts its own."""
    global _KEEPERS_LOCK
    _KEEPERS_LOCK = threading.Lock()
    _PID[0] = os.getpid()
    for keepers in _KEEPERS.values():
        for keeper in keepers:
            try:
                keeper._sock.close()
                os.close(keeper.events)
            except OSError:
                pass
    _KEEPERS.clear()


os.register_at_fork(after_in_child=forget_keepers)


class WatchWithFeeds(Protocol):
    """What :func:`keeper_for` needs of the process watch."""

    def add_feed(self, keeper: Keeper) -> None: ...
