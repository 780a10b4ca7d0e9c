"""Running a batch job again (``psij.requeue``, ``psij.retry``; see :mod:`psij._retry`):
:class:`Reruns`, a base of :class:`~psij.executors.batch.BatchSchedulerExecutor`.

Batch executors start a job's next run themselves (``_RERUNS = "submits"``). When a run ends
FAILED for a cause the job's policy covers, the job is QUEUED again (the base entered it, with
its ``spec`` replaced by the next run's) and :meth:`Reruns._run_again` submits it anew:

- The old scheduler job is followed no more (the status poller forgets it: nothing it says
  later reaches the job) and its files (``<native id>.ec``, ``.out``, ...) are removed unless
  ``keep_files``.
- The submit script is rendered from the new ``spec`` (its memory and duration scaled, its
  environment with ``PSIJ_ATTEMPT``), checked as any submission is, and submitted; the job's
  native id becomes the new one, its QUEUED status is restated with it (the keys of the rerun,
  ``attempt``, ``rerun``, ``cause``, ``previous``, kept), and the poller follows it. A failure
  raises; the job then ends FAILED, its message saying why it could not run again.
- A run goes alone: an element of a job array is submitted again as a job by itself.
- Jobs held by the client (``max_queued_per_shape``) had their turn: a rerun is submitted at
  once, outside the cap (it holds a slot of its shape no more).
- Jobs run on this machine (``fallback="local"``) belong to the local executor, which runs
  them again itself: none reaches here.
- A cancel asked between the end of the run and the submission of the next (the job is QUEUED
  but the old scheduler job is gone and the new one has no id yet) is kept: before the
  submission the job ends CANCELED without submitting; after it, the new scheduler job is
  cancelled as soon as it is followed, so that no run is left going.

A scheduler that requeues a job itself (Slurm's ``--requeue``, Grid Engine's ``-r y``) keeps
its native id: the poller reports it QUEUED again (``rerunnable`` jobs, see
:mod:`~psij.executors.batch._tracking`) and the base counts the requeue.

It runs scheduler commands only through the executor's submit step and command runner, and
writes only the submit script (through the submit step).
"""

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Iterator, List

from psij import _retry
from psij._lazylog import LazyLogger
from psij.exceptions import SubmitException
from psij.executors.batch._submit_io import submit_text
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["RUN_FILE_SUFFIXES", "Reruns"]

logger = LazyLogger(__name__)

# The files of one scheduler job, <native id><suffix>, in the work directory (the staging
# report and the signal request are added by the executor).
RUN_FILE_SUFFIXES = (".ec", ".out", ".nodefile", ".starts")
_MADE = threading.Lock()


