"""Tasks started by the engine's own thread: how a pilot runs the tasks of a small node.

On a node of at most :data:`INLINE_MAX_CORES` cores, an engine that was not told how many
workers to use starts the tasks of its node itself, with the same
:class:`~psij.executors.pilot._task_process.TaskProcesses` a worker uses (so a task sees the
same directory, descriptors, ``TMPDIR`` and node file either way), and sees their ends through
pidfds in its own loop. With so few cores a worker would run beside the engine on the same
ones, and each task would cost two more hand-overs between processes (the spawn request and
the report), each a wake-up of a sleeping process: measured on 2 cores, ``/bin/true`` tasks
ran at 0.77x the local executor's rate through one worker and at 0.9x started here.

One guard worker is still started (it gets no task): it dies with the engine's thread like
any worker, and when it loses the engine without being told to stop, it ends every process
that carries this run's marker (:func:`~psij.executors.pilot._orphans.end_run_processes`), so
that the tasks of a pilot killed outright do not outlive it here either. A guard that dies is
started again with the next task.

The interface is :class:`~psij.executors.pilot._local_workers.LocalWorkers`'s, so the engine
does not know which it has; everything runs on the engine thread. It decides nothing about
tasks.
"""

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from psij.executors._process import LaunchError
from psij.executors.pilot._engine_events import EngineEvent, WorkerExited
from psij.executors.pilot._local_workers import (
    WORKERS_VARIABLE,
    ExitHandler,
    LocalWorkers,
    LostHandler,
    StartedHandler,
)
from psij.executors.pilot._task_process import HAS_PIDFD, Launch, LoopWatch, TaskProcesses

__all__ = ["INLINE_MAX_CORES", "InlineTasks", "inline_fits"]

INLINE_MAX_CORES = 3
"""The most cores of a node whose tasks an engine starts itself (unless told to use workers)."""


def inline_fits(cores: int, configured: Optional[int], environ: Dict[str, str],
                loop_watch: Optional[LoopWatch]) -> bool:
    """Whether the engine starts its node's tasks itself: a small node, no number of workers
    asked for (``EngineConfig.workers`` or ``PSIJ_PILOT_WORKERS``), and pidfds to watch the
    tasks in the engine's own loop."""
    return (HAS_PIDFD and loop_watch is not None and cores <= INLINE_MAX_CORES
            and configured is None and not environ.get(WORKERS_VARIABLE))


class InlineTasks:
    """The tasks of the engine's node, started on the engine thread (see the module
    documentation)."""

    def __init__(self, tmp_root: Path, run_id: str, selector: Any, loop_watch: LoopWatch,
                 post: Callable[[EngineEvent], None], on_started: StartedHandler,
                 on_exit: ExitHandler, on_lost: LostHandler, grace: float,
                 environment: Dict[str, str]) -> None:
        self._on_started = on_started
        self._on_exit = on_exit
        self._processes = TaskProcesses(tmp_root / "inline", self._exited, loop_watch, grace)
        self._guard = LocalWorkers(tmp_root, run_id, selector, loop_watch, post, on_started,
                                   on_exit, on_lost, 1, 1, grace, environment, guard=True)
        self._spawns: List[List[Any]] = []  # to start at the next flush
        # Whether a guard that is gone is started again: not after a start that failed (it
        # said why once; trying on every flush would only repeat it).
        self._restart_guard = False
        self._signals: List[List[Any]] = []  # [task id, grace], after the spawns

    def __len__(self) -> int:
        return len(self._guard)

    def assign(self, row: List[Any]) -> None:
        """Start the task of ``row`` (the worker protocol's spawn row) at the next flush."""
        self._spawns.append(row)

    def signal(self, task_id: str, grace: float) -> None:
        """TERM the task's group at the next flush, KILL it ``grace`` seconds later."""
        self._signals.append([task_id, grace])

    def send(self, task_id: str, signum: int) -> None:
        """Send ``signum`` alone to the task's group now."""
        self._processes.send(task_id, signum)

    def signal_all(self, grace: float) -> None:
        for row in self._spawns:
            self.signal(row[0], grace)
        for task_id in self._processes.running_ids():
            self.signal(task_id, grace)

    def flush(self) -> None:
        """Start the tasks assigned since the last flush, then send the signals asked."""
        if self._spawns:
            if self._restart_guard and not len(self._guard):
                self.start_first()  # the last one died: its successor
            spawns, self._spawns = self._spawns, []
            for row in spawns:
                self._start(row)
        if self._signals:
            signals, self._signals = self._signals, []
            for task_id, grace in signals:
                self._processes.signal(task_id, grace)

    def _start(self, row: List[Any]) -> None:
        task_id = row[0]
        try:
            pid = self._processes.start(Launch(*row))
        except LaunchError as ex:
            self._on_exit(task_id, ex.exit_code, f"could not start the task: {ex}", None)
            return
        except Exception as ex:  # this task alone fails
            self._on_exit(task_id, None, f"the pilot hit an unexpected error while handling "
                                         f"this task: {ex!r}", None)
            return
        self._on_started(task_id, pid)

    def _exited(self, task_id: str, code: Optional[int]) -> None:
        # On the engine thread, from its loop's pidfd of the task (or a group check after).
        message, use = self._processes.finish_run(task_id, code)
        self._on_exit(task_id, code, message, use)

    def start_first(self) -> None:
        self._guard.start_first()
        self._restart_guard = bool(len(self._guard))

    def worker_exited(self, event: WorkerExited) -> None:
        self._guard.worker_exited(event)

    def stop(self) -> List[int]:
        """End what still runs (the engine waited for its tasks already), stop the guard;
        the pid of the guard if it has not ended yet (the caller reaps it later)."""
        self._processes.kill_all()
        late = self._guard.stop()
        self._processes.remove_tmp_root()
        return late
