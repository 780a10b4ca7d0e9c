"""A job's registry row made while it is submitted, so that the job is in the registry once
``submit()`` returns, even if the submitting process is killed the next instant.

The recorder (:mod:`psij._registry.recorder`) writes a job's first status a little later,
from its writer thread. An executor that must not lose a job it accepted uses this module
before its ``submit`` returns:

- :func:`submit_row` makes the job's QUEUED row (the columns and values the recorder would
  insert) for a process that outlives the submitter to write: the local executor sends it
  with the job's start to its keeper, which commits it with the job's pid as native id;
- :func:`commit_rows` commits the rows of jobs, in one transaction, in the caller's thread
  (for jobs no such process takes: started by the submitting process itself, waiting for a
  resource pool or a stage-in).

Either way the spec is encoded once: the recorder's own first write of the job reuses the
text made here. Recording never fails a job: a registry that cannot be written is reported
once per file on the ``psij.registry`` logger (as the recorder does) and the job goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from psij._clock import wall_time
from psij._registry import recorder
from psij._registry.accounting import use_of

if TYPE_CHECKING:
    from psij._registry.store import Row
    from psij.job import Job
    from psij.job_executor import JobExecutor

__all__ = ["commit_rows", "recorded", "submit_row"]


def recorded(job: Job) -> bool:
    """Whether the job's row was queued or written already (a job run again, attached)."""
    return recorder.RECORDED_ATTR in job.__dict__


def _row(executor: JobExecutor, job: Job, identity: Any) -> Row:
    """The row of ``job`` with its current status (QUEUED while it is NEW)."""
    from psij.job_state import JobState

    status = job.status
    state = JobState.QUEUED if status.state is JobState.NEW else status.state
    attempt, rerun = recorder.run_of(job, status)
    values = (job._native_id, state.name, state.order, status.exit_code, status.message,
              wall_time(), state.final, attempt, rerun, recorder.cause_of(status),
              use_of(status.metadata, state.final))
    from psij._registry.store import STATUS_COLUMNS

    row = recorder._row(job, identity, values)
    recorder.keep_spec_text(job, row[STATUS_COLUMNS.index("spec")])
    return row


def submit_row(executor: JobExecutor, job: Job
               ) -> Optional[Tuple[Tuple[str, ...], Tuple[Any, ...]]]:
    """The job's QUEUED row as (column names, values), or None when recording is off or the
    registry cannot be opened (said once per file)."""
    if not recorder.enabled():
        return None
    try:
        from psij._registry.store import STATUS_COLUMNS

        return tuple(STATUS_COLUMNS), tuple(_row(executor, job, recorder._identity(executor)))
    except Exception as ex:
        recorder._warn_once(str(getattr(executor.config, "work_directory", "?")), ex)
        return None


def commit_rows(executor: JobExecutor, jobs: Sequence[Job]) -> None:
    """Commit the rows of ``jobs`` (each with its current status) before returning; a row the
    recorder wrote first is left to it (the store never moves a job's state backwards)."""
    if not recorder.enabled() or not jobs:
        return
    try:
        identity = recorder._identity(executor)
        rows: List[Row] = [_row(executor, job, identity) for job in jobs]
        identity[1].write(rows, [])
    except Exception as ex:
        recorder._warn_once(str(getattr(executor.config, "work_directory", "?")), ex)
