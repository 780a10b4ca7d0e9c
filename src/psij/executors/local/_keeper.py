"""The keeper of a process's local jobs: it starts them, is their parent, and records how each
one ended, even after the process that asked for them is gone.

A Python process that runs local jobs starts one keeper (on its first job; see
``_keeper_client``), which runs this file with the standard library only (``python -I -S
_keeper.py REQUESTS EVENTS FINAL_RANK``). The process sends each job on the ``REQUESTS``
socket before its ``submit`` returns (those of one ``submit_many`` in one message): what is on
the socket is read even after the process died, so a job submitted runs. The keeper starts
each program with ``posix_spawn`` as the leader of a new process group, answers with the pid
on the ``EVENTS`` pipe, and records that the job started (pid, kernel start time, job id; and
the job's row when the request holds it). When a job ends the keeper reaps it (``wait3``),
writes ``<pid> <wait status> <started> <ended> <CPU seconds> <max RSS bytes>`` to the
``EVENTS`` pipe (the wall-clock times of its start and reaping, and the resource use the
system reports for the reaped process: see ``psij.executors.local``, "Resource use") and
records the exit code.

Records go to the job registry the request names (table ``local_runs``, see
``psij._registry.store``), a batch per transaction: what gathered while the keeper was busy,
committed when it has had nothing to do for a few milliseconds or every 50 ms at most, so a
burst of jobs costs a commit per 50 ms, not one per job. A ``("flush",)`` request commits them
at once (the requester's ``list()`` and ``attach()`` then see its own jobs). When the request
says the registry is not to be used, or it cannot be written (damaged, removed, or still
locked when the keeper ends), they are appended to the journal file it names instead, created
if needed (lines ``S <pid> <start> <job id>`` and ``E <pid> <start> <exit code>``; see
``_journal``).

When the requesting process ends (``kill -9`` included) the socket closes: the keeper stops
taking requests, goes on reaping, recording and sending the KILLs it was asked for until its
last job has ended and its last KILL is sent (or its group gone), writes the
final state of each job that ended meanwhile to the job registry the request named (rank
``FINAL_RANK``, with its resource use, only if the job is not final there yet; in the same
transactions), commits
what is left, and exits. So a job that ends after its submitter died still has its real exit
code.

Requests (a length-prefixed ``marshal`` tuple, the job's three standard streams passed as
descriptors with the length):

- ``("spawn", program, argv, directory, env, job_id, journal, registry, in_registry)`` →
  ``("ok", pid)`` or ``("err", errno, text)`` (``in_registry``: a bool, whether the job's
  records go to the registry rather than the journal; answered at once, never tried again);
- ``("env", number, env)``, no answer: the base environment ``number`` (the requester sends
  a new one when its own environment changed; the keeper keeps the latest few);
- ``("spawns", [(program, argv, directory, base, own, streams, job_id, journal, registry,
  in_registry[, row]), ...])``, no answer on the socket: starts each program in order, as
  ``spawn`` does (``row``: the job's registry row, written with its start: ``_keeper_rows``),
  with the variables of base environment ``base`` (None: none) under ``own``. Each stream is
  None (``/dev/null``), a path the keeper opens itself (in the job's directory:
  stdin read-only, stdout and stderr created 0666 less the umask and truncated, one opening
  when they are the same path) or the index of a descriptor passed with the message (the
  job's descriptors follow those of the jobs before it). Each start is answered, in order,
  on the ``EVENTS`` pipe, before any exit report of that job: ``s <pid> <start>`` or ``f
  <errno> <what> <words>`` where ``what`` is ``stdin``, ``stdout``, ``stderr`` (that stream
  could not be opened), ``directory`` (it could not be entered) or ``spawn``. A start the
  system refuses for now (EAGAIN or ENOMEM: no process or memory to spare, ``ulimit -u``) is
  tried again, after 10 ms, then twice as long each time up to 1 s, and sooner when a child
  ends; the loop goes on meanwhile (reaping, answering, reading requests), and the jobs
  taken after it wait for it, as their answers come in order. Once starts have been refused
  so for 60 s in a row (none succeeding), the job fails (``f``, with its errno, saying so);
- ``("flush",)`` → ``("ok", True)`` once the records gathered so far are committed (or kept
  for a retry if the registry is locked; jobs whose start waits for a retry are not waited
  for);
- ``("signal", pgid, signum)`` → ``("ok", sent)``: signals the group only while its leader is
  a child not yet reaped (so the id cannot have been reused);
- ``("terminate", pgid, grace, canceled)`` → ``("ok", sent)``: TERM to the group of a child
  not yet reaped now and KILL ``grace`` seconds later (at once when ``grace`` is 0), whatever
  is left of the group by then, even after the requesting process has ended: the keeper
  stays until it is sent. With ``canceled`` the job's end is recorded as a cancel (its
  exit record says so, and a final state written for it is CANCELED);
- ``("kill_later", pgid, grace, with_leader)`` → ``("ok", True)``: KILL ``grace`` seconds
  from now to a group that is not the keeper's (a job started by the requesting process
  itself, or by another one), with, when ``with_leader``, a pidfd of its leader passed as a
  descriptor: the group is signalled while that process still holds its id, or, once it
  was reaped, while no other process has taken the id.

The KILL that follows the TERM is the keeper's so that a job that ignores TERM is still
killed when the process that cancelled it exits at once (its own timers would die with it).

The keeper is single-threaded: it may change its working directory before each spawn. It
starts programs only through the package's process layer (``psij/_spawn.py``), writes the
registry through ``_keeper_rows`` and signals through ``_keeper_kills``, all loaded from their
files (``-I -S``: the package is not importable); when the layer cannot be loaded the keeper
exits with code 3, saying why on its stderr, and the process that started it starts its jobs
itself. It runs no user code and reads
no file but ``/proc/<pid>/stat`` and the registry.
"""

