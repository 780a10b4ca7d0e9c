"""A local job's stage-in, done by this process's worker thread before the job is handed to a
keeper, and the job held in the job registry meanwhile.

Until its stage-in ends, such a job exists only in the submitting process: were that process
killed, nobody would start it. So it is recorded as *held by psij* in this process before
``submit`` returns (:func:`psij._registry.held.mark`, as jobs waiting for the resource pool
are), as being started (``submitting``) while its start is handed to a keeper, and as no longer
held once the keeper has it, or with its final state when it ends before that (stage-in failed,
cancelled). A job whose process ended while it was held is shown so by ``psij list``/``status``
and submitted by ``psij release``, which stages it in again. A job marked so carries
:data:`STAGING_ATTR` while this process holds it: whoever submitted it leaves the marker to it.
"""

import threading
from typing import Any, Callable, Optional

from psij._lazylog import LazyLogger
from psij._registry.held import HELD, SUBMITTING
from psij._registry.held import mark as mark_held
from psij.exceptions import InvalidJobException, SubmitException
from psij.executors.local._prepared import NotRunnable, Prepared, Run
from psij.executors.local._transfer import local_path, transfer
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["STAGING_ATTR", "held_here", "hold", "let_go_cancelled", "stage_in_and_start"]

logger = LazyLogger("psij.executors.local")

# Set on a job (True) while this process holds it for its stage-in.
STAGING_ATTR = "_psij_staging_in"
# A marker is changed by one thread at a time (the worker's start and a cancel may meet).
_MARKING = threading.Lock()


def held_here(job: Job) -> bool:
    """Whether ``job`` is held by this process for its stage-in (its marker is this module's)."""
    return bool(job.__dict__.get(STAGING_ATTR))


def hold(executor: Any, job: Job) -> None:
    """Record ``job`` as held by this process until its stage-in ends (before ``submit``
    returns)."""
    job.__dict__[STAGING_ATTR] = True
    mark_held(executor, [job], HELD)


def _let_go(executor: Any, job: Job, final: Optional[JobStatus]) -> None:
    with _MARKING:
        if job.__dict__.pop(STAGING_ATTR, None) is None:
            return
        mark_held(executor, [job], None, None if final is None else (
            final.state.name, final.state.order, final.message or ""))


def _starting(executor: Any, job: Job) -> None:
    with _MARKING:
        if held_here(job):
            mark_held(executor, [job], SUBMITTING)


def let_go_cancelled(executor: Any, job: Job, status: JobStatus) -> None:
    """``job``, held for its stage-in, was cancelled before it started: it is held no more and
    its final state is written at once."""
    _let_go(executor, job, status)


def stage_in_and_start(executor: Any, run: Run, prepared: Prepared,
                       start: Callable[[Run, Prepared], None],
                       finish: Callable[[Run, JobStatus], None]) -> None:
    """On the worker thread: stage the job in, then ``start`` it (``finish`` with its final
    state when it cannot or was cancelled); its held marker follows (see the module)."""
    job = run.job
    spec = job.spec
    assert spec is not None

    def end(status: JobStatus) -> None:
        _let_go(executor, job, status)
        finish(run, status)

    if run.canceled:
        end(JobStatus(JobState.CANCELED))
        return
    try:
        if spec.stage_in:
            executor._set_job_status(job, JobStatus(JobState.STAGE_IN))
            for item in spec.stage_in:
                transfer(local_path(item.source, "StageIn.source"),
                         run.job_dir / item.target, item.mode)
        prepared.check_streams(spec)
        if run.canceled:
            end(JobStatus(JobState.CANCELED))
            return
        _starting(executor, job)
        start(run, prepared)
        _let_go(executor, job, None)
    except NotRunnable as ex:
        end(ex.status)
    except (OSError, SubmitException, InvalidJobException, ValueError) as ex:
        state = JobState.CANCELED if run.canceled else JobState.FAILED
        end(JobStatus(state, message=f"stage-in failed: {ex}"))
    except Exception as ex:
        # Whatever else: this job fails, the worker and the other jobs go on.
        logger.exception("local job %s could not be started", job.id)
        end(JobStatus(JobState.FAILED, message=f"could not start: {ex!r}"))
