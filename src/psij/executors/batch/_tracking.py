"""Job tracking for batch executors, as a pure state machine.

The tracker knows which scheduler jobs (by native id) an executor follows, what state each was
last reported in, and when the next status command is due. It is driven by events and answers
with actions; it does no I/O, starts no threads and reads the time only from the ``now`` it is
given. The executor's polling loop runs the commands and reads the files the actions ask for,
and feeds back what it learned as further events.

Events (:func:`step`): :class:`JobAdded`, :class:`Tick`, :class:`PollSucceeded`,
:class:`PollFailed`, :class:`MissingResolved`, :class:`CancelAsked`, :class:`CancelFailed`,
:class:`Hurry`, :class:`Forget`, :class:`FileSeen`. Actions: :class:`RunStatusCommand`,
:class:`ResolveMissing`, :class:`ReportState`, :class:`Restate`, :class:`Withdraw`,
:class:`Finish`.

Rules:

- One status command covers every tracked job. The first poll comes ``initial_delay`` after the
  first job arrives (at once for an attached job), the next ones ``interval`` apart.
- A job's state only moves forward, but for a job added ``rerunnable`` (one that may be run
  again, :mod:`psij._retry`): seen QUEUED after it was ACTIVE, the scheduler requeued it, and
  it is reported QUEUED again; seen with more ``restarts`` (observation metadata: the times
  the scheduler restarted it) than when it was last seen, it was requeued between two polls,
  and what was missed is reported: ACTIVE (the run it started, if it was not seen running),
  QUEUED, and ACTIVE when it runs again. A final state reported by the queue finishes the
  job. A job seen again in the state it was reported in is reported again (:class:`Restate`)
  when the scheduler starts or stops holding it (``held_by: "scheduler"`` in the observation's
  metadata, see :mod:`~psij.executors.batch._status_table`), or starts or stops saying that it
  can never start (``unstartable``, see :mod:`~psij.executors.batch._unstartable`), or gives
  another such reason; nothing else is said twice.
- A queued job the scheduler will never start ends FAILED (cause ``unstartable``) when the
  settings say ``fail_unstartable``: the job is first withdrawn (:class:`Withdraw`: cancelled in
  the scheduler), then finished. A job whose cancel was asked here is left to its cancel.
- Jobs of a *hurried* group (:class:`Hurry`: the executor holds back jobs of that shape for
  ``max_queued_per_shape``, and waits for a queued one to start) that are still queued are
  polled by themselves ``initial_delay`` after each poll, so that a start is seen within about
  that time; the others keep ``interval``. Without hurried groups nothing is polled sooner.
- A job missing from the queue output is never assumed done: the executor is asked to resolve
  it (exit-code file, then the scheduler's accounting). What it finds finishes the job. If it
  finds nothing, a job whose cancel was asked ends CANCELED; any other job is looked for again at
  the next polls and, after ``missing_grace`` polls without any trace, ends FAILED with a message
  saying that it left the queue without an exit code.
- A failed status command (non-zero exit, timeout, unparseable output) changes no job's state.
  The next attempt comes after a backoff that doubles up to ``max_backoff``. Only when more than
  ``error_threshold`` attempts in a row have failed *and* the failures have lasted at least
  ``outage_tolerance`` seconds are the tracked jobs failed, with the last error in the message.
- What a job's own files say (:class:`FileSeen`, any phase) comes before the next poll: a
  start makes a queued job ACTIVE; an end with exit status 0, no signal received by the script
  and no cancel asked finishes it COMPLETED (reporting ACTIVE first if it was queued). Any
  other end may have a cause only the scheduler knows (time limit, cancel, memory, node
  failure): the job stays followed, a poll comes ``confirm_delay`` later, and the scheduler's
  word decides. While the scheduler still shows the job (a script ends a moment before its
  job leaves the queue; Grid Engine keeps a deleted job a while), it is polled again, each
  time twice as late, up to ``interval``; once the scheduler has no trace of it, the file's
  word does. A poll that was under way when a file made a job
  ACTIVE is not taken for a requeue. Files carry the run they are of (the script's start
  count): once the scheduler requeued a job, what its files say of the run it was in is old
  news, and a start of a later run makes it ACTIVE again.
- A job forgotten (:class:`Forget`: its job runs again under another native id) is followed
  no more, in any phase; what a poll under way says of it is dropped.
- An event that is not legal in the current phase, or of another class, raises
  :class:`IllegalEvent` and leaves the state unchanged (the step function never mutates its
  input).
"""

