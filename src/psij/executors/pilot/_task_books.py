"""The pilot engine's books on its tasks: their states, dependents, events not yet delivered
and journal lines not yet written, all under one lock; and the rebuilding of those books from a
journal on resume.

:class:`TaskBooks` is the base of :class:`~psij.executors.pilot.engine.PilotEngine`: what
happens to tasks (scheduling, processes, agents, the loop) is the engine's; this module only
records it. It starts and delivers nothing and signals nothing but the leftovers of a crashed
run on resume (``journal.kill_leftovers``); the journal lines it makes (a task's end) wait in
``_journal_records`` for the engine to write.
"""

import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from psij._clock import Clock, wall_time
from psij._lazylog import LazyLogger
from psij._machine import IllegalEvent
from psij._record import replace
from psij.executors.pilot.journal import Journal, ReplayPlan, end_line, kill_leftovers
from psij.executors.pilot.resources import PoolUsage, ResourcePool, ResourceRequest
from psij.executors.pilot.scheduler import (
    CancelAsked,
    Scheduler,
    SucceededBefore,
    TaskRequest,
    TaskState,
    TaskSubmitted,
    Transition,
)
from psij.executors.pilot.tasks import (
    ReportedUse,
    TaskEvent,
    TaskShare,
    TaskSpec,
    TaskStatus,
    TaskUse,
)

__all__ = ["TaskBooks", "TaskEntry", "use_of"]

# The engine's logger: what users filter on for the engine's warnings stays one name.
logger = LazyLogger("psij.executors.pilot.engine")


class TaskEntry:
    """The engine's books on one task (guarded by the engine lock)."""

    __slots__ = ("agent_sent", "directory", "ended", "exit_code", "failure", "final_use",
                 "history", "message", "node", "reported", "run", "share", "spec",
                 "started", "timed_out", "use", "user_canceled")

    def __init__(self, spec: TaskSpec, directory: str) -> None:
        self.spec = spec
        self.directory = directory
        self.history: List[Tuple[float, TaskState]] = []
        self.reported: Optional[TaskState] = None
        self.message: Optional[str] = None
        self.exit_code: Optional[int] = None
        self.share: Optional[TaskShare] = None
        self.node: Optional[str] = None
        self.started: Optional[float] = None
        self.ended: Optional[float] = None
        self.run = 0  # which start of the task an exit belongs to
        self.agent_sent = False
        self.failure: Optional[str] = None  # engine's own reason for a failure
        self.timed_out = False
        self.user_canceled = False
        self.use: Optional[ReportedUse] = None  # of its process, as its reaper gave it
        self.final_use: Optional[TaskUse] = None  # the figures of its run, once it ended


def use_of(task: TaskEntry) -> TaskUse:
    """The figures of an ended task's run (see :class:`TaskUse`)."""
    share, spec = task.share, task.spec
    memory = spec.resources.memory_per_process
    cpu, rss = (None, None) if task.use is None else task.use
    return TaskUse(task.history[0][0] if task.history else None, task.started, task.ended,
                   cpu, rss, None if share is None else share.core_count, spec.time_limit,
                   memory * share.process_count if memory and share is not None else None)


