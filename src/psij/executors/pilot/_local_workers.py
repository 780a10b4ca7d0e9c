"""The engine's side of its workers: the processes that start and reap the tasks of its node.

The engine keeps books only; the tasks it places on its own node go to worker processes
(:mod:`~psij.executors.pilot._worker`, which documents the protocol), so that spawning,
reaping, ``TMPDIR`` and node-file work are spread over other processes and other cores.

- **How many**: at most :func:`worker_limit` (``EngineConfig.workers``, else the environment
  variable ``PSIJ_PILOT_WORKERS``, else one per three cores of the node, at least one).
- **When**: the first as the engine starts (its start-up then overlaps the engine's own rather
  than delaying the first task); another on demand, when every running one has as many tasks
  as its share of the node's cores (or more) and the limit allows.
- **Batches**: what the engine asks during one turn of its loop goes to each worker as one
  ``spawn`` and one ``signal`` message at :meth:`LocalWorkers.flush`; a worker's report carries
  many starts and ends. Writes never block the engine: what a worker cannot take yet waits
  and is written when its pipe is writable.
- **Faults**: a worker that exits (even with SIGKILL) is seen through its pid (a pidfd in the
  engine's loop, else the shared ``ProcessWatch`` thread, which posts a
  :class:`~psij.executors.pilot._engine_events.WorkerExited`); what it reported before is read
  first, then every task it still had is ended (:mod:`~psij.executors.pilot._orphans`) and
  lost with a message naming the worker's pid and how it ended. Later tasks go to the other
  workers, or to a new one; the other workers' tasks are not touched.

It runs on the engine thread only and decides nothing about tasks: which task runs where is
the scheduler's, what an end means is the engine's.
"""

import json
import os
import selectors
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Set

from psij._lazylog import LazyLogger
from psij._line_framing import LineFramer, encode_line
from psij.executors._process import LaunchError, exit_code_of, reap_within, signal_name
from psij.executors.pilot._engine_events import EngineEvent, WorkerExited
from psij.executors.pilot._orphans import end_orphaned_tasks
from psij.executors.pilot.tasks import ReportedUse, reported_use

__all__ = ["CORES_PER_WORKER", "WORKERS_VARIABLE", "LocalWorkers", "worker_limit"]

logger = LazyLogger("psij.executors.pilot.engine")

WORKERS_VARIABLE = "PSIJ_PILOT_WORKERS"
MAX_WORKERS = 1024
"""The most workers one engine may be told to start."""
_WARNED: Set[str] = set()  # values of the variable already warned about
"""The environment variable that sets how many workers an engine may start."""
CORES_PER_WORKER = 3
_RECV_SIZE = 1 << 16  # below malloc's mmap threshold: a read must not map and unmap memory
_loads = json.loads
_STOP_WAIT = 3.0  # seconds, for all workers to exit at the engine's close
_MAX_LINE = 64 * 1024 * 1024  # a report of many ends, each message at most a stderr excerpt

StartedHandler = Callable[[str, int], None]
# Task id, exit code, message, and the use of its process when known.
ExitHandler = Callable[[str, Optional[int], Optional[str], Optional[ReportedUse]], None]
LostHandler = Callable[[List[str], str], None]

# The worker runs with the tasks' environment, so it is told where psij is rather than given
# a PYTHONPATH that the tasks would inherit; sys.path[0] (the current directory, for -c)
# is replaced so that a task's files never shadow a module of the worker.
_BOOT = ("import sys; sys.path[0] = {path!r}; "
         "from psij.executors.pilot._worker import main; sys.exit(main())")