import errno
import importlib.util
import marshal
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections import OrderedDict, deque
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

_HEADER = struct.Struct("!I")
_MAX_REQUEST = 1 << 30
# Ignored here (by Python, or by the keeper so that a terminal's signals spare it), and
# ignored signals stay ignored across exec: a job gets their default actions back.
_IGNORED = ("SIGINT", "SIGHUP", "SIGTERM")
_RESTORED = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", *_IGNORED)
                  if hasattr(signal, n))
_JOURNAL_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_OPEN = 32
_MAX_FDS = 253  # descriptors one message may carry (SCM_MAX_FD)
_BASES_KEPT = 4  # base environments kept
_STARTS_AT_ONCE = 16  # jobs started between two looks at the socket and the children
_HOLD_SECONDS = 0.001  # events wait this long for others, to go in one write (and wake-up)
_READ = os.O_RDONLY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_IDLE_SECONDS = 0.005  # or this long without anything else to do
# A start the system refuses for now (no process or memory to spare) is tried again after
# _RETRY_FIRST seconds, then twice as long each time up to _RETRY_MOST, until starts have been
# refused so for _RETRY_SECONDS in a row: then the job fails.
_FOR_NOW = (errno.EAGAIN, errno.ENOMEM)
_RETRY_FIRST = 0.01
_RETRY_MOST = 1.0
_RETRY_SECONDS = 60.0
# A record for the registry: (kind, pid, start, text or a job's row, journal to use if it
# cannot be written, job id); see _keeper_rows.
Run = Tuple[str, int, str, Any, str, str]
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in KiB but on macOS
LAYER_FAILED = 3  # the keeper's exit code when the process layer cannot be loaded
_SPAWN: Any = None  # psij/_spawn.py, loaded by main()


def layer_path() -> str:
    """Where ``psij/_spawn.py`` is: two folders above this file's (``psij/executors/local/``),
    as the file was named, else once links are resolved."""
    named = os.path.abspath(__file__)
    for base in (named, os.path.realpath(named)):
        path = os.path.normpath(os.path.join(base, "../../../_spawn.py"))
        if os.path.isfile(path):
            return path
    return os.path.normpath(os.path.join(named, "../../../_spawn.py"))


