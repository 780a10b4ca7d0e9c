"""The pilot engine: runs the tasks the scheduler places, on the nodes of one allocation.

The engine owns a :class:`~psij.executors.pilot.scheduler.Scheduler` and the processes of the
tasks it placed. Tasks on the node this process runs on are spawned directly; tasks on other
nodes are sent to one agent per node (:mod:`psij.executors.pilot.agent`), started with the
allocation's launcher and connected back over a socket.

Threads:

- One engine thread owns the started processes, the agents' connections, the journal's start
  and end records, and listener delivery. It sleeps in one ``select`` on a wake-up pipe, the
  agents' sockets, a pidfd per local task and a timer; it never polls tasks.
- A local task's exit is therefore seen and handled on the engine thread itself. Where pidfds
  do not exist, exits arrive from the shared ``ProcessWatch`` thread, which only queues them.
- ``submit``/``cancel``/``status``/... may be called from any thread; they hold one short lock
  around the scheduler's books and never run listeners or spawn processes under it.
- Listeners get every state change, in order, on the engine thread, with no lock held; an
  exception in a listener is logged and does not affect the engine or other listeners.

A scheduling pass runs once per batch of events (submissions, exits, cancels), so its cost is
the scheduler's: it grows with the number of distinct task shapes, not with waiting tasks.

Journal (:mod:`~psij.executors.pilot.journal`): one JSON line per event (submit, start, end,
user cancel, forget), appended with one write per batch, fsync'd at most once a second and at
close; a line that cannot be used is skipped with a warning on resume. The ends of tasks are written
before any other task starts, so that a crash never leaves a started dependent behind an end
the journal does not hold. ``resume`` reads it back: tasks that succeeded are not run again
(they count as succeeded for what depends on them), tasks a user cancelled stay cancelled,
all others are queued again in their original order.

Faults: an unexpected error while handling one task fails that task (its process is killed)
and the engine goes on; an error outside any task is logged and the loop goes on, unless it
repeats on every turn, in which case every task that has not ended fails with the reason,
``failure`` says why and submissions are refused (``psij pilot serve`` then exits with 1).
A task ends when its process group is empty (see ``_task_process.TaskProcesses``).

Work that no task waits for (removing the run folders that killed pilots left) starts once
the first tasks are started, on a thread of its own.

The engine never reads or changes the tasks' output, and never blocks on a task.
"""

import os
import selectors
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Sequence, Set, Tuple

from psij import _check
from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger
from psij.executors._process_watch import timer_delay
from psij.executors.pilot._engine_events import (
    TASK_EVENTS,
    AgentLauncherExited,
    CloseRequested,
    EngineEvent,
    KillTask,
    StopRequested,
    TaskExited,
    TimeLimitReached,
    TimeLimits,
)
from psij.executors.pilot._record import replace
from psij.executors.pilot._remote_nodes import RemoteNodes
from psij.executors.pilot._run_dir import (
    make_run_dir,
    remove_dead_run_dirs,
    remove_tree,
    temporary_base,
)
from psij.executors.pilot._task_process import (
    HAS_PIDFD,
    Launch,
    LaunchError,
    LoopWatch,
    TaskProcesses,
)
from psij.executors.pilot.allocation import Allocation
from psij.executors.pilot.engine_config import EngineConfig
from psij.executors.pilot.journal import (
    RUN_VARIABLE,
    Journal,
    ReplayPlan,
    cancel_line,
    end_line,
    forget_line,
    kill_leftovers,
    read_journal,
    start_line,
    submit_lines,
)
from psij.executors.pilot.resources import PoolUsage, ResourcePool, ResourceRequest
from psij.executors.pilot.scheduler import Scheduler, TaskRequest, TaskState, Transition
from psij.executors.pilot.task_environment import nodefile_text, pilot_environment
from psij.executors.pilot.tasks import (
    Listener,
    TaskEvent,
    TaskShare,
    TaskSpec,
    TaskStatus,
    request_from_json,
    request_to_json,
)