class _InFlight:
    """Jobs between the end of a run and the submission of the next, and whether a cancel was
    asked for them meanwhile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: Dict[str, List[Any]] = {}  # job id -> [depth, cancel asked]

    def begin(self, job: Job) -> None:
        with self._lock:
            entry = self._jobs.setdefault(job.id, [0, False])
            entry[0] += 1

    def end(self, job: Job) -> bool:
        """Whether a cancel was asked (once the last window of the job closes)."""
        with self._lock:
            entry = self._jobs.get(job.id)
            if entry is None:
                return False
            entry[0] -= 1
            if entry[0] > 0:
                return False
            del self._jobs[job.id]
            return bool(entry[1])

    def ask_cancel(self, job: Job) -> bool:
        with self._lock:
            entry = self._jobs.get(job.id)
            if entry is None:
                return False
            entry[1] = True
            return True

    def cancel_asked(self, job: Job) -> bool:
        with self._lock:
            entry = self._jobs.get(job.id)
            return entry is not None and bool(entry[1])


class Reruns:
    """The reruns of :class:`~psij.executors.batch.BatchSchedulerExecutor` (see the module's
    documentation)."""

    _RERUNS: ClassVar[str] = "submits"

    if TYPE_CHECKING:
        config: Any

        def cancel(self, job: Job) -> None: ...

        def _ensure_open(self) -> None: ...

        def _status_poller(self) -> Any: ...

        def _script_inputs(self) -> Any: ...

        def _check_script_values(self, job: Job, spec: Any, inputs: Any = None) -> None: ...

        def _create_script_context(self, job: Job, inputs: Any = None) -> Dict[str, object]: ...

        def _render(self, job: Job, context: Dict[str, object], inputs: Any) -> str: ...

        def _submit_inputs(self) -> Any: ...

        def _set_job_status(self, job: Job, status: JobStatus) -> None: ...

        def _restate_job_status(self, job: Job, status: JobStatus) -> None: ...

        def _aux_path(self, native_id: str, suffix: str) -> Path: ...

    def _in_flight(self) -> _InFlight:
        made = self.__dict__.get("_reruns_in_flight")
        if made is None:
            with _MADE:
                made = self.__dict__.setdefault("_reruns_in_flight", _InFlight())
        return made  # type: ignore[no-any-return]

    @contextmanager
    def _rerun_window(self, job: Job, status: JobStatus) -> Iterator[None]:
        """Around entering ``status``: a FAILED status of a job that may run again opens the
        window in which a cancel is kept for its next run (see the module's documentation)."""
        if status.state is not JobState.FAILED or job.__dict__.get("_runs") is None:
            yield
            return
        flight = self._in_flight()
        flight.begin(job)
        try:
            yield
        finally:
            cancel = flight.end(job)
        if cancel and not job.status.state.final:
            try:
                self.cancel(job)
            except Exception as e:
                logger.warning("job %s: cancelling its new run failed: %s", job.id, e)

    def _cancel_rerun(self, job: Job) -> bool:
        """True when ``job`` is between two runs: the cancel is carried out there."""
        return self._in_flight().ask_cancel(job)

    def _run_again(self, job: Job, rerun: "_retry.Rerun") -> None:
        """Submit the next run of ``job`` (QUEUED again, its ``spec`` the run's)."""
        fallback = getattr(self, "_fallback", None)
        if fallback is not None:
            raise SubmitException("jobs of this executor run on this machine "
                                  f"({fallback.why}); the local executor runs them again")
        self._ensure_open()
        spec = job.spec
        assert spec is not None  # the base gives no run to a job without a spec
        old = job._native_id
        poller = self._status_poller()
        if old is not None:
            poller.forget(job, old)
            self._remove_run_files(old)
        inputs = self._script_inputs()
        self._check_script_values(job, spec, inputs)
        if self._in_flight().cancel_asked(job):
            self._set_job_status(job, JobStatus(
                JobState.CANCELED, message=f"cancelled before its run {rerun.attempt} was "
                                           "submitted"))
            return
        text = self._render(job, self._create_script_context(job, inputs), inputs)
        native_id = submit_text(self._submit_inputs(), job, text)
        if isinstance(native_id, SubmitException):
            raise native_id
        job._native_id = native_id
        logger.debug("job %s: run %d submitted as %s", job.id, rerun.attempt, native_id)
        current = job.status
        if current.state is JobState.QUEUED:
            meta = dict(current.metadata or {})
            meta["native_id"] = native_id
            self._restate_job_status(job, JobStatus(JobState.QUEUED, message=current.message,
                                                    metadata=meta))
        poller.add(job, native_id, attach=False, rerunnable=True)

    def _remove_run_files(self, native_id: str) -> None:
        """Remove the files the scheduler job ``native_id`` left, unless ``keep_files``."""
        if self.config.keep_files:
            return
        from psij.executors._staging import REPORT_SUFFIX
        from psij.executors.batch._signals import SIGNAL_SUFFIX

        for suffix in (*RUN_FILE_SUFFIXES, REPORT_SUFFIX, SIGNAL_SUFFIX):
            try:
                self._aux_path(native_id, suffix).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                logger.warning("job %s: could not delete its %s file: %s", native_id, suffix,
                               e)

