"""The I/O loop of :mod:`psij.controller`: its rules are stated there.

One thread (the one calling :meth:`ControllerLoop.run`) owns the selector, the connections,
the timers and the machine; worker threads run executor calls and nothing else, and every
other thread only posts events (:meth:`ControllerLoop.post`).
"""

import collections
import logging
import os
import selectors
import signal
import socket
import stat
import threading
from contextlib import contextmanager
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Hashable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from psij._clock import Clock, MonotonicClock
from psij._line_framing import BadLine, LineFramer, decode_line, encode_line
from psij._wakeup import TimerHeap, Wakeup, timer_delay
from psij.controller import _values as v
from psij.controller._io import WorkerPool, describe_error, peer_of

__all__ = ["ControllerLoop"]

logger = logging.getLogger("psij.controller")

_TICK = object()  # the timer name of the periodic tick: no machine can name a timer so
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE


class _Listener:
    __slots__ = ("name", "path", "sock")

    def __init__(self, sock: socket.socket, name: str, path: Optional[str]) -> None:
        self.sock = sock
        self.name = name
        self.path = path


class _Connection:
    __slots__ = ("closing", "conn", "framer", "out", "sock", "unix")

    def __init__(self, conn: int, sock: socket.socket, limit: int, unix: bool) -> None:
        self.conn = conn
        self.sock = sock
        self.framer = LineFramer(limit)
        self.out = bytearray()
        self.closing = False
        self.unix = unix


class _Completed:
    """A worker's result on the queue: delivered as ``event``, and one call less in flight."""

    __slots__ = ("event",)

    def __init__(self, event: v.Event) -> None:
        self.event = event


class _SignalPipe:
    __slots__ = ("read",)

    def __init__(self, read: socket.socket) -> None:
        self.read = read


