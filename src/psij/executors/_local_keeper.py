"""The keeper of a process's local jobs: it starts them, is their parent, and records how each
one ended, even after the process that asked for them is gone.

A Python process that runs local jobs starts one keeper (on its first job; see
``_keeper_client``), which runs this file with the standard library only (``python -I -S
_local_keeper.py REQUESTS EVENTS FINAL_RANK``). The process sends a request per job on the
``REQUESTS`` socket; the keeper starts the program with ``posix_spawn`` as the leader of a new
process group, answers with the pid, and appends ``S <pid> <start> <job id>`` to the journal
the request names. When a job ends the keeper reaps it, appends ``E <pid> <start> <exit code>``
and writes ``<pid> <wait status>`` to the ``EVENTS`` pipe.

When the requesting process ends (``kill -9`` included) the socket closes: the keeper stops
taking requests, goes on reaping and journaling until its last job has ended, writes the
final state of each job that ended meanwhile to the job registry the request named (rank
``FINAL_RANK``, only if the job is not final there yet), and exits. So a job that ends after
its submitter died still has its real exit code.

Requests (a length-prefixed ``marshal`` tuple, the job's three standard streams passed as
descriptors with the length):

- ``("spawn", program, argv, directory, env, job_id, journal, registry)`` → ``("ok", pid)``
  or ``("err", errno, text)``;
- ``("signal", pgid, signum)`` → ``("ok", sent)``: signals the group only while its leader is
  a child not yet reaped (so the id cannot have been reused).

The keeper is single-threaded: it may change its working directory before each spawn. It runs
no user code and reads no file but ``/proc/<pid>/stat``.
"""

import marshal
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

_HEADER = struct.Struct("!I")
_MAX_REQUEST = 1 << 30
# Ignored here (by Python, or by the keeper so that a terminal's signals spare it), and
# ignored signals stay ignored across exec: a job gets their default actions back.
_IGNORED = ("SIGINT", "SIGHUP", "SIGTERM")
_RESTORED = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", *_IGNORED)
                  if hasattr(signal, n))
_GROUP: Dict[str, Any] = {"setpgroup": 0} if sys.version_info >= (3, 11) else {"setsid": True}
_JOURNAL_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
_MAX_OPEN = 32


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


