"""Queued jobs that the scheduler says can never start as they were submitted.

A scheduler may accept a job that asks for more than its partition or queue can ever give (more
nodes than it has, a time limit above its maximum, an account or QOS that does not exist) and
keep it pending for good, with a reason saying so. Such a job is reported QUEUED with the
metadata ``unstartable`` (the scheduler's reason) and a message saying why and what to change;
reasons that go away by themselves (busy resources, priority, a dependency, a begin time, a
hold) are never reported so.

With the executor option ``fail_unstartable`` (off by default) the tracker
(:mod:`~psij.executors.batch._tracking`) ends such a job FAILED with that message (cause
``unstartable``) and asks for it to be cancelled in the scheduler, so that nothing stays behind.

This module holds the status such a job gets and the check of the option; which reasons are
final is declared by each backend (Slurm: ``UNSTARTABLE_REASONS`` in its module). Pure: no I/O.
"""

from typing import Any, Dict, Mapping, Optional

from psij import _check
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["CAUSE", "UNSTARTABLE", "fail_unstartable_choice", "failed_message",
           "unstartable_reason", "unstartable_status"]

# The metadata entry of a job that can never start: the scheduler's reason.
UNSTARTABLE = "unstartable"
# The cause of the failure when the executor fails such a job.
CAUSE = "unstartable"


def unstartable_status(metadata: Dict[str, object], reason: str, why: str,
                       scheduler: str) -> JobStatus:
    """QUEUED, and never to start: ``why`` says in words what ``reason`` (the scheduler's
    own word, kept in ``metadata[UNSTARTABLE]``) means and what to change."""
    metadata[UNSTARTABLE] = reason
    return JobStatus(JobState.QUEUED, metadata=metadata,
                     message=f"{scheduler} will never start this job as submitted "
                             f"(reason {reason}): {why}")


def unstartable_reason(metadata: object) -> Optional[str]:
    """The scheduler's reason when status metadata (a mapping, or anything else an executor
    gave) says the job can never start; None otherwise."""
    if not isinstance(metadata, Mapping):
        return None
    reason = metadata.get(UNSTARTABLE)
    return reason if isinstance(reason, str) and reason else None


def failed_message(queued_message: Optional[str], reason: str) -> str:
    """The message of a job failed for never starting (it was cancelled in the scheduler)."""
    said = queued_message or f"the scheduler will never start this job (reason {reason})"
    return f"{said}; the job was cancelled in the scheduler (fail_unstartable)"


def fail_unstartable_choice(field: str, value: Any) -> bool:
    """``fail_unstartable`` checked: True or False."""
    if not isinstance(value, bool):
        raise _check.fail_type(field, value, "bool (True: fail and cancel queued jobs the "
                                             "scheduler will never start; False: report them "
                                             "queued)")
    return value
