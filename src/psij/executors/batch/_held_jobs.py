"""Carries out the holding machine's decisions (``max_queued_per_shape``) for a batch executor.

The decisions are made by the pure machine of :mod:`psij.executors.batch._holding`; this module
feeds it (a job submitted by the user, a queued job seen leaving the queue by the status
poller, a submission's outcome, a cancel) and does what it asks:

- A job whose shape has room is submitted at once, in the caller's thread, exactly as without
  a cap (an error raises from ``submit`` and leaves the job NEW and unbound). Of the jobs given
  to ``submit_many``, those with room go to the scheduler together, as job arrays where it has
  them (an array counts as its elements toward the cap).
- A held job is reported QUEUED without a native id, with the message :data:`HELD_MESSAGE`
  and the metadata ``held_by: "client"``, its ``shape`` and how many jobs of that shape are
  held. Its submit script is written only when it is submitted. Before ``submit`` returns it
  is recorded in the job registry as held by this process (:mod:`psij._registry.held`,
  written at once, not by the recorder's writer thread), so that a process killed the next
  instant leaves a row saying so, which ``psij release`` submits.
- Held jobs chosen later are submitted by one worker thread per executor, never by the status
  poller's thread; the jobs chosen within :data:`_GATHER_SECONDS` of each other (several
  slots freed by one poll) go together, as arrays where the scheduler has them. Each is
  recorded as being submitted before, and as no longer held (with its native id) after. A
  submission that fails for a reason the scheduler calls transient is tried again (up to
  :data:`RETRIES` times, waiting longer each time); any other failure ends the job FAILED
  with the scheduler's message, and the next held job of its shape is tried.
- Cancelling a held job ends it CANCELED at once; a job cancelled while being submitted is
  cancelled in the scheduler as soon as it has a native id.
- A new priority (:meth:`HeldJobs.reprioritize`) reorders a held job at once; a job being
  submitted gets it from the scheduler once it has a native id (``use_nice``).
- While a shape holds jobs, the status poller polls that shape's queued jobs at its short
  interval (``initial_queue_polling_delay``), so that a start frees a slot within seconds
  rather than at the next full poll.
- Closing the executor ends the jobs still held FAILED, saying that they were never submitted.

An error while submitting one job fails only that job: the worker logs it and goes on.

The jobs come checked (the executor's check step ran before); everything it needs from the
executor is one :class:`HoldInputs` given at construction (its name, clock and buckets, and
the callables of the steps after the check: submit, set or restate a status, cancel, hurry
the status poller). It never names or imports the executor's class.
"""

