"""The pilot engine: runs the tasks the scheduler places, on the nodes of one allocation.

The engine owns a :class:`~psij.executors.pilot.scheduler.Scheduler`, a pure machine it feeds
the tasks' events, and keeps the books of the tasks it placed. Tasks on the node this process
runs on are sent, in batches, to worker processes (:mod:`~psij.executors.pilot._worker`; the
engine's side of them, how many and when, is :mod:`~psij.executors.pilot._local_workers`),
except on a node of three cores or fewer, where the engine starts them itself
(:mod:`~psij.executors.pilot._inline_tasks` says why); tasks on other nodes are sent to one
agent per node (:mod:`psij.executors.pilot.agent`), started with the allocation's launcher and
connected back over a socket (the engine's side of them is
:mod:`~psij.executors.pilot._remote_nodes`); with an allocation policy, nodes also join as the
allocations it asks for start (:mod:`~psij.executors.pilot._elastic`). Its books on the tasks are
:mod:`~psij.executors.pilot._task_books`; what other threads tell it arrives as the typed
events of :mod:`~psij.executors.pilot._engine_events`.

Threads:

- One engine thread owns the workers' and agents' connections, the journal's start and end
  records, and listener delivery. It sleeps in one ``select`` (a :class:`psij._wakeup.Wakeup`)
  on those pipes and sockets, a pidfd per worker and its next timer; it never polls tasks.
  Time limits, agents' connect deadlines and the journal's fsync interval are measured on the
  engine's :class:`~psij._clock.Clock`.
- A local task's start and end arrive in a worker's report, read on the engine thread. A
  worker's own exit is seen through its pidfd; where pidfds do not exist, from the shared
  ``ProcessWatch`` thread, which only queues it. A task is RUNNING once its worker reported
  its start (a task that could not start never is).
- ``submit``/``cancel``/``status``/... may be called from any thread; they hold one short lock
  around the scheduler's books and never run listeners or spawn processes under it.
- Listeners get every state change, in order, on the engine thread, with no lock held; an
  exception in a listener is logged and does not affect the engine or other listeners.

A scheduling pass (the scheduler's ``Schedule`` event) runs once per batch of events
(submissions, exits, cancels), so its cost is the scheduler's: it grows with the number of
distinct task shapes, not with waiting tasks.

Journal (:mod:`~psij.executors.pilot.journal`): one JSON line per event (submit, start, end,
user cancel, forget), appended with one write per turn of the loop (never one per task), before
that turn's events reach the listeners, and fsync'd at most once a second and at close (when
and what, and what a crash can lose: :mod:`~psij.executors.pilot._engine_output`); a line that
cannot be used is skipped with a warning on resume. ``resume`` reads it back: tasks that
succeeded are not run again (they count as succeeded for what depends on them), tasks a user
cancelled stay cancelled, all others are queued again in their original order.

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
import signal
import threading
from collections import deque
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Deque, List, Optional, Sequence, Union

from psij import _check
from psij._clock import Clock, MonotonicClock, wall_time
from psij._lazylog import LazyLogger
from psij._wakeup import Timers, Wakeup, timer_delay
from psij.executors._process import reap_later
from psij.executors.pilot._engine_events import (
    TASK_EVENTS,
    AgentLauncherExited,
    CloseRequested,
    EndSignalDue,
    EngineEvent,
    KillTask,
    RunCall,
    StopRequested,
    TaskExited,
    TimeLimitReached,
    WorkerExited,
    time_limit_message,
)
from psij.executors.pilot._engine_output import EngineOutput
from psij.executors.pilot._local_workers import LocalWorkers, worker_limit
from psij.executors.pilot._remote_nodes import RemoteNodes
from psij.executors.pilot._run_dir import (
    make_run_dir,
    remove_dead_run_dirs,
    remove_tree,
    temporary_base,
)
from psij.executors.pilot._task_books import TaskEntry
from psij.executors.pilot._task_process import HAS_PIDFD, Launch, LaunchError, LoopWatch
from psij.executors.pilot.allocation import Allocation
from psij.executors.pilot.engine_config import EngineConfig
from psij.executors.pilot.journal import (
    RUN_VARIABLE,
    Journal,
    cancel_line,
    forget_line,
    read_journal,
    start_line,
    submit_lines,
)
from psij.executors.pilot.resources import ResourcePool
from psij.executors.pilot.scheduler import (
    SCHEDULE,
    CancelAsked,
    Forgotten,
    NodeLost,
    TaskFinished,
    TaskState,
)
from psij.executors.pilot.task_environment import ShareFiles
from psij.executors.pilot.tasks import (
    ReportedUse,
    TaskEvent,
    TaskShare,
    TaskSpec,
    TaskStatus,
    request_from_json,
    request_to_json,
)

if TYPE_CHECKING:
    from psij.executors.pilot._elastic import ElasticAllocations
    from psij.executors.pilot._inline_tasks import InlineTasks

__all__ = ["EngineConfig", "PilotEngine", "TaskEvent", "TaskShare", "TaskSpec", "TaskStatus",
           "read_journal", "request_from_json", "request_to_json"]

# Agents, sockets and their modules are loaded only when a pilot has nodes other than its own,
# and logging only when something goes wrong: neither is on the start-up path of a pilot.
logger = LazyLogger(__name__)

_MAX_ERRORS_IN_A_ROW = 20
_SPIN_CLOCK = MonotonicClock()  # the pause after an error guards the CPU, not a rule: never manual


# -- engine internals -------------------------------------------------------------------------


class PilotEngine(EngineOutput):
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
        self._timers = Timers(self._clock)  # the engine's own: time limits
        super().__init__(ResourcePool(list(allocation.nodes)), self.config.work_directory)
        self._inbox: Deque[EngineEvent] = deque()
        self._wakeup: Optional[Wakeup] = None
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[Union[LocalWorkers, InlineTasks]] = None
        # Exits of the workers: in the engine's own loop where pidfds exist, else through the
        # shared ProcessWatch thread.
        self._loop_watch: Optional[LoopWatch] = None
        self._share_files = ShareFiles(allocation, self.config.slurm_variables)
        self._agents: Optional[RemoteNodes] = None
        self._run_dir: Optional[Path] = None
        self._closing = False  # the engine thread is cancelling everything
        self._refusing = False  # close() was called: no more submissions
        self._closed = threading.Event()
        self._started = False
        self._running = 0  # tasks whose process may still run (local or agent)
        # Marks this run's task processes, so that a resume kills only a crashed run's own
        # processes, never one that reused a pid.
        self._run_id = os.urandom(8).hex()
        self._swept = False  # whether the run folders of dead pilots were removed
        self.failure: Optional[str] = None  # why the engine stopped, if it had to
        self.elastic: Optional[ElasticAllocations] = None  # with an allocation policy

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
        self._wakeup = Wakeup()
        selector = self._wakeup.selector
        if HAS_PIDFD:
            self._loop_watch = LoopWatch(selector)
        local = self.allocation.local_node
        if local is not None:
            cores = next(n.cores for n in self.allocation.nodes if n.name == local)
            tmp_root = self._run_dir / "tmp"
            tmp_root.mkdir(mode=0o700)
            environment = dict(os.environ)
            # Loaded here: an engine that runs no task on its own node does without it.
            from psij.executors.pilot._inline_tasks import InlineTasks, inline_fits
            if inline_fits(cores, config.workers, environment, self._loop_watch):
                assert self._loop_watch is not None
                self._workers = InlineTasks(
                    tmp_root, self._run_id, selector, self._loop_watch, self._post,
                    self._on_started, self._on_exit_safe, self._workers_lost,
                    config.cancel_grace_period, environment)
            else:
                self._workers = LocalWorkers(
                    tmp_root, self._run_id, selector, self._loop_watch, self._post,
                    self._on_started, self._on_exit_safe, self._workers_lost,
                    worker_limit(cores, config.workers), cores, config.cancel_grace_period,
                    environment)
        if config.journal is not None:
            previous = read_journal(config.journal) if config.resume else []
            self._journal = Journal(config.journal, self._clock)
            if previous:
                self._replay(previous)
        policy = config.allocation_policy
        if self.allocation.remote_nodes or policy is not None:
            self._agents = RemoteNodes(self.allocation, config, self._clock, selector,
                                       self._post, self._on_exit, self._node_lost,
                                       partial(self._on_started, pid=None))
            self._agents.start(self._run_dir)
            if policy is not None:
                from psij.executors.pilot._elastic import ElasticAllocations
                self.elastic = ElasticAllocations(self, policy, self._agents,
                                                  lambda call: self._post(RunCall(call)))
        self._thread = threading.Thread(target=self._loop, name="psij-pilot-engine",
                                        daemon=True)
        self._thread.start()
        self._wake()

    def close(self, timeout: Optional[float] = None, wait: bool = True) -> None:
        """Cancel every task that has not ended, wait for their processes to exit (at most
        the grace period plus ``timeout``, default 5 s), stop the agents, flush the journal.
        ``wait=False`` (a collected executor) returns at once: the engine thread does it all,
        its last step the run folder's removal and the wake-up pipe's close."""
        with self._lock:
            self._refusing = True
        if self._thread is None:
            return
        self._post(CloseRequested())
        if not wait or threading.current_thread() is self._thread:
            return  # the engine thread stops itself (from a listener: a collected executor)
        limit = self.config.cancel_grace_period + (5.0 if timeout is None else timeout)
        self._clock.wait(self._closed, limit)
        if self._thread.is_alive():
            self._post(StopRequested())
        self._thread.join(5.0)

    # -- public operations ------------------------------------------------------------------

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
                self._journal.write(submit_lines([t.to_json() for t in tasks], [
                    self._tasks[i].history[0][0] for i in ids]))
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
            transitions = self._scheduler.step(CancelAsked(task_id))
            if transitions:
                self._ended(transitions)
                self._dirty = True
            else:
                self._inbox.append(KillTask(task_id))
        self._wake()

    def forget(self, task_id: str) -> None:
        """Drop an ended task so its name can be used again (``IllegalEvent`` for a task that
        has not ended, or that the pilot does not know)."""
        with self._lock:
            self._scheduler.step(Forgotten(task_id))
            task = self._tasks.pop(task_id)
            if task.reported is not None and task.reported.final:
                self._delivered_finals -= 1
            self._dependents.pop(task_id, None)
            if self._journal is not None:
                self._journal.write([forget_line(task_id)])

    # -- engine thread ----------------------------------------------------------------------

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:  # else not started yet
            wakeup.wake()

    def _post(self, event: EngineEvent) -> None:
        self._inbox.append(event)
        self._wake()

    def _on_exit_safe(self, task_id: str, code: Optional[int], message: Optional[str],
                      use: Optional[ReportedUse]) -> None:
        # On the engine thread (a worker's report): handled at once.
        try:
            self._on_exit(task_id, code, message, use)
        except Exception as ex:
            self._task_broke(task_id, ex)

    def _on_started(self, task_id: str, pid: Optional[int]) -> None:
        """On the engine thread: a worker or an agent started the task's process (``pid``:
        of a worker's; an agent's is on another node, where a resume cannot reach it)."""
        try:
            with self._lock:
                task = self._tasks.get(task_id)
                if task is None or task.node is None \
                        or self._scheduler.state(task_id) is not TaskState.RUNNING:
                    return
                task.started = wall_time()
                self._journal_records.append(start_line(
                    task_id, task.node, pid, None if pid is None else self._run_id,
                    task.started, task.share))
                self._report(task, TaskState.RUNNING, share=task.share)
            limit = task.spec.time_limit
            if limit is not None:
                self._timers.call_later(limit, partial(
                    self._inbox.append, TimeLimitReached(task_id, task.run)))
                warning = task.spec.end_signal
                if warning is not None:
                    self._timers.call_later(limit - int(warning.partition("@")[2]), partial(
                        self._inbox.append, EndSignalDue(task_id, task.run)))
        except Exception as ex:
            self._task_broke(task_id, ex)

    def _loop(self) -> None:
        wakeup = self._wakeup
        assert wakeup is not None
        watch = self._loop_watch
        errors = 0  # unexpected errors in a row
        if self._workers is not None:
            # On this thread, as every worker: a worker dies with the thread that started it.
            self._workers.start_first()
        try:
            while True:
                try:
                    timeout = self._timeout()
                    if timeout != 0.0:
                        self._flush()
                        if not self._swept:
                            self._sweep()
                    for key, mask in wakeup.select(timeout):
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
                    _SPIN_CLOCK.sleep(0.01 * errors)  # never spin on an error that repeats
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
        if self._workers is not None:
            self._workers.signal(task_id, 0.0)
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
        if self._workers is not None:
            self._workers.signal_all(0.0)

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
        for left in (self._timers.next_timeout(), self._flush_in(),
                     None if self._agents is None else self._agents.next_deadline_in(),
                     None if self.elastic is None else self.elastic.due_in(self._clock.now())):
            if left is not None:
                due = left if due is None else min(due, left)
        return None if due is None else timer_delay(due)

    def _step(self) -> bool:
        """Handle what arrived, schedule, start, deliver; False once the engine may stop."""
        stop = False
        inbox = self._inbox
        for action in self._timers.pop_due():
            action()
        while inbox:
            if self._handle(inbox.popleft()):
                stop = True
        if self._agents:
            self._agents.check_deadlines()
        if self._dirty and not self._closing:
            # Ends that others wait for first: a task must not start before the end of its
            # dependencies is written, or a crash right after its start would make a resume
            # run them again.
            if self._journal_urgent:
                self._write_journal()
            self._schedule()
        if self.elastic is not None and not self._closing:
            self.elastic.turn()  # after the pass: its backlog is what the pass left
        if self._journal is not None:
            self._journal.sync()
        if self._workers is not None:
            self._workers.flush()
        if self._agents:
            self._agents.flush()
        self._deliver()
        self._flush()
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
            self._on_exit(event.task_id, event.code, event.message, None)
        elif isinstance(event, KillTask):
            self._kill(event.task_id)
        elif isinstance(event, TimeLimitReached):
            self._on_time_limit(event.task_id, event.run)
        elif isinstance(event, EndSignalDue):
            self._send_end_signal(event.task_id, event.run)
        elif isinstance(event, WorkerExited):
            if self._workers is not None:
                self._workers.worker_exited(event)
        elif isinstance(event, AgentLauncherExited):
            if self._agents is not None:
                self._agents.launcher_exited(event)
        elif isinstance(event, RunCall):
            event.call()
        elif isinstance(event, CloseRequested):
            self._begin_close()
        elif isinstance(event, StopRequested):
            return True
        return False

    def _schedule(self) -> None:
        with self._lock:
            self._dirty = False
            placements = self._scheduler.step(SCHEDULE)
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

    def _start_task(self, task: TaskEntry, spec: TaskSpec) -> None:
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
        environment, nodefile = self._share_files.get(share, spec.resources.cores_per_process)
        environment["QCG_PM_STEP_ID"] = spec.name
        environment[RUN_VARIABLE] = self._run_id
        if spec.environment:
            environment.update(spec.environment)
        node = share.nodes[0]
        task.node = node
        argv = [spec.executable, *spec.arguments]
        if node == self.allocation.local_node:
            # RUNNING, the journal's start and the time limit once the worker reports the
            # start (see _on_started).
            assert self._workers is not None
            try:
                self._workers.assign([spec.name, argv, task.directory, environment,
                                      spec.inherit_environment, spec.stdin, spec.stdout,
                                      spec.stderr, nodefile, spec.create_directories])
            except LaunchError as ex:
                self._finish(task, task.run, None, f"could not start the task: {ex}")
            return
        assert self._agents is not None
        lost = self._agents.spawn(node, Launch(
            spec.name, argv, task.directory, environment, spec.inherit_environment, spec.stdin,
            spec.stdout, spec.stderr, nodefile, spec.create_directories))
        if lost is not None:
            self._finish(task, task.run, None, f"node {node} is lost: {lost}")
        # RUNNING, the journal's start and the time limit once the agent reports the start.

    def _on_exit(self, task_id: str, code: Optional[int], message: Optional[str],
                 use: Optional[ReportedUse] = None) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            return
        task.use = use  # the process's, as its reaper gave it
        if task.node != self.allocation.local_node and self._agents is not None:
            self._agents.task_ended(task.node, task_id)
        if task.timed_out and code != 0:
            message = time_limit_message(task.spec.time_limit, code)
        self._finish(task, task.run, code, message)

    def _finish(self, task: TaskEntry, run: int, code: Optional[int],
                message: Optional[str]) -> None:
        """A started (or about to start) task ended; settle the scheduler and dependents."""
        if run != task.run:
            return
        with self._lock:
            if self._scheduler.state(task.spec.name) is not TaskState.RUNNING:
                return
            self._running -= 1
            transitions = self._scheduler.step(TaskFinished(task.spec.name, code == 0))
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
            assert self._workers is not None
            self._workers.signal(task_id, grace)
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

    def _send_end_signal(self, task_id: str, run: int) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.run != run or task.node is None or task.spec.end_signal \
                    is None or self._scheduler.state(task_id) is not TaskState.RUNNING:
                return
        signum = int(getattr(signal, "SIG" + task.spec.end_signal.partition("@")[0]))
        if task.node == self.allocation.local_node:
            assert self._workers is not None
            self._workers.send(task_id, signum)
        else:
            assert self._agents is not None
            self._agents.send(task.node, task_id, signum)

    def _begin_close(self) -> None:
        with self._lock:
            self._closing = True
            if self._agents is not None:
                self._agents.closing = True
            for name in self._tasks:
                state = self._scheduler.state(name)
                if not state.final:
                    # A running task then ends CANCELED, not FAILED, when its process exits.
                    transitions = self._scheduler.step(CancelAsked(name))
                    if transitions:
                        self._ended(transitions)
            running = [n for n in self._tasks
                       if self._scheduler.state(n) is TaskState.RUNNING]
        for name in running:
            self._kill(name)
        if self.elastic is not None:  # after the cancels: its tasks there end CANCELED
            self.elastic.close()

    def _shutdown(self) -> None:
        try:
            self._deliver()
            self._flush(force=True)
            late = self._workers.stop() if self._workers is not None else []
            if self._agents is not None:
                self._agents.stop()
            if self.elastic is not None:
                self.elastic.shutdown()
            if self._journal is not None:
                with self._lock:
                    records, self._journal_records = self._journal_records, []
                self._journal.write(records)
                self._journal.close()
                self._journal = None
            if self._loop_watch is not None:
                self._loop_watch.close()
            if self._run_dir is not None:  # and again once every worker ended (one slow to
                remove_tree(self._run_dir)  # start makes its folder again)
                reap_later(late, partial(remove_tree, self._run_dir) if late else None)
        finally:
            if self._wakeup is not None:
                self._wakeup.close()  # no one selects on it any more
            self._closed.set()
            with self._changed:
                self._changed.notify_all()

    def _node_lost(self, node: str, task_ids: List[str], why: str) -> None:
        """A remote node's agent is gone: nothing more is placed there, the tasks it had fail
        with ``why``, and so do the waiting ones that cannot fit the nodes left."""
        with self._lock:
            transitions = self._scheduler.step(NodeLost(node, why))
            if transitions:
                self._ended(transitions)
                self._dirty = True
        self._workers_lost(task_ids, f"node {node} is lost: {why}")

    def _workers_lost(self, task_ids: List[str], why: str) -> None:
        """A worker of this node (or a node) is gone: the tasks it had fail with ``why``."""
        for name in task_ids:
            with self._lock:
                task = self._tasks.get(name)
            if task is not None:
                self._finish(task, task.run, None, why)