__all__ = ["EngineConfig", "PilotEngine", "TaskEvent", "TaskShare", "TaskSpec", "TaskStatus",
           "read_journal", "request_from_json", "request_to_json"]

# Agents, sockets and their modules are loaded only when a pilot has nodes other than its own,
# and logging only when something goes wrong: neither is on the start-up path of a pilot.
logger = LazyLogger(__name__)

_SHARE_CACHE_SIZE = 4096
_MAX_ERRORS_IN_A_ROW = 20


# -- engine internals -------------------------------------------------------------------------


class _Task:
    """The engine's books on one task (guarded by the engine lock)."""

    __slots__ = ("agent_sent", "directory", "ended", "exit_code", "failure", "history",
                 "message", "node", "reported", "run", "share", "spec", "started",
                 "timed_out", "user_canceled")

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


class PilotEngine:
    """Schedules and runs tasks on one allocation (see the module documentation)."""

    def __init__(self, allocation: Allocation, config: Optional[EngineConfig] = None,
                 clock: Optional[Clock] = None) -> None:
        """``clock`` measures time limits, agent connect deadlines and the journal's fsync
        interval (default: the monotonic clock; tests give a ``ManualClock``)."""
        _check.instance("allocation", allocation, Allocation, "Allocation", False)
        _check.instance("config", config, EngineConfig, "EngineConfig")
        self.allocation = allocation
        self.config = config if config is not None else EngineConfig()
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._time_limits = TimeLimits(self._clock)
        self._pool = ResourcePool(list(allocation.nodes))
        self._scheduler = Scheduler(self._pool)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._tasks: Dict[str, _Task] = {}
        self._dependents: Dict[str, List[str]] = {}
        self._outbox: List[TaskEvent] = []
        # Journal lines not yet written: written before the next task starts, so that a task
        # never starts before the end of the tasks it depends on is in the journal.
        self._journal_records: List[str] = []
        self._listeners: List[Listener] = []
        self._inbox: Deque[EngineEvent] = deque()
        self._dirty = False  # something may have become schedulable
        self._selector: Optional[selectors.BaseSelector] = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: Optional[threading.Thread] = None
        self._journal: Optional[Journal] = None
        self._local: Optional[TaskProcesses] = None
        # Exits and timed actions of local tasks: in the engine's own loop where pidfds exist,
        # else through the shared ProcessWatch thread.
        self._loop_watch: Optional[LoopWatch] = None
        # The environment and node file of each distinct share, made once.
        self._share_files: Dict[Tuple[Any, ...], Tuple[Dict[str, str], str]] = {}
        self._agents: Optional[RemoteNodes] = None
        self._run_dir: Optional[Path] = None
        self._closing = False  # the engine thread is cancelling everything
        self._refusing = False  # close() was called: no more submissions
        self._closed = threading.Event()
        self._started = False
        self._running = 0  # tasks whose process may still run (local or agent)
        self._delivered_finals = 0  # tasks whose final event listeners have had
        # Marks this run's task processes, so that a resume kills only a crashed run's own
        # processes, never one that reused a pid.
        self._run_id = os.urandom(8).hex()
        self._swept = False  # whether the run folders of dead pilots were removed
        self.failure: Optional[str] = None  # why the engine stopped, if it had to

    # -- life cycle -------------------------------------------------------------------------

    @property
    def pool(self) -> ResourcePool:
        return self._pool

    def start(self) -> None:
        """Replay the journal (with ``resume``), start the agents and the engine thread."""
        with self._lock:
            if self._started:
                raise RuntimeError("start: this engine was already started")
            self._started = True
        config = self.config
        self._run_dir = make_run_dir(config.tmp_root or temporary_base())
        self._selector = selectors.DefaultSelector()
        if HAS_PIDFD:
            self._loop_watch = LoopWatch(self._selector)
            self._local = TaskProcesses(self._run_dir / "tmp", self._on_local_exit,
                                        self._loop_watch, config.cancel_grace_period)
        else:
            self._local = TaskProcesses(self._run_dir / "tmp", self._local_exit,
                                        grace=config.cancel_grace_period)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
        if config.journal is not None:
            previous = read_journal(config.journal) if config.resume else []
            self._journal = Journal(config.journal, self._clock)
            if previous:
                self._replay(previous)
        if self.allocation.remote_nodes:
            self._agents = RemoteNodes(self.allocation, config, self._clock, self._selector,
                                       self._post, self._on_exit, self._node_lost)
            self._agents.start(self._run_dir)
        self._thread = threading.Thread(target=self._loop, name="psij-pilot-engine",
                                        daemon=True)
        self._thread.start()
        self._wake()

    def close(self, timeout: Optional[float] = None) -> None:
        """Cancel every task that has not ended, wait for their processes to exit (at most
        the grace period plus ``timeout``, default 5 s), stop the agents, flush the journal."""
        with self._lock:
            self._refusing = True
        if self._thread is None:
            return
        self._post(CloseRequested())
        if threading.current_thread() is self._thread:
            return  # from a listener (a collected executor): the engine thread stops itself
        limit = self.config.cancel_grace_period + (5.0 if timeout is None else timeout)
        self._closed.wait(limit)
        if self._thread.is_alive():
            self._post(StopRequested())
        self._thread.join(5.0)
        if not self._thread.is_alive() and self._wake_w >= 0:
            # Only now: the engine thread no longer uses them.
            wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
            os.close(wake_w)
            os.close(wake_r)
            if self._selector is not None:
                self._selector.close()

    # -- public operations ------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        if not callable(listener):
            raise _check.fail_type("listener", listener, "a callable taking a TaskEvent")
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def submit(self, task: TaskSpec) -> str:
        """Add a task; raises ValueError/TypeError naming the field, adding nothing."""
        return self.submit_many([task])[0]

    def submit_many(self, tasks: Sequence[TaskSpec]) -> List[str]:
        """Add several tasks at once, all or none (one journal write, one wake-up)."""
        if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
            raise _check.fail_type("tasks", tasks, "a list of TaskSpec")
        for i, task in enumerate(tasks):
            _check.instance(f"tasks[{i}]", task, TaskSpec, "TaskSpec", False)
        with self._lock:
            if self._refusing:
                why = "is shutting down" if self.failure is None else f"stopped: {self.failure}"
                raise RuntimeError(f"submit: the pilot {why}")
            self._check_batch(tasks)
            ids = [self._add(task) for task in tasks]
            if self._journal is not None:
                self._journal.write(submit_lines(t.to_json() for t in tasks))
            self._dirty = True
        self._wake()
        return ids

    def cancel(self, task_id: str) -> None:
        """Cancel a task: a waiting or queued one ends CANCELED at once; a running one gets
        TERM (KILL after the grace period) and ends CANCELED when it exits."""
        with self._lock:
            task = self._get(task_id)
            if task.history and task.history[-1][1].final:
                return
            task.user_canceled = True
            if self._journal is not None:
                self._journal.write([cancel_line(task_id)])
            transitions = self._scheduler.cancel(task_id)
            if transitions:
                self._ended(transitions)
                self._dirty = True
            else:
                self._inbox.append(KillTask(task_id))
        self._wake()

    def forget(self, task_id: str) -> None:
        """Drop an ended task so its name can be used again."""
        with self._lock:
            self._scheduler.forget(task_id)
            task = self._tasks.pop(task_id)
            if task.reported is not None and task.reported.final:
                self._delivered_finals -= 1
            self._dependents.pop(task_id, None)
            if self._journal is not None:
                self._journal.write([forget_line(task_id)])

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
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                if task_ids is None:
                    # A count, not a scan: waiting for every task costs the same with 100 000.
                    if self._delivered_finals >= len(self._tasks):
                        return True
                elif all(self._delivered_final(n) for n in task_ids):
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)

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
        base = self.config.work_directory
        assert base is not None
        if spec.directory is None:
            return str(base)
        return os.path.join(base, spec.directory)

    def _add(self, spec: TaskSpec) -> str:
        task = _Task(spec, self._directory(spec))
        self._tasks[spec.name] = task
        request = TaskRequest(spec.name, spec.resources, spec.priority, spec.after, spec.group)
        self._scheduler.submit(request)
        for dependency in request.after:
            members = (dependency,) if dependency in self._tasks \
                else self._scheduler.group_members(dependency)
            for member in members:
                self._dependents.setdefault(member, []).append(spec.name)
        state = self._scheduler.state(spec.name)
        if state.final:
            self._end_task(task, state, self._scheduler.message(spec.name))
        else:
            self._report(task, state)
        return spec.name

    def _get(self, task_id: str) -> _Task:
        task = self._tasks.get(task_id)
        if task is None:
            raise ValueError(f"task_id: {task_id!r} is not a task of this pilot")
        return task

    def _delivered_final(self, task_id: str) -> bool:
        task = self._tasks.get(task_id)
        return task is None or (task.reported is not None and task.reported.final)

    def _report(self, task: _Task, state: TaskState, exit_code: Optional[int] = None,
                share: Optional[TaskShare] = None) -> None:
        now = time.time()
        task.history.append((now, state))
        self._outbox.append(TaskEvent(task.spec.name, state, now, task.message, exit_code,
                                      share))

    def _end_task(self, task: _Task, state: TaskState, message: Optional[str],
                  exit_code: Optional[int] = None) -> None:
        task.message = message
        task.exit_code = exit_code
        task.ended = time.time()
        self._report(task, state, exit_code, task.share)

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
                                                      transition.state.value, code))
        first = transitions[0] if transitions else None
        if first is not None and first.state is TaskState.SUCCEEDED:
            for dependent in self._dependents.pop(first.task_id, ()):
                waiting = self._tasks.get(dependent)
                if waiting is not None and waiting.history[-1][1] is TaskState.WAITING \
                        and self._scheduler.state(dependent) is TaskState.QUEUED:
                    self._report(waiting, TaskState.QUEUED)

    def _snapshot(self, task: _Task) -> TaskStatus:
        state = task.history[-1][1] if task.history else self._scheduler.state(task.spec.name)
        return TaskStatus(task.spec.name, state, task.message, task.exit_code, task.share,
                          tuple(task.history), task.directory, task.started, task.ended)

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
                    task = _Task(spec, self._directory(spec))
                    self._tasks[name] = task
                    self._scheduler.record_succeeded(name, spec.group)
                    self._end_task(task, TaskState.SUCCEEDED,
                                   "succeeded in an earlier run of the pilot", 0)
            for name, spec in specs.items():
                if name in self._tasks:
                    continue
                known = tuple(a for a in spec.after if a in self._tasks or self._is_group(a))
                try:
                    self._add(replace(spec, after=known) if known != spec.after else spec)
                except (KeyError, TypeError, ValueError) as ex:
                    logger.warning("pilot journal: task %r cannot be resumed: %s", name, ex)
                    continue
                if name in canceled:
                    self._tasks[name].user_canceled = True
                    transitions = self._scheduler.cancel(name)
                    if transitions:
                        self._ended(transitions)
            self._journal_records.clear()  # those ends are in the journal already
            self._dirty = True

    # -- engine thread ----------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # already awake, or not started yet

    def _post(self, event: EngineEvent) -> None:
        self._inbox.append(event)
        self._wake()

    def _drain_wake(self, mask: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _local_exit(self, task_id: str, code: Optional[int]) -> None:
        # On the ProcessWatch thread: queue only.
        self._post(TaskExited(task_id, code))

    def _on_local_exit(self, task_id: str, code: Optional[int]) -> None:
        # On the engine thread (a pidfd of the loop): handled at once.
        try:
            self._on_exit(task_id, code, None)
        except Exception as ex:
            self._task_broke(task_id, ex)

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        watch = self._loop_watch
        errors = 0  # unexpected errors in a row
        try:
            while True:
                try:
                    timeout = self._timeout()
                    if timeout != 0.0:
                        # About to sleep: what waits for the journal goes now.
                        self._write_journal()
                        if not self._swept:
                            self._sweep()
                    for key, mask in selector.select(timeout):
                        key.data(mask)
                    if watch is not None:
                        watch.run_due()
                    if not self._step():
                        break
                    errors = 0
                except Exception as ex:
                    # What a task's own handling raises fails that task where it is caught;
                    # this is for the rest. The engine goes on unless it keeps failing.
                    errors += 1
                    logger.exception("the pilot engine hit an unexpected error")
                    if errors >= _MAX_ERRORS_IN_A_ROW:
                        self._give_up(f"the pilot engine stopped after {errors} unexpected "
                                      f"errors in a row, the last one: {ex!r}")
                        break
                    time.sleep(0.01 * errors)  # never spin on an error that repeats
        finally:
            self._shutdown()

    def _task_broke(self, task_id: str, error: BaseException) -> None:
        """An unexpected error while handling one task: it alone fails (its process, if any,
        is killed) and the engine goes on."""
        logger.error("pilot: task %r failed on an unexpected error: %r", task_id, error,
                     exc_info=error)
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            return
        if self._local is not None:
            self._local.signal(task_id, 0.0)
        self._finish(task, task.run, None, f"the pilot hit an unexpected error while "
                                           f"handling this task: {error!r}")

    def _give_up(self, reason: str) -> None:
        """The engine cannot go on: every task that has not ended fails with ``reason``."""
        logger.error("pilot: %s", reason)
        with self._lock:
            self.failure = reason
            self._refusing = True
            for task in self._tasks.values():
                if not task.history or not task.history[-1][1].final:
                    self._end_task(task, TaskState.FAILED, reason)
        if self._local is not None:
            self._local.signal_all(0.0)

    def _sweep(self) -> None:
        """Remove what killed pilots left, on a thread of its own: a large leftover must not
        hold up the tasks of this one."""
        self._swept = True
        assert self._run_dir is not None
        threading.Thread(target=remove_dead_run_dirs, args=(self._run_dir.parent,),
                         name="psij-pilot-sweep", daemon=True).start()

    def _timeout(self) -> Optional[float]:
        if self._inbox or self._dirty or self._outbox:
            return 0.0
        due = self._journal.due() if self._journal is not None else None
        if self._loop_watch is not None:
            timed = self._loop_watch.next_timeout()
            if timed is not None:
                due = timed if due is None else min(due, timed)
        for left in (self._time_limits.next_in(),
                     None if self._agents is None else self._agents.next_deadline_in()):
            if left is not None:
                due = left if due is None else min(due, left)
        return None if due is None else timer_delay(due)

    def _step(self) -> bool:
        """Handle what arrived, schedule, start, deliver; False once the engine may stop."""
        stop = False
        inbox = self._inbox
        inbox.extend(self._time_limits.expired())
        while inbox:
            if self._handle(inbox.popleft()):
                stop = True
        if self._agents:
            self._agents.check_deadlines()
        if self._dirty and not self._closing:
            # Ends first: a task must not start before the end of its dependencies is
            # written, or a crash right after its start would make a resume run them again.
            self._write_journal()
            self._schedule()
        if self._journal is not None:
            self._journal.sync()
        self._deliver()
        if self._closing and self._running == 0:
            return False
        return not stop

    def _handle(self, event: EngineEvent) -> bool:
        """Act on one posted event; True for the request to stop. An unexpected error fails
        the task the event is about."""
        try:
            return self._act(event)
        except Exception as ex:
            if not isinstance(event, TASK_EVENTS):
                raise
            self._task_broke(event.task_id, ex)
            return False

    def _act(self, event: EngineEvent) -> bool:
        if isinstance(event, TaskExited):
            self._on_exit(event.task_id, event.code, event.message)
        elif isinstance(event, KillTask):
            self._kill(event.task_id)
        elif isinstance(event, TimeLimitReached):
            self._on_time_limit(event.task_id, event.run)
        elif isinstance(event, AgentLauncherExited):
            if self._agents is not None:
                self._agents.launcher_exited(event)
        elif isinstance(event, CloseRequested):
            self._begin_close()
        elif isinstance(event, StopRequested):
            return True
        return False

    def _write_journal(self) -> None:
        if self._journal is None or not self._journal_records:
            return
        with self._lock:
            lines, self._journal_records = self._journal_records, []
        self._journal.write(lines)

    def _deliver(self) -> None:
        with self._lock:
            events, self._outbox = self._outbox, []
            listeners = self._listeners
        if not events:
            return
        for event in events:
            for listener in listeners:
                try:
                    listener(event)
                except Exception:
                    logger.exception("pilot listener %r raised on %s", listener, event)
        with self._changed:
            for event in events:
                task = self._tasks.get(event.task_id)
                if task is not None and (task.reported is None or not task.reported.final):
                    task.reported = event.state
                    if event.state.final:
                        self._delivered_finals += 1
            self._changed.notify_all()

    def _schedule(self) -> None:
        with self._lock:
            self._dirty = False
            placements = self._scheduler.schedule()
            starts = []
            for placement in placements:
                task = self._tasks[placement.task_id]
                task.share = TaskShare.of(placement)
                task.run += 1
                self._running += 1
                starts.append((task, task.spec))
        for task, spec in starts:
            try:
                self._start_task(task, spec)
            except Exception as ex:
                self._task_broke(task.spec.name, ex)

    def _start_task(self, task: _Task, spec: TaskSpec) -> None:
        share = task.share
        assert share is not None
        if task.user_canceled:
            self._finish(task, task.run, None, None)
            return
        prepare = self.config.prepare
        if prepare is not None:
            try:
                spec = prepare(spec, share)
                if not isinstance(spec, TaskSpec) or spec.name != task.spec.name:
                    raise TypeError("prepare must return a TaskSpec with the same name")
            except Exception as ex:
                self._finish(task, task.run, None, f"could not prepare the task: {ex}")
                return
            task.directory = self._directory(spec)
        environment, nodefile = self._share_environment(share,
                                                        spec.resources.cores_per_process)
        environment["QCG_PM_STEP_ID"] = spec.name
        environment[RUN_VARIABLE] = self._run_id
        if spec.environment:
            environment.update(spec.environment)
        launch = Launch(spec.name, [spec.executable, *spec.arguments], task.directory,
                        environment, spec.inherit_environment, spec.stdin, spec.stdout,
                        spec.stderr, nodefile, spec.create_directories)
        node = share.nodes[0]
        task.node = node
        if node == self.allocation.local_node:
            assert self._local is not None
            try:
                pid = self._local.start(launch)
            except LaunchError as ex:
                self._finish(task, task.run, ex.exit_code, f"could not start the task: {ex}")
                return
            record = start_line(spec.name, node, pid, self._run_id)
        else:
            assert self._agents is not None
            lost = self._agents.spawn(node, launch)
            if lost is not None:
                self._finish(task, task.run, None, f"node {node} is lost: {lost}")
                return
            record = start_line(spec.name, node)
        task.started = time.time()
        with self._lock:
            self._journal_records.append(record)
            self._report(task, TaskState.RUNNING, share=share)
        if spec.time_limit is not None:
            self._time_limits.start(spec.name, task.run, spec.time_limit)

    def _share_environment(self, share: TaskShare, cores_per_process: int
                           ) -> Tuple[Dict[str, str], str]:
        """A new copy of the variables describing ``share`` (QCG_PM_STEP_ID to be set), and
        its node file's text; made once per distinct share."""
        key = (share.nodes, share.processes, cores_per_process,
               share.gpus[0] if share.gpus else ())
        known = self._share_files.get(key)
        if known is None:
            if len(self._share_files) >= _SHARE_CACHE_SIZE:
                self._share_files.clear()
            slurm = self.config.slurm_variables
            if slurm is None:
                slurm = self.allocation.kind == "slurm"
            known = (pilot_environment("", share, cores_per_process, slurm),
                     nodefile_text(share))
            self._share_files[key] = known
        return dict(known[0]), known[1]

    def _on_exit(self, task_id: str, code: Optional[int], message: Optional[str]) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            return
        if task.node == self.allocation.local_node:
            assert self._local is not None
            message = self._local.finish(task_id, code)
        elif self._agents is not None:
            self._agents.task_ended(task.node, task_id)
        if task.timed_out and code != 0:
            message = (f"the task exceeded its time limit of {task.spec.time_limit:g} s and "
                       f"was killed (exit code {code})")
        self._finish(task, task.run, code, message)

    def _finish(self, task: _Task, run: int, code: Optional[int],
                message: Optional[str]) -> None:
        """A started (or about to start) task ended; settle the scheduler and dependents."""
        if run != task.run:
            return
        with self._lock:
            if self._scheduler.state(task.spec.name) is not TaskState.RUNNING:
                return
            self._running -= 1
            transitions = self._scheduler.finished(task.spec.name, code == 0)
            if transitions[0].state is TaskState.FAILED and message is None:
                message = f"the task ended with exit code {code}"
            self._ended(transitions, code, message)
            self._dirty = True

    def _kill(self, task_id: str) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or self._scheduler.state(task_id) is not TaskState.RUNNING:
                return
        grace = self.config.cancel_grace_period
        if task.node is None:
            return  # placed but not started: _start_task sees user_canceled
        if task.node == self.allocation.local_node:
            assert self._local is not None
            self._local.signal(task_id, grace)
            return
        assert self._agents is not None
        if self._agents.signal(task.node, task_id, grace):
            self._finish(task, task.run, None, None)

    def _on_time_limit(self, task_id: str, run: int) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.run != run \
                    or self._scheduler.state(task_id) is not TaskState.RUNNING:
                return
            task.timed_out = True
        self._kill(task_id)

    def _begin_close(self) -> None:
        with self._lock:
            self._closing = True
            if self._agents is not None:
                self._agents.closing = True
            for name in self._tasks:
                state = self._scheduler.state(name)
                if not state.final:
                    # A running task then ends CANCELED, not FAILED, when its process exits.
                    transitions = self._scheduler.cancel(name)
                    if transitions:
                        self._ended(transitions)
            running = [n for n in self._tasks
                       if self._scheduler.state(n) is TaskState.RUNNING]
        for name in running:
            self._kill(name)

    def _shutdown(self) -> None:
        try:
            self._deliver()
            if self._agents is not None:
                self._agents.stop()
            if self._journal is not None:
                with self._lock:
                    records, self._journal_records = self._journal_records, []
                self._journal.write(records)
                self._journal.close()
                self._journal = None
            if self._loop_watch is not None:
                self._loop_watch.close()
            if self._local is not None:
                self._local.remove_tmp_root()
            if self._run_dir is not None:
                remove_tree(self._run_dir)
        finally:
            self._closed.set()
            with self._changed:
                self._changed.notify_all()

    def _node_lost(self, node: str, task_ids: List[str], why: str) -> None:
        """A remote node's agent is gone: the tasks it had fail with ``why``."""
        for name in task_ids:
            with self._lock:
                task = self._tasks.get(name)
            if task is not None:
                self._finish(task, task.run, None, f"node {node} is lost: {why}")