class Keeper:
    def __init__(self, requests: socket.socket, events: int, final_rank: int) -> None:
        self.requests = requests
        self.events = events
        self.journals: OrderedDict[str, int] = OrderedDict()  # the latest used last
        self.final_rank = final_rank
        # pid -> (start, job id, journal, registry)
        self.children: Dict[int, Tuple[str, str, str, str]] = {}
        self.pending = b""  # events not yet written (the pipe was full)
        self.events_waiting = False  # registered to write them when it can
        # (registry, job id, code) of jobs that ended with nobody listening
        self.orphaned: List[Tuple[str, str, int]] = []
        self.parent_gone = False
        self.buffer = b""
        self.fds: List[int] = []
        self.cwd = os.getcwd()
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
        while not (self.parent_gone and not self.children):
            events = self.selector.select(None if not self.orphaned else 0.05)
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
            if self.orphaned and (not events or not self.children or len(self.orphaned) >= 100):
                self.record_orphans()  # a batch: what ended within about 50 ms
        self.record_orphans()

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            found = self.children.pop(pid, None)
            if found is None:
                continue
            start, job_id, journal, registry = found
            code = exit_code(status)
            self.append(journal, f"E {pid} {start} {code}\n")
            if self.parent_gone:
                self.orphaned.append((registry, job_id, code))
            else:
                self.pending += f"{pid} {status}\n".encode()
                self.flush_events()

    # -- requests -------------------------------------------------------------------------------

    def read_requests(self) -> None:
        try:
            data, anc, _flags, _addr = self.requests.recvmsg(
                65536, socket.CMSG_SPACE(3 * 4 * 4), socket.MSG_CMSG_CLOEXEC)
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
        started: Optional[Tuple[int, Tuple[str, str, str]]] = None
        if request[0] == "spawn":
            fds, self.fds = self.fds[:3], self.fds[3:]
            try:
                reply = self.spawn(request, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            if reply[0] == "ok":
                started = (reply[1], request[5:8])
        elif request[0] == "signal" and len(request) == 3:
            try:
                reply = ("ok", self.signal(int(request[1]), int(request[2])))
            except (TypeError, ValueError) as ex:
                reply = ("err", 0, f"a signal request holds a group and a signal: {ex}")
        else:
            reply = ("err", 0, f"unknown request {request[0]!r:.80}")
        self.send(reply)
        if started is not None:  # after the answer: the requester need not wait for it
            pid, (job_id, journal, registry) = started
            start = start_time(pid)
            self.children[pid] = (start, job_id, journal, registry)
            self.append(journal, f"S {pid} {start} {job_id}\n")

    def send(self, reply: Tuple[Any, ...]) -> None:
        data = marshal.dumps(reply)
        self.requests.sendall(_HEADER.pack(len(data)) + data)

    def spawn(self, request: Tuple[Any, ...], fds: List[int]) -> Tuple[Any, ...]:
        if len(request) != 8 or not all(isinstance(x, str) for x in request[5:]):
            return ("err", 0, f"a spawn request has 8 items, the last 3 text: {request!r:.80}")
        _, program, argv, directory, env, _job_id, _journal, _registry = request
        if len(fds) != 3:
            return ("err", 0, f"expected 3 stream descriptors, got {len(fds)}")
        try:
            if directory != self.cwd:
                os.chdir(directory)
                self.cwd = directory
            pid = os.posix_spawn(program, argv, env, setsigdef=_RESTORED,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, fds[0], 0),
                                               (os.POSIX_SPAWN_DUP2, fds[1], 1),
                                               (os.POSIX_SPAWN_DUP2, fds[2], 2)],
                                 **_GROUP)
        except OSError as ex:
            return ("err", ex.errno or 0, ex.strerror or str(ex))
        except (UnicodeEncodeError, ValueError, TypeError) as ex:
            return ("err", 0, str(ex))
        return ("ok", pid)

    def signal(self, pgid: int, signum: int) -> bool:
        if pgid not in self.children:
            return False
        try:
            os.killpg(pgid, signum)
        except OSError:
            return False
        return True

    # -- output ---------------------------------------------------------------------------------

    def append(self, journal: str, line: str) -> None:
        """Append to a journal, keeping at most :data:`_MAX_OPEN` of them open."""
        try:
            fd = self.journals.get(journal)
            if fd is None:
                fd = self.journals[journal] = os.open(journal, _JOURNAL_FLAGS)
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

    def record_orphans(self) -> None:
        """The final states of jobs that ended after the requesting process, in the registry
        (one transaction); a job already final there (cancelled by someone) keeps its state."""
        done, self.orphaned = self.orphaned, []
        by_registry: Dict[str, List[Tuple[str, int]]] = {}
        for registry, job_id, code in done:
            by_registry.setdefault(registry, []).append((job_id, code))
        for registry, ended in by_registry.items():
            try:
                self.record(registry, ended)
            except Exception as ex:  # this registry only: the others are written
                self.note(f"keeper: registry {registry}: {ex}")

    def record(self, registry: str, ended: List[Tuple[str, int]]) -> None:
        import sqlite3

        if not registry or not os.path.isfile(registry):
            return  # never made (recording off) or removed: nothing to update
        conn = sqlite3.connect(registry, timeout=60)
        try:
            with conn:
                now = time.time()
                conn.executemany(
                    "UPDATE jobs SET state = ?, rank = ?, exit_code = ?, message = ?, "
                    "updated = ?, final = 1 WHERE id = ? AND final = 0",
                    [("COMPLETED" if code == 0 else "FAILED", self.final_rank, code,
                      None if code == 0 else _message(code), now, job_id)
                     for job_id, code in ended])
        finally:
            conn.close()

    @staticmethod
    def note(text: str) -> None:
        try:
            os.write(2, (text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def _message(code: int) -> str:
    """The words the local executor gives a failed job's exit code (``exit_message``)."""
    words = {126: " (command not executable)", 127: " (command not found)"}.get(code, "")
    if code > 128:
        try:
            return f"the job was killed by {signal.Signals(code - 128).name} (exit code {code})"
        except ValueError:
            pass
    return f"the job exited with code {code}{words}"


def main(argv: List[str]) -> int:
    requests_fd, events_fd, final_rank = int(argv[1]), int(argv[2]), int(argv[3])
    for fd in (requests_fd, events_fd):
        os.set_inheritable(fd, False)
    # Blocking: it is read only when the loop saw it readable, and answers are short.
    requests = socket.socket(fileno=requests_fd)
    Keeper(requests, events_fd, final_rank).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
