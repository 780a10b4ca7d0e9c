"""A pilot worker: the process that starts and reaps the tasks of the engine's own node.

The engine (its side is :mod:`~psij.executors.pilot._local_workers`) starts one or more of these
as ``python -c ...`` with a pipe from the engine as standard input, a pipe to it as standard
output, and the tasks' base environment as the worker's own environment: that environment is
thus sent once per worker, and a task brings only its own variables. Tasks are started by
:class:`~psij.executors.pilot._task_process.TaskProcesses` exactly as an agent starts them (own
process group, directory, redirections, a fresh ``TMPDIR`` and a node file), so what a task
sees does not depend on which process started it.

Protocol: one JSON object per line both ways (framed by :mod:`psij._line_framing`), each
carrying a batch, so that the engine's cost per task is a share of one message:

- engine to worker: ``{"op": "spawn", "tasks": [[id, argv, directory, environment, inherit,
  stdin, stdout, stderr, nodefile, create_directories], ...]}``; ``{"op": "signal", "tasks":
  [[id, grace], ...]}`` (TERM to the task's group now, KILL after ``grace`` seconds; an entry
  ``[id, grace, signum]`` sends ``signum`` alone, the signal asked for before the time limit);
  ``{"op": "stop"}``.
- worker to engine: ``{"op": "report", "started": [[id, pid], ...], "ended": [[id, code,
  message, cpu_seconds, max_rss_bytes], ...]}`` with what happened since the last one: at once
  when a task ended, a few milliseconds after a start otherwise (so that a short task costs one
  report). The last two of an end are the use of the task's leader process as the worker
  reaped it (``wait4``: user + system CPU seconds and peak resident bytes, each counting the
  descendants it waited for); an end without them has none known. A task
  that could not be started is only in ``ended``, with ``code`` 127 or 126 for a program not
  found or not executable (else null) and the message ``could not start the task: ...``.

Lifetime: the worker stops when the engine says ``stop``, when its connection ends, or when
the thread that started it exits (``PR_SET_PDEATHSIG`` on Linux gives it SIGTERM, so a pilot
killed with SIGKILL does not leave it behind); in every case it ends every task it runs (TERM,
KILL after a short grace) before it exits. A worker killed with SIGKILL cannot do that: the
engine then ends that worker's tasks itself (:mod:`~psij.executors.pilot._orphans`).

A guard (``--guard RUN``, the one worker of an engine that starts its tasks itself, see
:mod:`~psij.executors.pilot._inline_tasks`) gets no tasks; when it loses the engine without
being told to stop, it KILLs every process of this user that carries the run's marker.

It never decides what runs, where or when: that is the engine's.
"""

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from psij._clock import Clock, MonotonicClock
from psij._line_framing import LineFramer, encode_line
from psij._wakeup import Wakeup
from psij.executors._process_watch import ExitHandler
from psij.executors.pilot._orphans import end_run_processes
from psij.executors.pilot._task_process import (
    Launch,
    LaunchError,
    LoopWatch,
    TaskProcesses,
    use_of_rusage,
)

__all__ = ["main"]