class ControllerLoop:
    """Runs ``machine`` (see :mod:`psij.controller` for the rules).

    :param machine: the controller's :class:`~psij.controller.Machine`.
    :param executors: the executor (or executors by name) that :class:`~psij.controller.Submit`,
        :class:`~psij.controller.Attach` and :class:`~psij.controller.Cancel` use; the
        executor named "" (or the only one given) is the default.
    :param clock: where the time given to the machine and the timers come from.
    :param tick: seconds between :class:`~psij.controller.Tick` events (None: no tick).
    :param workers: the most executor calls running at once.
    :param signals: the signals delivered as :class:`~psij.controller.SignalReceived` when the
        loop runs on the main thread.
    :param max_line_bytes: the longest line a connection may send.
    :param max_pending_bytes: the most bytes waiting to be sent on one connection.
    :param executor_factory: called with a name no executor is known by yet (from
        ``executors``), returns the executor to use for it from then on (or raises: the action
        then fails with the error's message). A controller serving many users makes one
        executor per user this way.
    :param action_handlers: the machine's own kinds of action, each run on the loop's thread
        by the function given for its class (writing the machine's journal, for instance);
        what the function raises is logged, and the loop goes on.
    """

    def __init__(self, machine: v.Machine,
                 executors: Union[Any, Mapping[str, Any], None] = None,
                 clock: Optional[Clock] = None, tick: Optional[float] = None,
                 workers: int = 4,
                 signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
                 max_line_bytes: int = 1024 * 1024,
                 max_pending_bytes: int = 64 * 1024 * 1024,
                 executor_factory: Optional[Callable[[str], Any]] = None,
                 action_handlers: Optional[Mapping[type, Callable[[Any], None]]] = None
                 ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: expected a whole number >= 1, got {workers!r}")
        if tick is not None and not (isinstance(tick, (int, float)) and 0 < tick < 86400):
            raise ValueError(f"tick: expected seconds > 0 and < 86400, or None, got {tick!r}")
        self.machine = machine
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        if executors is None:
            self._executors: Dict[str, Any] = {}
        elif isinstance(executors, Mapping):
            self._executors = dict(executors)
            if "" not in self._executors and len(self._executors) == 1:
                self._executors[""] = next(iter(self._executors.values()))
        else:
            self._executors = {"": executors}
        self._executor_factory = executor_factory
        self._action_handlers: Dict[type, Callable[[Any], None]] = dict(action_handlers or {})
        self._tick = tick
        self._signals = tuple(signals)
        self._max_line = max_line_bytes
        self._max_pending = max_pending_bytes
        self._wakeup = Wakeup()
        self._posted: Deque[Any] = collections.deque()
        self._pool = WorkerPool(workers)
        self._in_flight = 0
        self._jobs: Dict[Hashable, Any] = {}
        self._job_executor: Dict[Hashable, Any] = {}
        self._timers: TimerHeap[Hashable] = TimerHeap()
        self._listeners: List[_Listener] = []
        self._connections: Dict[int, _Connection] = {}
        self._next_conn = 0
        self._stop: Optional[Tuple[int, float]] = None
        self._exit_code: Optional[int] = None
        self._started = False
        self.steps = 0
        """How many events the machine has been given."""

    # -- what other threads may call --------------------------------------------------------

    def post(self, event: v.Event) -> None:
        """Give ``event`` to the machine on the loop's thread; safe from any thread."""
        self._posted.append(event)
        self._wakeup.wake()

    # -- set-up -----------------------------------------------------------------------------

    def listen_unix(self, path: str, mode: int = 0o600, name: str = "unix") -> str:
        """Accept connections on a Unix socket at ``path`` (with permissions ``mode``); a stale
        socket left there by a process that died is replaced, a live one is an error.
        Returns ``path``."""
        if os.path.lexists(path):
            info = os.lstat(path)
            if not stat.S_ISSOCK(info.st_mode):
                raise FileExistsError(f"{path}: exists and is not a socket; not replacing it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise FileExistsError(f"{path}: another process is listening on it")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        self._add_listener(sock, name, path)
        return path

    def listen_tcp(self, host: str = "127.0.0.1", port: int = 0,
                   name: str = "tcp") -> Tuple[str, int]:
        """Accept TCP connections on ``host:port`` (0: any free port); returns the address."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self._add_listener(sock, name, None)
        address = sock.getsockname()
        return str(address[0]), int(address[1])

    def _add_listener(self, sock: socket.socket, name: str, path: Optional[str]) -> None:
        sock.listen(128)
        sock.setblocking(False)
        listener = _Listener(sock, name, path)
        self._listeners.append(listener)
        self._wakeup.register(sock, _READ, listener)

    # -- running ----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until the machine stops the loop; returns the exit code it gave."""
        with self._signal_pipe():
            try:
                self.start()
                while self._exit_code is None:
                    self.run_once(self._timeout())
            finally:
                self.close()
        assert self._exit_code is not None
        return self._exit_code

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once the loop has stopped, None while it runs."""
        return self._exit_code

    def start(self) -> None:
        """Give the machine :class:`~psij.controller.Started` (once); :meth:`run` calls it."""
        if not self._started:
            self._started = True
            if self._tick is not None:
                self._set_timer(_TICK, self._tick)
            self._deliver(v.Started())

    def run_once(self, timeout: Optional[float] = 0.0) -> None:
        """Wait at most ``timeout`` seconds for I/O, then deliver what happened: I/O events,
        posted events, due timers. Tests call it with a manual clock."""
        self.start()
        for key, mask in self._wakeup.select(timeout):
            data = key.data
            if isinstance(data, _Connection):
                if mask & _WRITE:
                    self._flush(data)
                if mask & _READ and data.conn in self._connections:
                    self._read(data)
            elif isinstance(data, _Listener):
                self._accept(data)
            elif isinstance(data, _SignalPipe):
                self._read_signals(data)
        posted = self._posted
        # Only what was posted before this round: under a steady stream of completions the
        # sockets, signals and timers still get their turn every round.
        for _ in range(len(posted)):
            event = posted.popleft()
            if type(event) is _Completed:
                self._in_flight -= 1
                event = event.event
            self._deliver(event)
        self._fire_timers()
        self._check_stop()

    def _timeout(self) -> Optional[float]:
        if self._posted:
            return 0.0
        now = self.clock.now()
        when = self._timers.next_due()
        if self._stop is not None:
            when = self._stop[1] if when is None else min(when, self._stop[1])
        return None if when is None else timer_delay(when - now)

    def _deliver(self, event: v.Event) -> None:
        self.steps += 1
        try:
            actions = list(self.machine.step(event, self.clock.now()))
        except Exception:
            logger.exception("controller: the machine failed on %r; going on with the next event",
                             event)
            return
        for action in actions:
            try:
                self._act(action)
            except Exception:
                logger.exception("controller: action %r failed; going on", action)

    # -- actions ----------------------------------------------------------------------------

    def _act(self, action: v.Action) -> None:
        kind = type(action)
        if kind is v.Send:
            self._send(action.conn, action.message)  # type: ignore[attr-defined]
        elif kind is v.Submit:
            self._submit(action)  # type: ignore[arg-type]
        elif kind is v.Cancel:
            self._cancel(action.key, action.kill)  # type: ignore[attr-defined]
        elif kind is v.SetTimer:
            self._set_timer(action.name, action.delay)  # type: ignore[attr-defined]
        elif kind is v.CancelTimer:
            self._timers.cancel(action.name)  # type: ignore[attr-defined]
        elif kind is v.Log:
            logger.log(action.level, "%s", action.message)  # type: ignore[attr-defined]
        elif kind is v.Forget:
            self._jobs.pop(action.key, None)  # type: ignore[attr-defined]
            self._job_executor.pop(action.key, None)  # type: ignore[attr-defined]
        elif kind is v.Attach:
            self._attach(action)  # type: ignore[arg-type]
        elif kind is v.Call:
            self._call(action.key, v.ActionKind.CALL, action.function)  # type: ignore[attr-defined]
        elif kind is v.Close:
            self._close_when_sent(action.conn)  # type: ignore[attr-defined]
        elif kind is v.Stop:
            self._begin_stop(action)  # type: ignore[arg-type]
        else:
            handler = self._action_handlers.get(kind)
            if handler is None:
                raise TypeError(f"not a controller action: {action!r}")
            handler(action)

    def _executor(self, key: Hashable, action: v.ActionKind, name: str) -> Any:
        executor = self._executors.get(name)
        if executor is None and self._executor_factory is not None:
            try:
                executor = self._executor_factory(name)
            except Exception as error:
                self.post(v.ActionFailed(key, action, f"no executor for {name!r}: "
                                       f"{describe_error(error)}", error))
                return None
            self._executors[name] = executor
        if executor is None:
            known = ", ".join(repr(n) for n in sorted(self._executors)) or "none"
            self.post(v.ActionFailed(key, action, f"no executor named {name!r} (known: {known})",
                                   None))
        return executor

    def _new_job(self, key: Hashable, spec: Any) -> Any:
        from psij.job import Job
        job = Job(spec)
        post = self.post

        def changed(_job: Any, status: Any) -> None:
            post(v.JobStatusChanged(key, status))

        job._add_watcher(changed)  # every state, and restatements (the scheduler holds it)
        return job

    def _submit(self, action: v.Submit) -> None:
        key = action.key
        if key in self._jobs:
            self.post(v.ActionFailed(key, v.ActionKind.SUBMIT,
                                     f"a job is already known as {key!r}", None))
            return
        executor = self._executor(key, v.ActionKind.SUBMIT, action.executor)
        if executor is None:
            return
        try:
            job = self._new_job(key, action.spec)
        except Exception as error:
            self.post(v.ActionFailed(key, v.ActionKind.SUBMIT,
                                     f"cannot make a job of the spec: {error}", error))
            return
        self._jobs[key] = job
        self._job_executor[key] = executor

        def submit() -> Any:
            executor.submit(job)
            return job.native_id

        self._call(key, v.ActionKind.SUBMIT, submit)

    def _attach(self, action: v.Attach) -> None:
        key = action.key
        if key in self._jobs:
            self.post(v.ActionFailed(key, v.ActionKind.ATTACH,
                                     f"a job is already known as {key!r}", None))
            return
        executor = self._executor(key, v.ActionKind.ATTACH, action.executor)
        if executor is None:
            return
        job = self._new_job(key, None)
        self._jobs[key] = job
        self._job_executor[key] = executor
        native_id = action.native_id

        def attach() -> Any:
            executor.attach(job, native_id)
            return native_id

        self._call(key, v.ActionKind.ATTACH, attach)

    def _cancel(self, key: Hashable, kill: bool) -> None:
        job = self._jobs.get(key)
        if job is None:
            self.post(v.ActionFailed(key, v.ActionKind.CANCEL, f"no job is known as {key!r}", None))
            return
        executor = self._job_executor[key]
        how = getattr(executor, "kill", None) if kill else None  # duck-typed executors too
        self._call(key, v.ActionKind.CANCEL, (lambda: how(job)) if callable(how)
                   else (lambda: executor.cancel(job)))

    def _call(self, key: Hashable, action: v.ActionKind, function: Callable[[], Any]) -> None:
        self._in_flight += 1
        posted, wake = self._posted, self._wakeup.wake

        def post(completed: _Completed) -> None:
            posted.append(completed)
            wake()

        def done(ok: bool, value: Any) -> None:
            if ok:
                post(_Completed(v.ActionDone(key, action, value)))
            else:
                post(_Completed(v.ActionFailed(key, action, describe_error(value), value)))

        self._pool.run(function, done)

    def job(self, key: Hashable) -> Any:
        """The :class:`~psij.Job` the loop holds for ``key`` (None when there is none)."""
        return self._jobs.get(key)

    def _set_timer(self, name: Hashable, delay: float) -> None:
        when = self.clock.now() + timer_delay(float(delay))
        self._timers.set(name, when, name)

    def _fire_timers(self) -> None:
        timers = self._timers
        now = self.clock.now()
        while True:
            due = timers.pop_due(now)
            if due is None:
                return
            name = due[1]
            if name is _TICK:
                assert self._tick is not None
                self._set_timer(_TICK, self._tick)
                self._deliver(v.Tick())
            else:
                self._deliver(v.TimerFired(name))

    def _begin_stop(self, action: v.Stop) -> None:
        if action.reason:
            logger.info("controller: stopping (exit code %d): %s", action.exit_code, action.reason)
        grace = timer_delay(float(action.grace)) if action.grace == action.grace else 0.0
        if self._stop is None:
            self._stop = (int(action.exit_code), self.clock.now() + grace)
        else:
            self._stop = (int(action.exit_code), min(self._stop[1], self.clock.now() + grace))

    def _check_stop(self) -> None:
        stop = self._stop
        if stop is None or self._exit_code is not None:
            return
        if self._in_flight == 0 and not self._posted:
            self._exit_code = stop[0]
        elif self.clock.now() >= stop[1]:
            logger.warning("controller: %d executor call(s) still running after the grace "
                           "period; stopping without them", self._in_flight)
            self._exit_code = stop[0]

    # -- connections ------------------------------------------------------------------------

    def _accept(self, listener: _Listener) -> None:
        for _ in range(64):
            try:
                sock, address = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                # Out of descriptors, for one: the others still get served.
                logger.warning("controller: accepting on %s failed: %s", listener.name, error)
                return
            sock.setblocking(False)
            unix = listener.path is not None
            peer = peer_of(sock, address, unix)
            self._next_conn += 1
            conn = _Connection(self._next_conn, sock, self._max_line, unix)
            self._connections[conn.conn] = conn
            self._wakeup.register(sock, _READ, conn)
            self._deliver(v.Connected(conn.conn, peer, listener.name))

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(256 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._drop(conn, f"read error: {error}")
            return
        if not data:
            self._drop(conn, "closed by the peer")
            return
        framer = conn.framer
        for line in framer.feed(data):
            if conn.conn not in self._connections:
                return  # the machine closed it on an earlier line
            self._deliver_line(conn.conn, line)
        if framer.too_long:
            self._deliver(v.BadMessage(conn.conn, f"line longer than {self._max_line} bytes"))
            self._drop(conn, "line too long")

    def _deliver_line(self, conn: int, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = decode_line(line)
        except BadLine as bad:
            self._deliver(v.BadMessage(conn, str(bad), bad.field, bad.value))
            return
        self._deliver(v.MessageReceived(conn, message))

    def _send(self, conn_id: int, message: Any) -> None:
        conn = self._connections.get(conn_id)
        if conn is None or conn.closing:
            logger.debug("controller: not sending to connection %s: it is closed", conn_id)
            return
        try:
            conn.out += encode_line(message)
        except (TypeError, ValueError) as error:
            logger.error("controller: cannot send %r on connection %s: %s", message, conn_id,
                         error)
            return
        if len(conn.out) > self._max_pending:
            self._drop(conn, f"peer not reading: more than {self._max_pending} bytes waiting")
            return
        self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        out = conn.out
        while out:
            try:
                sent = conn.sock.send(out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                self._drop(conn, f"write error: {error}")
                return
            del out[:sent]
        if conn.conn not in self._connections:
            return
        if out:
            self._wakeup.modify(conn.sock, _READ | _WRITE, conn)
        elif conn.closing:
            self._drop(conn, "closed by the controller")
        else:
            self._wakeup.modify(conn.sock, _READ, conn)

    def _close_when_sent(self, conn_id: int) -> None:
        conn = self._connections.get(conn_id)
        if conn is None:
            return
        conn.closing = True
        self._flush(conn)

    def _drop(self, conn: _Connection, reason: str) -> None:
        if self._connections.pop(conn.conn, None) is None:
            return
        try:
            self._wakeup.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        self._deliver(v.Disconnected(conn.conn, reason))

    # -- signals ----------------------------------------------------------------------------

    @contextmanager
    def _signal_pipe(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread() or not self._signals:
            yield
            return
        read, write = socket.socketpair()
        read.setblocking(False)
        write.setblocking(False)
        previous_fd = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        previous: Dict[int, Any] = {}
        try:
            for signum in self._signals:
                previous[signum] = signal.signal(signum, _caught)
            self._wakeup.register(read, _READ, _SignalPipe(read))
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            try:
                self._wakeup.unregister(read)
            except (KeyError, ValueError):
                pass
            read.close()
            write.close()

    def _read_signals(self, pipe: _SignalPipe) -> None:
        try:
            data = pipe.read.recv(512)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            if signum not in self._signals:
                continue
            second = self._stop is not None
            self._deliver(v.SignalReceived(signum))
            if second and self._stop is not None and self._exit_code is None:
                logger.warning("controller: second stop signal; stopping at once")
                self._exit_code = self._stop[0]

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the listeners (removing their socket files) and the connections."""
        for listener in self._listeners:
            try:
                self._wakeup.unregister(listener.sock)
            except (KeyError, ValueError):
                pass
            listener.sock.close()
            if listener.path is not None:
                try:
                    os.unlink(listener.path)
                except OSError:
                    pass
        self._listeners = []
        for conn in list(self._connections.values()):
            if conn.out:
                try:
                    conn.sock.send(conn.out)
                except OSError:
                    pass
            self._connections.pop(conn.conn, None)
            conn.sock.close()
        self._pool.close()


def _caught(signum: int, frame: Any) -> None:
    """The Python-level handler: the byte on the wake-up pipe is what the loop reads."""
