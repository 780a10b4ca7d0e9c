"""The pilot's task scheduler: which waiting task starts next, on which resources.

A pure machine: no I/O, no threads, no subprocesses, no clock. The engine feeds
:meth:`Scheduler.step` events and carries out its actions: it starts the tasks that the
:class:`Placement` actions name and reports how they ended. Resource arithmetic lives in
:mod:`psij.executors.pilot.resources`.

Events (:meth:`Scheduler.step`): :class:`TaskSubmitted` and :class:`SucceededBefore` (a task
arrives; the second for one that SUCCEEDED in an earlier run of the pilot, which takes no
resources and is never placed), :class:`Schedule` (place what fits now),
:class:`TaskFinished`, :class:`CancelAsked`, :class:`NodeLost`, :class:`NodeAdded` (an
elastic pilot's node joins: what did not fit may fit now) and :class:`Forgotten`.
Actions: a :class:`Placement` for each task a ``Schedule`` starts, a :class:`Transition` for
each task another event ends (the task it names first, then its dependents). Scheduling is an
event of its own, not a pass run after every event: a caller feeds a batch of events, then one
``Schedule`` (:data:`SCHEDULE`), so a pass is paid once per batch, whatever its length.
Queries (:meth:`Scheduler.state`, :meth:`Scheduler.message`, ...) are methods: they change
nothing.

Rules:

- A task is WAITING while some task it depends on (``after``) has not ended, QUEUED once all
  of them SUCCEEDED, RUNNING once placed, and then SUCCEEDED, FAILED or CANCELED. A task whose
  dependency ends FAILED, CANCELED or OMITTED becomes OMITTED, and so do, in turn, the tasks
  that depend on it. A dependency named at submission must already be known (a task name or an
  iteration group, which stands for all of its members).
- A task whose shape does not fit the pool even when the pool is empty ends FAILED at
  submission, with a message saying what it asked for and what the pool has; a task whose
  dependency already failed ends OMITTED at submission. Either is the submission's
  :class:`Transition`.
- A lost node (:class:`NodeLost`) gets no more tasks; every waiting or queued task that cannot
  fit the nodes left ends FAILED then, its dependents OMITTED. The caller fails the tasks that
  ran there.
- Order: higher ``priority`` first, then earlier submission. Priority is a barrier: while a
  QUEUED task of some priority does not fit, no task of lower priority starts. Within one
  priority, a task that does not fit does not hold back later ones that do (as in QCG-PilotJob
  request files: skip what cannot start, fill what is left). A wide task that must not be
  overtaken is therefore given a higher priority; the pool then drains for it.
- Queued tasks are kept per *shape* (equal resolved resource requests), each shape ordered by
  priority, then arrival. A scheduling pass looks at the head of each shape at most once plus
  once per task it starts, and a shape that did not fit is not tried again until resources are
  released. So the cost of a decision grows with the number of distinct shapes (and nodes),
  never with the number of waiting tasks. :class:`SchedulerStats` counts that work.
- :class:`TaskFinished` releases a RUNNING task's resources. A task whose cancel was asked
  while it ran ends CANCELED unless it reports success. Cancelling a WAITING or QUEUED task
  ends it at once; cancelling a RUNNING one only records the request (the caller stops the
  process and then feeds ``TaskFinished``); cancelling an ended task does nothing.
  :class:`Forgotten` drops an ended task, so that its name can be used again (QCG's
  ``removeJob``).
- An event the scheduler cannot accept in its state (a name or group already used, a
  dependency it does not know, ``TaskFinished``, ``CancelAsked`` or ``Forgotten`` of a task it
  does not know, ``TaskFinished`` of a task that is not running, ``Forgotten`` of a task that
  has not ended), or of a class it does not take, raises ``psij._machine.IllegalEvent`` and
  changes nothing: every check is made before the books are touched. A value that is wrong
  whatever the state (an empty name, a flag that is not a bool) is refused when the event is
  made (``ValueError`` or ``TypeError``), and a query about an unknown task raises
  ``ValueError``.
"""

import re
from bisect import bisect_left, bisect_right
from heapq import heapify, heappop, heappush
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union, overload

from psij import _check
from psij._machine import IllegalEvent, StateMachine, handles
from psij.executors.pilot._scheduler_values import (
    SCHEDULE,
    Action,
    CancelAsked,
    Event,
    Forgotten,
    NodeAdded,
    NodeLost,
    Placement,
    Schedule,
    SucceededBefore,
    TaskFinished,
    TaskRequest,
    TaskSubmitted,
    Transition,
)
from psij.executors.pilot._shape_queue import ShapeQueue
from psij.executors.pilot._task_state import TaskState
from psij.executors.pilot.resources import UNBOUNDED, ResourcePool, ResourceRequest, Shape