from enum import Enum
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    AbstractSet,
    Any,
    Dict,
    FrozenSet,
    Hashable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from psij._clock import Clock
from psij._machine import IllegalEvent
from psij._record import Record, replace
from psij.executors.batch._status_table import is_held_by_scheduler
from psij.executors.batch._tracking_events import (
    EMPTY,
    Action,
    CancelAsked,
    CancelFailed,
    Event,
    FileSeen,
    Finish,
    Forget,
    Hurry,
    JobAdded,
    MissingResolved,
    Observation,
    PollFailed,
    PollSucceeded,
    ReportState,
    ResolveMissing,
    Restate,
    RunStatusCommand,
    Tick,
    Withdraw,
    observed,
)
from psij.executors.batch._unstartable import CAUSE, failed_message, unstartable_reason
from psij.job_state import JobState

if TYPE_CHECKING:
    pass

__all__ = [
    "Action", "CancelAsked", "CancelFailed", "Event", "FileSeen", "Finish", "Forget", "Hurry",
    "IllegalEvent",
    "JobAdded", "JobTracker", "MissingResolved", "Observation", "Phase", "PollFailed",
    "PollSucceeded", "ReportState", "ResolveMissing", "Restate", "RunStatusCommand", "Settings",
    "Tick", "TrackedJob", "TrackerState", "Withdraw", "observed", "step",
]

_EMPTY: Mapping[str, Any] = EMPTY  # (the records' shared empty mapping)
_NONE: FrozenSet[Hashable] = frozenset()


