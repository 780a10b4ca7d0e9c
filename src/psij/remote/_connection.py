"""One SSH connection to a remote ``psij remote serve``, shared by every remote executor of a
process that names the same target.

A reader thread takes the server's lines: answers wake the caller waiting for them; status
events go, in order, to a dispatcher thread that hands each to the follower of its job (so a
status callback may itself call the executor). When the connection drops, the requests not yet
answered are kept, a reconnecting thread starts ``ssh`` again with growing pauses (0.1 s
doubling to 30 s), sends them again on the new connection (each means the same when sent
twice) and then runs the reconnect hooks (the executors ask for the current status of their
jobs). A caller waits at most :attr:`Connection.call_timeout` for its answer.
"""

import atexit
import collections
import logging
import os
import queue
import re
import select
import subprocess
import threading
import weakref
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from psij._clock import MonotonicClock
from psij._line_framing import BadLine, LineFramer, decode_line, encode_line
from psij._spawn import popen
from psij.remote._protocol import (
    HELLO_KEY,
    MAX_LINE,
    PROTOCOL,
    RemoteConnectError,
    RemoteError,
    RemoteProtocolError,
    RemoteVersionError,
    raised,
)
from psij.remote._target import Target
from psij.version import __version__

logger = logging.getLogger(__name__)

_CLOCK = MonotonicClock()
HELLO_TIMEOUT = 60.0
BACKOFF = (0.1, 30.0)
Follower = Callable[[Mapping[str, Any]], None]


class _Pending:
    __slots__ = ("answer", "done", "error", "line", "sent")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.sent: Optional[int] = None  # the connection it was written on
        self.done = threading.Event()
        self.answer: Optional[Mapping[str, Any]] = None
        self.error: Optional[Exception] = None


