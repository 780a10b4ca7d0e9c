"""A job: its spec, its status history as seen by callbacks, waiting and cancelling.

Status changes arrive from executor threads. One module-wide lock guards every job's state
(jobs are many and transitions are short, so one lock costs less memory than one per job);
callbacks always run outside that lock, in the order the states were entered, and never two at a
time for the same job. An exception raised by a callback is logged and swallowed.

``wait`` returns once the callbacks for the awaited state have run, so whatever they record is
visible to the waiter (a callback that waits on its own job is answered from the current state).

Callbacks see each state once, as in psij-python, per run of the job: a job run again
(requeued or retried, :mod:`psij._retry`) enters QUEUED again (:meth:`Job._rerun`). An
executor that learns more about the state the job is in (the scheduler holds the queued job,
or released it) *restates* it (:meth:`Job._restate`): the status is replaced and the job's
watchers (psij's own listeners, such as the controllers' event loop) are told, in order with
the other changes.
"""

import os
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple, Union

from psij import _check
from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger
from psij.exceptions import SubmitException
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_state import JobStateOrder as JobStateOrder
from psij.job_status import JobStatus

if TYPE_CHECKING:
    import psij._job_async
    from psij.job_executor import JobExecutor

__all__ = ["FunctionJobStatusCallback", "Job", "JobStatusCallback"]

logger = LazyLogger(__name__)

_LOCK = threading.Lock()

# The longest wait psij-python's Job.wait uses in place of "forever" (a longer timedelta
# overflows when added to the current time); kept under the same name for code that uses it.
LARGE_TIMEOUT = timedelta(days=3650)
_CLOCK: Clock = MonotonicClock()  # what Job.wait's timeout is measured on