import logging
import threading
from collections import deque
from typing import (
    AbstractSet,
    Callable,
    Deque,
    Dict,
    Hashable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from psij import _priority
from psij._clock import Clock
from psij._record import Record
from psij._registry.held import HELD, SUBMITTING
from psij.exceptions import SubmitException
from psij.executors.batch._holding import (
    Action,
    Arrived,
    Cancel,
    CancelSubmitted,
    Dropped,
    Event,
    Hold,
    Holding,
    LeftQueue,
    Phase,
    Reprioritize,
    Submit,
    SubmitFailed,
    Submitted,
)
from psij.executors.batch._shapes import Shape, shape_of
from psij.job import Job
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["HELD_MESSAGE", "RETRIES", "HeldJobs", "HoldInputs"]

logger = logging.getLogger(__name__)

HELD_MESSAGE = "held by the client until fewer jobs of its shape are queued"
RETRIES = 5
_FIRST_RETRY_DELAY = 1.0
_GATHER_SECONDS = 0.05  # how long the worker lets freed slots gather before it submits


class HoldInputs(Record):
    """What the holding takes from a batch executor: ``name`` (of its thread), ``owner`` (the
    executor in words, for the error of a closed one), its ``clock``, the buckets shapes are
    made with (``memory_bucket``, ``tmp_bucket``), and the steps after the check as
    callables: ``submit`` (context -> render -> submit -> track for a checked, bound job; on
    failure the job is unbound and the error raised), ``submit_many`` (the same for several
    jobs, as arrays where the scheduler has them; the jobs that failed, unbound, each with its
    error), ``set_status`` and ``restate`` (a job's status), ``cancel`` (a job in the
    scheduler), ``hurry`` (the status poller, for the shapes that hold jobs) and ``mark``
    (jobs held, being submitted or no longer held, in the job registry at once; see
    :func:`psij._registry.held.mark`)."""

    name: str
    owner: str
    clock: Clock
    memory_bucket: int
    tmp_bucket: int
    submit: Callable[[Job, JobSpec], None]
    submit_many: Callable[[List[Tuple[Job, JobSpec]]], List[Tuple[Job, BaseException]]]
    set_status: Callable[[Job, JobStatus], None]
    restate: Callable[[Job, JobStatus], None]
    cancel: Callable[[Job], None]
    hurry: Callable[[AbstractSet[Hashable]], None]
    mark: Callable[[Sequence[Job], Optional[str], Optional[Tuple[str, int, str]]], None]


class HeldJobs:
    """The holding of one batch executor (see the module's documentation)."""

    def __init__(self, cap: int, hooks: HoldInputs) -> None:
        self._hooks = hooks
        self._machine = Holding(cap)
        self._cond = threading.Condition()
        # Held from a job's arrival until it is recorded as held, and taken to record jobs as
        # being submitted: the registry never gets the second before the first.
        self._marking = threading.Lock()
        self._jobs: Dict[str, Job] = {}
        self._todo: Deque[Action] = deque()
        self._left_early: Set[str] = set()  # seen leaving the queue before Submitted was fed
        self._cancelled: Set[str] = set()
        # Reprioritized while being submitted: given to the scheduler once submitted.
        self._renice: Dict[str, Callable[[], object]] = {}
        self._holding_seen = 0  # the machine's holding_changes the poller was last told of
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    # -- from the executor (user threads, the poller's thread)

    def submit(self, job: Job, spec: JobSpec) -> None:
        """Submit ``job`` (checked, bound) now or hold it; raises as ``submit`` does for a job
        submitted now."""
        hooks = self._hooks
        try:
            shape = shape_of(spec, hooks.memory_bucket, hooks.tmp_bucket)
            priority = _priority.job_priority(spec.attributes)
        except BaseException:
            job.executor = None
            raise
        with self._marking:
            with self._cond:
                if self._stopped:
                    job.executor = None
                    raise SubmitException(f"{hooks.owner} is closed")
                (action,) = self._machine.step(Arrived(job.id, shape, priority))
                self._jobs[job.id] = job
                self._tell_holding()
            if isinstance(action, Hold):
                hooks.mark([job], HELD, None)
        if isinstance(action, Hold):
            self._hold(job, shape, action.held, priority)
            return
        try:
            hooks.submit(job, spec)
        except BaseException:
            self._feed(SubmitFailed(job.id))
            raise
        self._submitted(job)

    def submit_many(self, checked: Sequence[Tuple[Job, JobSpec]]
                    ) -> List[Tuple[Job, BaseException]]:
        """Submit or hold each of ``checked`` jobs (checked, bound), those submitted now
        together (as arrays where the scheduler has them); the jobs that failed, unbound."""
        hooks = self._hooks
        failures: List[Tuple[Job, BaseException]] = []
        now: List[Tuple[Job, JobSpec]] = []
        held: List[Tuple[Job, Shape, int, Union[int, float]]] = []
        with self._marking:
            self._arrive_many(checked, failures, now, held)
            hooks.mark([job for job, _, _, _ in held], HELD, None)
        for job, shape, count, priority in held:
            self._hold(job, shape, count, priority)
        try:
            failed = hooks.submit_many(now) if now else []
        except Exception as e:  # not one job's failure: every one of them failed so
            failed = [(job, e) for job, _ in now]
        for job, _ in failed:
            job.executor = None
            self._feed(SubmitFailed(job.id))
        gone = {job.id for job, _ in failed}
        for job, _ in now:
            if job.id not in gone:
                self._submitted(job)
        return failures + failed

    def _arrive_many(self, checked: Sequence[Tuple[Job, JobSpec]],
                     failures: List[Tuple[Job, BaseException]], now: List[Tuple[Job, JobSpec]],
                     held: List[Tuple[Job, Shape, int, Union[int, float]]]) -> None:
        """Give the machine each of ``checked``: a job to submit now goes to ``now``, a job
        held to ``held``, a job refused (unbound) to ``failures``."""
        hooks = self._hooks
        for job, spec in checked:
            try:
                shape = shape_of(spec, hooks.memory_bucket, hooks.tmp_bucket)
                priority = _priority.job_priority(spec.attributes)
                with self._cond:
                    if self._stopped:
                        raise SubmitException(f"{hooks.owner} is closed")
                    (action,) = self._machine.step(Arrived(job.id, shape, priority))
                    self._jobs[job.id] = job
                    self._tell_holding()
            except Exception as e:
                job.executor = None
                failures.append((job, e))
                continue
            if isinstance(action, Hold):
                held.append((job, shape, action.held, priority))
            else:
                now.append((job, spec))

    def _hold(self, job: Job, shape: Shape, held: int, priority: Union[int, float]) -> None:
        self._hooks.set_status(job, JobStatus(JobState.QUEUED, message=HELD_MESSAGE, metadata={
            "held_by": "client", "shape": shape.describe(), "held": held,
            "priority": priority}))

    def shape_key(self, job: Job) -> Optional[Hashable]:
        """The shape of a job that is held, being submitted or queued (None: not ours)."""
        with self._cond:
            return self._machine.shape_of(job.id)

    def reprioritize(self, job: Job, priority: Union[int, float],
                     renice: Callable[[], object]) -> Optional[Phase]:
        """Give ``job`` its new ``priority`` if it is held (reordered at once) or being
        submitted (``renice`` is called once it is submitted); where it was (None: not ours,
        QUEUED: in the scheduler, where the caller gives it the priority)."""
        with self._cond:
            phase = self._machine.phase(job.id)
            if phase is Phase.HELD:
                self._machine.step(Reprioritize(job.id, priority))
            elif phase is Phase.SUBMITTING:
                self._renice[job.id] = renice
        return phase

    def left_queue(self, job: Job) -> None:
        """``job`` was seen in a state past QUEUED."""
        with self._cond:
            phase = self._machine.phase(job.id)
            if phase is Phase.SUBMITTING:
                self._left_early.add(job.id)
                return
            if phase is not Phase.QUEUED:
                return
        self._feed(LeftQueue(job.id))

    def cancel(self, job: Job) -> bool:
        """Cancel ``job`` if it is held or being submitted (True); False when it is not ours."""
        with self._cond:
            phase = self._machine.phase(job.id)
            if phase is None or phase is Phase.QUEUED:
                return False
            self._cancelled.add(job.id)
        self._feed(Cancel(job.id))
        return True

    def close(self) -> None:
        """Stop submitting; the jobs still held end FAILED."""
        with self._cond:
            self._stopped = True
            self._todo.clear()
            held = [job for key, job in self._jobs.items()
                    if self._machine.phase(key) is Phase.HELD]
            self._cond.notify_all()
        message = ("the executor was closed while the job was held by the client "
                   "(max_queued_per_shape); it was never submitted")
        for job in held:
            self._hooks.set_status(job, JobStatus(JobState.FAILED, message=message))
        self._hooks.mark(held, None, (JobState.FAILED.name, JobState.FAILED.order, message))

    # -- the machine

    def _feed(self, event: Event) -> None:
        with self._cond:
            actions = self._machine.step(event)
            if isinstance(event, (LeftQueue, SubmitFailed)):
                self._jobs.pop(str(event.key), None)
                self._cancelled.discard(event.key)
                self._renice.pop(str(event.key), None)
            self._tell_holding()
        self._perform(actions)

    def _tell_holding(self) -> None:
        """Tell the poller which shapes hold jobs, when that changed (called locked: the
        poller never calls back into this object while it holds its own lock)."""
        machine = self._machine
        if machine.holding_changes != self._holding_seen and not self._stopped:
            self._holding_seen = machine.holding_changes
            self._hooks.hurry(machine.holding())

    def _perform(self, actions: List[Action]) -> None:
        for action in actions:
            if isinstance(action, Dropped):
                with self._cond:
                    job = self._jobs.pop(str(action.key), None)
                    self._cancelled.discard(action.key)
                if job is not None:
                    message = "cancelled while held by the client"
                    self._hooks.set_status(job, JobStatus(JobState.CANCELED, message=message))
                    self._hooks.mark([job], None, (JobState.CANCELED.name,
                                                   JobState.CANCELED.order, message))
            elif isinstance(action, (Submit, CancelSubmitted)):
                with self._cond:
                    if self._stopped:
                        continue
                    self._todo.append(action)
                    if self._thread is None:
                        self._thread = threading.Thread(
                            target=self._run, daemon=True,
                            name=f"psij-{self._hooks.name}-held")
                        self._thread.start()
                    self._cond.notify_all()

    # -- the worker thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._todo and not self._stopped:
                    if not self._hooks.clock.wait(self._cond, 30.0) and not self._todo:
                        self._thread = None
                        return
                if not self._stopped and isinstance(self._todo[0], Submit):
                    # The slots one status poll frees come one by one: let them gather.
                    self._hooks.clock.wait_for(self._cond, lambda: self._stopped,
                                               _GATHER_SECONDS)
                if self._stopped:
                    self._thread = None
                    return
                action = self._todo.popleft()
                job = self._jobs.get(str(action.key))
                batch: List[Job] = []
                if isinstance(action, Submit):  # every job chosen so far goes with it
                    while self._todo and isinstance(self._todo[0], Submit):
                        other = self._jobs.get(str(self._todo.popleft().key))
                        if other is not None:
                            batch.append(other)
            if job is None and not batch:
                continue
            try:
                if not isinstance(action, Submit):
                    if job is not None:
                        self._hooks.cancel(job)
                else:
                    self._submit_chosen(([job] if job is not None else []) + batch)
            except Exception:
                logger.exception("job %s: internal error while submitting a held job",
                                 action.key)

    def _submit_chosen(self, jobs: List[Job]) -> None:
        """Submit held jobs chosen for freed slots: one alone as ``submit`` does, several
        together (arrays); a job whose submission failed is then tried alone."""
        hooks = self._hooks
        with self._marking:  # after the mark of each as held (submit holds it till then)
            hooks.mark(jobs, SUBMITTING, None)
        if len(jobs) == 1:
            self._submit_held(jobs[0])
            return
        bound = {job.id: job.executor for job in jobs}
        try:
            failed = hooks.submit_many([(job, job.spec) for job in jobs
                                        if job.spec is not None])
        except Exception as e:  # not one job's failure: each is tried alone
            failed = [(job, e) for job in jobs]
        again = {job.id for job, _ in failed}
        for job, error in failed:
            job.executor = bound[job.id]
            self._submit_held(job, error)
        done = [job for job in jobs if job.id not in again]
        for job in done:
            hooks.restate(job, JobStatus(JobState.QUEUED, metadata={"native_id": job.native_id}))
        hooks.mark(done, None, None)
        for job in done:
            self._submitted(job)

    def _submit_held(self, job: Job, error: Optional[BaseException] = None) -> None:
        """Submit one held job (``error``: its first try failed so)."""
        hooks = self._hooks
        spec = job.spec
        assert spec is not None
        bound = job.executor
        delay = _FIRST_RETRY_DELAY
        for attempt in range(RETRIES + 1):
            try:
                if error is not None:
                    first, error = error, None
                    raise first
                hooks.submit(job, spec)
                break
            except Exception as e:
                job.executor = bound  # the submit step unbinds a job it could not submit
                transient = isinstance(e, SubmitException) and e.transient
                if transient and attempt < RETRIES and not self._stopped:
                    with self._cond:
                        hooks.clock.wait(self._cond, delay)
                    delay *= 2
                    continue
                with self._cond:
                    cancelled = job.id in self._cancelled
                if cancelled:
                    status = JobStatus(JobState.CANCELED, message="cancelled while held by the "
                                       "client; its submission failed too: " + str(e))
                else:
                    status = JobStatus(JobState.FAILED, message=str(e))
                hooks.set_status(job, status)
                hooks.mark([job], None, (status.state.name, status.state.order,
                                         status.message or ""))
                self._feed(SubmitFailed(job.id))
                return
        # Still QUEUED (held by the client until now): now with a native id.
        hooks.restate(job, JobStatus(JobState.QUEUED, metadata={"native_id": job.native_id}))
        hooks.mark([job], None, None)
        self._submitted(job)

    def _submitted(self, job: Job) -> None:
        with self._cond:
            early = job.id in self._left_early
            self._left_early.discard(job.id)
            renice = self._renice.pop(job.id, None)
        self._feed(Submitted(job.id))
        if early:
            self._feed(LeftQueue(job.id))
        if renice is not None and not early:
            try:
                renice()
            except Exception as e:
                logger.warning("job %s: its new priority could not be given to the scheduler: "
                               "%s", job.id, e)
