"""Running a local job again (``psij.requeue``, ``psij.retry``: see :mod:`psij._retry`).

The base class decides: when a run of a job that may run again ends FAILED with a cause its
policy covers (the executor's time limit gives ``time_limit``, an exit with 85 is a
``checkpoint``, any other non-zero exit ``failed``), it enters the job QUEUED again, replaces
``job.spec`` by the next run's and calls the executor's ``_run_again``, which is
:func:`run_again`: a new run of the same job through the path a submit takes (the resource
pool when there is one, the stage-in, the keeper), a new process whose pid becomes the job's
native id. Its records (job registry ``local_runs`` or journal) are keyed by pid and start
time, so one job id may have several, one per run; ``attach`` by the latest pid follows the
latest run.

A cancel that comes while a run's end is being handled, or before the next run is registered,
is remembered (:func:`cancel_between_runs`): the next run never starts and the job ends
CANCELED. A cancel after the next run is registered cancels it as a cancel after submit does.

It sets no job state but CANCELED for a run it does not start; the executor sets the others.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Tuple

from psij._lazylog import LazyLogger
from psij.exceptions import SubmitException
from psij.executors.local._prepared import NotRunnable
from psij.job import Job
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.local._prepared import Run

logger = LazyLogger("psij.executors.local")


class Starts(Protocol):
    """What :func:`run_again` takes from the executor: its lock, its runs by job, its pool,
    and its steps of a submit (prepare, launch with staging, start)."""

    @property
    def _lock(self) -> Any: ...

    @property
    def _runs(self) -> "Dict[int, Run]": ...

    @property
    def _pool(self) -> Any: ...

    def _prepare(self, job: Job, spec: JobSpec) -> "Tuple[Run, Any]": ...

    def _launch(self, todo: "Tuple[Run, Any]") -> Any: ...

    def _start(self, run: "Run", prepared: Any) -> None: ...

    def _set_job_status(self, job: Job, status: JobStatus) -> None: ...

__all__ = ["TIME_LIMIT", "Starts", "cancel_between_runs", "may_run_again", "run_again"]

TIME_LIMIT = {"cause": "time_limit"}
"""The metadata of a FAILED status of a job stopped at its duration (a copy is given)."""
_CANCELED = "_local_canceled_between_runs"  # in the job's __dict__


def may_run_again(job: Job) -> bool:
    """Whether ``job`` has a requeue or retry policy (its end may start another run)."""
    return job.__dict__.get("_runs") is not None


def cancel_between_runs(job: Job, run: "Optional[Run]") -> bool:
    """Called with the executor's lock held, by a cancel that found ``run`` (None when none is
    registered): True when the job may run again and is between two runs (its run exited and
    its end is being handled, or the next one is not registered yet); the cancel is then
    remembered and the next run is never started."""
    if not may_run_again(job) or job.status.final or (run is not None and not run.exited):
        return False
    job.__dict__[_CANCELED] = True
    return True


def keep_outputs(job: Job, spec: JobSpec, job_dir: Path) -> None:
    """Before run N (N >= 2) of ``job``: the output files of run N-1 (``stdout_path``,
    ``stderr_path``, once each, relative ones in ``job_dir`` as the job opens them; not
    ``/dev/null``) become ``<path>.<N-1>``, as the batch
    executors' scripts do, so each run's output is kept and the last run's is where the spec
    says. A file that is not there (or cannot be moved) is left as it is."""
    runs = job.__dict__.get("_runs")
    attempt = getattr(runs, "attempt", None)
    if not isinstance(attempt, int) or attempt < 2:
        return
    done: List[str] = []
    for value in (spec.stdout_path, spec.stderr_path):
        if value is None:
            continue
        path = str(job_dir / value)  # an absolute value stays as it is
        if path == "/dev/null" or path in done:
            continue
        done.append(path)
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.replace(path, f"{path}.{attempt - 1}")
        except OSError as ex:
            logger.warning("local job %s: could not keep the output %s of run %d: %s",
                           job.id, path, attempt - 1, ex)


def run_again(ex: Starts, job: Job) -> None:
    """Start the next run of ``job`` (QUEUED, its ``spec`` the new run's); raise when it
    cannot start (the base class then ends the job with the status of the run before)."""
    if job.__dict__.get(_CANCELED):
        ex._set_job_status(job, JobStatus(JobState.CANCELED))
        return
    spec = job.spec
    assert spec is not None
    run, prepared = ex._prepare(job, spec)
    keep_outputs(job, spec, run.job_dir)
    with ex._lock:
        canceled = bool(job.__dict__.get(_CANCELED))
        if not canceled:
            ex._runs[id(job)] = run
    if canceled:
        ex._set_job_status(job, JobStatus(JobState.CANCELED))
        return
    try:
        if ex._pool is not None:
            ex._pool.submit(job, spec, (run, prepared))
        elif spec.stage_in or spec.stage_out or spec.cleanup:
            ex._launch((run, prepared))
        else:
            # Started here rather than by _launch, which would end the job at once with a
            # missing program's 127: this run could not start, the job ends as the last did.
            ex._start(run, prepared)
    except BaseException as error:
        with ex._lock:
            if ex._runs.get(id(job)) is run:
                del ex._runs[id(job)]
        if isinstance(error, NotRunnable):
            raise SubmitException(str(error)) from error
        raise
