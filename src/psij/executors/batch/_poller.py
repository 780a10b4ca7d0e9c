"""The status poller of a batch executor: one thread, one status command per interval for all
of the executor's jobs.

Its decisions come from the pure state machine in :mod:`~psij.executors.batch._tracking`; this
module only carries them out: it waits until the tracker has something due (measured on the
executor's :class:`~psij._clock.Clock`), runs the status command or looks up jobs that left
the queue through the hooks it was given, and delivers statuses to the jobs (a status of the
state a job is already in, when the scheduler starts or stops holding it, as a restatement).
Everything it needs from the executor is one :class:`TrackInputs` given at construction: the
executor's I/O hooks as callables that hold it only weakly (:func:`weakly`), so that its
thread ends when the executor is closed or garbage collected, or after a while without jobs.
It never names or imports the executor's class, and never runs scheduler commands itself. An
error while working on one action is logged and fails only what that action was about.
"""

import logging
import threading
import weakref
from collections import deque
from pathlib import Path
from typing import (
    AbstractSet,
    Any,
    Callable,
    Deque,
    Dict,
    Hashable,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
    cast,
)

from psij._clock import Clock
from psij._record import Record
from psij.exceptions import SubmitException
from psij.executors._staging import REPORT_SUFFIX, read_report, staged_status
from psij.executors.batch._dir_events import DirEvents
from psij.executors.batch._figures import has_figures
from psij.executors.batch._figures_wait import AwaitingFigures
from psij.executors.batch._job_files import END_SUFFIX, START_SUFFIX, JobFiles
from psij.executors.batch._tracking import (
    Action,
    CancelAsked,
    CancelFailed,
    Event,
    Finish,
    Forget,
    Hurry,
    JobAdded,
    JobTracker,
    MissingResolved,
    Observation,
    PollFailed,
    ReportState,
    ResolveMissing,
    Restate,
    RunStatusCommand,
    Settings,
    Tick,
    Withdraw,
)
from psij.executors.batch._unstartable import CAUSE as UNSTARTABLE_CAUSE
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["EVENT_GAP", "IDLE_LINGER", "LOOK_SECONDS", "UNSEEN_LIMIT", "StatusPoller",
           "TrackInputs", "weakly"]

logger = logging.getLogger(__name__)

# Seconds the thread stays after its last job before it ends.
IDLE_LINGER = 30.0
# Seconds between two looks at the jobs' start and end files (one stat call each).
LOOK_SECONDS = 0.25
# The least seconds between two looks asked for by file events.
EVENT_GAP = 0.02
# Jobs the scheduler ended COMPLETED in a row without a file of theirs in sight, after which
# the files are taken for not visible here (not a shared file system) and no longer looked at.
UNSEEN_LIMIT = 3

_F = TypeVar("_F", bound=Callable[..., Any])
_LOOK = object()  # the thread's own action: look at the jobs' files
_FIGURES = object()  # the thread's own action: ask for the records of ended jobs