def _new_id() -> str:
    """A random (version 4) UUID string; ``uuid`` itself is slow to import."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _targets(what: str, target_states: Optional[Union[JobState, Sequence[JobState]]]
             ) -> Sequence[JobState]:
    if isinstance(target_states, JobState):
        return (target_states,)
    if target_states is None:
        return ()
    targets = tuple(target_states)
    for t in targets:
        if not isinstance(t, JobState):
            raise TypeError(f"{what} target_states: expected JobState items, got {t!r}")
    return targets


class _Restated:
    """A status of the state the job is already in, told to watchers only."""

    __slots__ = ("status",)

    def __init__(self, status: JobStatus) -> None:
        self.status = status


class JobStatusCallback:
    """Receives status changes; override ``job_status_changed``."""

    def job_status_changed(self, job: "Job", job_status: JobStatus) -> None:
        """Called once for each state the job enters."""
        raise NotImplementedError


class FunctionJobStatusCallback(JobStatusCallback):
    """Adapts a plain function ``fn(job, status)`` to the callback interface."""

    def __init__(self, fn: "Callable[[Job, JobStatus], None]") -> None:
        self.fn = fn

    def job_status_changed(self, job: "Job", job_status: JobStatus) -> None:
        self.fn(job, job_status)


if TYPE_CHECKING:
    CallbackLike = Union[JobStatusCallback, Callable[["Job", JobStatus], None]]
else:  # the same without the forward reference, which typing would compile on import
    CallbackLike = Union[JobStatusCallback, Callable[..., None]]


def as_callback(cb: Optional[CallbackLike], field: str) -> Optional[JobStatusCallback]:
    if cb is None or isinstance(cb, JobStatusCallback):
        return cb
    if callable(cb):
        return FunctionJobStatusCallback(cb)
    raise TypeError(f"{field}: expected a JobStatusCallback or a callable (job, status), "
                    f"got {cb!r} ({type(cb).__name__})")


class Job:
    """A unit of work described by a :class:`~psij.JobSpec` and run by a JobExecutor."""

    def __init__(self, spec: Optional[JobSpec] = None) -> None:
        self._id = _new_id()
        self.spec = spec
        self._status = JobStatus(JobState.NEW)
        self.executor: Optional[JobExecutor] = None
        self._native_id: Optional[str] = None
        self._cb: Optional[JobStatusCallback] = None
        # Statuses entered but not yet delivered to callbacks; a list only while delivering.
        self._pending: Optional[List[Union[JobStatus, _Restated]]] = None
        self._delivered = self._status  # the last status whose callbacks have run
        self._deliverer: Optional[int] = None  # thread running this job's callbacks
        self._cv: Optional[threading.Condition] = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "spec" and value is not None and not isinstance(value, JobSpec):
            raise TypeError(f"Job.spec: expected psij.JobSpec or None, got {value!r} "
                            f"({type(value).__name__})")
        object.__setattr__(self, name, value)

    @property
    def id(self) -> str:
        """A unique identifier made by this library (a uuid4 string)."""
        return self._id

    @property
    def name(self) -> Optional[str]:
        """The spec's name (which defaults to the executable), for templates and messages."""
        return self.spec.name if self.spec is not None else None

    @property
    def native_id(self) -> Optional[str]:
        """The identifier given to the job by the executor's backend, once submitted (an
        executor that starts jobs after ``submit`` returns, such as ``local``, has this wait
        until the backend gave it)."""
        native_id = self._native_id
        if native_id is None and self.executor is not None:
            wait = getattr(self.executor, "_wait_native_id", None)
            if wait is not None:
                wait(self)
                native_id = self._native_id
        return native_id

    @property
    def status(self) -> JobStatus:
        """The latest status."""
        return self._status

    @status.setter
    def status(self, status: JobStatus) -> None:
        self._set_status(status)

    def _set_status(self, status: JobStatus) -> bool:
        """Enter ``status`` (and any skipped states first); returns False if it was ignored."""
        if not isinstance(status, JobStatus):
            raise TypeError(f"Job.status: expected psij.JobStatus, got {status!r}")
        ex = self.executor
        quiet = self._cb is None and (ex is None or ex._silent()) \
            and "_watchers" not in self.__dict__
        with _LOCK:
            current = self._status.state
            if not status.state.is_greater_than(current):
                return False
            if quiet and self._pending is None and self._cv is None:
                # Nobody to tell, nobody waiting: the states skipped are seen by no one.
                self._status = self._delivered = status
                return True
            chain: List[Union[JobStatus, _Restated]] = []
            prev = status.state.predecessor
            attempt = status.metadata.get("attempt") if status.metadata else None
            while prev is not None and prev.is_greater_than(current):
                skipped = JobStatus._made(prev, status.time)
                if attempt is not None:  # a job run again: each state says which run
                    skipped.metadata = {"attempt": attempt}
                chain.append(skipped)
                prev = prev.predecessor
            chain.reverse()
            chain.append(status)
            self._status = status
            if self._pending is not None:
                # Another thread is delivering callbacks for this job; it will take these.
                self._pending.extend(chain)
                return True
            self._pending = chain
        self._deliver()
        return True

    def _restate(self, status: JobStatus) -> bool:
        """Replace the current status by ``status``, of the same non-final state, and tell the
        watchers (not the callbacks); returns False (and does nothing) for another state."""
        if not isinstance(status, JobStatus):
            raise TypeError(f"Job.status: expected psij.JobStatus, got {status!r}")
        with _LOCK:
            if status.state is not self._status.state or status.state.final:
                return False
            self._status = status
            if self._pending is not None:
                self._pending.append(_Restated(status))
                return True
            self._pending = [_Restated(status)]
        self._deliver()
        return True

    def _rerun(self, status: JobStatus) -> bool:
        """Enter ``status``, QUEUED, again: the job runs again (requeued or retried, see
        :mod:`psij._retry`); its callbacks see QUEUED and the states after it once more.
        Returns False (and does nothing) when the job is final or ``status`` is not QUEUED."""
        if not isinstance(status, JobStatus):
            raise TypeError(f"Job.status: expected psij.JobStatus, got {status!r}")
        with _LOCK:
            if self._status.state.final or status.state is not JobState.QUEUED:
                return False
            self._status = status
            if self._pending is not None:
                self._pending.append(status)
                return True
            self._pending = [status]
        self._deliver()
        return True

    def _deliver(self) -> None:
        self._deliverer = threading.get_ident()
        while True:
            with _LOCK:
                batch = self._pending
                if not batch:
                    self._pending = None
                    self._deliverer = None
                    return
                self._pending = []
            for entry in batch:
                if isinstance(entry, _Restated):
                    st = entry.status
                    self._tell_watchers(st)
                else:
                    st = entry
                    self._notify(st)
                with _LOCK:
                    self._delivered = st
                    if self._cv is not None:
                        self._cv.notify_all()
                        if st.state.final:
                            self._cv = None

    def _notify(self, status: JobStatus) -> None:
        cb = self._cb
        if cb is not None:
            try:
                cb.job_status_changed(self, status)
            except Exception:
                logger.exception("status callback of job %s raised", self._id)
        ex = self.executor
        if ex is not None:
            ex._notify_callback(self, status)
        self._tell_watchers(status)

    def _tell_watchers(self, status: JobStatus) -> None:
        watchers: Tuple[Callable[[Job, JobStatus], None], ...] = \
            self.__dict__.get("_watchers", ())
        for watch in watchers:
            try:
                watch(self, status)
            except Exception:
                logger.exception("a status watcher of job %s raised", self._id)

    def _add_watcher(self, watch: "Callable[[Job, JobStatus], None]") -> None:
        """Also tell ``watch`` of each status, when the callbacks are told (asyncio waits,
        the controllers' loop), and of each restatement (:meth:`_restate`)."""
        with _LOCK:
            self.__dict__["_watchers"] = (*self.__dict__.get("_watchers", ()), watch)

    def _remove_watcher(self, watch: "Callable[[Job, JobStatus], None]") -> None:
        with _LOCK:
            left = tuple(w for w in self.__dict__.get("_watchers", ()) if w is not watch)
            self.__dict__["_watchers"] = left

    def set_job_status_callback(self, cb: Optional[CallbackLike]) -> None:
        """Call ``cb`` for every state this job enters (before the executor's callback)."""
        self._cb = as_callback(cb, "Job.set_job_status_callback")

    def cancel(self) -> None:
        """Ask the executor to cancel the job; nothing happens if the job is already final."""
        if self._status.state.final:
            return
        if self.executor is None:
            raise SubmitException("Job.cancel: the job has not been submitted to an executor")
        self.executor.cancel(self)

    def wait(self, timeout: Union[timedelta, float, None] = None,
             target_states: Optional[Union[JobState, Sequence[JobState]]] = None
             ) -> Optional[JobStatus]:
        """Wait until the job is final or has reached one of ``target_states`` (or gone past it).

        Returns the status reached, or None if ``timeout`` passed first. ``timeout`` is a
        ``timedelta`` or a number of seconds; zero checks once without waiting; None (or
        ``float("inf")``) waits for as long as it takes.
        """
        limit = _check.timeout("Job.wait timeout", timeout)
        targets = _targets("Job.wait", target_states)
        deadline = None if limit is None else _CLOCK.now() + limit
        me = threading.get_ident()
        with _LOCK:
            while True:
                st = self._status if self._deliverer == me else self._delivered
                if st.state.final or any(st.state is t or st.state.is_greater_than(t)
                                         for t in targets):
                    return st
                remaining = None if deadline is None else deadline - _CLOCK.now()
                if remaining is not None and remaining <= 0:
                    return None
                if self._cv is None:
                    self._cv = threading.Condition(_LOCK)
                _CLOCK.wait(self._cv, remaining)

    async def wait_async(self, timeout: Union[timedelta, float, None] = None,
                         target_states: Optional[Union[JobState, Sequence[JobState]]] = None
                         ) -> Optional[JobStatus]:
        """:meth:`wait` for asyncio: the same result, awaited without blocking the event loop.

        ``timeout`` is a timedelta or a number of seconds. Nothing polls and no thread is
        started: the job's status notification wakes the waiting task.
        """
        from psij._job_async import wait_async

        return await wait_async(self, timeout, _targets("Job.wait_async", target_states))

    def status_changes(self) -> "psij._job_async.StatusChanges":
        """An async iterator of this job's statuses: the current one, then each state entered,
        ending after a final one. Call it while an event loop runs::

            async for status in job.status_changes():
                print(status.state)
        """
        from psij._job_async import StatusChanges

        return StatusChanges(self)

    def __hash__(self) -> int:
        return hash(self._id)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __str__(self) -> str:
        return f"Job[id={self._id}, native_id={self._native_id}, executor={self.executor}, " \
               f"status={self._status}]"

    __repr__ = __str__
