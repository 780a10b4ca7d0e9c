"""Changing the priority of a job a batch executor has taken: ``set_priority(job, priority)``.

The new priority (``psij.priority``: a finite number, higher goes first) goes where the job's
place is decided now:

- a job held by the client (``max_queued_per_shape``) takes its new place among the held jobs
  of its shape at once (:mod:`~psij.executors.batch._holding`), and its status metadata shows
  the new priority;
- a job queued in the scheduler gets, with ``use_nice``, the scheduler's value for the new
  priority through the scheduler's own command (:func:`~psij.executors.batch._nice.
  nice_update_command`: ``scontrol update``, ``qalter -p``, ``bmod -sp``); a job being
  submitted by the holding worker gets it as soon as it has a native id;
- a job already running, or queued in the scheduler without ``use_nice``, keeps its place:
  ``set_priority`` returns False (True when the new priority was applied).

The job's spec is replaced by a copy that carries the new ``psij.priority`` (the spec given
to ``Job`` may be shared by other jobs, whose priority must not change), so a job submitted
later from it, or a held one rendered later, uses the new value.

Errors, raised before anything changes: a value that is not a finite number (TypeError,
ValueError naming ``priority``), a job this executor did not take or that is final or still
being submitted by ``submit`` (InvalidJobException); the scheduler refusing the change
(SubmitException with its words). It runs scheduler commands only through the executor.
"""

import copy
import math
from typing import TYPE_CHECKING, Union, cast

from psij import _check
from psij._priority import ATTRIBUTE
from psij.exceptions import InvalidJobException, SubmitException
from psij.executors.batch._holding import Phase
from psij.executors.batch._nice import nice_mapping, nice_update_command
from psij.job import Job
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["PriorityChange", "checked_priority", "with_priority"]

Priority = Union[int, float]


def checked_priority(priority: object) -> Priority:
    """``priority`` when it is a finite number; TypeError or ValueError naming it otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise _check.fail_type("set_priority priority", priority,
                               "a number (int or float; higher goes first)")
    if not math.isfinite(priority):
        raise ValueError(f"set_priority priority: expected a finite number, got {priority!r}")
    return priority


def with_priority(spec: JobSpec, priority: Priority) -> JobSpec:
    """A copy of ``spec`` whose ``psij.priority`` is ``priority`` (``spec`` is not changed)."""
    new = copy.copy(spec)
    attributes = copy.copy(spec.attributes)
    attributes.custom_attributes = dict(attributes.custom_attributes or {})
    attributes.set_custom_attribute(ATTRIBUTE, priority)
    new.attributes = attributes
    return new


class PriorityChange:
    """``set_priority`` for :class:`~psij.executors.batch.batch_scheduler_executor.
    BatchSchedulerExecutor` (see the module's documentation)."""

    def set_priority(self, job: Job, priority: Priority) -> bool:
        """Give ``job`` the priority ``priority`` (``psij.priority``, higher goes first).

        A job held by the client is reordered at once; a job queued in the scheduler gets
        the scheduler's value with ``use_nice``. Returns False when nothing orders the job
        any more (it runs, or the scheduler has it and ``use_nice`` is off).
        """
        ex = cast("BatchSchedulerExecutor", self)
        if not isinstance(job, Job):
            raise _check.fail_type("set_priority job", job, "psij.Job")
        priority = checked_priority(priority)
        if ex._fallback is not None:  # its jobs belong to the local executor
            return ex._fallback.local.set_priority(job, priority)
        if job.executor is not ex:
            raise InvalidJobException(f"job {job.id} was not submitted to (or attached by) "
                                      f"this {ex.name} executor")
        state = job.status.state
        if state.final:
            raise InvalidJobException(f"job {job.id} is {state}; its priority no longer matters")
        if state is JobState.ACTIVE:
            return False
        held = ex._held
        spec = job.spec
        if spec is not None:
            job.spec = with_priority(spec, priority)  # before it is rendered (held jobs)
        if held is not None:
            phase = held.reprioritize(job, priority, lambda: _renice(ex, job, priority))
            if phase is Phase.HELD:
                _show_priority(ex, job, priority)
                return True
            if phase is Phase.SUBMITTING:
                return nice_mapping(ex) is not None
        native_id = job.native_id
        if native_id is None:
            raise InvalidJobException(f"job {job.id} is being submitted; set its priority once "
                                      "submit has returned")
        return _renice(ex, job, priority)


def _renice(ex: "BatchSchedulerExecutor", job: Job, priority: Priority) -> bool:
    """Give the queued job its new priority in the scheduler (False without ``use_nice``)."""
    native_id = job.native_id
    assert native_id is not None
    argv = nice_update_command(ex, native_id, priority)
    if argv is None:
        return False
    result = ex._run(argv)
    if not result.ok:
        raise SubmitException(f"job {job.id}: the scheduler did not take its new priority: "
                              f"{result.describe()}", transient=result.exit_code is None)
    return True


def _show_priority(ex: "BatchSchedulerExecutor", job: Job, priority: Priority) -> None:
    """The held job's status, with its new priority."""
    status = job.status
    if status.state is JobState.QUEUED and status.metadata is not None \
            and status.metadata.get("held_by") == "client":
        ex._restate_job_status(job, JobStatus(JobState.QUEUED, message=status.message,
                                              metadata=dict(status.metadata,
                                                            priority=priority)))