_RECV_SIZE = 1 << 16  # below malloc's mmap threshold: a read must not map and unmap memory
_MAX_LINE = 256 * 1024 * 1024  # a batch of spawns: many tasks, each up to exec's limits
_STOP_GRACE = 2.0
_START_REPORT_DELAY = 0.002  # seconds a start waits to go with the end that may follow
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int, guard: Optional[str]) -> None:
    """SIGTERM to this process when the thread that started it ends (Linux only); exit at
    once if that already happened (a guard ending its run's processes first)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the end of the connection still stops the worker
    if os.getppid() != parent:
        if guard is not None:
            end_run_processes(guard)
        os._exit(1)


class ChildWatch(LoopWatch):
    """The exits of this process's children, all of them tasks, collected together.

    Rather than a pidfd per task in the selector, SIGCHLD wakes the loop (through
    ``signal.set_wakeup_fd``) and :meth:`reap_all` collects every child that exited with
    ``wait4(-1)`` (its use kept for ``take_usage`` while its handler runs): a few system calls
    per task fewer, and one turn of the loop for many exits.
    Only for a process whose every child is watched here (a child reaped here is gone for
    any other waiter). The rest (signals, timed actions) is :class:`LoopWatch`'s.
    """

    def __init__(self, selector: Any, clock: Optional[Clock] = None) -> None:
        super().__init__(selector, clock)
        self._handlers: Dict[int, ExitHandler] = {}
        self._signals, write = os.pipe()
        for fd in (self._signals, write):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore)
        selector.register(self._signals, 1, self._drain)

    def watch(self, pid: int, on_exit: ExitHandler) -> bool:
        self._children[pid] = -1  # known and not reaped: signal_group may signal it
        self._handlers[pid] = on_exit
        return True

    def _drain(self, mask: int) -> None:
        try:
            os.read(self._signals, 4096)  # what is left keeps the pipe readable: read next turn
        except OSError:
            pass
        self.reap_all()

    def reap_all(self) -> None:
        while self._handlers:  # none left to watch: nothing to ask for
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._children.pop(pid, None)
            handler = self._handlers.pop(pid, None)
            if handler is not None:
                self._exited(pid, status, use_of_rusage(rusage), handler)

    def close(self) -> None:
        self._children.clear()
        self._handlers.clear()


def _ignore(signum: int, frame: Any) -> None:
    pass  # SIGCHLD only wakes the loop, through the wakeup fd


class Worker:
    """One worker's loop (see the module documentation); all on one thread."""

    def __init__(self, reading: int, writing: int, tmp_root: Path, grace: float) -> None:
        self._fd = reading
        self._out = writing
        self._framer = LineFramer(_MAX_LINE)
        self._wakeup = Wakeup()
        self._grace = grace
        self._clock: Clock = MonotonicClock()
        self._watch = ChildWatch(self._wakeup.selector, self._clock)
        self._processes = TaskProcesses(tmp_root, self._exited, self._watch, grace)
        self._started: List[Any] = []
        self._ended: List[Any] = []
        self._stopping = False
        self.told_to_stop = False  # by the engine, rather than losing it
        self._deadline: Optional[float] = None
        self._report_due: Optional[float] = None  # when the starts waiting are reported
        self._wakeup.register(reading, 1, self._read)

    def _exited(self, task_id: str, code: Optional[int]) -> None:
        message, use = self._processes.finish_run(task_id, code)
        self._ended.append([task_id, code, message] if use is None
                           else [task_id, code, message, *use])

    def on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True
        self._wakeup.wake()

    def run(self) -> None:
        watch = self._watch
        monotonic = self._clock.now
        while True:
            timeout = watch.next_timeout()
            if self._stopping:
                left = max(0.0, self._begin_stop() - monotonic())
                timeout = left if timeout is None else min(timeout, left)
            if self._report_due is not None:
                left = max(0.0, self._report_due - monotonic())
                timeout = left if timeout is None else min(timeout, left)
            try:
                for key, mask in self._wakeup.select(timeout):
                    key.data(mask)
                watch.run_due()
            except Exception as ex:  # what a task's own handling raises fails it there
                _complain(f"unexpected error, going on: {ex!r}")
            # Ends go at once (they free a share of the node); starts alone wait a little for
            # the ends that usually follow, so that a short task costs one message, not two.
            if self._ended or self._stopping or (
                    self._report_due is not None and monotonic() >= self._report_due):
                self._report()
            elif self._started and self._report_due is None:
                self._report_due = monotonic() + _START_REPORT_DELAY
            if self._stopping and (not self._processes.running()
                                   or monotonic() >= self._begin_stop()):
                return

    def _begin_stop(self) -> float:
        """End what still runs, once; the time by which the worker exits in any case."""
        if self._deadline is None:
            # What still runs now may have nobody to report to: ended within a short
            # grace, whatever the engine's own.
            grace = min(self._grace, _STOP_GRACE)
            self._deadline = self._clock.now() + grace + 1.0
            self._processes.signal_all(grace)
        return self._deadline

    def _report(self) -> None:
        self._report_due = None
        if not self._started and not self._ended:
            return
        message = {"op": "report", "started": self._started, "ended": self._ended}
        self._started, self._ended = [], []
        data = encode_line(message)
        try:
            while data:
                sent = os.write(self._out, data)
                data = data[sent:]
        except OSError:
            self._stop_reading()  # the engine is gone

    def _read(self, mask: int) -> None:
        try:
            data = os.read(self._fd, _RECV_SIZE)
        except OSError:
            data = b""
        if not data:
            self._stop_reading()
            return
        for line in self._framer.feed(data):
            # The engine is this worker's parent, writing with encode_line: its lines are
            # read as plain JSON, without a peer's checks.
            try:
                message = json.loads(line)
                if not isinstance(message, dict):
                    raise ValueError("expected a JSON object")
            except ValueError as bad:
                _complain(f"a request cannot be read ({bad}); skipped")
                continue
            try:
                self._handle(message)
            except Exception as ex:  # a request of a shape it does not know: the others go on
                _complain(f"a request cannot be followed ({ex!r}); skipped")
        if self._framer.too_long:
            _complain("a request too long to read; stopping")
            self._stop_reading()

    def _stop_reading(self) -> None:
        self._stopping = True
        try:
            self._wakeup.unregister(self._fd)
        except (KeyError, ValueError):
            pass

    def _handle(self, message: Any) -> None:
        op = message.get("op")
        if op == "spawn":
            for row in message.get("tasks", ()):
                self._spawn(row)
        elif op == "signal":
            for entry in message.get("tasks", ()):
                if len(entry) == 3:
                    self._processes.send(str(entry[0]), int(entry[2]))
                else:
                    self._processes.signal(str(entry[0]), float(entry[1]))
        elif op == "stop":
            self._stopping = True
            self.told_to_stop = True

    def _spawn(self, row: List[Any]) -> None:
        task_id = str(row[0])
        try:
            launch = Launch(task_id, row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                            row[8], row[9])
            pid = self._processes.start(launch)
        except LaunchError as ex:
            self._ended.append([task_id, ex.exit_code, f"could not start the task: {ex}"])
            return
        except Exception as ex:  # this task alone fails; the worker goes on
            self._ended.append([task_id, None, f"the pilot hit an unexpected error while "
                                               f"handling this task: {ex!r}"])
            return
        self._started.append([task_id, pid])

    def close(self) -> None:
        self._report()
        self._processes.remove_tmp_root()
        self._watch.close()


def _complain(text: str) -> None:
    print(f"psij pilot worker {os.getpid()}: {text}", file=sys.stderr, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """``--parent PID --tmp-root DIR --grace SECONDS [--guard RUN]``: serve the engine on fd 0
    and 1; with ``--guard``, end every process of run ``RUN`` when the engine is lost."""
    args = sys.argv[1:] if argv is None else argv
    options = dict(zip(args[::2], args[1::2]))
    guard = options.get("--guard")
    # A TERM from here on (the engine's end) is kept until the worker can act on it.
    early: List[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: early.append(signum))
    _die_with_parent(int(options["--parent"]), guard)
    # The pipes move off 0 and 1, which get /dev/null: nothing printed by mistake can reach
    # the engine as a message.
    reading, writing = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    worker = Worker(reading, writing, Path(options["--tmp-root"]), float(options["--grace"]))
    signal.signal(signal.SIGTERM, worker.on_signal)
    if early:
        worker.on_signal(signal.SIGTERM, None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine decides; a terminal's ^C not
    try:
        worker.run()
    finally:
        worker.close()
        if guard is not None and not worker.told_to_stop:
            # The engine that started the tasks itself is gone: they go with it.
            end_run_processes(guard)
    return 0