def load_layer(path: str = "") -> Any:
    """The package's process layer (or the module at ``path``), loaded from its file; raises
    when it cannot be (the package is not importable here)."""
    path = path or layer_path()
    spec = importlib.util.spec_from_file_location(f"psij_{os.path.basename(path)[:-3]}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HERE = os.path.dirname(os.path.realpath(__file__))  # where the keeper's parts are
_ROWS = load_layer(os.path.join(_HERE, "_keeper_rows.py"))
_RUN_SQL = _ROWS.RUN_SQL
_Records: Any = _ROWS.Records  # the keeper's writing of its records, a part of Keeper
_Kills: Any = load_layer(os.path.join(_HERE, "_keeper_kills.py")).Kills  # signals, KILLs
_BATCH_SECONDS = _ROWS.BATCH_SECONDS  # records wait at most this long for a commit


def start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (as the journal reader computes it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return "None"
    fields = data[data.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else "None"


def exit_code(status: int) -> int:
    """Shell-style, as the executor reports it: the code, or 128 + the signal's number."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Keeper(_Records, _Kills):  # type: ignore[misc]
    def __init__(self, requests: socket.socket, events: int, final_rank: int) -> None:
        self.requests = requests
        self.events = events
        self.journals: OrderedDict[str, int] = OrderedDict()  # the latest used last
        self.final_rank = final_rank
        # pid -> (start, job id, journal, registry, records go to the registry)
        self.children: Dict[int, Tuple[str, str, str, str, bool]] = {}
        self.began: Dict[int, float] = {}  # pid -> when it was started (wall clock)
        self.runs: Dict[str, List[Run]] = {}  # by registry, not yet committed
        self.since = 0.0  # when the oldest record not yet committed was made
        self.broken: Dict[str, str] = {}  # registries that cannot be written, and why
        self.conns: Dict[str, Any] = {}  # sqlite3 connections, by registry
        self.pending = b""  # events not yet written (the pipe was full)
        self.events_waiting = False  # registered to write them when it can
        self.held = 0.0  # since when events wait to be written with later ones, if they do
        # (registry, job id, code, canceled, use) of jobs that ended with nobody listening
        self.orphaned: List[Tuple[str, str, int, bool, Tuple[float, float, float, int]]] = []
        self.canceled: Set[int] = set()  # children whose end is a cancel
        self.kills: Dict[int, float] = {}  # process group -> when it gets KILL
        self.leaders: Dict[int, int] = {}  # process group not ours -> pidfd of its leader
        self.parent_gone = False
        self.buffer = b""
        self.fds: List[int] = []
        # Jobs taken and not started yet: (item, its descriptors, base environment, why bad).
        self.todo: Deque[Tuple[Any, List[int], Optional[Dict[str, str]], str]] = deque()
        self.refused_since = 0.0  # since when starts are refused for now (0: they are not)
        self.retry_at = 0.0  # when the first job taken is tried again (0: now)
        self.retry_wait = _RETRY_FIRST  # the wait before the next try after this one
        self.row_kept = False  # the row of the first job taken is recorded while it waits
        self.cwd = os.getcwd()
        self.bases: Dict[int, Dict[str, str]] = {}  # base environments, by number
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.selector = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        self.wake_r = wake_r
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for name in _IGNORED:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        os.set_blocking(events, False)
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        self.selector.register(requests, selectors.EVENT_READ, "request")

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        while not (self.parent_gone and not self.children and not self.kills
                   and not self.todo):
            timeout = None
            if self.todo:  # at once, or when the first job taken is tried again
                timeout = max(0.0, self.retry_at - time.monotonic())
            if self.runs or self.orphaned:
                timeout = max(0.0, min(_IDLE_SECONDS if timeout is None else timeout,
                                       self.since + _BATCH_SECONDS - time.monotonic()))
            if self.kills:  # select's timeout has a limit (about 24 days): an hour at most
                due = max(0.0, min(min(self.kills.values()) - time.monotonic(), 3600.0))
                timeout = due if timeout is None else min(timeout, due)
            if self.held:  # answers and exit reports held to go in one write
                due = max(0.0, self.held + _HOLD_SECONDS - time.monotonic())
                timeout = due if timeout is None else min(timeout, due)
            events = self.selector.select(timeout)
            if self.kills:
                self.send_due_kills()
            for key, _ in events:
                try:
                    if key.data == "wake":
                        try:
                            os.read(self.wake_r, 4096)
                        except BlockingIOError:
                            pass
                        self.reap()
                    elif key.data == "request":
                        self.read_requests()
                    elif key.data == "events":
                        self.flush_events()
                except Exception as ex:  # one bad request or write: the others go on
                    self.note(f"keeper: {ex!r}")
            if self.todo:
                self.start_queued(_STARTS_AT_ONCE)
            if self.pending and not self.events_waiting:
                now = time.monotonic()
                self.held = self.held or now
                if now - self.held >= _HOLD_SECONDS:
                    self.held = 0.0
                    self.flush_events()
            if (self.runs or self.orphaned) and (
                    not events or time.monotonic() - self.since >= _BATCH_SECONDS):
                self.commit()  # idle for a moment, or the oldest record waited long enough
        self.commit(final=True)
        for conn in self.conns.values():
            conn.close()

    def reap(self) -> None:
        while self.children:
            try:
                pid, status, rusage = os.wait3(os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                self.began.clear()
                return
            if pid == 0:
                return
            ended = time.time()
            found = self.children.pop(pid, None)
            began = self.began.pop(pid, ended)
            if found is None:
                continue
            # The group leader's own use and that of the descendants it waited for.
            use = (began, ended, rusage.ru_utime + rusage.ru_stime,
                   rusage.ru_maxrss * _RSS_UNIT)
            if self.retry_at:  # a process ended: a start refused for now may go through
                self.retry_at = time.monotonic()
            start, job_id, journal, registry, in_registry = found
            code = exit_code(status)
            canceled = pid in self.canceled
            self.canceled.discard(pid)
            text = f"{code} canceled" if canceled else str(code)
            self.record(("E", pid, start, text, journal, job_id), registry, in_registry)
            if self.parent_gone:
                self.orphaned.append((registry, job_id, code, canceled, use))
                self.since = self.since or time.monotonic()
            else:
                self.pending += f"{pid} {status} {began!r} {ended!r} {use[2]!r} {use[3]}\n" \
                    .encode()

    # -- requests -------------------------------------------------------------------------------

    def read_requests(self) -> None:
        try:
            data, anc, _flags, _addr = self.requests.recvmsg(
                262144, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC)
        except OSError:
            data, anc = b"", []
        if not data:
            self.parent_gone = True
            self.selector.unregister(self.requests)
            self.requests.close()
            self.pending = b""
            self.flush_events()
            return
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                self.fds += list(struct.unpack(f"{usable // 4}i", payload[:usable]))
        self.buffer += data
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if size > _MAX_REQUEST:
                raise ValueError(f"request of {size} bytes")
            if len(self.buffer) < _HEADER.size + size:
                return
            body = self.buffer[_HEADER.size:_HEADER.size + size]
            self.buffer = self.buffer[_HEADER.size + size:]
            try:
                request = marshal.loads(body)
                if not isinstance(request, tuple) or not request:
                    raise ValueError(f"not a request: {request!r:.80}")
            except (ValueError, EOFError, TypeError) as ex:
                # The requester waits for an answer: it gets one, saying what was wrong.
                self.send(("err", 0, f"the keeper could not read the request: {ex}"))
                continue
            self.answer(request)

    def answer(self, request: Tuple[Any, ...]) -> None:
        started: Optional[Tuple[int, Tuple[str, str, str, bool]]] = None
        if request[0] == "spawns" and len(request) == 2:  # answered on the events pipe
            for item in request[1] if isinstance(request[1], list) else ():
                self.queue(item)
            return
        if request[0] == "env" and len(request) == 3:  # not answered
            try:
                self.bases[int(request[1])] = dict(request[2])
            except (TypeError, ValueError) as ex:
                self.note(f"keeper: a bad environment: {ex!r}")
            while len(self.bases) > _BASES_KEPT:
                del self.bases[min(self.bases)]
            return
        if request[0] == "spawn":
            began = time.time()
            fds, self.fds = self.fds[:3], self.fds[3:]
            try:
                reply = self.spawn(request, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            if reply[0] == "ok":
                started = (reply[1], request[5:9])
        elif request[0] == "flush":
            self.start_queued(len(self.todo))  # what was sent before is started first
            self.commit()
            reply = ("ok", True)
        elif request[0] == "signal" and len(request) == 3:
            try:
                reply = ("ok", self.signal(int(request[1]), int(request[2])))
            except (TypeError, ValueError) as ex:
                reply = ("err", 0, f"a signal request holds a group and a signal: {ex}")
        elif request[0] == "kill_later" and len(request) == 4:
            fds, self.fds = self.fds[:1 if request[3] else 0], self.fds[1 if request[3] else 0:]
            try:
                reply = ("ok", self.kill_later(_group(request[1]), _number(request[2]),
                                               fds[0] if fds else None))
            except (TypeError, ValueError, OverflowError, IndexError) as ex:
                for fd in fds:
                    os.close(fd)
                reply = ("err", 0, f"a kill_later request holds a group, a grace in seconds "
                                   f"and a flag: {ex}")
        elif request[0] == "terminate" and len(request) == 4:
            try:
                reply = ("ok", self.terminate(_group(request[1]), _number(request[2]),
                                              bool(request[3])))
            except (TypeError, ValueError, OverflowError) as ex:
                reply = ("err", 0, f"a terminate request holds a group, a grace in seconds "
                                   f"and a flag: {ex}")
        else:
            reply = ("err", 0, f"unknown request {request[0]!r:.80}")
        self.send(reply)
        if started is not None:  # after the answer: the requester need not wait for it
            pid, (job_id, journal, registry, in_registry) = started
            start = start_time(pid)
            self.children[pid] = (start, job_id, journal, registry, in_registry)
            self.began[pid] = began
            self.record(("S", pid, start, job_id, journal, job_id), registry, in_registry)

    def queue(self, item: Any) -> None:
        """Take a job of a ``spawns`` request, with its descriptors and base environment, to
        start in turn: the socket is read ahead of the starts, so a requester never waits."""
        try:
            count = 1 + max((s for s in item[5] if isinstance(s, int)), default=-1)
            base = None if item[3] is None else self.bases.get(item[3])
        except Exception as ex:  # this job only: its answer says so, in its turn
            self.todo.append((None, [], None, f"a bad spawn request: {ex!r}"))
            return
        passed, self.fds = self.fds[:count], self.fds[count:]
        self.todo.append((item, passed, base, ""))

    def start_queued(self, most: int) -> None:
        """Start the first ``most`` jobs taken (each answered in turn on the events pipe). A
        job the system refused to start for now stays first, to be tried again at
        :attr:`retry_at`, and those taken after it wait for it (they are answered in order)."""
        for _ in range(min(most, len(self.todo))):
            if self.retry_at > time.monotonic():
                return
            item, passed, base, bad = self.todo[0]
            try:
                if bad:
                    raise ValueError(bad)
                if not self.start(item, passed, base):
                    continue  # refused for now: kept first, with its descriptors
            except Exception as ex:  # this job only: the others are started
                self.pending += _failure(0, "spawn", f"a bad spawn request: {ex!r}")
            self.todo.popleft()
            self.row_kept = False
        if not self.todo:  # nothing waits: the next refusal starts a new count
            self.refused_since = self.retry_at = 0.0

    def refused_for_now(self, code: int) -> bool:
        """Whether a start the system refused with errno ``code`` is tried again later (no
        process or memory to spare, and not refused so for :data:`_RETRY_SECONDS` yet); if
        so, sets when (:attr:`retry_at`)."""
        if code not in _FOR_NOW:
            return False
        now = time.monotonic()
        if not self.refused_since:
            self.refused_since, self.retry_wait = now, _RETRY_FIRST
        elif now - self.refused_since >= _RETRY_SECONDS:
            return False
        self.retry_at = now + self.retry_wait
        self.retry_wait = min(2 * self.retry_wait, _RETRY_MOST)
        return True

    def start(self, item: Tuple[Any, ...], passed: List[int],
              base: Optional[Dict[str, str]]) -> bool:
        """Start one job of a ``spawns`` request; its answer is queued on the events pipe, its
        row (an 11th item, if any) for the registry with its start record. False when the
        system refused it for now: nothing is answered, its descriptors are kept, and its
        row is recorded as it is (QUEUED) at the first refusal."""
        job_id, journal, registry, in_registry = item[6:10]
        began = time.time()
        got = self.launch(item[:10], passed, base)
        try:
            row = _ROWS.check_row(item[10]) if len(item) == 11 and not (
                got is None and self.row_kept) else None
        except ValueError as ex:
            self.note(f"keeper: job {job_id}: its row is not written: {ex}")
            row = None
        if got is None:
            if row is not None:
                self.record((_ROWS.JOB, 0, "", row, journal, job_id), registry, in_registry)
            self.row_kept = True
            return False
        if isinstance(got, bytes):
            self.pending += got
            if row is not None:
                _, _, what, words = got.decode("utf-8", "replace").split(" ", 3)
                self.record((_ROWS.JOB, 0, "", _ROWS.failed_row(
                    row, self.final_rank, f"{what}: {words.strip()}"), journal, job_id),
                    registry, in_registry)
            return True
        pid, start = got
        self.refused_since = self.retry_at = 0.0
        self.pending += f"s {pid} {start}\n".encode()
        self.children[pid] = (start, job_id, journal, registry, in_registry)
        self.began[pid] = began
        if row is not None:
            self.record((_ROWS.JOB, pid, start, _ROWS.started_row(row, pid), journal, job_id),
                        registry, in_registry)
        self.record(("S", pid, start, job_id, journal, job_id), registry, in_registry)
        return True

    def launch(self, item: Tuple[Any, ...], passed: List[int],
               base_env: Optional[Dict[str, str]]) -> Any:
        """Start the program of a ``spawns`` item: (pid, start), the events line saying
        why it could not be started, or None when the system refused it for now (then the
        descriptors ``passed`` are left open, for the next try)."""
        program, argv, directory, base, own, streams, job_id, journal, registry, \
            in_registry = item
        opened: List[int] = []
        kept: List[int] = []
        try:
            if base is None:
                env = dict(own)
            elif base_env is not None:
                env = {**base_env, **own}
            else:
                return _failure(0, "spawn", f"no base environment {base}")
            if directory != self.cwd:
                try:
                    os.chdir(directory)
                except OSError as ex:
                    return _failure(ex.errno or 0, "directory", ex.strerror or "")
                self.cwd = directory
            fds = []
            for which, stream in zip(("stdin", "stdout", "stderr"), streams):
                if stream is None:
                    fds.append(self.devnull)
                elif isinstance(stream, int):
                    fds.append(passed[stream])
                elif which == "stderr" and stream == streams[1]:
                    fds.append(fds[1])
                else:
                    try:
                        fd = os.open(stream, _READ if which == "stdin" else _WRITE, 0o666)
                    except OSError as ex:
                        return _failure(ex.errno or 0, which, ex.strerror or "")
                    opened.append(fd)
                    fds.append(fd)
            reply = self.spawn(("spawn", program, argv, directory, env, job_id, journal,
                                registry, in_registry), fds)
            if reply[0] != "ok" and self.refused_for_now(reply[1]):
                kept = passed
                return None
        finally:
            for fd in opened + passed:
                if fd not in kept:
                    os.close(fd)
        if reply[0] != "ok":
            if reply[1] in _FOR_NOW:
                return _failure(reply[1], "spawn", f"{reply[2]} (starts were refused so for "
                                f"{_RETRY_SECONDS:g} s: the system's limit on processes, "
                                "ulimit -u, or its memory was reached)")
            return _failure(reply[1], "spawn", reply[2])
        return reply[1], start_time(reply[1])

    def send(self, reply: Tuple[Any, ...]) -> None:
        data = marshal.dumps(reply)
        self.requests.sendall(_HEADER.pack(len(data)) + data)

    def spawn(self, request: Tuple[Any, ...], fds: List[int]) -> Tuple[Any, ...]:
        if len(request) != 9 or not all(isinstance(x, str) for x in request[5:8]) \
                or not isinstance(request[8], bool):
            return ("err", 0, f"a spawn request has 9 items, 3 texts then a bool last: "
                              f"{request!r:.80}")
        _, program, argv, directory, env, _job_id, _journal, _registry, _in_registry = request
        if len(fds) != 3:
            return ("err", 0, f"expected 3 stream descriptors, got {len(fds)}")
        try:
            pid = _SPAWN.start(argv, directory, env, (fds[0], fds[1], fds[2]), program=program,
                               may_chdir=True, restore=_RESTORED)
        except OSError as ex:
            return ("err", ex.errno or 0, ex.strerror or str(ex))
        except (UnicodeEncodeError, ValueError, TypeError) as ex:
            return ("err", 0, str(ex))
        return ("ok", pid)

    # -- output ---------------------------------------------------------------------------------

    def append(self, journal: str, line: str) -> None:
        """Append to a journal, keeping at most :data:`_MAX_OPEN` of them open."""
        try:
            fd = self.journals.get(journal)
            if fd is None:
                fd = self.journals[journal] = os.open(journal, _JOURNAL_FLAGS, 0o600)
                while len(self.journals) > _MAX_OPEN:
                    os.close(self.journals.popitem(last=False)[1])
            else:
                self.journals.move_to_end(journal)
            os.write(fd, line.encode("utf-8", "surrogateescape"))
        except OSError as ex:
            self.note(f"keeper: journal {journal}: {ex}")

    def flush_events(self) -> None:
        while self.pending:
            try:
                n = os.write(self.events, self.pending)
            except BlockingIOError:
                break
            except OSError:  # the reader is gone
                self.pending = b""
                break
            self.pending = self.pending[n:]
        waiting = bool(self.pending)
        if waiting != self.events_waiting:
            self.events_waiting = waiting
            if waiting:
                self.selector.register(self.events, selectors.EVENT_WRITE, "events")
            else:
                self.selector.unregister(self.events)

    @staticmethod
    def note(text: str) -> None:
        try:
            os.write(2, (text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def _failure(code: int, what: str, words: str) -> bytes:
    """The events line saying a job could not be started."""
    text = " ".join(str(words).split())
    return f"f {code} {what} {text}\n".encode("utf-8", "replace")


def _number(value: Any) -> float:
    """A number of a request (a bool or a text is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r:.40}")
    return float(value)


def _group(value: Any) -> int:
    """A process group id of a request."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a process group id, got {value!r:.40}")
    return value


def main(argv: List[str]) -> int:
    global _SPAWN
    try:
        _SPAWN = load_layer()
    except Exception as ex:  # the requester sees the socket close and starts its jobs itself
        Keeper.note(f"keeper: cannot load the process layer {layer_path()}: {ex!r}")
        return LAYER_FAILED
    requests_fd, events_fd, final_rank = int(argv[1]), int(argv[2]), int(argv[3])
    for fd in (requests_fd, events_fd):
        os.set_inheritable(fd, False)
    # Blocking: it is read only when the loop saw it readable, and answers are short.
    requests = socket.socket(fileno=requests_fd)
    Keeper(requests, events_fd, final_rank).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
