"""Queue caps toward a batch scheduler (``max_queued_per_shape``), as a pure machine.

The machine decides which jobs a batch executor gives to the scheduler and which it keeps back
("holds") in the client. It is driven by events and answers with actions; it runs no commands,
starts no threads and reads no clock. The executor's submit path and its status poller feed it
and carry out what it asks for (:mod:`psij.executors.batch._held_jobs`).

Events (:meth:`Holding.step`): :class:`Arrived`, :class:`Submitted`, :class:`SubmitFailed`,
:class:`LeftQueue`, :class:`Cancel`, :class:`Reprioritize`. Actions: :class:`Submit`,
:class:`Hold`, :class:`Dropped`, :class:`CancelSubmitted`.

Rules:

- Jobs are grouped by resource shape (:mod:`psij.executors.batch._shapes`). Per shape, at most
  ``cap`` jobs are *queued*: being submitted, or submitted and not yet started. Running jobs
  are never counted.
- A job that arrives while its shape has room is submitted at once (:class:`Submit`);
  otherwise it is held (:class:`Hold`). While a shape has room none of its jobs is held.
- When a queued job leaves the queue (it started, or ended without starting) or its submission
  failed, the slot goes to the held job of that shape with the highest priority; equal
  priorities go by arrival. A submission that fails frees its slot like a start does, so a
  shape whose jobs all fail at submission goes through its held jobs (each failing on its own)
  and never blocks another shape: shapes share nothing.
- A held job's priority may change (:class:`Reprioritize`): it takes its new place among the
  held jobs of its shape at once (keeping its arrival for ties). Only held jobs are reordered
  here; the executor gives a queued job's new priority to the scheduler itself (``use_nice``).
- The shapes that hold jobs (:meth:`Holding.holding`) are the ones whose queued jobs the
  executor watches closely: a start there frees a slot for a held job.
- Cancelling a held job drops it (:class:`Dropped`, the executor reports CANCELED). Cancelling a
  job whose submission is under way is remembered: once it is submitted the executor is asked
  to cancel it in the scheduler (:class:`CancelSubmitted`); if its submission fails, nothing
  more is done. Cancelling a job already queued in the scheduler is not the machine's business
  (the executor cancels it there and feeds :class:`LeftQueue` when it leaves).
- Cost: each shape keeps its held jobs in a heap ordered by (priority, arrival), so choosing
  the next job is a look at one shape's head, O(log of that shape's held jobs), whatever the
  number of held jobs; a cancelled held job, or the old place of a reprioritized one, is removed
  lazily when it reaches the head.
- An event that is not legal for the job's phase (unknown job, a job arriving twice, a
  submission outcome for a job not being submitted, ...), or of a class the machine does not
  take, raises :class:`IllegalEvent` and changes nothing: every check is made before the
  state is touched.

The state is the machine's own (a heap per shape, a dict per job): with a million held jobs,
copying immutable values at each step would cost far more than the decision itself. Events
and actions are immutable values.
"""

from enum import Enum
from heapq import heappop, heappush
from typing import AbstractSet, Dict, Hashable, List, Optional, Set, Tuple, Union

from psij._machine import IllegalEvent, StateMachine, handles
from psij._record import Record

__all__ = [
    "Action", "Arrived", "Cancel", "CancelSubmitted", "Dropped", "Event", "Hold", "Holding",
    "IllegalEvent", "LeftQueue", "Phase", "Reprioritize", "Submit", "SubmitFailed", "Submitted",
]

Key = Hashable


class Phase(Enum):
    """Where a job known to the machine is."""

    HELD = "held"
    SUBMITTING = "submitting"
    QUEUED = "queued"


# ------------------------------------------------------------------------------------- events


class _Keyed(Record):
    """An event or action about one job."""

    key: Key


class Arrived(Record):
    """A job is to be submitted; ``shape`` groups it, higher ``priority`` goes first."""

    key: Key
    shape: Hashable
    priority: Union[int, float]


class Submitted(_Keyed):
    """The scheduler accepted the job: it is queued there."""


class SubmitFailed(_Keyed):
    """The job's submission failed; the job is no longer the machine's."""


class LeftQueue(_Keyed):
    """A submitted job is no longer waiting in the scheduler's queue (it started or ended)."""


class Cancel(_Keyed):
    """Cancel a held job, or a job whose submission is under way."""


class Reprioritize(Record):
    """A held job's priority is now ``priority``."""

    key: Key
    priority: Union[int, float]


Event = Union[Arrived, Submitted, SubmitFailed, LeftQueue, Cancel, Reprioritize]

# ------------------------------------------------------------------------------------ actions


class Submit(_Keyed):
    """Submit this job now, then feed Submitted or SubmitFailed."""


class Hold(Record):
    """The job is held by the client (``held`` jobs of its shape are held now)."""

    key: Key
    held: int


class Dropped(_Keyed):
    """A held job was cancelled before it was submitted."""


class CancelSubmitted(_Keyed):
    """The job was cancelled while it was being submitted: cancel it in the scheduler."""


Action = Union[Submit, Hold, Dropped, CancelSubmitted]

# -------------------------------------------------------------------------------------- state


class _Shape:
    """The jobs of one shape: the held ones (a heap) and how many are queued."""

    __slots__ = ("heap", "held", "key", "queued")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        # (-priority, arrival, key): the smallest is the next to submit.
        self.heap: List[Tuple[Union[int, float], int, Key]] = []
        self.held = 0
        self.queued = 0


class _Job:
    __slots__ = ("arrival", "cancel", "phase", "priority", "shape")

    def __init__(self, shape: _Shape, phase: Phase, arrival: int,
                 priority: Union[int, float]) -> None:
        self.shape = shape
        self.phase = phase
        self.arrival = arrival
        self.priority = priority
        self.cancel = False


