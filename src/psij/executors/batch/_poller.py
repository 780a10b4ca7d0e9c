"""The status poller of a batch executor: one thread, one status command per interval for all
of the executor's jobs.

Its decisions come from the pure state machine in :mod:`~psij.executors.batch._tracking`; this
module only carries them out: it waits until the tracker has something due (measured on the
executor's :class:`~psij._clock.Clock`), asks the executor to run the status
command or to look up jobs that left the queue, and delivers statuses to the jobs (a status of
the state a job is already in, when the scheduler starts or stops holding it, as a
restatement: ``JobExecutor._restate_job_status``). It holds the
executor only weakly, and its thread ends when the executor is closed or garbage collected, or
after a while without jobs. An error while working on one action is logged and fails only what
that action was about. It never runs scheduler commands itself.
"""

import logging
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, AbstractSet, Deque, Dict, Hashable, List, Optional, Union

from psij._clock import Clock
from psij.exceptions import SubmitException
from psij.executors._staging import REPORT_SUFFIX, read_report, staged_status
from psij.executors.batch._tracking import (
    Action,
    CancelAsked,
    CancelFailed,
    Event,
    Finish,
    Hurry,
    JobAdded,
    JobTracker,
    MissingResolved,
    PollFailed,
    ReportState,
    ResolveMissing,
    Restate,
    RunStatusCommand,
    Settings,
    Tick,
    Withdraw,
)
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["IDLE_LINGER", "StatusPoller"]

logger = logging.getLogger(__name__)

# Seconds the thread stays after its last job before it ends.
IDLE_LINGER = 30.0


class StatusPoller:
    """Follows the jobs of one executor: one thread, one status command per interval.

    The executor is held weakly: when it is collected the thread ends. Jobs being followed hold
    their executor, so an executor lives at least as long as it has unfinished jobs. The thread
    also ends after a while without jobs, and starts again with the next job.
    """

    def __init__(self, executor: "BatchSchedulerExecutor", settings: Settings,
                 clock: Clock) -> None:
        self._executor = weakref.ref(executor)
        self._label = f"psij-{executor._work_name()}-status"
        self._clock = clock
        self._cond = threading.Condition()
        self._tracker = JobTracker(settings, clock)
        self._jobs: Dict[str, List[Job]] = {}
        self._last: Dict[str, JobStatus] = {}
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self._failing = False  # the last status poll failed (said once, not at every retry)
        weakref.finalize(executor, self.stop)

    # called from user threads

    def add(self, job: Job, native_id: str, attach: bool) -> None:
        executor = self._executor()
        held = None if executor is None or attach else executor._held
        # Its shape, if the executor holds jobs back (max_queued_per_shape): see hurry().
        group = None if held is None else held.shape_key(job)
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
                                            group=group))
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
        interval from now on, so that a freed slot is used within seconds."""
        with self._cond:
            due = self._tracker.next_deadline()
            self._tracker.feed(Hurry(shapes))
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

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._label, daemon=True)
            self._thread.start()

    # the poller's thread

    def _run(self) -> None:
        try:
            while True:
                actions = self._next_actions()
                if actions is None:
                    return
                self._perform(actions)
        except Exception:
            logger.exception("%s: internal error; status polling stopped", self._label)
            with self._cond:
                self._thread = None

    def _next_actions(self) -> Optional[List[Action]]:
        """Wait until something is due; None when the thread should end."""
        with self._cond:
            idle_since: Optional[float] = None
            while True:
                if self._stopped:
                    self._thread = None
                    return None
                actions = self._tracker.feed(Tick())
                if actions:
                    return actions
                now = self._clock.now()
                if not self._tracker.tracked():
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= IDLE_LINGER:
                        self._thread = None
                        return None
                    self._clock.wait(self._cond, IDLE_LINGER)
                    continue
                idle_since = None
                deadline = self._tracker.next_deadline()
                self._clock.wait(self._cond,
                                 None if deadline is None else max(0.0, deadline - now))

    def _perform(self, first: List[Action]) -> None:
        queue: Deque[Action] = deque(first)
        while queue:
            action = queue.popleft()
            executor = self._executor()
            if executor is None:
                self.stop()
                return
            try:
                if isinstance(action, RunStatusCommand):
                    try:
                        event: Event = executor._poll_status(action.native_ids)
                    except Exception as e:
                        logger.exception("%s: status poll failed", self._label)
                        event = PollFailed(f"internal error while polling: {e!r}")
                    self._say_outage(event)
                    queue.extend(self._feed(event))
                elif isinstance(action, ResolveMissing):
                    try:
                        event = executor._resolve_missing(action.native_ids)
                    except Exception:
                        logger.exception("%s: looking up jobs that left the queue failed",
                                         self._label)
                        event = MissingResolved({})
                    queue.extend(self._feed(event))
                elif isinstance(action, (ReportState, Restate)):
                    self._report(action)
                elif isinstance(action, Withdraw):
                    executor._withdraw(action.native_id)
                elif isinstance(action, Finish):
                    self._finish(executor, action)
            finally:
                del executor

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
            self._deliver(job, status, restated=isinstance(action, Restate))

    def _finish(self, executor: "BatchSchedulerExecutor", action: Finish) -> None:
        with self._cond:
            jobs = self._jobs.pop(action.native_id, [])
            self._last.pop(action.native_id, None)
        try:
            status = staged_status(executor._final_status(
                jobs, action.native_id, action.observation, action.cancel_requested),
                read_report(executor._aux_path(action.native_id, REPORT_SUFFIX)),
                f"job {action.native_id}")
        except Exception as e:
            logger.exception("job %s: could not work out its final status", action.native_id)
            status = JobStatus(action.observation.state if action.observation.state.final
                               else JobState.FAILED,
                               message=f"{action.observation.message or ''} (internal error "
                                       f"while reading the job's files: {e!r})".strip(),
                               metadata={"native_id": action.native_id})
        try:
            executor._job_ended(jobs, action.native_id)
        except Exception:
            logger.exception("job %s: could not clean up its files", action.native_id)
        for job in jobs:
            self._deliver(job, status)

    @staticmethod
    def _deliver(job: Job, status: JobStatus, restated: bool = False) -> None:
        """Enter ``status``, or restate the job's current state with it."""
        executor = job.executor
        if executor is None:
            (job._restate if restated else job._set_status)(status)
        elif restated:
            executor._restate_job_status(job, status)
        else:
            executor._set_job_status(job, status)
