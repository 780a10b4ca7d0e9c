"""The books of one function job: its call directory, its calls' futures, what each future
gets when the job ends, cancellation of calls not started, and the removal of the directory.

Called from the executor's status callbacks (``status_changed``), from ``cancel()``, and from
the executor's result watcher (``collect_early``: results written before the job ends). The
futures are given their values after the lock is released, so that done-callbacks never run
under it; one call whose result cannot be read fails alone. It submits nothing and never
unpickles a result before ``_payload`` checked it; it removes only its own call directory.
"""

import os
import threading
from typing import TYPE_CHECKING, Callable, List, Optional, Set, Tuple

from psij._lazylog import LazyLogger
from psij.futures import _wire
from psij.futures._future import FunctionFuture
from psij.futures._payload import Outcome, load_result
from psij.futures._workdir import WorkDirectory
from psij.futures.errors import FunctionJobError, FunctionResultError

if TYPE_CHECKING:
    from psij.job import Job
    from psij.job_status import JobStatus

__all__ = ["JobCalls"]

_log = LazyLogger(__name__)
_STDERR_TAIL = 2000  # characters of the job's stderr quoted in its error


class JobCalls:
    """The calls of one job and their futures."""

    def __init__(self, work: WorkDirectory, directory: str, futures: List[FunctionFuture],
                 keep_files: bool, ended: Callable[["JobCalls"], None],
                 key: Optional[bytes] = None, remote: bool = False) -> None:
        self.work = work
        self.key = work.key if key is None else key  # what signs this job's files
        self.remote = remote  # run on another host: its claims are not seen here
        self.directory = directory
        self.futures = futures
        self.keep_files = keep_files
        self.job: Optional[Job] = None
        self._ended_hook = ended
        self._lock = threading.Lock()
        self._ended = False
        self._cancelled: Set[int] = set()
        self._left_to_end: Set[int] = set()  # results read early that could not be used
        for index, future in enumerate(futures):
            future._place(self, None, index)

    def bind(self, job: "Job") -> None:
        self.job = job
        for index, future in enumerate(self.futures):
            future._place(self, job, index)

    @property
    def name(self) -> str:
        return os.path.basename(self.directory)

    def status_changed(self, job: "Job", status: "JobStatus") -> None:
        """The job's status callback: settles every future once the job is final."""
        if not status.final:
            return
        with self._lock:
            if self._ended:
                return
            self._ended = True
        if self.job is None:
            self.bind(job)
        outcomes: List[Tuple[FunctionFuture, Outcome]] = []
        for index, future in enumerate(self.futures):
            if future.done():
                continue
            try:
                outcome = self._outcome(index, job, status)
            except Exception as ex:  # a broken file fails its call only
                _log.exception("function job %s: call %d", job.id, index)
                outcome = (False, FunctionResultError(f"call {index} of job {job.id}: its "
                                                      f"result cannot be read: {ex}"))
            if outcome is not None:
                outcomes.append((future, outcome))
        if not self.keep_files:
            self.work.remove(self.directory)
        for future, (ok, value) in outcomes:
            future._settle(ok, value)
        try:
            self._ended_hook(self)
        except Exception:
            _log.exception("function job %s: ended hook", job.id)

    def collect_early(self) -> None:
        """Settle the futures of calls whose results are written while the job still runs (a
        pack's first calls, or a batch job whose end the scheduler's next poll will tell): a
        value, or the function's own exception. Anything else (no file yet, a file that
        cannot be trusted, a call that could not run) waits for the job's end, which says
        how the job ended."""
        if self.remote:
            # Its results come back with the job's end (its stage-out), and a future settled
            # before then could let the executor close while the job's remote folder is
            # being removed.
            return
        with self._lock:
            if self._ended:
                return
            pending = [(i, f) for i, f in enumerate(self.futures)
                       if not f.done() and i not in self._left_to_end]
        outcomes: List[Tuple[FunctionFuture, Outcome]] = []
        for index, future in pending:
            path = _wire.result_file(self.directory, index)
            try:
                if not os.path.exists(path):
                    continue
                ok, value = load_result(path, self.key, f"{self.name}/{index}",
                                        _not_yet)
            except _NotYet:  # whole but not usable: read once more, at the job's end only
                self._left_to_end.add(index)
                continue
            except Exception:  # the directory removed at the job's end meanwhile
                continue
            if ok or not isinstance(value, FunctionJobError):
                outcomes.append((future, (ok, value)))
            else:
                self._left_to_end.add(index)
        for future, (ok, value) in outcomes:
            future._settle(ok, value)

    def _outcome(self, index: int, job: "Job", status: "JobStatus") -> Optional[Outcome]:
        call = f"{self.name}/{index}"
        path = _wire.result_file(self.directory, index)
        where = (f"call {index} ({self.futures[index].function_name}) of job {job.id} "
                 f"({_executor_name(job)} {job.native_id})")

        def error(message: str) -> FunctionResultError:
            return FunctionResultError(f"{where}: {message}", job.id, job.native_id, status)

        if os.path.lexists(path):
            ok, value = load_result(path, self.key, call, error)
            if isinstance(value, FunctionJobError) and not isinstance(
                    value, FunctionResultError):
                value = FunctionJobError(f"{where}: {value}", job.id, job.native_id, status)
            return ok, value
        claimed = self._claim(index)
        if claimed == _wire.CLAIM_CANCEL:
            return None  # the future was cancelled
        state = status.state.name
        if state == "COMPLETED":
            return False, error(f"the job completed but left no result for it ({path} is "
                                f"missing)")
        started = " after the call had started" if claimed == _wire.CLAIM_RUN else ""
        return False, FunctionJobError(f"{where}: the job ended {state}{started} without a "
                                       f"result for it{_reason(status, self.directory)}",
                                       job.id, job.native_id, status)

    def _claim(self, index: int) -> Optional[bytes]:
        try:
            with open(_wire.claim_file(self.directory, index), "rb") as claim:
                return claim.read(16)
        except OSError:
            return None

    def cancel_call(self, future: FunctionFuture) -> bool:
        """``future.cancel()``: claims the call before the runner does."""
        index = future.index
        with self._lock:
            if self._ended:
                return future.cancelled()
            if self.remote and not self._whole_job_cancellable():
                return False
            try:
                if not _wire.claim(self.directory, index, _wire.CLAIM_CANCEL):
                    return False
            except OSError:
                return False
            self._cancelled.add(index)
            nothing_left = len(self._cancelled) == len(self.futures)
        cancelled = future._cancel_now()
        job = self.job
        if nothing_left and job is not None:
            try:
                job.cancel()
            except Exception:  # ended or not yet submitted: the runner skips the calls
                _log.debug("function job %s: cancel", job.id, exc_info=True)
        return cancelled

    def _whole_job_cancellable(self) -> bool:
        """On another host the runner cannot see a claim made here: a call is cancelled only
        with its whole job, while the job is queued (it is cancelled then)."""
        from psij.job_state import JobState

        job = self.job
        if job is None or job.status.state is not JobState.QUEUED:
            return False
        return len(self._cancelled) + 1 >= len(self.futures)


class _NotYet(Exception):
    """A result file read before the job's end that cannot be used (yet): left to the end."""


def _not_yet(message: str) -> FunctionResultError:
    raise _NotYet(message)


def _executor_name(job: "Job") -> str:
    executor = job.executor
    try:
        return executor.name if executor is not None else "unbound"
    except Exception:
        return type(executor).__name__


def _reason(status: "JobStatus", directory: str) -> str:
    parts = []
    if status.message:
        parts.append(status.message)
    if status.exit_code is not None and not (
            status.message and f"exit code {status.exit_code}" in status.message):
        parts.append(f"exit code {status.exit_code}")  # unless the message says it already
    if status.metadata:
        parts.append(f"metadata {status.metadata}")
    tail = _stderr_tail(directory)
    if tail:
        parts.append(f"the job's stderr ends with:\n{tail}")
    return (": " + "; ".join(parts)) if parts else ""


def _stderr_tail(directory: str) -> str:
    try:
        with open(os.path.join(directory, "stderr"), "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - _STDERR_TAIL))
            return stream.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