class Settings(Record):
    """Timing and tolerance of one executor's tracking (seconds, counts), and whether queued
    jobs the scheduler will never start are failed (``fail_unstartable``)."""

    interval: float = 30.0
    initial_delay: float = 2.0
    error_threshold: int = 2
    outage_tolerance: float = 300.0
    max_backoff: float = 120.0
    missing_grace: int = 3
    cancel_poll_delay: float = 1.0
    fail_unstartable: bool = False
    confirm_delay: float = 1.0

    def _validate(self) -> None:
        if not isinstance(self.fail_unstartable, bool):
            raise TypeError(f"Settings.fail_unstartable: expected bool, got "
                            f"{self.fail_unstartable!r}")
        for name in ("interval", "max_backoff"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Settings.{name}: must be positive, got {getattr(self, name)}")
        for name in ("initial_delay", "outage_tolerance", "cancel_poll_delay", "confirm_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"Settings.{name}: must not be negative, got "
                                 f"{getattr(self, name)}")
        for name in ("error_threshold", "missing_grace"):
            if getattr(self, name) < 0:
                raise ValueError(f"Settings.{name}: must not be negative, got "
                                 f"{getattr(self, name)}")


class TrackedJob(Record):
    """One followed job: the state last reported for it (and whether the scheduler holds it,
    and its reason when it said the job can never start), what is pending about it, and its
    group (see :class:`Hurry`; None: none)."""

    native_id: str
    state: JobState
    cancel_requested: bool = False
    misses: int = 0
    held: bool = False
    group: Hashable = None
    unstartable: Optional[str] = None
    rerunnable: bool = False
    restarts: int = 0
    # What its files said of its end, while the scheduler is asked (see FileSeen).
    ended: Optional[Observation] = None
    ended_run: int = 0
    confirms: int = 0
    # The latest run whose start its files told, and the runs known over (requeued): the
    # end file of such a run is not the job's end.
    run: int = 0
    over: int = 0
    # Made ACTIVE by its files while a poll was under way: that poll's QUEUED is old news.
    file_ahead: bool = False


class Phase(Enum):
    """What the tracker is doing: nothing to follow, waiting for the next poll, waiting for the
    status command's outcome, or waiting for missing jobs to be looked up."""

    IDLE = "idle"
    WAITING = "waiting"
    POLLING = "polling"
    RESOLVING = "resolving"


class TrackerState(Record):
    """Everything the tracker knows; a new value after every event."""

    jobs: Mapping[str, TrackedJob] = _EMPTY
    phase: Phase = Phase.IDLE
    # When all jobs are polled next (while a round of the hurried jobs only is under way too).
    next_poll_at: Optional[float] = None
    in_flight: Tuple[str, ...] = ()
    # The earliest poll asked for while a poll round was under way (by a new job or a cancel).
    requested_poll_at: Optional[float] = None
    failures: int = 0
    outage_since: Optional[float] = None
    hurried: FrozenSet[Hashable] = _NONE
    # When the queued jobs of the hurried groups are polled next (None: no such job).
    next_hurry_at: Optional[float] = None


# -------------------------------------------------------------------------------------- step


def _frozen(jobs: Dict[str, TrackedJob]) -> Mapping[str, TrackedJob]:
    return MappingProxyType(jobs)


def _thawed(jobs: Mapping[str, TrackedJob]) -> Dict[str, TrackedJob]:
    """A new dict of ``jobs``: copied whole (``dict()`` of a read-only view goes item by item,
    some 15 times slower, which made each submit cost more the more jobs were followed)."""
    if isinstance(jobs, (dict, MappingProxyType)):
        return jobs.copy()
    return dict(jobs)


def _backoff(settings: Settings, failures: int) -> float:
    return min(settings.max_backoff, settings.interval * float(2 ** min(failures - 1, 30)))


def _after_round(state: TrackerState, jobs: Dict[str, TrackedJob], settings: Settings,
                 now: float) -> TrackerState:
    """The state once a poll round is over: waiting for the next poll, or idle."""
    if not jobs:
        return replace(state, jobs=_frozen(jobs), phase=Phase.IDLE, next_poll_at=None,
                       in_flight=(), requested_poll_at=None, next_hurry_at=None)
    # A round of the hurried jobs only leaves the next round of all where it was.
    due = state.next_poll_at if state.next_poll_at is not None else now + settings.interval
    return replace(state, jobs=_frozen(jobs), phase=Phase.WAITING, in_flight=(),
                   next_poll_at=_earliest(due, state.requested_poll_at),
                   requested_poll_at=None,
                   next_hurry_at=now + settings.initial_delay
                   if _hurried_ids(jobs, state.hurried) else None)


def _hurried_ids(jobs: Mapping[str, TrackedJob], groups: AbstractSet[Hashable]
                 ) -> Tuple[str, ...]:
    """The queued jobs of the hurried ``groups``."""
    if not groups:
        return ()
    return tuple(sorted(nid for nid, job in jobs.items()
                        if job.state is JobState.QUEUED and job.group in groups))


def _earliest(at: float, requested: Optional[float]) -> float:
    return at if requested is None else min(at, requested)


def _ask_poll_by(state: TrackerState, at: float) -> TrackerState:
    """Brings the next poll forward to ``at`` (or remembers it for after the current round)."""
    if state.phase is Phase.WAITING and state.next_poll_at is not None:
        return replace(state, next_poll_at=min(state.next_poll_at, at))
    if state.phase in (Phase.POLLING, Phase.RESOLVING):
        return replace(state, requested_poll_at=_earliest(at, state.requested_poll_at))
    return state


def _restarts(obs: Observation) -> Optional[int]:
    seen = obs.metadata.get("restarts")
    return seen if isinstance(seen, int) and not isinstance(seen, bool) else None


def _requeued(job: TrackedJob, obs: Observation, jobs: Dict[str, TrackedJob],
              actions: List[Action]) -> bool:
    """Report a rerunnable job that the scheduler requeued (see the rules); False when it
    was not."""
    seen = _restarts(obs)
    grew = seen is not None and seen > job.restarts
    restarts = job.restarts if seen is None else max(seen, job.restarts)
    nid = job.native_id
    if job.state is JobState.ACTIVE and obs.state is JobState.QUEUED:
        actions.append(ReportState(nid, obs))
    elif grew and job.state in (JobState.QUEUED, JobState.ACTIVE) \
            and obs.state in (JobState.QUEUED, JobState.ACTIVE):
        # Restarted between two polls: the run it started (when it was not seen running),
        # the requeue, and the run it is in now.
        if job.state is JobState.QUEUED:
            actions.append(ReportState(nid, replace(obs, state=JobState.ACTIVE)))
        actions.append(ReportState(nid, replace(obs, state=JobState.QUEUED)))
        if obs.state is JobState.ACTIVE:
            actions.append(ReportState(nid, obs))
    else:
        if restarts != job.restarts:
            jobs[nid] = replace(job, restarts=restarts)
        return False
    jobs[nid] = replace(job, misses=0, state=obs.state, held=is_held_by_scheduler(obs.metadata),
                        restarts=restarts)
    return True


def _observe(job: TrackedJob, obs: Observation, jobs: Dict[str, TrackedJob],
             actions: List[Action], settings: Settings) -> None:
    if job.file_ahead:
        job = jobs[job.native_id] = replace(job, file_ahead=False)
        if obs.state is JobState.QUEUED:
            return  # seen before the job's start file was
    if job.rerunnable and not obs.state.final and _requeued(job, obs, jobs, actions):
        if job.native_id in jobs:  # the run it was in is over, whatever its files say later
            jobs[job.native_id] = replace(jobs[job.native_id], ended=None, confirms=0,
                                          over=max(job.run, job.over + 1))
        return
    job = jobs.get(job.native_id, job)
    if job.ended is not None and not obs.state.final:  # still in the queue: asked again later
        job = jobs[job.native_id] = replace(job, confirms=job.confirms + 1)
    if obs.state.final:
        del jobs[job.native_id]
        actions.append(Finish(job.native_id, obs, job.cancel_requested))
        return
    held = is_held_by_scheduler(obs.metadata)
    never = unstartable_reason(obs.metadata) if obs.state is JobState.QUEUED else None
    if never is not None and settings.fail_unstartable and not job.cancel_requested:
        del jobs[job.native_id]
        actions.append(Withdraw(job.native_id))
        actions.append(Finish(job.native_id, Observation(
            JobState.FAILED, failed_message(obs.message, never), None,
            {**obs.metadata, "cause": CAUSE}), False))
        return
    if obs.state.is_greater_than(job.state):
        jobs[job.native_id] = replace(job, misses=0, state=obs.state, held=held,
                                      unstartable=never)
        actions.append(ReportState(job.native_id, obs))
    elif obs.state is job.state and (held is not job.held or never != job.unstartable):
        jobs[job.native_id] = replace(job, misses=0, held=held, unstartable=never)
        actions.append(Restate(job.native_id, obs))
    elif job.misses:
        jobs[job.native_id] = replace(job, misses=0)


def _confirming(state: TrackerState, settings: Settings, now: float) -> TrackerState:
    """Brings the next poll forward when a job's end awaits the scheduler's word:
    ``confirm_delay`` from now, twice as late after each poll that still showed the job, up
    to ``interval``."""
    waits = [job.confirms for job in state.jobs.values() if job.ended is not None]
    if not waits:
        return state
    delay = min(settings.confirm_delay * 2.0 ** min(min(waits), 30), settings.interval)
    return _ask_poll_by(state, now + delay)


def _file_seen(state: TrackerState, settings: Settings, event: FileSeen,
               now: float) -> Tuple[TrackerState, List[Action]]:
    actions: List[Action] = []
    job = state.jobs.get(event.native_id)
    if job is None:
        return state, actions  # (ended already, or forgotten)
    run = event.run if event.run is not None else max(job.run, 1)
    if run <= job.over or (not event.started and job.ended is not None):
        return state, actions  # a run requeued since, or an end said already
    meta: Dict[str, Any] = {"source": "job file"}
    if event.at is not None:
        meta["started_at" if event.started else "ended_at"] = event.at
    jobs = _thawed(state.jobs)
    if event.started and job.ended is not None and run > job.ended_run:
        # The end waiting for the scheduler's word was a requeue's: this is the next run.
        job = replace(job, ended=None, confirms=0, over=max(job.over, job.ended_run))
    job = jobs[event.native_id] = replace(job, run=max(job.run, run))
    polling = state.phase in (Phase.POLLING, Phase.RESOLVING) \
        and event.native_id in state.in_flight
    if job.state in (JobState.NEW, JobState.QUEUED):
        active = {"source": "job file", "started_at": event.at} if event.at is not None \
            else {"source": "job file"}  # (an end seen first: the run started by then)
        actions.append(ReportState(event.native_id,
                                   Observation(JobState.ACTIVE, metadata=active)))
        job = jobs[event.native_id] = replace(job, state=JobState.ACTIVE, misses=0,
                                              file_ahead=polling or job.file_ahead)
    if event.started:
        return replace(state, jobs=_frozen(jobs)), actions
    code = event.exit_code
    if code == 0 and event.signal is None and not job.cancel_requested:
        del jobs[event.native_id]
        actions.append(Finish(event.native_id, Observation(JobState.COMPLETED, None, 0, meta),
                              False))
        if not jobs and state.phase is Phase.WAITING:
            return replace(state, jobs=_frozen(jobs), phase=Phase.IDLE, next_poll_at=None,
                           requested_poll_at=None, next_hurry_at=None), actions
        return replace(state, jobs=_frozen(jobs)), actions
    if event.signal is not None:
        meta["signal_received"] = event.signal
    ended = Observation(JobState.FAILED if code != 0 else JobState.COMPLETED, None, code, meta)
    jobs[event.native_id] = replace(job, ended=ended, ended_run=run, confirms=0)
    return _ask_poll_by(replace(state, jobs=_frozen(jobs)), now + settings.confirm_delay), \
        actions


def _require(state: TrackerState, phase: Phase, event: object) -> None:
    if state.phase is not phase:
        raise IllegalEvent(f"{type(event).__name__} is only accepted while "
                           f"{phase.value}; the tracker is {state.phase.value}")


def step(state: TrackerState, settings: Settings, event: Event,
         now: float) -> Tuple[TrackerState, List[Action]]:
    """The state after ``event`` at time ``now``, and the actions it calls for."""
    actions: List[Action] = []
    if isinstance(event, JobAdded):
        if event.native_id in state.jobs:
            raise IllegalEvent(f"job {event.native_id} is already tracked")
        if event.state.final:
            raise IllegalEvent(f"job {event.native_id} cannot be tracked from a final state "
                               f"({event.state})")
        jobs = _thawed(state.jobs)
        jobs[event.native_id] = TrackedJob(event.native_id, event.state, group=event.group,
                                           rerunnable=event.rerunnable)
        due = now + (0.0 if event.poll_soon else settings.initial_delay)
        if state.phase is Phase.IDLE:
            return replace(state, jobs=_frozen(jobs), phase=Phase.WAITING,
                           next_poll_at=due), actions
        return _ask_poll_by(replace(state, jobs=_frozen(jobs)), due), actions

    if isinstance(event, Tick):
        if state.phase is not Phase.WAITING or not state.jobs:
            return state, actions
        if state.next_poll_at is not None and now >= state.next_poll_at:
            ids = tuple(sorted(state.jobs))
            actions.append(RunStatusCommand(ids))
            return replace(state, phase=Phase.POLLING, next_poll_at=None,
                           next_hurry_at=None, in_flight=ids), actions
        if state.next_hurry_at is not None and now >= state.next_hurry_at:
            ids = _hurried_ids(state.jobs, state.hurried)
            if not ids:
                return replace(state, next_hurry_at=None), actions
            actions.append(RunStatusCommand(ids))
            return replace(state, phase=Phase.POLLING, next_hurry_at=None,
                           in_flight=ids), actions
        return state, actions

    if isinstance(event, Hurry):
        groups = frozenset(event.groups) - {None}
        state = replace(state, hurried=groups)
        if state.phase is not Phase.WAITING:
            return state, actions  # the round under way sets the time (or there is no job)
        if not _hurried_ids(state.jobs, groups):
            return replace(state, next_hurry_at=None), actions
        at = now + settings.initial_delay
        return replace(state, next_hurry_at=_earliest(at, state.next_hurry_at)), actions

    if isinstance(event, PollSucceeded):
        _require(state, Phase.POLLING, event)
        jobs = _thawed(state.jobs)
        missing: List[str] = []
        for native_id in state.in_flight:
            job = jobs.get(native_id)
            if job is None:
                continue
            obs = event.observations.get(native_id)
            if obs is None:
                missing.append(native_id)
            else:
                _observe(job, obs, jobs, actions, settings)
        state = replace(state, failures=0, outage_since=None)
        if missing:
            ids = tuple(missing)
            actions.append(ResolveMissing(ids))
            return replace(state, jobs=_frozen(jobs), phase=Phase.RESOLVING,
                           in_flight=ids), actions
        return _confirming(_after_round(state, jobs, settings, now), settings, now), actions

    if isinstance(event, FileSeen):
        return _file_seen(state, settings, event, now)

    if isinstance(event, PollFailed):
        _require(state, Phase.POLLING, event)
        failures = state.failures + 1
        since = state.outage_since if state.outage_since is not None else now
        jobs = _thawed(state.jobs)
        if failures > settings.error_threshold and now - since >= settings.outage_tolerance:
            message = (f"the job's status could not be obtained for {now - since:.0f} s "
                       f"({failures} failed attempts in a row); last error: {event.error}")
            for native_id in sorted(jobs):
                job = jobs[native_id]
                actions.append(Finish(native_id, Observation(JobState.FAILED, message),
                                      job.cancel_requested))
            return replace(state, jobs=_frozen({}), phase=Phase.IDLE, next_poll_at=None,
                           in_flight=(), requested_poll_at=None, failures=0,
                           outage_since=None), actions
        state = replace(state, failures=failures, outage_since=since)
        if not jobs:
            return replace(state, phase=Phase.IDLE, next_poll_at=None, in_flight=(),
                           requested_poll_at=None, next_hurry_at=None), actions
        # A retry after a failure keeps its backoff even if a new job asked for an earlier poll
        # (or its group is hurried).
        return replace(state, phase=Phase.WAITING, in_flight=(), requested_poll_at=None,
                       next_poll_at=now + _backoff(settings, failures),
                       next_hurry_at=None), actions

    if isinstance(event, MissingResolved):
        _require(state, Phase.RESOLVING, event)
        jobs = _thawed(state.jobs)
        for native_id in state.in_flight:
            job = jobs.get(native_id)
            if job is None:
                continue
            obs = event.found.get(native_id)
            if obs is not None:
                _observe(job, obs, jobs, actions, settings)
            elif job.ended is not None:  # no trace in the scheduler: the job's word
                del jobs[native_id]
                actions.append(Finish(native_id, job.ended, job.cancel_requested))
            elif job.cancel_requested:
                del jobs[native_id]
                actions.append(Finish(native_id, Observation(
                    JobState.CANCELED, "cancelled; the job left the queue and the scheduler "
                    "kept no record of it", metadata={"native_state": None}), True))
            elif job.misses + 1 >= settings.missing_grace:
                del jobs[native_id]
                actions.append(Finish(native_id, Observation(
                    JobState.FAILED,
                    "the job left the scheduler's queue without an exit code and the "
                    "scheduler's accounting has no record of its end, so its outcome is "
                    "unknown", metadata={"native_state": None}), False))
            else:
                jobs[native_id] = replace(job, misses=job.misses + 1)
        return _confirming(_after_round(state, jobs, settings, now), settings, now), actions

    if isinstance(event, CancelAsked):
        job = state.jobs.get(event.native_id)
        if job is None:
            raise IllegalEvent(f"job {event.native_id} is not tracked")
        jobs = _thawed(state.jobs)
        jobs[event.native_id] = replace(job, cancel_requested=True)
        return _ask_poll_by(replace(state, jobs=_frozen(jobs)),
                            now + settings.cancel_poll_delay), actions

    if isinstance(event, Forget):
        if event.native_id not in state.jobs:
            return state, actions
        jobs = _thawed(state.jobs)
        del jobs[event.native_id]
        if not jobs and state.phase is Phase.WAITING:
            return replace(state, jobs=_frozen(jobs), phase=Phase.IDLE, next_poll_at=None,
                           requested_poll_at=None, next_hurry_at=None), actions
        return replace(state, jobs=_frozen(jobs)), actions

    if isinstance(event, CancelFailed):
        job = state.jobs.get(event.native_id)
        if job is None:
            raise IllegalEvent(f"job {event.native_id} is not tracked")
        jobs = _thawed(state.jobs)
        jobs[event.native_id] = replace(job, cancel_requested=False)
        return replace(state, jobs=_frozen(jobs)), actions

    raise IllegalEvent(f"unknown event {event!r}")


class JobTracker:
    """Holds the current :class:`TrackerState` and steps it with the time of ``clock``.

    Not thread-safe by itself: the polling loop feeds it under its lock.
    """

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self.state = TrackerState()

    def feed(self, event: Event) -> List[Action]:
        """Apply ``event`` now; returns the actions to perform."""
        self.state, actions = step(self.state, self.settings, event, self.clock.now())
        return actions

    def next_deadline(self) -> Optional[float]:
        """When a Tick may next produce an action (None: nothing is due until another event)."""
        s = self.state
        if s.phase is Phase.WAITING and s.jobs:
            if s.next_hurry_at is None or s.next_poll_at is None:
                return s.next_poll_at if s.next_hurry_at is None else s.next_hurry_at
            return min(s.next_poll_at, s.next_hurry_at)
        return None

    def is_tracked(self, native_id: str) -> bool:
        """Whether the job with this native id is followed."""
        return native_id in self.state.jobs

    def tracked(self) -> Sequence[str]:
        """The native ids of all followed jobs."""
        return tuple(self.state.jobs)
