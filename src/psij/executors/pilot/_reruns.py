"""Running a pilot job again (``psij.requeue``, ``psij.retry``: see :mod:`psij._retry`).

The base class decides: when a task of a job that may run again ends FAILED with a cause its
policy covers (``time_limit`` for a task killed at its ``pilot.time_limit``, ``checkpoint``
for an exit with 85, ``failed`` for any other), it enters the job QUEUED again, replaces
``job.spec`` by the next run's (``pilot.time_limit`` scaled as the duration is) and calls the
executor's ``_run_again``, which is :func:`run_again`: a new task, ``<job id>.<attempt>``,
becomes the job's native id. The task of the run before is then forgotten by the pilot (its
journal says so), so that a resumed pilot does not run it again besides the new one.

It runs on the thread that delivers the pilot's events: for an in-process pilot the task is
submitted there; a served pilot's reader thread cannot wait for a reply, so the task is sent
from a thread of its own, and a failure to send it ends the job FAILED from there, as the base
class would (the status of the run before, and why). A cancel that came while the next run was
being submitted (it read the native id of the run before) is sent again to the new task.
"""

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol

from psij._lazylog import LazyLogger
from psij.exceptions import SubmitException
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij._retry import Rerun
    from psij.executors.pilot.tasks import TaskSpec



class Sends(Protocol):
    """What :func:`run_again` takes from the executor: its state (closed, lock, jobs by name,
    the served pilot's path), how it makes and sends a task, its pilot, cancel and statuses."""

    @property
    def _closed(self) -> bool: ...

    @property
    def _lock(self) -> Any: ...

    @property
    def _by_name(self) -> Dict[str, List[str]]: ...

    @property
    def _path(self) -> Any: ...

    def _task_of(self, job: Job, name: Optional[str] = None) -> "TaskSpec": ...

    def _send(self, job: Job, task: "TaskSpec") -> None: ...

    def _local_engine(self) -> Any: ...

    def _remote(self) -> Any: ...

    def cancel(self, job: Job) -> None: ...

    def _set_job_status(self, job: Job, status: JobStatus) -> None: ...


__all__ = ["CANCELED", "Sends", "run_again"]

logger = LazyLogger(__name__)
CANCELED = "_pilot_canceled"
"""Set in a job's ``__dict__`` by a cancel: a next run starting meanwhile reads it."""


def run_again(ex: Sends, job: Job, rerun: "Rerun") -> None:
    """Submit the next run of ``job`` (QUEUED, its spec the run's) as a new task; raise when
    it cannot be (the base class then ends the job with the status of the run before)."""
    if ex._closed:
        raise SubmitException(f"{ex} is closed")
    if job.__dict__.get(CANCELED):
        ex._set_job_status(job, JobStatus(JobState.CANCELED))
        return
    before = job._native_id
    task = ex._task_of(job, f"{job.id}.{rerun.attempt}")
    if ex._path is None:
        _submit(ex, job, task, before)
        return
    threading.Thread(target=_send_from_thread, args=(ex, job, task, before, rerun),
                     name="psij-pilot-rerun", daemon=True).start()


def _submit(ex: Sends, job: Job, task: "TaskSpec", before: Any) -> None:
    ex._send(job, task)
    name = job.spec.name if job.spec is not None else None
    with ex._lock:
        known = ex._by_name.get(name or "")
        if known is not None and before in known:  # pilot.after names the latest run
            known[known.index(before)] = task.name
    if isinstance(before, str):
        try:
            if ex._path is None:
                ex._local_engine().forget(before)
            else:
                ex._remote().request("forget", task=before)
        except Exception as error:  # the new run goes on; a resume would run both
            logger.warning("job %s: the pilot could not forget its run before, %s: %s",
                           job.id, before, error)
    if job.__dict__.get(CANCELED):  # a cancel read the native id of the run before
        ex.cancel(job)


def _send_from_thread(ex: Sends, job: Job, task: "TaskSpec", before: Any,
                      rerun: "Rerun") -> None:
    try:
        _submit(ex, job, task, before)
    except Exception as error:
        logger.warning("job %s: could not start run %d: %s", job.id, rerun.attempt, error)
        now = job.status
        previous: Dict[str, Any] = dict((now.metadata or {}).get("previous") or {})
        meta: Dict[str, Any] = {"attempt": rerun.attempt}
        if rerun.cause not in ("failed", "checkpoint"):
            meta["cause"] = rerun.cause
        job.__dict__["_runs"] = None  # it runs no more: this is its end
        ex._set_job_status(job, JobStatus(
            JobState.FAILED, message=f"{previous.get('message') or 'the job failed'}; running "
            f"it again ({rerun.kind} after {rerun.cause}) failed: {error}",
            exit_code=previous.get("exit_code"), metadata=meta))