def weakly(method: _F) -> _F:
    """The bound ``method`` called through a weak reference to its object; calling it once the
    object is gone raises ReferenceError."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        if bound is None:
            raise ReferenceError("the executor of this status poller is gone")
        return bound(*args, **kwargs)

    return cast(_F, call)


class TrackInputs(Record):
    """What the track step takes from a batch executor: its name (for the thread's and the
    log's words) and its hooks, each holding the executor weakly (:func:`weakly`).

    ``poll_status``: the tracker event of one status command for these native ids;
    ``resolve_missing``: what the exit-code files and the accounting say of jobs that left
    the queue; ``withdraw``: cancel a job in the scheduler alone; ``final_status``: the final
    status of a job from what the scheduler said and what it left behind; ``aux_path``: the
    path of one of a job's files (``<native id><suffix>``); ``job_ended``: remove the files of
    an ended job; ``set_status`` and ``restate``: enter or restate a job's status;
    ``job_files``: the directory where the jobs' scripts write their start and end files,
    looked at every :data:`LOOK_SECONDS` while jobs are followed (None: not looked at);
    ``ended_figures``: the figures of ended jobs from the scheduler's record (see
    :mod:`~psij.executors.batch._figures_wait`; None: their ends do not wait for them), waited
    for at most ``figures_wait`` seconds after an end.
    """

    name: str
    poll_status: Callable[[Sequence[str]], Event]
    resolve_missing: Callable[[Sequence[str]], MissingResolved]
    withdraw: Callable[[str], None]
    final_status: Callable[[Sequence[Job], str, Observation, bool], JobStatus]
    aux_path: Callable[[str, str], Path]
    job_ended: Callable[[Sequence[Job], str], None]
    set_status: Callable[[Job, JobStatus], None]
    restate: Callable[[Job, JobStatus], None]
    job_files: Optional[Path] = None
    ended_figures: Optional[Callable[[Sequence[str]],
                                     Optional[Mapping[str, Mapping[str, Any]]]]] = None
    figures_wait: float = 8.0


class StatusPoller:
    """Follows the jobs of one executor: one thread, one status command per interval.

    Its hooks hold the executor weakly: once it is collected the thread ends (the executor
    also stops its poller when it is finalized). Jobs being followed hold their executor, so
    an executor lives at least as long as it has unfinished jobs. The thread also ends after
    a while without jobs, and starts again with the next job.
    """

    def __init__(self, hooks: TrackInputs, settings: Settings, clock: Clock) -> None:
        self._hooks = hooks
        self._label = f"psij-{hooks.name}-status"
        self._clock = clock
        self._cond = threading.Condition()
        self._tracker = JobTracker(settings, clock)
        self._jobs: Dict[str, List[Job]] = {}
        self._last: Dict[str, JobStatus] = {}
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self._failing = False  # the last status poll failed (said once, not at every retry)
        self._files = None if hooks.job_files is None else JobFiles(hooks.job_files)
        self._events = None if hooks.job_files is None \
            else DirEvents(hooks.job_files, self._file_event, self._label,
                           (START_SUFFIX, END_SUFFIX))
        self._next_look = 0.0
        self._last_look = 0.0
        self._unseen = 0  # jobs in a row that ended with no file of theirs in sight
        self._hurried: AbstractSet[Hashable] = frozenset()  # (see hurry)
        self._awaiting: AwaitingFigures[Finish] = AwaitingFigures(hooks.figures_wait)

    # called from user threads

    def add(self, job: Job, native_id: str, attach: bool,
            group: Optional[Hashable] = None, rerunnable: bool = False) -> None:
        """Follow ``job`` as ``native_id``: one just submitted (QUEUED), or one attached
        (looked up at once); ``group``: its shape, if the executor holds jobs back
        (max_queued_per_shape; see :meth:`hurry`); ``rerunnable``: the scheduler may requeue
        it, which is reported as QUEUED again (see :mod:`~psij.executors.batch._tracking`)."""
        with self._cond:
            if self._stopped:
                raise SubmitException("the executor is closed")
            known = self._jobs.get(native_id)
            due = self._tracker.next_deadline()
            if known is not None:
                known.append(job)
                last = self._last.get(native_id)
            else:
                self._tracker.feed(JobAdded(native_id, JobState.NEW if attach
                                            else JobState.QUEUED, poll_soon=attach,
                                            group=group, rerunnable=rerunnable))
                self._jobs[native_id] = [job]
                last = None
            if self._thread is None:
                self._ensure_thread()
            elif due is None or self._tracker.next_deadline() != due:
                # The thread sleeps until the deadline it saw: woken only when that moved
                # (waking it for every job submitted in a row costs each submit a switch).
                self._cond.notify_all()
        if last is not None:
            self._deliver(job, last)

    def forget(self, job: Job, native_id: str) -> None:
        """Follow ``job`` as ``native_id`` no more (it runs again as another scheduler job);
        nothing said of ``native_id`` later reaches it."""
        with self._cond:
            jobs = self._jobs.get(native_id)
            if jobs is None or job not in jobs:
                return
            jobs.remove(job)
            if not jobs:
                del self._jobs[native_id]
                self._last.pop(native_id, None)
                self._tracker.feed(Forget(native_id))

    def cancel_asked(self, native_id: str) -> None:
        with self._cond:
            if self._tracker.is_tracked(native_id):
                self._tracker.feed(CancelAsked(native_id))
                self._cond.notify_all()

    def cancel_failed(self, native_id: str) -> None:
        with self._cond:
            if self._tracker.is_tracked(native_id):
                self._tracker.feed(CancelFailed(native_id))

    def hurry(self, shapes: AbstractSet[Hashable]) -> None:
        """Poll the queued jobs of these shapes (those that hold jobs back) at the short
        interval from now on, so that a freed slot is used within seconds; not while the jobs'
        start files are looked at, which tell a start sooner without a scheduler command."""
        with self._cond:
            self._hurried = frozenset(shapes)
            self._hurry_now()

    def _hurry_now(self) -> None:
        due = self._tracker.next_deadline()
        self._tracker.feed(Hurry(self._hurried if self._files is None else frozenset()))
        if self._tracker.next_deadline() != due:
            self._cond.notify_all()

    def wake(self) -> None:
        """Look at the clock again now (tests call it after moving a manual clock)."""
        with self._cond:
            self._cond.notify_all()

    def stop(self, wait: bool = False) -> None:
        with self._cond:
            self._stopped = True
            thread = self._thread
            self._cond.notify_all()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._events is not None:
            self._events.stop(wait)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._label, daemon=True)
            self._thread.start()
            if self._events is not None and self._files is not None:
                self._events.start()

    def _file_event(self) -> None:
        """A file appeared in the jobs' directory (on the events' thread): look soon."""
        with self._cond:
            at = self._last_look + EVENT_GAP
            if at < self._next_look:
                self._next_look = at
                self._cond.notify_all()

    def _ended(self) -> None:
        """The thread ends (with the lock held)."""
        self._thread = None
        if self._events is not None:
            self._events.stop()

    # the poller's thread

    def _run(self) -> None:
        try:
            while True:
                actions = self._next_actions()
                if actions is None:
                    for action in self._awaiting.drain():  # (ended while it stopped)
                        self._finish(action)
                    return
                self._perform(actions)
        except Exception:
            logger.exception("%s: internal error; status polling stopped", self._label)
            with self._cond:
                self._ended()

    def _next_actions(self) -> Optional[List[Any]]:
        """Wait until something is due; None when the thread should end."""
        with self._cond:
            idle_since: Optional[float] = None
            while True:
                if self._stopped:
                    self._ended()
                    return None
                actions = self._tracker.feed(Tick())
                if actions:
                    return actions
                now = self._clock.now()
                figures_due = self._awaiting.due_at()
                if figures_due is not None and now >= figures_due:
                    return [_FIGURES]
                if not self._tracker.tracked():
                    if figures_due is not None:
                        idle_since = None
                        self._clock.wait(self._cond, figures_due - now)
                        continue
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= IDLE_LINGER:
                        self._ended()
                        return None
                    self._clock.wait(self._cond, IDLE_LINGER)
                    continue
                idle_since = None
                deadline = self._tracker.next_deadline()
                if figures_due is not None:
                    deadline = figures_due if deadline is None else min(deadline, figures_due)
                if self._files is not None:
                    if now >= self._next_look:
                        self._last_look = now
                        self._next_look = now + LOOK_SECONDS
                        return [_LOOK]
                    deadline = self._next_look if deadline is None \
                        else min(deadline, self._next_look)
                self._clock.wait(self._cond,
                                 None if deadline is None else max(0.0, deadline - now))

    def _perform(self, first: List[Any]) -> None:
        queue: Deque[Any] = deque(first)
        hooks = self._hooks
        while queue:
            action = queue.popleft()
            try:
                if action is _LOOK:
                    queue.extend(self._look())
                elif isinstance(action, RunStatusCommand):
                    try:
                        event: Event = hooks.poll_status(action.native_ids)
                    except ReferenceError:
                        raise
                    except Exception as e:
                        logger.exception("%s: status poll failed", self._label)
                        event = PollFailed(f"internal error while polling: {e!r}")
                    self._say_outage(event)
                    queue.extend(self._feed(event))
                elif isinstance(action, ResolveMissing):
                    try:
                        event = hooks.resolve_missing(action.native_ids)
                    except ReferenceError:
                        raise
                    except Exception:
                        logger.exception("%s: looking up jobs that left the queue failed",
                                         self._label)
                        event = MissingResolved({})
                    queue.extend(self._feed(event))
                elif isinstance(action, (ReportState, Restate)):
                    self._report(action)
                elif isinstance(action, Withdraw):
                    hooks.withdraw(action.native_id)
                elif isinstance(action, Finish):
                    self._end(action)
                elif action is _FIGURES:
                    self._ask_figures()
            except ReferenceError:  # the executor is gone
                self.stop()
                return

    def _look(self) -> List[Action]:
        """What the jobs' start and end files say now, fed to the tracker."""
        files = self._files
        if files is None:
            return []
        with self._cond:
            ids = self._tracker.tracked()
        actions: List[Action] = []
        for event in files.look(ids):
            with self._cond:
                actions.extend(self._tracker.feed(event))
        return actions

    def _ended_unseen(self, native_id: str, last: Optional[JobStatus],
                      status: JobStatus) -> None:
        """Counts the jobs the scheduler showed running and then ended COMPLETED while no file
        of theirs was in sight (before they are removed); after :data:`UNSEEN_LIMIT` in a row
        the files are taken for not visible from here, and are no longer looked at (said once
        in the log). A job attached when it had ended already (its files may be gone with
        the process that followed it) does not count."""
        files = self._files
        if files is None:
            return
        files.forget(native_id)
        if status.state is not JobState.COMPLETED or last is None \
                or last.state is not JobState.ACTIVE \
                or (last.metadata or {}).get("source") == "job file":
            return
        if any(self._hooks.aux_path(native_id, suffix).exists()
               for suffix in (START_SUFFIX, END_SUFFIX)):
            self._unseen = 0
            return
        self._unseen += 1
        if self._unseen >= UNSEEN_LIMIT:
            with self._cond:
                self._files = None
                self._hurry_now()
            if self._events is not None:
                self._events.stop()
            logger.warning("%s: the jobs' start and end files are not visible in %s from this "
                           "host (%d jobs ended without them): their starts and ends are "
                           "seen at the status polls only, as without a shared file system",
                           self._label, files.directory, self._unseen)

    def _say_outage(self, event: Event) -> None:
        """Log the first failed status poll of a run of them, and the first success after."""
        if isinstance(event, PollFailed):
            if not self._failing:
                self._failing = True
                logger.warning("%s: status poll failed; retrying, and the jobs fail if it goes "
                               "on failing (queue_polling_outage_tolerance): %s", self._label,
                               event.error)
        elif self._failing:
            self._failing = False
            logger.warning("%s: status polling works again", self._label)

    def _feed(self, event: Event) -> List[Action]:
        with self._cond:
            return self._tracker.feed(event)

    def _report(self, action: Union[ReportState, Restate]) -> None:
        obs = action.observation
        meta = dict(obs.metadata)
        meta["native_id"] = action.native_id
        status = JobStatus(obs.state, message=obs.message, exit_code=obs.exit_code,
                           metadata=meta)
        with self._cond:
            jobs = list(self._jobs.get(action.native_id, ()))
            self._last[action.native_id] = status
        for job in jobs:
            if job._native_id == action.native_id:  # else it runs again as another job
                self._deliver(job, status, restated=isinstance(action, Restate))

    def _end(self, action: Finish) -> None:
        """Finish a job, or let it wait for the scheduler's record of its run (see
        :mod:`~psij.executors.batch._figures_wait`) when that is not in hand."""
        obs = action.observation
        meta = obs.metadata
        now = self._clock.now()
        with self._cond:
            last = self._last.get(action.native_id)
        never_ran = obs.state is JobState.CANCELED and (last is None
                                                        or last.state is not JobState.ACTIVE)
        if self._hooks.ended_figures is None or self._hooks.figures_wait <= 0 \
                or has_figures(meta) or never_ran \
                or meta.get("cause") == UNSTARTABLE_CAUSE or not self._awaiting.wanted(now):
            self._finish(action)
        else:
            # An end the job's files told comes before the scheduler's record of it.
            self._awaiting.add(action.native_id, action, now,
                               at_once=meta.get("source") != "job file")

    def _ask_figures(self) -> None:
        """One command for the records of the ended jobs that wait; finish those it told
        (or all it asked about, if it failed) and those that waited long enough."""
        hooks = self._hooks
        asked = self._awaiting.take_due(self._clock.now())
        if not asked or hooks.ended_figures is None:
            return
        try:
            found = hooks.ended_figures(asked)
        except ReferenceError:
            raise
        except Exception:
            logger.exception("%s: asking for the records of ended jobs failed", self._label)
            found = None
        for action, figures in self._awaiting.settle(asked, found, self._clock.now()):
            self._finish(action, figures)

    def _finish(self, action: Finish, figures: Optional[Mapping[str, Any]] = None) -> None:
        hooks = self._hooks
        with self._cond:
            jobs = self._jobs.pop(action.native_id, [])
            last = self._last.pop(action.native_id, None)
        obs = _with_figures(action.observation, figures, last)
        try:
            status = staged_status(hooks.final_status(
                jobs, action.native_id, obs, action.cancel_requested),
                read_report(hooks.aux_path(action.native_id, REPORT_SUFFIX)),
                f"job {action.native_id}")
        except ReferenceError:
            raise
        except Exception as e:
            logger.exception("job %s: could not work out its final status", action.native_id)
            status = JobStatus(action.observation.state if action.observation.state.final
                               else JobState.FAILED,
                               message=f"{action.observation.message or ''} (internal error "
                                       f"while reading the job's files: {e!r})".strip(),
                               metadata={"native_id": action.native_id})
        try:
            self._ended_unseen(action.native_id, last, status)
        except OSError:
            pass
        try:
            hooks.job_ended(jobs, action.native_id)
        except ReferenceError:
            raise
        except Exception:
            logger.exception("job %s: could not clean up its files", action.native_id)
        for job in jobs:
            if job._native_id == action.native_id:  # else it runs again as another job
                self._deliver(job, status)

    def _deliver(self, job: Job, status: JobStatus, restated: bool = False) -> None:
        """Enter ``status``, or restate the job's current state with it (through the
        executor's hooks while the job is bound to it)."""
        if job.executor is None:
            (job._restate if restated else job._set_status)(status)
        elif restated:
            self._hooks.restate(job, status)
        else:
            self._hooks.set_status(job, status)


def _with_figures(obs: Observation, figures: Optional[Mapping[str, Any]],
                  last: Optional[JobStatus]) -> Observation:
    """The observation of a job's end with the figures of the scheduler's record; the start
    and end the job's own files told (to the sub-second; the record's are whole seconds, or
    minutes) are kept, and an end is never put before the start."""
    meta: Dict[str, Any] = {**obs.metadata, **(figures or {})}
    if last is not None and last.state is JobState.ACTIVE and last.metadata \
            and last.metadata.get("started_at") is not None:
        meta["started_at"] = last.metadata["started_at"]  # its start file's time
    if obs.metadata.get("source") == "job file" and "ended_at" in obs.metadata:
        meta["ended_at"] = obs.metadata["ended_at"]
    start, end = meta.get("started_at"), meta.get("ended_at")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end < start:
        meta["ended_at"] = start
    if meta == obs.metadata:
        return obs
    return Observation(obs.state, obs.message, obs.exit_code, meta)