def worker_limit(cores: int, configured: Optional[int] = None,
                 environ: Mapping[str, str] = os.environ) -> int:
    """How many workers an engine on a node of ``cores`` cores may start: ``configured``, else
    ``PSIJ_PILOT_WORKERS`` (a positive integer; anything else is ignored with a warning), else
    one per :data:`CORES_PER_WORKER` cores, at least one."""
    if configured is not None:
        return configured
    text = environ.get(WORKERS_VARIABLE)
    if text:
        value = text.strip()
        if value.isascii() and value.isdigit() and 0 < int(value) <= MAX_WORKERS:
            return int(value)
        if text not in _WARNED:
            _WARNED.add(text)
            logger.warning("%s=%r: a whole number from 1 to %d is accepted; ignored (one "
                           "worker per %d cores)", WORKERS_VARIABLE, text, MAX_WORKERS,
                           CORES_PER_WORKER)
    return max(1, cores // CORES_PER_WORKER)


class _Worker:
    __slots__ = ("ended", "framer", "number", "out", "pid", "reading", "signals", "spawns",
                 "tasks", "writing")

    def __init__(self, number: int, pid: int, reading: int, writing: int) -> None:
        self.number = number
        self.pid = pid
        self.reading = reading  # the pipe from the worker (-1 once closed)
        self.framer = LineFramer(_MAX_LINE)
        self.tasks: Dict[str, Optional[int]] = {}  # sent and not ended -> pid once started
        self.spawns: List[List[Any]] = []  # to send at the next flush
        self.signals: List[List[Any]] = []
        self.writing = writing  # the pipe to the worker (-1 once closed)
        self.out = b""  # written in part: the rest waits until the pipe is writable
        self.ended = False  # its process exited


class LocalWorkers:
    """The workers of one engine (see the module documentation)."""

    def __init__(self, tmp_root: Path, run_id: str, selector: selectors.BaseSelector,
                 loop_watch: Any, post: Callable[[EngineEvent], None],
                 on_started: StartedHandler, on_exit: ExitHandler, on_lost: LostHandler,
                 limit: int, cores: int, grace: float, environment: Dict[str, str],
                 guard: bool = False) -> None:
        # ``guard``: its workers get no tasks and end every process of the run when they
        # lose the engine (see _inline_tasks).
        self._tmp_root = tmp_root
        self._run_id = run_id
        self._selector = selector
        self._loop_watch = loop_watch  # a LoopWatch in the engine's loop, or None
        self._post = post
        self._on_started = on_started
        self._on_exit = on_exit
        self._on_lost = on_lost
        self._limit = limit
        self._share = max(1, -(-cores // limit))  # a worker is busy with this many tasks
        self._grace = grace
        self._environment = environment
        self._workers: Dict[int, _Worker] = {}  # live ones, by number
        self._where: Dict[str, _Worker] = {}
        self._count = 0
        self._spawner: Any = None
        self._pending = False  # something waits for flush()
        self._guard = guard

    def __len__(self) -> int:
        return len(self._workers)

    # -- requests from the engine -----------------------------------------------------------

    def assign(self, row: List[Any]) -> None:
        """Have a worker start the task of ``row`` (see the worker's protocol) at the next
        flush; raises LaunchError when no worker can be started."""
        worker = self._choose()
        task_id = row[0]
        worker.tasks[task_id] = None
        worker.spawns.append(row)
        self._where[task_id] = worker
        self._pending = True

    def signal(self, task_id: str, grace: float) -> None:
        """TERM the task's group at the next flush, KILL it ``grace`` seconds later."""
        worker = self._where.get(task_id)
        if worker is not None and not worker.ended:
            worker.signals.append([task_id, grace])
            self._pending = True

    def send(self, task_id: str, signum: int) -> None:
        """Send ``signum`` alone to the task's group at the next flush."""
        worker = self._where.get(task_id)
        if worker is not None and not worker.ended:
            worker.signals.append([task_id, 0, signum])
            self._pending = True

    def signal_all(self, grace: float) -> None:
        for task_id in list(self._where):
            self.signal(task_id, grace)

    def flush(self) -> None:
        """Send what the engine asked since the last flush: one message of each kind per
        worker."""
        if not self._pending:
            return
        self._pending = False
        for worker in list(self._workers.values()):
            if worker.writing < 0 or not (worker.spawns or worker.signals):
                continue
            data = b""
            if worker.spawns:
                data += encode_line({"op": "spawn", "tasks": worker.spawns})
                worker.spawns = []
            if worker.signals:
                data += encode_line({"op": "signal", "tasks": worker.signals})
                worker.signals = []
            self._write(worker, data)

    def stop(self) -> List[int]:
        """Ask every worker to stop (each ends what it still runs) and close the pipes; the
        pids of those that have not ended yet (the caller reaps them later)."""
        for worker in list(self._workers.values()):
            if worker.writing >= 0:
                # The worker reads at once; what it cannot take now is dropped: closing the
                # pipe stops it as well.
                try:
                    os.write(worker.writing, worker.out + encode_line({"op": "stop"}))
                except OSError:
                    pass
            self._drop(worker)
            if not worker.tasks:
                # Every task it had has ended: it has nothing left to do, and one still
                # starting (slow on a loaded machine) would take that long to read the stop.
                try:
                    os.kill(worker.pid, signal.SIGKILL)  # our unreaped child: its own pid
                except OSError:
                    pass
        # Each ends at once once its tasks have (the engine waited for them): reaped here, so
        # that none is left a zombie, and its CPU time counts as this process's children's.
        late = reap_within([w.pid for w in self._workers.values()], _STOP_WAIT, 0.005)
        self._workers.clear()
        return late

    def start_first(self) -> None:
        """Start the first worker now rather than with the first task, so that its start-up
        overlaps the engine's own; a failure is only logged (the first task then says it)."""
        if not self._workers:
            try:
                self._start_worker()
            except LaunchError as ex:
                logger.warning("pilot: %s", ex)

    # -- workers ------------------------------------------------------------------------------

    def _choose(self) -> _Worker:
        best: Optional[_Worker] = None
        for worker in self._workers.values():
            if worker.writing >= 0 and (best is None or len(worker.tasks) < len(best.tasks)):
                best = worker
        if best is None or (len(best.tasks) >= self._share
                            and len(self._workers) < self._limit):
            try:
                return self._start_worker()
            except LaunchError:
                if best is None:
                    raise
        return best

    def _start_worker(self) -> _Worker:
        from psij.executors._process import Spawner

        if self._spawner is None:
            self._spawner = Spawner()
        self._count += 1
        number = self._count
        # Two pipes (no socket module: `psij pilot run` starts without it).
        their_stdin, to_worker = os.pipe()
        from_worker, their_stdout = os.pipe()
        path = os.path.dirname(os.path.dirname(os.path.abspath(
            sys.modules["psij"].__file__ or "")))
        argv = [sys.executable, "-c", _BOOT.format(path=path), "--parent", str(os.getpid()),
                "--tmp-root", str(self._tmp_root / f"w{number}"), "--grace", str(self._grace)]
        if self._guard:
            argv += ["--guard", self._run_id]
        try:
            pid = self._spawner.spawn(argv, os.getcwd(), self._environment, their_stdin,
                                      their_stdout, 2)
        except LaunchError as ex:
            os.close(to_worker)
            os.close(from_worker)
            raise LaunchError(f"no pilot worker could be started: {ex}") from ex
        finally:
            os.close(their_stdin)
            os.close(their_stdout)
        os.set_blocking(to_worker, False)
        os.set_blocking(from_worker, False)
        worker = _Worker(number, pid, from_worker, to_worker)
        self._workers[number] = worker
        self._selector.register(from_worker, selectors.EVENT_READ,
                                lambda mask: self._read(worker))
        if self._loop_watch is not None:
            self._loop_watch.watch(pid, lambda pid, status: self._exited(worker, status))
        else:
            from psij.executors._process_watch import WATCH

            WATCH.watch(pid, lambda pid, status: self._post(WorkerExited(number, status)))
        return worker

    def _write(self, worker: _Worker, data: bytes) -> None:
        fd = worker.writing
        if fd < 0:
            return
        waited = bool(worker.out)
        out = worker.out + data if waited else data
        try:
            sent = os.write(fd, out) if out else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = len(out)  # the worker is gone: its exit says how
        worker.out = out[sent:]
        if bool(worker.out) != waited:
            if worker.out:
                self._selector.register(fd, selectors.EVENT_WRITE,
                                        lambda mask: self._write(worker, b""))
            else:
                self._selector.unregister(fd)

    def _read(self, worker: _Worker) -> bool:
        """Read what the worker sent; True when there may be more to read now."""
        fd = worker.reading
        if fd < 0:
            return False
        try:
            data = os.read(fd, _RECV_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._drop(worker)
            return False
        for line in worker.framer.feed(data):
            # A worker is this engine's own child, writing what the engine sent it: its
            # lines are read as plain JSON, without a peer's checks.
            try:
                message = _loads(line)
                if not isinstance(message, dict):
                    raise ValueError("expected a JSON object")
                self._handle(worker, message)
            except (ValueError, TypeError, IndexError) as bad:
                logger.warning("pilot: a report of worker %d cannot be read (%s)",
                               worker.pid, bad)
        if worker.framer.too_long:
            logger.warning("pilot: worker %d sent a line too long; it is stopped", worker.pid)
            self._drop(worker)
            return False
        return True

    def _handle(self, worker: _Worker, message: Dict[str, Any]) -> None:
        tasks = worker.tasks
        for task_id, pid in message.get("started", ()):
            if task_id in tasks:
                tasks[task_id] = pid
                self._on_started(task_id, pid)
        for ended in message.get("ended", ()):
            task_id = ended[0]
            if tasks.pop(task_id, 0) != 0:
                self._where.pop(task_id, None)
                self._on_exit(task_id, ended[1], ended[2],
                              reported_use(*ended[3:5]) if len(ended) == 5 else None)

    def _drop(self, worker: _Worker) -> None:
        for fd in (worker.reading, worker.writing):
            if fd >= 0:
                try:
                    self._selector.unregister(fd)
                except (KeyError, ValueError):
                    pass
                os.close(fd)
        worker.reading = worker.writing = -1

    def worker_exited(self, event: WorkerExited) -> None:
        worker = self._workers.get(event.number)
        if worker is not None:
            self._exited(worker, event.status)

    def _exited(self, worker: _Worker, status: Optional[int]) -> None:
        """On the engine thread: the worker's process ended. What it reported first counts;
        what it still had is ended and lost."""
        worker.ended = True
        while self._read(worker):
            pass
        self._drop(worker)
        self._workers.pop(worker.number, None)
        if not worker.tasks:
            return
        code = exit_code_of(status)
        name = signal_name(code)
        how = f"killed by signal {code - 128} ({name})" if name is not None and code \
            else f"with exit code {code}"
        why = f"the pilot's worker process {worker.pid} ended, {how}, while the task ran"
        lost = dict(worker.tasks)
        worker.tasks.clear()
        for task_id in lost:
            self._where.pop(task_id, None)
        end_orphaned_tasks(self._run_id, lost)
        self._on_lost(list(lost), why)
