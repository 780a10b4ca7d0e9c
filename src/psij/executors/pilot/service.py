"""A running pilot you can submit into: the socket server of ``psij pilot serve`` and its client.

The server listens on a Unix socket that only its user can open (created 0600) and speaks
newline-delimited JSON. A request is ``{"id": N, "op": ..., ...}``; its reply carries the same
``id`` and ``"ok": true`` with data, or ``"ok": false`` with ``"error"`` (the message) and
``"kind"`` (``ValueError``, ``TypeError`` or ``RuntimeError``). Events of watched tasks are
pushed as ``{"event": {...}}`` lines (``TaskEvent.to_json``), in the engine's order.

Operations: ``ping``; ``submit`` (``tasks``: TaskSpec JSON list, ``watch``: push their events
to this connection); ``cancel`` (``task``); ``forget`` (``task``, one that ended: dropped, so
that a resume does not run it again); ``status`` (``tasks``); ``list`` (every task with
its state); ``watch`` (``tasks``, or null for all; the reply holds their current statuses, so
nothing is missed between the snapshot and the events); ``usage``; ``shutdown``.

One server thread owns the sockets; the engine's listener only appends encoded events to the
watching connections' buffers and wakes it, so a slow client never delays the engine. The
client keeps one connection and one reader thread; it never polls.

A request line longer than ``max_request_bytes`` (``--max-request-bytes``, 64 MiB by default)
gets an error reply (``"id": null``, ``"kind": "ValueError"``) and its connection is closed;
lines are read in time linear in their length (:mod:`psij._line_framing`). A line that is not
JSON, or holds what no request may (nesting deeper than 64, a number that is not finite:
:func:`psij._line_framing.decode_line`), gets an error reply (``ValueError``, with the
request's id when it could be read) and the connection goes on; a lone surrogate fails only
the task that holds it. When accepting fails
for want of file descriptors (EMFILE, ENFILE, ...), the server stops accepting for a while
(50 ms, doubling up to 1 s) instead of spinning or dying, and takes the waiting connections
once descriptors are free again; the connections it has are served all along.
"""

import errno
import itertools
import logging
import os
import selectors
import socket
import stat
import threading
from typing import Any, Callable, Dict, List, Optional, Set

from psij._clock import Clock, MonotonicClock
from psij._line_framing import (
    DEFAULT_MAX_LINE_BYTES,
    BadLine,
    LineFramer,
    decode_line,
    encode_line,
)
from psij._machine import IllegalEvent
from psij._private_dirs import ensure_private_dir
from psij._stop_signals import StopSignals
from psij._wakeup import Wakeup
from psij.executors.pilot.engine import PilotEngine
from psij.executors.pilot.tasks import TaskEvent, TaskSpec

__all__ = ["AlreadyRunning", "PilotClient", "PilotService", "PilotUnavailable",
           "answering", "socket_path_of"]

logger = logging.getLogger(__name__)

_RECV_SIZE = 65536
_KINDS = {"ValueError": ValueError, "TypeError": TypeError}
# accept() errors that concern one connection only (it went away): just go on. Any other
# (EMFILE, ENFILE, ENOBUFS, ENOMEM: no descriptor or memory now) pauses accepting.
_CONNECTION_ERRORS = (errno.ECONNABORTED, errno.EPROTO)
_ACCEPT_PAUSE_FIRST = 0.05
_ACCEPT_PAUSE_MAX = 1.0


class AlreadyRunning(Exception):
    """A live pilot already answers on the socket path."""


class PilotUnavailable(ConnectionError):
    """The pilot cannot be reached, or went away."""


def socket_path_of(url: str) -> str:
    """The socket path of ``unix:///path``, ``unix:/path`` or a plain path."""
    if url.startswith("unix://"):
        path = url[len("unix://"):]
    elif url.startswith("unix:"):
        path = url[len("unix:"):]
    else:
        path = url
    if not path or "://" in path:
        raise ValueError(f"url: {url!r} is not a pilot socket (unix:///path or a path)")
    return path


def answering(path: str, timeout: float = 2.0) -> bool:
    """Whether a pilot answers a ping on ``path``."""
    try:
        client = PilotClient(path, timeout=timeout)
    except PilotUnavailable:
        return False
    try:
        client.request("ping", timeout=timeout)
        return True
    except (PilotUnavailable, TimeoutError, RuntimeError):
        return False
    finally:
        client.close()