__all__ = [
    "SCHEDULE", "Action", "CancelAsked", "Event", "Forgotten", "IllegalEvent", "NodeAdded",
    "NodeLost",
    "Placement", "Schedule", "Scheduler", "SchedulerStats", "SucceededBefore", "TaskFinished",
    "TaskRequest", "TaskState", "TaskSubmitted", "Transition", "expand_iterations",
]


_QUEUED = TaskState.QUEUED
_RUNNING = TaskState.RUNNING
_SUCCEEDED = TaskState.SUCCEEDED


# -------------------------------------------------------------------------------------- state


class SchedulerStats:
    """Work counters, for tests and benchmarks (not timings)."""

    __slots__ = ("fit_checks", "heads_examined", "placements", "schedule_calls")

    def __init__(self) -> None:
        self.schedule_calls = 0
        self.heads_examined = 0
        self.fit_checks = 0
        self.placements = 0

    def __repr__(self) -> str:
        return (f"SchedulerStats(schedule_calls={self.schedule_calls}, heads_examined="
                f"{self.heads_examined}, fit_checks={self.fit_checks}, placements="
                f"{self.placements})")


class _Task:
    __slots__ = ("bucket", "cancel_requested", "dependents", "group", "message", "name",
                 "pending", "placement", "priority", "seq", "state")

    def __init__(self, name: str, priority: int, group: Optional[str],
                 bucket: Optional[ShapeQueue], seq: int) -> None:
        self.name = name
        self.priority = priority
        self.group = group
        self.bucket = bucket  # None for a task recorded as having succeeded elsewhere
        self.seq = seq
        self.state = TaskState.WAITING
        self.message: Optional[str] = None
        self.pending = 0
        self.dependents: Optional[List[_Task]] = None
        self.placement: Optional[Placement] = None
        self.cancel_requested = False


# The events whose actions are transitions (all but Schedule).
_Ending = Union[TaskSubmitted, SucceededBefore, TaskFinished, CancelAsked, NodeLost, NodeAdded,
                Forgotten]