def _shown(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."


# ssh's own words for a login the server refused ("user@host: Permission denied (publickey).");
# a remote shell that cannot run a command says "...: Permission denied" with no methods after it.
_LOGIN_REFUSED = re.compile(r"Permission denied \((?:publickey|password|keyboard-interactive"
                            r"|hostbased|gssapi)|Too many authentication failures")
_SSH_FAILED = 255  # the exit status of ssh itself failing (a remote command's is passed on)


def connect_error(target: Target, code: Optional[int], stderr: bytes) -> RemoteConnectError:
    """What an ``ssh`` that ended before the server's hello means, in words: ssh's own failure
    (its exit status 255: its configuration, the host key, the login) or, once logged in, the
    remote shell's (126: the command was found but could not be started; 127: not found)."""
    said = _shown(stderr, 600)
    where = target.where
    if ("Host key verification failed" in said or "HOST IDENTIFICATION HAS CHANGED" in said
            or "host key is known" in said):
        return RemoteConnectError(
            f"ssh to {where}: the host key is not one this machine's SSH configuration "
            f"accepts (unknown or changed), so the connection was refused; check it and add it "
            f"to known_hosts (for example by connecting once with ssh): {said}")
    if "Can't open user config file" in said or (
            code == _SSH_FAILED and "bad configuration option" in said.lower()):
        given = (f"the file given with ssh_config= in the URL ({target.ssh_config!r})"
                 if target.ssh_config is not None else "the file given to ssh with -F")
        return RemoteConnectError(
            f"ssh to {where}: ssh cannot use its configuration file, {given}; nothing was "
            f"sent to the host (check that the file exists on this machine and can be read): "
            f"{said}")
    if _LOGIN_REFUSED.search(said):
        return RemoteConnectError(
            f"ssh to {where}: the login was refused (no key or agent identity it accepts; "
            f"psij never asks for a password): {said}")
    logged_in = code is not None and code != _SSH_FAILED
    if "bad interpreter" in said:
        return RemoteConnectError(
            f"ssh to {where}: the login succeeded, but the remote psij command "
            f"{target.psij!r} could not be started: the interpreter its first line (#!) names "
            f"cannot be run there by that user (missing, or in a folder it may not enter); "
            f"install psij there with a Python that user can run, or give another one with "
            f"?psij=/path/to/psij in the URL or PSIJ_REMOTE_PSIJ: {said}")
    if code == 126 or (logged_in and "Permission denied" in said):
        return RemoteConnectError(
            f"ssh to {where}: the login succeeded, but the remote psij command "
            f"{target.psij!r} could not be started there by that user (not executable, or in "
            f"a folder it may not enter): {said}")
    if code == 127 or "command not found" in said or (
            code != _SSH_FAILED and "No such file or directory" in said):
        return RemoteConnectError(
            f"ssh to {where}: the remote psij command {target.psij!r} was not found there; "
            f"install psij on that host, or give its path with ?psij=/path/to/psij in the URL "
            f"or PSIJ_REMOTE_PSIJ: {said}")
    if "invalid choice: 'remote'" in said:
        return RemoteConnectError(
            f"ssh to {where}: the psij there has no 'remote serve' command (a version before "
            f"remote executors; this machine has psij {__version__}): {said}")
    if logged_in:
        return RemoteConnectError(
            f"ssh to {where}: the login succeeded, but the remote psij command "
            f"{target.psij!r} ended (exit status {code}) before it started its server: "
            f"{said or 'nothing was printed'}")
    return RemoteConnectError(f"ssh to {where} ended (exit status {code}) before the remote "
                              f"psij started: {said or 'nothing was printed'}")


def check_hello(line: bytes, target: Target) -> Dict[str, Any]:
    """The server's hello, or the error saying why ``line`` is not one this psij can talk to."""
    try:
        hello = decode_line(line)
    except BadLine:
        hello = None
    if not isinstance(hello, dict) or HELLO_KEY not in hello:
        raise RemoteProtocolError(
            f"ssh to {target.where}: the remote command {target.psij!r} did not start a psij "
            f"server; it printed {_shown(line)!r}")
    protocol = hello.get(HELLO_KEY)
    if protocol != PROTOCOL:
        raise RemoteVersionError(
            f"{target.where} runs psij {str(hello.get('version'))[:40]} (remote protocol "
            f"{str(protocol)[:20]}) and this machine psij {__version__} (remote protocol "
            f"{PROTOCOL}): they cannot talk; install the same psij version on both")
    return hello


class Connection:
    """See the module documentation. Made by :func:`connect`; raises RemoteError subclasses
    when the first connection cannot be made."""

    call_timeout = 300.0

    def __init__(self, target: Target) -> None:
        self.target = target
        self.users = 0
        self.closed = False
        self.hello: Dict[str, Any] = {}
        self.connects = 0
        self.last_error: Optional[Exception] = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._next_id = 0
        self._pending: Dict[int, _Pending] = {}
        self._followers: Dict[str, Follower] = {}
        self._hooks: List[weakref.WeakMethod[Callable[[], None]]] = []
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._generation = 0
        self._up = False
        self._reconnecting = False
        self._closing = threading.Event()
        self._events: queue.SimpleQueue[Optional[Mapping[str, Any]]] = queue.SimpleQueue()
        self._open()
        threading.Thread(target=self._dispatch, name="psij-remote-events", daemon=True).start()

    # -- the ssh process --------------------------------------------------------------------

    def _open(self) -> None:
        argv = self.target.argv()
        try:
            proc = popen(argv, env=None, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, bufsize=0)
        except OSError as ex:
            raise RemoteConnectError(f"cannot run {argv[0]!r} to reach {self.target.where}: "
                                     f"{ex.strerror or ex}") from None
        assert proc.stdout is not None and proc.stderr is not None
        stderr: Deque[bytes] = collections.deque(maxlen=64)
        drainer = threading.Thread(target=self._drain, args=(proc, stderr),
                                   name="psij-remote-stderr", daemon=True)
        drainer.start()
        try:
            line, rest = self._first_line(proc)
            if line is None:
                code = _wait(proc, 10.0)
                drainer.join(2.0)
                raise connect_error(self.target, code, b"".join(stderr))
            self.hello = check_hello(line, self.target)
        except BaseException:
            _stop(proc)
            raise
        with self._lock:
            self._generation += 1
            generation = self._generation
            self._proc = proc
            self._up = True
            self.connects += 1
        threading.Thread(target=self._read, args=(proc, generation, rest),
                         name="psij-remote-reader", daemon=True).start()

    def _first_line(self, proc: "subprocess.Popen[bytes]") -> Tuple[Optional[bytes], bytes]:
        """The server's first line and the bytes read after it; (None, b"") if it ended."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buffer = b""
        deadline = _CLOCK.now() + HELLO_TIMEOUT
        # poll, not select: select refuses descriptors past 1023, which a process with many
        # files open gives out
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in buffer:
            left = deadline - _CLOCK.now()
            if left <= 0:
                raise RemoteConnectError(f"ssh to {self.target.where}: no answer from the remote "
                                         f"psij in {HELLO_TIMEOUT:.0f} s")
            ready = poller.poll(min(left, 1.0) * 1000)
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                return (None, b"") if not buffer else (buffer, b"")
            buffer += data
            if len(buffer) > 65536 and b"\n" not in buffer:
                return buffer, b""
        line, _, rest = buffer.partition(b"\n")
        return line, rest

    def _drain(self, proc: "subprocess.Popen[bytes]", keep: Deque[bytes]) -> None:
        assert proc.stderr is not None
        fd = proc.stderr.fileno()
        try:
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                keep.append(data)
                logger.debug("ssh %s: %s", self.target.where, _shown(data))
        finally:
            # Closed here, by its only reader, once ssh is gone (an unclosed pipe is a
            # ResourceWarning when the process object goes).
            proc.stderr.close()

    def _read(self, proc: "subprocess.Popen[bytes]", generation: int, rest: bytes) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        framer = LineFramer(MAX_LINE)
        data = rest
        problem: Optional[Exception] = None
        while problem is None:
            for line in framer.feed(data):
                problem = self._take(line)
                if problem is not None:
                    break
            if framer.too_long:
                problem = RemoteProtocolError(f"{self.target.where} sent a line longer than "
                                              f"{MAX_LINE} bytes")
            if problem is not None:
                break
            try:
                data = os.read(fd, 1 << 20)
            except OSError:
                data = b""
            if not data:
                break
        self._lost(proc, generation, problem)

    def _take(self, line: bytes) -> Optional[Exception]:
        """Hand one line on; the protocol error it is, if it is not a message."""
        try:
            message = decode_line(line)
        except BadLine as ex:
            return RemoteProtocolError(f"{self.target.where} sent a line that is not the "
                                       f"remote protocol ({ex}): {_shown(line)!r}")
        if isinstance(message, dict) and "re" in message:
            request_id = message["re"]
            with self._lock:
                pending = self._pending.pop(request_id, None) \
                    if isinstance(request_id, int) else None
            if pending is not None:
                pending.answer = message
                pending.done.set()
            elif request_id is None:
                logger.warning("%s refused a request: %s", self.target.where,
                               str(message.get("error"))[:300])
            return None
        if isinstance(message, dict) and message.get("ev") == "status":
            self._events.put(message)
            return None
        return RemoteProtocolError(f"{self.target.where} sent a message that is not the remote "
                                   f"protocol: {_shown(line)!r}")

    def _lost(self, proc: "subprocess.Popen[bytes]", generation: int,
              problem: Optional[Exception]) -> None:
        _stop(proc)
        with self._lock:
            if generation != self._generation:
                return
            self._up = False
            if problem is not None:
                # A server that says what it should not: what it was asked fails now.
                failed = list(self._pending.values())
                self._pending.clear()
            else:
                failed = []
            start = not self.closed and not self._reconnecting
            self._reconnecting = self._reconnecting or start
        self.last_error = problem or RemoteError(f"the connection to {self.target.where} "
                                                 f"was lost")
        if problem is not None:
            logger.warning("%s", problem)
        for pending in failed:
            pending.error = problem
            pending.done.set()
        if start:
            threading.Thread(target=self._reconnect, name="psij-remote-reconnect",
                             daemon=True).start()

    def _reconnect(self) -> None:
        delay = BACKOFF[0]
        while not self.closed:
            try:
                self._open()
                break
            except RemoteError as ex:
                self.last_error = ex
                logger.info("reconnecting to %s: %s", self.target.where, ex)
            except Exception as ex:  # whatever it was, try again later
                self.last_error = ex
                logger.warning("reconnecting to %s", self.target.where, exc_info=True)
            _CLOCK.wait(self._closing, delay)
            delay = min(delay * 2, BACKOFF[1])
        with self._lock:
            self._reconnecting = False
            proc = self._proc if self.closed else None
        if self.closed:
            if proc is not None:  # closed while this connection was being made
                _stop(proc)
            return
        self._resend()
        for ref in list(self._hooks):
            hook = ref()
            if hook is None:
                continue
            try:
                hook()
            except Exception:
                logger.warning("a reconnect hook of %s raised", self.target.where, exc_info=True)

    def _resend(self) -> None:
        with self._lock:
            generation = self._generation
            lines = []
            for request_id in sorted(self._pending):
                pending = self._pending[request_id]
                if pending.sent != generation:
                    pending.sent = generation
                    lines.append(pending.line)
        for line in lines:
            self._write(line, generation)

    def _write(self, line: bytes, generation: int) -> None:
        with self._write_lock:
            proc = self._proc
            if proc is None or generation != self._generation or proc.stdin is None:
                return
            try:
                proc.stdin.write(line)
            except (OSError, ValueError):
                pass  # the reader sees the end and a new connection sends it again

    # -- use --------------------------------------------------------------------------------

    def call(self, op: str, fields: Mapping[str, Any], timeout: Optional[float] = None) -> Any:
        """Send a request and return the value of its answer; raises what the answer says
        (the exception kind it names, or RemoteError)."""
        if self.closed:
            raise RemoteError(f"the connection to {self.target.where} is closed")
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            pending = _Pending(encode_line({"id": request_id, "op": op, **fields}))
            self._pending[request_id] = pending
            if self._up:
                pending.sent = self._generation
        if pending.sent is not None:
            self._write(pending.line, pending.sent)
        wait = self.call_timeout if timeout is None else timeout
        if not pending.done.wait(wait):
            with self._lock:
                self._pending.pop(request_id, None)
            last = f" (last: {self.last_error})" if self.last_error is not None else ""
            raise RemoteError(f"no answer from {self.target.where} to {op} in {wait:g} s{last}")
        if pending.error is not None:
            raise pending.error
        answer = pending.answer
        assert answer is not None
        if answer.get("ok") is not True:
            raise raised(answer, self.target.where)
        return answer.get("value")

    def follow(self, job_id: str, follower: Follower) -> None:
        with self._lock:
            self._followers[job_id] = follower

    def unfollow(self, job_id: str) -> None:
        with self._lock:
            self._followers.pop(job_id, None)

    def on_reconnect(self, hook: Callable[[], None]) -> None:
        """Call the bound method ``hook`` after each reconnection (held weakly)."""
        self._hooks.append(weakref.WeakMethod(hook))

    def _dispatch(self) -> None:
        while True:
            message = self._events.get()
            if message is None:
                return
            with self._lock:
                follower = self._followers.get(message.get("job"))  # type: ignore[arg-type]
            if follower is None:
                continue
            try:
                follower(message)
            except Exception:
                logger.warning("a status from %s could not be taken", self.target.where,
                               exc_info=True)

    def kill(self) -> None:
        """End the ssh process as a dropped connection would (used by tests of faults)."""
        proc = self._proc
        if proc is not None:
            proc.kill()

    def close(self) -> None:
        """Close the channel (the server flushes its registry and exits) and stop."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._closing.set()
            proc = self._proc
            failed = list(self._pending.values())
            self._pending.clear()
        for pending in failed:
            pending.error = RemoteError(f"the connection to {self.target.where} was closed")
            pending.done.set()
        self._events.put(None)
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
            if _wait(proc, 20.0) is None:
                _stop(proc)


def _wait(proc: "subprocess.Popen[bytes]", timeout: float) -> Optional[int]:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is None:
        proc.kill()
        _wait(proc, 5.0)
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass


_POOL: Dict[Tuple[str, ...], Connection] = {}
_POOL_LOCK = threading.Lock()


def connect(target: Target) -> Connection:
    """The process's connection to ``target``, made if there is none (one per ssh command)."""
    key = tuple(target.argv())
    with _POOL_LOCK:
        conn = _POOL.get(key)
        if conn is None or conn.closed:
            conn = Connection(target)
            _POOL[key] = conn
        conn.users += 1
        return conn


def release(conn: Connection, wait: bool = True) -> None:
    """One user fewer; the last one closes the connection (``wait=False``: on a thread of its
    own, for a finalizer, which may run on any thread, one of psij's own among them)."""
    with _POOL_LOCK:
        conn.users -= 1
        if conn.users > 0:
            return
        for key, found in list(_POOL.items()):
            if found is conn:
                del _POOL[key]
    if wait:
        conn.close()
    else:
        threading.Thread(target=conn.close, name="psij-remote-close", daemon=True).start()


@atexit.register
def _close_all() -> None:
    with _POOL_LOCK:
        conns = list(_POOL.values())
        _POOL.clear()
    for conn in conns:
        conn.close()