class _Connection:
    __slots__ = ("closing", "framer", "outbuf", "sock", "watch_all", "watched", "writing")

    def __init__(self, sock: socket.socket, max_line: int) -> None:
        self.sock = sock
        self.writing = False  # registered for write readiness (the socket buffer was full)
        self.closing = False  # answered a bad request: close once outbuf is sent
        self.framer = LineFramer(max_line)
        self.outbuf = bytearray()
        self.watch_all = False
        self.watched: Set[str] = set()


class PilotService:
    """Serves one engine on a Unix socket (see the module documentation)."""

    def __init__(self, engine: PilotEngine, path: str,
                 on_shutdown: Optional[Callable[[], None]] = None,
                 max_request_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 clock: Optional[Clock] = None) -> None:
        """``clock`` measures the pause after a failed accept (default: monotonic)."""
        if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int) \
                or max_request_bytes < 1:
            raise ValueError(f"max_request_bytes: expected a whole number of bytes >= 1, got "
                             f"{max_request_bytes!r}")
        self.max_request_bytes = max_request_bytes
        self._accept_pause = 0.0  # the current pause after a failed accept, 0 when accepting
        self._accept_resume: Optional[float] = None  # when to listen again (on the clock)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._engine = engine
        self._path = path
        self._on_shutdown = on_shutdown
        self._lock = threading.Lock()
        self._connections: Dict[int, _Connection] = {}
        self._wakeup = Wakeup()
        self._selector = self._wakeup.selector
        self._listener: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = False

    def start(self) -> None:
        """Claim the socket path (refusing a live pilot, removing a stale socket), listen."""
        path = self._path
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise FileExistsError(f"{path!r} exists and is not a socket; not replacing it")
            if answering(path):
                raise AlreadyRunning(f"a pilot is already running on {path}")
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # The umask makes the socket 0600 from its creation: no moment where others may open it.
        old = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._engine.add_listener(self._on_event)
        self._thread = threading.Thread(target=self._loop, name="psij-pilot-service",
                                        daemon=True)
        self._thread.start()

    def close(self, flush_timeout: float = 1.0) -> None:
        """Stop serving: flush what is queued for clients (briefly), close, remove the socket."""
        self._engine.remove_listener(self._on_event)
        with self._lock:
            self._stopping = True
        self._wakeup.wake()
        if self._thread is not None:
            self._thread.join(flush_timeout + 1.0)
        try:
            os.unlink(self._path)
        except OSError:
            pass

    # -- engine side ------------------------------------------------------------------------

    def _on_event(self, event: TaskEvent) -> None:
        line = None
        with self._lock:
            for conn in self._connections.values():
                if conn.watch_all or event.task_id in conn.watched:
                    if line is None:
                        line = encode_line({"event": event.to_json()})
                    conn.outbuf += line
                    if event.state.final and not conn.watch_all:
                        conn.watched.discard(event.task_id)
        if line is not None:
            self._wakeup.wake()

    # -- server thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    stopping = self._stopping
                    pending = any(c.outbuf for c in self._connections.values())
                if stopping and not pending:
                    break
                timeout = self._resume_accepting()
                if stopping:
                    timeout = 0.2 if timeout is None else min(timeout, 0.2)
                for key, mask in self._wakeup.select(timeout):
                    if key.data is None:
                        self._accept()
                    else:
                        self._serve(key.data, mask)
                self._flush_all()
        except Exception:
            logger.exception("the pilot service thread failed")
        finally:
            for conn in list(self._connections.values()):
                self._drop(conn)
            if self._listener is not None:
                self._listener.close()
            self._wakeup.close()

    def _serve(self, conn: _Connection, mask: int) -> None:
        """One connection's turn; whatever goes wrong ends that connection only."""
        try:
            if mask & selectors.EVENT_READ and not conn.closing:
                self._read(conn)
            if mask & selectors.EVENT_WRITE:
                self._write(conn)
        except Exception:
            logger.exception("pilot service: a connection failed; closing it")
            self._drop(conn)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as ex:
            if ex.errno not in _CONNECTION_ERRORS:
                self._pause_accepting(ex)
            return
        if self._accept_pause:
            logger.warning("pilot service: accepting connections again")
            self._accept_pause = 0.0
        sock.setblocking(False)
        conn = _Connection(sock, self.max_request_bytes)
        with self._lock:
            self._connections[sock.fileno()] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _pause_accepting(self, ex: OSError) -> None:
        """Stop listening for a while (doubling each time it fails again)."""
        assert self._listener is not None
        if not self._accept_pause:
            logger.warning("pilot service: cannot accept connections (%s); retrying in %g s, "
                           "then less and less often until descriptors are free",
                           ex.strerror or ex, _ACCEPT_PAUSE_FIRST)
        self._accept_pause = min(_ACCEPT_PAUSE_MAX,
                                 max(_ACCEPT_PAUSE_FIRST, self._accept_pause * 2))
        self._accept_resume = self._clock.now() + self._accept_pause
        self._selector.unregister(self._listener)

    def _resume_accepting(self) -> Optional[float]:
        """Listen again when the pause is over; else the seconds left (None: not paused)."""
        if self._accept_resume is None:
            return None
        left = self._accept_resume - self._clock.now()
        if left > 0:
            return left
        assert self._listener is not None
        self._accept_resume = None
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        return None

    def _drop(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        for line in conn.framer.feed(data):
            if line.strip():
                reply = self._handle(conn, line)
                with self._lock:
                    conn.outbuf += encode_line(reply)
        if conn.framer.too_long:
            error = {"id": None, "ok": False, "kind": "ValueError",
                     "error": f"request line longer than {self.max_request_bytes} bytes (the "
                              f"pilot's --max-request-bytes); closing this connection"}
            with self._lock:
                conn.outbuf += encode_line(error)
            conn.closing = True
            self._write(conn)

    def _flush_all(self) -> None:
        with self._lock:
            ready = [c for c in self._connections.values() if c.outbuf]
        for conn in ready:
            self._write(conn)

    def _write(self, conn: _Connection) -> None:
        with self._lock:
            data = bytes(conn.outbuf)
        left = False
        if data:
            try:
                sent = conn.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._drop(conn)
                return
            with self._lock:
                del conn.outbuf[:sent]
                left = bool(conn.outbuf)
        if conn.closing and not left:
            self._drop(conn)
            return
        if left != conn.writing or conn.closing:
            conn.writing = left
            # A closing connection is not read any more: what it sends is not wanted.
            events = (0 if conn.closing else selectors.EVENT_READ) \
                | (selectors.EVENT_WRITE if left else 0)
            try:
                self._selector.modify(conn.sock, events, conn)
            except (KeyError, ValueError):
                pass

    # -- requests ---------------------------------------------------------------------------

    def _handle(self, conn: _Connection, line: bytes) -> Dict[str, Any]:
        request_id: Any = None
        try:
            try:
                # A lone surrogate fails only the task that holds it (the engine's rule).
                request = decode_line(line, surrogates=True)
            except BadLine as bad:
                # JSON, but a value in it is refused: answer its id still, when it has one.
                if isinstance(bad.value, dict):
                    request_id = _plain_id(bad.value.get("id"))
                raise
            if not isinstance(request, dict):
                raise ValueError("a request must be a JSON object")
            request_id = request.get("id")
            op = request.get("op")
            handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
            if handler is None:
                raise ValueError(f"op: {op!r} is not an operation of the pilot; accepted: "
                                 "ping, submit, cancel, forget, status, list, watch, usage, "
                                 "allocations, shutdown")
            reply: Dict[str, Any] = handler(conn, request)
            reply.update({"id": request_id, "ok": True})
            return reply
        except (ValueError, TypeError, RuntimeError, KeyError) as ex:
            kind = next((name for name, cls in _KINDS.items() if isinstance(ex, cls)),
                        "RuntimeError")
            text = str(ex) if not isinstance(ex, KeyError) else f"missing field {ex}"
            return {"id": request_id, "ok": False, "error": text, "kind": kind}

    def _op_ping(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        return {"pid": os.getpid(), "allocation": self._engine.allocation.describe()}

    def _op_submit(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        raw = request.get("tasks")
        if not isinstance(raw, list):
            raise TypeError(f"tasks: expected a list of tasks, got {raw!r}")
        tasks: List[TaskSpec] = []
        for i, item in enumerate(raw):
            try:
                tasks.append(TaskSpec.from_json(item))
            except (TypeError, ValueError) as ex:
                raise type(ex)(f"tasks[{i}]: {ex}") from ex
        watch = bool(request.get("watch"))
        if watch:
            # Before submitting: the first events may come before submit_many returns.
            with self._lock:
                conn.watched.update(t.name for t in tasks)
        try:
            ids = self._engine.submit_many(tasks)
        except BaseException:
            if watch:
                with self._lock:
                    conn.watched.difference_update(t.name for t in tasks)
            raise
        return {"ids": ids}

    def _op_cancel(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        self._engine.cancel(str(request["task"]))
        return {}

    def _op_forget(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        try:
            self._engine.forget(str(request["task"]))
        except IllegalEvent as ex:  # unknown, or not ended
            raise ValueError(f"task: {ex}") from ex
        return {}

    def _op_status(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        names = request.get("tasks")
        if not isinstance(names, list):
            raise TypeError(f"tasks: expected a list of task ids, got {names!r}")
        return {"statuses": [self._engine.status(str(n)).to_json() for n in names]}

    def _op_list(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        return {"tasks": [[s.task_id, s.state.value] for s in self._engine.statuses()]}

    def _op_watch(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        names = request.get("tasks")
        with self._lock:
            if names is None:
                conn.watch_all = True
            elif isinstance(names, list):
                conn.watched.update(str(n) for n in names)
            else:
                raise TypeError(f"tasks: expected a list of task ids or null, got {names!r}")
        # The snapshot is taken after the watch is in place: an event may repeat a state
        # already in it, but none is lost.
        statuses = self._engine.statuses() if names is None \
            else [self._engine.status(str(n)) for n in names]
        return {"statuses": [s.to_json() for s in statuses]}

    def _op_usage(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        usage = self._engine.usage()
        return {"usage": {**usage.as_dict(), "used_cores": usage.used_cores}}

    def _op_allocations(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        elastic = self._engine.elastic
        if elastic is None:
            raise ValueError("allocations: this pilot has no allocation policy")
        return {"allocations": elastic.status()}

    def _op_shutdown(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        if self._on_shutdown is not None:
            threading.Thread(target=self._on_shutdown, name="psij-pilot-shutdown",
                             daemon=True).start()
        return {}



def _plain_id(value: Any) -> Any:
    """A request id fit to be sent back: a string or a whole number, else None."""
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Optional[Dict[str, Any]] = None


class PilotClient:
    """One connection to a served pilot: requests with replies, and pushed task events.

    ``on_event`` is called on the client's reader thread for every pushed event;
    ``on_lost`` once, with a reason, when the connection ends.
    """

    def __init__(self, path: str, on_event: Optional[Callable[[TaskEvent], None]] = None,
                 on_lost: Optional[Callable[[str], None]] = None,
                 timeout: float = 10.0) -> None:
        self.path = path
        self._on_event = on_event
        self._on_lost = on_lost
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._lost: Optional[str] = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as ex:
            sock.close()
            raise PilotUnavailable(f"no pilot answers on {path}: {ex.strerror or ex}") from ex
        sock.settimeout(None)
        self._sock = sock
        self._reader = threading.Thread(target=self._read_loop, name="psij-pilot-client",
                                        daemon=True)
        self._reader.start()

    def request(self, op: str, timeout: Optional[float] = 60.0, **fields: Any) -> Dict[str, Any]:
        """Send one request and wait for its reply; raises ValueError/TypeError as the pilot
        did, PilotUnavailable when the connection is gone, TimeoutError after ``timeout``."""
        request_id = next(self._ids)
        pending = _Pending()
        with self._lock:
            if self._lost is not None:
                raise PilotUnavailable(self._lost)
            self._pending[request_id] = pending
        data = encode_line({"id": request_id, "op": op, **fields})
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as ex:
            with self._lock:
                self._pending.pop(request_id, None)
            raise PilotUnavailable(f"the pilot on {self.path} went away: {ex}") from ex
        if not pending.done.wait(timeout):
            with self._lock:
                self._pending.pop(request_id, None)
            raise TimeoutError(f"the pilot on {self.path} did not answer {op!r} within "
                               f"{timeout} s")
        reply = pending.reply
        if reply is None:
            raise PilotUnavailable(self._lost or f"the pilot on {self.path} went away")
        if not reply.get("ok"):
            kind = _KINDS.get(str(reply.get("kind")), RuntimeError)
            raise kind(str(reply.get("error")))
        return reply

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if threading.current_thread() is not self._reader:
            self._reader.join(2.0)

    def _read_loop(self) -> None:
        framer = LineFramer()
        reason = f"the pilot on {self.path} closed the connection"
        refused: Optional[str] = None
        try:
            while True:
                try:
                    data = self._sock.recv(_RECV_SIZE)
                except OSError as ex:
                    reason = f"the connection to the pilot on {self.path} failed: {ex}"
                    break
                if not data:
                    break
                for line in framer.feed(data):
                    if line.strip():
                        try:
                            message = decode_line(line, surrogates=True)
                            if not isinstance(message, dict):
                                raise BadLine("expected a JSON object")
                        except BadLine as ex:
                            refused = f"the pilot on {self.path} sent what is not a reply: {ex}"
                            return
                        if message.get("id") is None and message.get("ok") is False:
                            # Not the answer to a request: why the pilot is hanging up.
                            refused = f"the pilot on {self.path} closed the connection: " \
                                      f"{message.get('error')}"
                        self._dispatch(message)
        finally:
            self._sock.close()
            with self._lock:
                self._lost = reason = refused or reason
                pending, self._pending = self._pending, {}
            for waiter in pending.values():
                waiter.done.set()
            if self._on_lost is not None:
                try:
                    self._on_lost(reason)
                except Exception:
                    logger.exception("pilot client: connection-lost handler raised")

    def _dispatch(self, message: Dict[str, Any]) -> None:
        event = message.get("event")
        if event is not None:
            if self._on_event is not None:
                try:
                    self._on_event(TaskEvent.from_json(event))
                except Exception:
                    logger.exception("pilot client: event handler raised")
            return
        with self._lock:
            waiter = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
        if waiter is not None:
            waiter.reply = message
            waiter.done.set()


JOURNAL_NAME = "psij-pilot.journal"


def _read_policy(path: str) -> Any:
    """The allocation policy in the JSON file ``path`` (``--allocation-policy``)."""
    import json

    from psij.executors.pilot.allocation_policy import AllocationPolicy

    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as ex:
            raise ValueError(f"--allocation-policy {path}: not JSON: {ex}") from None
    return AllocationPolicy.from_json(data, f"--allocation-policy {path}")


def serve_main(socket_path: str, cores: Optional[int] = None, nodes: Optional[str] = None,
               work_directory: Optional[str] = None, resume: bool = False,
               max_request_bytes: int = DEFAULT_MAX_LINE_BYTES,
               gpus: Optional[str] = None, allocation_policy: Optional[str] = None,
               agent_host: Optional[str] = None) -> int:
    """``psij pilot serve``: run a pilot on a socket until SIGTERM/SIGINT; the exit status."""
    import signal
    import sys
    from pathlib import Path

    from psij.executors.pilot.allocation import allocation_from_options
    from psij.executors.pilot.engine_config import EngineConfig

    def say(message: str) -> None:
        print(f"psij pilot serve: {message}", file=sys.stderr, flush=True)

    path = os.path.abspath(socket_path)
    if os.path.lexists(path) and stat.S_ISSOCK(os.lstat(path).st_mode) and answering(path):
        say(f"already running on {path}")
        return 1
    wd = Path(work_directory or os.getcwd()).absolute()
    try:
        ensure_private_dir(wd, "pilot work directory (--wd)")
        allocation = allocation_from_options(cores, nodes, gpus=gpus)
        policy = None if allocation_policy is None else _read_policy(allocation_policy)
        engine = PilotEngine(allocation, EngineConfig(
            work_directory=wd, journal=wd / JOURNAL_NAME, resume=resume,
            allocation_policy=policy, agent_host=agent_host,
            agent_transport="auto" if agent_host is None else "tcp"))
    except (OSError, ValueError, TypeError) as ex:
        say(f"cannot start: {ex}")
        return 1
    stop = threading.Event()
    service = PilotService(engine, path, on_shutdown=stop.set,
                           max_request_bytes=max_request_bytes)
    with StopSignals(lambda signum: stop.set(), signals=(signal.SIGTERM, signal.SIGINT)):
        engine.start()
        try:
            service.start()
        except (AlreadyRunning, FileExistsError, OSError) as ex:
            engine.close()
            say("already running" if isinstance(ex, AlreadyRunning) else f"cannot start: {ex}")
            return 1
        say(f"serving {allocation.describe()} on {path}")
        say(f"GPUs of this node: {allocation.describe_gpus()}")
        while not stop.wait(1.0):
            if engine.failure is not None:
                # Its tasks have failed with the reason; clients see the socket close.
                say(f"stopping: {engine.failure}")
                engine.close()
                service.close()
                return 1
        say("stopping: cancelling running tasks")
        engine.close()
        service.close()
        return 0