class Holding(StateMachine):
    """The machine: ``step(event, now)`` gives the actions (see the module's rules)."""

    def __init__(self, cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_queued_per_shape: expected a whole number of at least 1, "
                             f"got {cap!r}")
        self.cap = cap
        self._shapes: Dict[Hashable, _Shape] = {}
        self._jobs: Dict[Key, _Job] = {}
        self._holding: Set[Hashable] = set()
        self._arrivals = 0
        self.decisions = 0  # how many times a held job was chosen for a freed slot
        self.holding_changes = 0  # how many times the set of shapes that hold jobs changed

    # -- queries

    def phase(self, key: Key) -> Optional[Phase]:
        """Where the job is (None: not known to the machine)."""
        job = self._jobs.get(key)
        return None if job is None else job.phase

    def held(self) -> int:
        """How many jobs are held, all shapes together."""
        return sum(s.held for s in self._shapes.values())

    def counts(self, shape: Hashable) -> Tuple[int, int]:
        """(queued, held) for ``shape``."""
        s = self._shapes.get(shape)
        return (0, 0) if s is None else (s.queued, s.held)

    def shape_of(self, key: Key) -> Optional[Hashable]:
        """The shape of a job known to the machine (None: not known)."""
        job = self._jobs.get(key)
        return None if job is None else job.shape.key

    def holding(self) -> AbstractSet[Hashable]:
        """The shapes that hold jobs now (a copy)."""
        return frozenset(self._holding)

    # -- step

    def step(self, event: Event, now: float = 0.0) -> List[Action]:
        """Apply ``event`` (``now`` is not needed by these rules); the actions to carry out."""
        actions: List[Action] = self.event_handlers[type(event)](self, event)
        return actions

    @handles(LeftQueue)
    def _left_queue(self, event: LeftQueue) -> List[Action]:
        job = self._job(event, Phase.QUEUED)
        del self._jobs[event.key]
        return self._free(job.shape)

    @handles(Submitted)
    def _submitted(self, event: Submitted) -> List[Action]:
        job = self._job(event, Phase.SUBMITTING)
        job.phase = Phase.QUEUED
        return [CancelSubmitted(event.key)] if job.cancel else []

    @handles(SubmitFailed)
    def _submit_failed(self, event: SubmitFailed) -> List[Action]:
        job = self._job(event, Phase.SUBMITTING)
        del self._jobs[event.key]
        return self._free(job.shape)

    def _job(self, event: Event, phase: Phase) -> _Job:
        job = self._jobs.get(event.key)
        if job is None:
            raise IllegalEvent(f"{type(event).__name__}: job {event.key!r} is not known")
        if job.phase is not phase:
            raise IllegalEvent(f"{type(event).__name__}: job {event.key!r} is "
                               f"{job.phase.value}, not {phase.value}")
        return job

    @handles(Arrived)
    def _arrived(self, event: Arrived) -> List[Action]:
        if event.key in self._jobs:
            raise IllegalEvent(f"Arrived: job {event.key!r} is already known")
        priority = _priority(event)
        shape = self._shapes.get(event.shape)
        if shape is None:
            shape = self._shapes[event.shape] = _Shape(event.shape)
        self._arrivals += 1
        if shape.queued < self.cap:
            shape.queued += 1
            self._jobs[event.key] = _Job(shape, Phase.SUBMITTING, self._arrivals, priority)
            return [Submit(event.key)]
        self._jobs[event.key] = _Job(shape, Phase.HELD, self._arrivals, priority)
        heappush(shape.heap, (-priority, self._arrivals, event.key))
        self._count_held(shape, 1)
        return [Hold(event.key, shape.held)]

    def _count_held(self, shape: _Shape, change: int) -> None:
        shape.held += change
        if (shape.held > 0) is not (shape.key in self._holding):
            (self._holding.add if shape.held > 0 else self._holding.discard)(shape.key)
            self.holding_changes += 1

    def _free(self, shape: _Shape) -> List[Action]:
        """A queued slot of ``shape`` was freed: give it to the first held job."""
        heap = shape.heap
        jobs = self._jobs
        while heap:
            negative, arrival, key = heappop(heap)
            job = jobs.get(key)
            if job is None or job.phase is not Phase.HELD or job.arrival != arrival \
                    or job.priority != -negative:
                continue  # cancelled while held, or the old place of a reprioritized job
            self._count_held(shape, -1)
            job.phase = Phase.SUBMITTING
            self.decisions += 1
            return [Submit(key)]
        shape.queued -= 1
        return []

    @handles(Reprioritize)
    def _reprioritize(self, event: Reprioritize) -> List[Action]:
        job = self._job(event, Phase.HELD)
        priority = _priority(event)
        if priority != job.priority:
            job.priority = priority  # its old place is skipped when it comes up
            heappush(job.shape.heap, (-priority, job.arrival, event.key))
        return []

    @handles(Cancel)
    def _cancel(self, event: Cancel) -> List[Action]:
        job = self._jobs.get(event.key)
        if job is None or job.phase is Phase.QUEUED:
            where = "not known" if job is None else "queued in the scheduler"
            raise IllegalEvent(f"Cancel: job {event.key!r} is {where}")
        if job.phase is Phase.SUBMITTING:
            job.cancel = True
            return []
        del self._jobs[event.key]  # its heap entry is skipped when it comes up
        self._count_held(job.shape, -1)
        return [Dropped(event.key)]


def _priority(event: Union[Arrived, Reprioritize]) -> Union[int, float]:
    priority = event.priority
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) \
            or priority != priority:
        raise IllegalEvent(f"{type(event).__name__}: job {event.key!r} has priority "
                           f"{priority!r}; expected a number")
    return priority