class TaskBooks:
    """The tasks of one engine as it knows them (see the module documentation)."""

    _clock: Clock  # the engine's

    def __init__(self, pool: ResourcePool, work_directory: Path) -> None:
        self._pool = pool
        self._scheduler = Scheduler(pool)
        self._work_directory = work_directory
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._tasks: Dict[str, TaskEntry] = {}
        self._dependents: Dict[str, List[str]] = {}
        self._outbox: List[TaskEvent] = []
        # Journal lines not yet written: written before the next task starts, so that a task
        # never starts before the end of the tasks it depends on is in the journal.
        self._journal_records: List[str] = []
        self._journal: Optional[Journal] = None
        self._journal_urgent = False  # an end that others wait for is not written yet
        self._dirty = False  # something may have become schedulable
        self._delivered_finals = 0  # tasks whose final event listeners have had

    # -- queries ----------------------------------------------------------------------------

    def status(self, task_id: str) -> TaskStatus:
        with self._lock:
            return self._snapshot(self._get(task_id))

    def statuses(self) -> List[TaskStatus]:
        with self._lock:
            return [self._snapshot(t) for t in self._tasks.values()]

    def task_ids(self) -> List[str]:
        with self._lock:
            return list(self._tasks)

    def usage(self) -> PoolUsage:
        with self._lock:
            return self._pool.usage()

    def wait(self, task_ids: Optional[Sequence[str]] = None,
             timeout: Optional[float] = None) -> bool:
        """Wait until the given tasks (default: every known task) have ended; False on
        timeout. Ended means that their final event has been delivered to listeners."""
        def ended() -> bool:
            if task_ids is None:
                # A count, not a scan: waiting for every task costs the same with 100 000.
                return self._delivered_finals >= len(self._tasks)
            return all(self._delivered_final(n) for n in task_ids)

        with self._changed:
            return self._clock.wait_for(self._changed, ended, timeout)

    # -- submission books (under the lock) --------------------------------------------------

    def _check_batch(self, tasks: Sequence[TaskSpec]) -> None:
        names: Set[str] = set()
        groups: Set[str] = set()
        requests: Set[ResourceRequest] = set()
        for i, task in enumerate(tasks):
            if task.name in self._tasks or task.name in names:
                raise ValueError(f"tasks[{i}].name: {task.name!r} is already a task of this "
                                 "pilot; task names must be unique")
            if self._is_group(task.name) or task.name in groups:
                raise ValueError(f"tasks[{i}].name: {task.name!r} is already the name of an "
                                 "iteration group")
            if task.group is not None and (task.group in self._tasks or task.group in names):
                raise ValueError(f"tasks[{i}].group: {task.group!r} is already the name of a "
                                 "task")
            for dependency in task.after:
                if dependency not in self._tasks and not self._is_group(dependency) \
                        and dependency not in names and dependency not in groups:
                    raise ValueError(f"tasks[{i}].after: {dependency!r} is neither a task nor "
                                     "an iteration group known to this pilot")
            if task.resources not in requests:
                requests.add(task.resources)
                self._pool.resolve(task.resources)  # raises for ranges this pool cannot have
            names.add(task.name)
            if task.group is not None:
                groups.add(task.group)

    def _is_group(self, name: str) -> bool:
        return self._scheduler.is_group(name)

    def _directory(self, spec: TaskSpec) -> str:
        base = self._work_directory
        if spec.directory is None:
            return str(base)
        return os.path.join(base, spec.directory)

    def _add(self, spec: TaskSpec) -> str:
        task = TaskEntry(spec, self._directory(spec))
        self._tasks[spec.name] = task
        request = TaskRequest(spec.name, spec.resources, spec.priority, spec.after, spec.group)
        ended = self._scheduler.step(TaskSubmitted(request))
        for dependency in request.after:
            members = (dependency,) if dependency in self._tasks \
                else self._scheduler.group_members(dependency)
            for member in members:
                self._dependents.setdefault(member, []).append(spec.name)
        if ended:  # it can never fit, or a dependency already failed
            self._end_task(task, ended[0].state, ended[0].message)
            if self._journal is not None:  # after its submission, which is written at once
                self._journal_records.append(end_line(spec.name, ended[0].state.value, None,
                                                      task.ended))
        else:
            self._report(task, self._scheduler.state(spec.name))
        return spec.name

    def _get(self, task_id: str) -> TaskEntry:
        task = self._tasks.get(task_id)
        if task is None:
            raise ValueError(f"task_id: {task_id!r} is not a task of this pilot")
        return task

    def _delivered_final(self, task_id: str) -> bool:
        task = self._tasks.get(task_id)
        return task is None or (task.reported is not None and task.reported.final)

    def _report(self, task: TaskEntry, state: TaskState, exit_code: Optional[int] = None,
                share: Optional[TaskShare] = None, use: Optional[TaskUse] = None) -> None:
        now = wall_time()
        task.history.append((now, state))
        self._outbox.append(TaskEvent(task.spec.name, state, now, task.message, exit_code,
                                      share, use))

    def _end_task(self, task: TaskEntry, state: TaskState, message: Optional[str],
                  exit_code: Optional[int] = None) -> None:
        task.message = message
        task.exit_code = exit_code
        task.ended = wall_time()
        task.final_use = use_of(task)
        self._report(task, state, exit_code, task.share, task.final_use)

    def _ended(self, transitions: List[Transition], exit_code: Optional[int] = None,
               message: Optional[str] = None) -> None:
        """Record final states from the scheduler: the first may carry the process's exit
        code and the engine's message; the rest are dependents (OMITTED)."""
        for i, transition in enumerate(transitions):
            task = self._tasks[transition.task_id]
            if i == 0 and transition.state is TaskState.FAILED and message is not None:
                text: Optional[str] = message
            else:
                text = transition.message
            self._end_task(task, transition.state, text, exit_code if i == 0 else None)
            if self._journal is not None:
                code = exit_code if i == 0 else None
                self._journal_records.append(end_line(transition.task_id,
                                                      transition.state.value, code,
                                                      task.ended, task.use))
                if transition.task_id in self._dependents or task.spec.group is not None:
                    self._journal_urgent = True
        first = transitions[0] if transitions else None
        if first is not None and first.state is TaskState.SUCCEEDED:
            for dependent in self._dependents.pop(first.task_id, ()):
                waiting = self._tasks.get(dependent)
                if waiting is not None and waiting.history[-1][1] is TaskState.WAITING \
                        and self._scheduler.state(dependent) is TaskState.QUEUED:
                    self._report(waiting, TaskState.QUEUED)

    def _snapshot(self, task: TaskEntry) -> TaskStatus:
        state = task.history[-1][1] if task.history else self._scheduler.state(task.spec.name)
        return TaskStatus(task.spec.name, state, task.message, task.exit_code, task.share,
                          tuple(task.history), task.directory, task.started, task.ended,
                          task.final_use if state.final else None)

    # -- resume -----------------------------------------------------------------------------

    def _replay(self, records: List[Dict[str, Any]]) -> None:
        """Rebuild the tasks of a previous run from its journal (see the module rules)."""
        plan = ReplayPlan(records)
        specs: Dict[str, TaskSpec] = {}
        for raw in plan.submitted.values():
            try:
                spec = TaskSpec.from_json(raw)
            except (KeyError, TypeError, ValueError) as ex:
                logger.warning("pilot journal: a submission could not be read: %s", ex)
                continue
            specs[spec.name] = spec
        final, canceled = plan.final, plan.canceled
        kill_leftovers(plan.leftovers)
        with self._lock:
            # Tasks that already succeeded are known to the scheduler as such, so that tasks
            # after them may start; they take no resources and never run again.
            for name, spec in specs.items():
                if final.get(name) == "SUCCEEDED":
                    task = TaskEntry(spec, self._directory(spec))
                    self._tasks[name] = task
                    self._scheduler.step(SucceededBefore(name, spec.group))
                    self._end_task(task, TaskState.SUCCEEDED,
                                   "succeeded in an earlier run of the pilot", 0)
            for name, spec in specs.items():
                if name in self._tasks:
                    continue
                known = tuple(a for a in spec.after if a in self._tasks or self._is_group(a))
                try:
                    self._add(replace(spec, after=known) if known != spec.after else spec)
                except (KeyError, TypeError, ValueError, IllegalEvent) as ex:
                    logger.warning("pilot journal: task %r cannot be resumed: %s", name, ex)
                    continue
                if name in canceled:
                    self._tasks[name].user_canceled = True
                    transitions = self._scheduler.step(CancelAsked(name))
                    if transitions:
                        self._ended(transitions)
            self._journal_records.clear()  # those ends are in the journal already
            self._dirty = True