class Scheduler(StateMachine):
    """Queues tasks and places them on a :class:`ResourcePool`: ``step(event, now)`` gives
    the actions (see the module's rules)."""

    def __init__(self, pool: ResourcePool) -> None:
        _check.instance("pool", pool, ResourcePool, "ResourcePool", False)
        self._pool = pool
        self._tasks: Dict[str, _Task] = {}
        self._groups: Dict[str, List[str]] = {}
        self._shapes: Dict[ResourceRequest, Shape] = {}
        self._buckets: Dict[Shape, ShapeQueue] = {}
        # Buckets with queued tasks, by the cores they need at least: a pass stops reading
        # them at the first that needs more cores than are free.
        self._ready: List[ShapeQueue] = []
        self._ready_ranks: List[Tuple[int, int]] = []
        self._ready_keys: List[List[Any]] = []  # their keys, in the same order
        # Queued tasks per priority, and the highest such priority (the barrier).
        self._queued_priorities: Dict[int, int] = {}
        self._highest = 0
        self._counts: Dict[TaskState, int] = dict.fromkeys(TaskState, 0)
        self._seq = 0
        # Bumped on every release: a shape that did not fit at this epoch still does not fit.
        self._release_epoch = 0
        self.stats = SchedulerStats()

    @property
    def pool(self) -> ResourcePool:
        return self._pool

    # -- queries ----------------------------------------------------------------------------

    def state(self, task_id: str) -> TaskState:
        return self._task(task_id).state

    def message(self, task_id: str) -> Optional[str]:
        """Why the task is FAILED, CANCELED or OMITTED; None in the other states."""
        return self._task(task_id).message

    def placement(self, task_id: str) -> Optional[Placement]:
        """Where the task runs or ran; None if it never started."""
        return self._task(task_id).placement

    def counts(self) -> Dict[TaskState, int]:
        """How many known tasks are in each state."""
        return dict(self._counts)

    def task_ids(self) -> List[str]:
        """The known tasks, in submission order."""
        return list(self._tasks)

    def is_group(self, name: str) -> bool:
        """Whether ``name`` is an iteration group with members."""
        return name in self._groups

    def group_members(self, group: str) -> Tuple[str, ...]:
        members = self._groups.get(group)
        if members is None:
            raise ValueError(f"group: {group!r} is not an iteration group of this scheduler")
        return tuple(members)

    def shape_count(self) -> int:
        """How many distinct shapes have queued tasks now."""
        return len(self._ready)

    # -- step -------------------------------------------------------------------------------

    @overload
    def step(self, event: Schedule, now: float = 0.0) -> List[Placement]: ...

    @overload
    def step(self, event: _Ending, now: float = 0.0) -> List[Transition]: ...

    def step(self, event: Event, now: float = 0.0) -> Union[List[Placement], List[Transition]]:
        """Apply ``event`` (``now`` is not needed by these rules); the actions to carry out."""
        actions: Union[List[Placement], List[Transition]] = \
            self.event_handlers[type(event)](self, event)
        return actions

    @handles(TaskSubmitted)
    def _submitted(self, event: TaskSubmitted) -> List[Transition]:
        request = event.request
        name = request.name
        self._check_new(name, request.group)
        dependencies = self._dependencies(request.after)  # before a shape queue is made
        bucket = self._bucket(request.resources)

        task = _Task(name, request.priority, request.group, bucket, self._seq)
        self._seq += 1
        self._tasks[name] = task
        self._counts[TaskState.WAITING] += 1
        if task.group is not None:
            self._groups.setdefault(task.group, []).append(name)

        if not bucket.fits_empty:
            message = (f"task {name!r} asks for {bucket.shape.describe()}, which can never "
                       f"fit: the pool has {self._pool.describe()}")
            self._end(task, TaskState.FAILED, message)
            return [Transition(name, TaskState.FAILED, message)]
        failed = next((d for d in dependencies if d.state.final
                       and d.state is not TaskState.SUCCEEDED), None)
        if failed is not None:
            message = _omitted_message(failed)
            self._end(task, TaskState.OMITTED, message)
            return [Transition(name, TaskState.OMITTED, message)]
        for dependency in dependencies:
            if dependency.state is not TaskState.SUCCEEDED:
                task.pending += 1
                if dependency.dependents is None:
                    dependency.dependents = []
                dependency.dependents.append(task)
        if task.pending == 0:
            self._enqueue(task)
        return []

    @handles(SucceededBefore)
    def _succeeded_before(self, event: SucceededBefore) -> List[Transition]:
        task_id, group = event.task_id, event.group
        self._check_new(task_id, group)
        task = _Task(task_id, 0, group, None, self._seq)
        self._seq += 1
        task.state = TaskState.SUCCEEDED
        self._tasks[task_id] = task
        self._counts[TaskState.SUCCEEDED] += 1
        if group is not None:
            self._groups.setdefault(group, []).append(task_id)
        return []

    @handles(Schedule)
    def _schedule(self, event: Schedule) -> List[Placement]:
        stats = self.stats
        stats.schedule_calls += 1
        placements: List[Placement] = []
        if not self._ready:
            return placements
        epoch = self._release_epoch
        pool = self._pool
        free_cores, free_gpus, idle_nodes = pool.free_totals()
        # The shapes that need no more cores than are free, in the order of their heads; the
        # shapes' keys are the heap's entries (a key changes only when its shape starts its
        # head, which takes the key off the heap first).
        enough_cores = bisect_right(self._ready_ranks, (free_cores, UNBOUNDED))
        heap = self._ready_keys[:enough_cores]
        stats.heads_examined += len(heap)
        heapify(heap)
        highest = self._highest
        counts = self._counts
        while heap:
            key = heappop(heap)
            # Candidates come in priority order, and every shape whose head has a higher
            # priority than this one and is still queued was tried and did not fit (or was
            # not even a candidate): the barrier.
            if -key[0] < highest:
                break
            bucket = key[2]
            # Not a candidate: known not to fit since the last release, or short of GPUs or
            # idle nodes in total.
            if bucket.blocked_epoch == epoch or bucket.need_gpus > free_gpus \
                    or bucket.need_idle > idle_nodes:
                continue
            stats.fit_checks += 1
            shares = pool.allocate(bucket.shape)
            if shares is None:
                bucket.blocked_epoch = epoch
                continue
            task = bucket.pop_head()
            self._dequeued(task)
            highest = self._highest
            placement = Placement(task.name, shares)
            task.placement = placement
            counts[_QUEUED] -= 1
            counts[_RUNNING] += 1
            task.state = _RUNNING
            placements.append(placement)
            if bucket.live:
                stats.heads_examined += 1
                heappush(heap, key)
            if pool.free_totals()[0] == 0:
                break  # every shape needs a core: nothing else can start in this pass
        stats.placements += len(placements)
        return placements

    @handles(TaskFinished)
    def _finished(self, event: TaskFinished) -> List[Transition]:
        task_id = event.task_id
        task = self._known(task_id)
        if task.state is not _RUNNING:
            raise IllegalEvent(f"finished: task {task_id!r} is {task.state.value}, "
                               f"not RUNNING")
        assert task.placement is not None
        self._pool.release(task.placement.shares)
        self._release_epoch += 1
        if event.succeeded:
            state, message = _SUCCEEDED, None
        elif task.cancel_requested:
            state, message = TaskState.CANCELED, "canceled while running"
        else:
            state, message = TaskState.FAILED, "the task reported failure"
        counts = self._counts
        counts[_RUNNING] -= 1
        counts[state] += 1
        task.state = state
        task.message = message
        transition = Transition(task.name, state, message)
        if task.dependents is None:
            return [transition]
        return [transition, *self._settle_dependents(task)]

    @handles(CancelAsked)
    def _cancel(self, event: CancelAsked) -> List[Transition]:
        task = self._known(event.task_id)
        if task.state.final:
            return []
        if task.state is TaskState.RUNNING:
            task.cancel_requested = True
            return []
        message = "canceled before it started"
        queued = task.state is TaskState.QUEUED
        self._end(task, TaskState.CANCELED, message)
        if queued:  # after the state change: ``drop`` looks for the next queued task
            assert task.bucket is not None
            task.bucket.drop(task)
            self._dequeued(task)
        return [Transition(task.name, TaskState.CANCELED, message),
                *self._settle_dependents(task)]

    @handles(NodeLost)
    def _node_lost(self, event: NodeLost) -> List[Transition]:
        pool = self._pool
        pool.lose_node(event.node, event.why)
        shut = False
        for queue in self._buckets.values():
            if queue.fits_empty and not pool.could_ever_fit(queue.shape):
                queue.fits_empty = False
                shut = True
        ended: List[Transition] = []
        if not shut:
            return ended
        for task in list(self._tasks.values()):
            bucket = task.bucket
            if bucket is None or bucket.fits_empty \
                    or task.state not in (TaskState.WAITING, TaskState.QUEUED):
                continue
            message = (f"task {task.name!r} asks for {bucket.shape.describe()}, which can no "
                       f"longer fit: the pool has {pool.describe()}")
            queued = task.state is TaskState.QUEUED
            self._end(task, TaskState.FAILED, message)
            if queued:
                bucket.drop(task)
                self._dequeued(task)
            ended.append(Transition(task.name, TaskState.FAILED, message))
            ended.extend(self._settle_dependents(task))
        return ended

    @handles(NodeAdded)
    def _node_added(self, event: NodeAdded) -> List[Transition]:
        pool = self._pool
        if any(node.name == event.node.name for node in pool.nodes):
            raise IllegalEvent(f"node added: {event.node.name!r} is in the pool already")
        pool.add_node(event.node)
        self._release_epoch += 1  # shapes that did not fit may fit now
        for queue in self._buckets.values():
            if not queue.fits_empty and pool.could_ever_fit(queue.shape):
                queue.fits_empty = True  # tasks of that shape are taken from now on
        return []

    @handles(Forgotten)
    def _forgotten(self, event: Forgotten) -> List[Transition]:
        task_id = event.task_id
        task = self._known(task_id)
        if not task.state.final:
            raise IllegalEvent(f"forget: task {task_id!r} is {task.state.value}; only ended "
                               f"tasks can be forgotten")
        del self._tasks[task_id]
        self._counts[task.state] -= 1
        if task.group is not None:
            members = self._groups[task.group]
            members.remove(task_id)
            if not members:
                del self._groups[task.group]
        return []

    # -- internals --------------------------------------------------------------------------

    def _task(self, task_id: str) -> _Task:
        """The task a query names (ValueError: a bad argument)."""
        task = self._tasks.get(task_id)
        if task is None:
            raise ValueError(f"task_id: {task_id!r} is not a task of this scheduler")
        return task

    def _known(self, task_id: str) -> _Task:
        """The task an event names (IllegalEvent: not one of this scheduler's)."""
        task = self._tasks.get(task_id)
        if task is None:
            raise IllegalEvent(f"task_id: {task_id!r} is not a task of this scheduler")
        return task

    def _check_new(self, name: str, group: Optional[str]) -> None:
        """Raise unless ``name`` may name a new task of ``group``."""
        if name in self._tasks:
            raise IllegalEvent(f"TaskRequest.name: {name!r} is already a task of this "
                               f"scheduler; task names must be unique")
        if name in self._groups:
            raise IllegalEvent(f"TaskRequest.name: {name!r} is already the name of an "
                               f"iteration group")
        if group is not None and group in self._tasks:
            raise IllegalEvent(f"TaskRequest.group: {group!r} is already the name of a task")

    def _bucket(self, request: ResourceRequest) -> ShapeQueue:
        shape = self._shapes.get(request)
        if shape is None:
            shape = self._pool.resolve(request)
            self._shapes[request] = shape
        bucket = self._buckets.get(shape)
        if bucket is None:
            bucket = ShapeQueue(shape, self._pool.could_ever_fit(shape), len(self._buckets))
            self._buckets[shape] = bucket
        return bucket

    def _dependencies(self, after: Sequence[str]) -> List[_Task]:
        found: List[_Task] = []
        seen: Set[str] = set()
        for name in after:
            if name in self._tasks:
                names: Sequence[str] = (name,)
            elif name in self._groups:
                names = self._groups[name]
            else:
                raise IllegalEvent(f"TaskRequest.after: {name!r} is neither a task nor an "
                                   f"iteration group known to this scheduler")
            for member in names:
                if member not in seen:
                    seen.add(member)
                    found.append(self._tasks[member])
        return found

    def _move(self, task: _Task, state: TaskState) -> None:
        self._counts[task.state] -= 1
        self._counts[state] += 1
        task.state = state

    def _end(self, task: _Task, state: TaskState, message: Optional[str]) -> None:
        self._move(task, state)
        task.message = message

    def _enqueue(self, task: _Task) -> None:
        self._move(task, TaskState.QUEUED)
        bucket = task.bucket
        assert bucket is not None
        bucket.push(task)
        if bucket.live == 1:
            at = bisect_left(self._ready_ranks, bucket.rank)
            self._ready.insert(at, bucket)
            self._ready_ranks.insert(at, bucket.rank)
            self._ready_keys.insert(at, bucket.key)
        priorities = self._queued_priorities
        if not priorities or task.priority > self._highest:
            self._highest = task.priority
        priorities[task.priority] = priorities.get(task.priority, 0) + 1

    def _dequeued(self, task: _Task) -> None:
        """Books of a task that left its bucket (started or cancelled)."""
        bucket = task.bucket
        assert bucket is not None
        if not bucket.live:
            at = bisect_left(self._ready_ranks, bucket.rank)
            del self._ready[at]
            del self._ready_ranks[at]
            del self._ready_keys[at]
        priorities = self._queued_priorities
        priority = task.priority
        left = priorities[priority] - 1
        if left:
            priorities[priority] = left
        else:
            del priorities[priority]
            if priorities and priority == self._highest:
                self._highest = max(priorities)

    def _settle_dependents(self, ended: _Task) -> List[Transition]:
        omitted: List[Transition] = []
        stack = [ended]
        while stack:
            done = stack.pop()
            dependents, done.dependents = done.dependents, None
            for dependent in dependents or ():
                if dependent.state is not TaskState.WAITING:
                    continue
                if done.state is TaskState.SUCCEEDED:
                    dependent.pending -= 1
                    if dependent.pending == 0:
                        self._enqueue(dependent)
                else:
                    message = _omitted_message(done)
                    self._end(dependent, TaskState.OMITTED, message)
                    omitted.append(Transition(dependent.name, TaskState.OMITTED, message))
                    stack.append(dependent)
        return omitted


