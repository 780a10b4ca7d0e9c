"""This process's side of the local jobs' keeper (``_local_keeper``, which says what it does).

:func:`keeper_for` starts one keeper per process on the first local job, and gives it to every
local executor of the process, whatever its work directory. :meth:`Keeper.spawn` asks it to
start a program and returns its pid; the keeper's exit reports reach the process watch
(``ProcessWatch.watch_kept``) through :attr:`Keeper.events`.

If no keeper can be started (no Python executable to run it, or its file or that of the process
layer it loads, ``psij/_spawn.py``, is not on disk, or a keeper could not load that layer and
ended at once), :func:`keeper_for` returns None and the executor starts its jobs itself, as
children of this process.
"""

import marshal
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Tuple

from psij._lazylog import LazyLogger
from psij._spawn import launch_error, popen

__all__ = ["Keeper", "flush_keepers", "forget_keepers", "keeper_for"]

logger = LazyLogger(__name__)

_HEADER = struct.Struct("!I")
_ANSWER_SECONDS = 120.0
_PROGRAM = str(Path(__file__).with_name("_local_keeper.py"))
_LAYER = str(Path(__file__).parent.parent / "_spawn.py")  # loaded by the keeper from its file
_LAYER_FAILED = 3  # the keeper's exit code when it cannot (_local_keeper.LAYER_FAILED)


class KeeperGone(Exception):
    """The keeper ended or stopped answering; the executor starts a new one."""


class Keeper:
    """One running keeper: requests go through :meth:`spawn`, :meth:`signal` and
    :meth:`terminate` (one at a time), exit reports come on the pipe :attr:`events` (``<pid>
    <wait status>`` lines)."""

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
        # A keeper that stops answering (stopped, swapped out) fails a submit, not hangs it.
        ours.settimeout(_ANSWER_SECONDS)
        self._lock = threading.Lock()
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.alive = True
        self.watch: Optional[WatchWithFeeds] = None  # the one its reports go to

    def _ask(self, request: Tuple[Any, ...], fds: List[int]) -> Tuple[Any, ...]:
        data = marshal.dumps(request)
        with self._lock:
            if not self.alive:
                raise KeeperGone("the keeper has ended")
            try:
                message = _HEADER.pack(len(data)) + data
                sent = socket.send_fds(self._sock, [message], fds) if fds \
                    else self._sock.send(message)
                if sent < len(message):
                    self._sock.sendall(message[sent:])
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

    def spawn(self, program: str, argv: List[str], directory: str, env: Dict[str, str],
              streams: Tuple[int, int, int], job_id: str, journal: str, registry: str,
              in_registry: bool = False) -> int:
        """The pid of the started program (the keeper records its start and end in
        ``registry`` if ``in_registry``, else or if it cannot, in the journal file ``journal``,
        and records its final state in ``registry`` if this process is gone by then);
        LaunchError as ``Spawner`` raises it when it could not start, KeeperGone when the
        keeper could not be asked."""
        fds = [self._devnull if fd == subprocess.DEVNULL else fd for fd in streams]
        try:
            reply = self._ask(("spawn", program, argv, directory, env, job_id, journal,
                               registry, bool(in_registry)), fds)
        except KeeperGone:
            if self._exit_code() == _LAYER_FAILED and not _UNUSABLE:
                _UNUSABLE.append(_LAYER)
                logger.warning("the local jobs' keeper cannot load %s; local jobs are started "
                               "by this process, and a job that ends after it has no "
                               "recorded exit code", _LAYER)
            raise
        if reply[0] == "ok":
            return int(reply[1])
        raise launch_error(OSError(int(reply[1]), str(reply[2])), argv, env)

    def _exit_code(self) -> Optional[int]:
        """The keeper's exit code, once its socket closed: it is ending (waited for a moment),
        or None."""
        for _ in range(100):
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            time.sleep(0.01)
        return None

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
        """Its exit reports ended: the keeper is dead (its jobs' codes are lost)."""
        with self._lock:
            self.alive = False
            self._sock.close()


# By process id (a forked child starts its own) and watch.
_KEEPERS: Dict[Tuple[int, int], Keeper] = {}
_KEEPERS_LOCK = threading.Lock()
_FAILED: List[str] = []
# Not empty once a keeper could not load the process layer: no other is started then.
_UNUSABLE: List[str] = []


def keeper_for(final_rank: int, watch: "WatchWithFeeds") -> Optional[Keeper]:
    """This process's live keeper reporting to ``watch`` (there is one watch, but for tests),
    started if needed; None if none can be started."""
    key = (os.getpid(), id(watch))
    keeper = _KEEPERS.get(key)
    if keeper is not None and keeper.alive and keeper.watch is watch:
        return keeper
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(key)
        if keeper is not None and keeper.alive and keeper.watch is watch:
            return keeper
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
        watch.add_feed(keeper)
        keeper.watch = watch  # held: the id in the key is not given to another watch
        _KEEPERS[key] = keeper
        return keeper


def flush_keepers() -> None:
    """Let this process's keepers commit what they recorded (before reading the records)."""
    pid = os.getpid()
    for (owner, _), keeper in list(_KEEPERS.items()):
        if owner == pid and keeper.alive:
            keeper.flush()


def forget_keepers() -> None:
    """In a forked child: the keepers are the parent's (closing its copies of their sockets
    lets them see the parent's end); the child starts its own."""
    global _KEEPERS_LOCK
    _KEEPERS_LOCK = threading.Lock()
    for keeper in _KEEPERS.values():
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