def _omitted_message(dependency: _Task) -> str:
    return f"omitted: dependency {dependency.name!r} ended {dependency.state.value}"


_ITERATION_VARIABLE = r"\$\{\s*it\s*\}"


def expand_iterations(request: TaskRequest, start: int, stop: int) -> List[TaskRequest]:
    """The sub-tasks ``name:start`` ... ``name:stop-1`` of an iterative request.

    Each sub-task belongs to the group ``name``, so that a later task with ``after=[name]``
    waits for all of them. ``${it}`` in an ``after`` entry becomes the iteration index, so
    ``after=["prep:${it}"]`` makes iteration i wait for ``prep:i`` only.
    """
    _check.instance("request", request, TaskRequest, "TaskRequest", False)
    first = _check.opt_int("start", start)
    last = _check.opt_int("stop", stop)
    if first is None or last is None:
        raise _check.fail_type("start/stop", (start, stop), "two ints")
    if last <= first:
        raise ValueError(f"iterations: stop ({last}) must be greater than start ({first})")
    if request.group is not None:
        raise ValueError(f"TaskRequest.group: {request.name!r} already belongs to group "
                         f"{request.group!r}; iterations cannot be nested")
    return [TaskRequest(f"{request.name}:{i}", request.resources, request.priority,
                        tuple(re.sub(_ITERATION_VARIABLE, str(i), a) for a in request.after),
                        request.name)
            for i in range(first, last)]
