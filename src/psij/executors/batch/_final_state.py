"""How a batch job's final status is decided, as pure functions of what was observed.

The rules:

- the exit code is the one in the job's exit-code file, else the one the scheduler gave, else
  the accounting's (asked only when both are missing and the job was not cancelled:
  :func:`needs_accounting`); a job that left the queue with a non-zero exit code in its file
  takes the cause of its end from the accounting (:func:`with_accounting_cause`);
- a job the scheduler reports CANCELED, or that ended (FAILED without a known cause or because
  its batch shell died: ``launch_failure``, what a KILL sent by ``kill`` looks like; or
  COMPLETED: its script passes the cancel's signal on and it may leave by itself with 0) after
  this executor's cancel reached it, ends CANCELED; when nobody here asked, the message says it
  was cancelled from outside (a cancel that found the job gone is not counted);
- a job reported COMPLETED ends COMPLETED only if its exit code is 0 or unknown (then 0);
  otherwise, and for every other state, it ends FAILED;
- a FAILED job's message says why, in this order: the cause's words (time limit, memory, ...)
  or else the scheduler's message, what the launcher said when it failed, the exit code in
  words, the end of the job's stderr; with none of these, that the scheduler gave no reason. A
  job failed because the scheduler would never start it (cause ``unstartable``) never ran: it
  has no exit code, launcher output or stderr to quote, and no accounting is asked about it.

The caller reads the files and runs the accounting command; this module does no I/O, so every
rule is tested by calling :func:`final_status` with a :class:`Seen`.
"""

from datetime import timedelta
from typing import Any, Dict, List, Optional

from psij._record import Record
from psij.executors._process import stderr_part
from psij.executors.batch._figures import figures_of
from psij.executors.batch._job_output import _describe_duration, _describe_exit
from psij.executors.batch._tracking import Observation
from psij.executors.batch._unstartable import CAUSE as UNSTARTABLE_CAUSE
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["CAUSE_MESSAGES", "Seen", "final_state", "final_status", "needs_accounting",
           "with_accounting_cause"]

# Why a job failed, in words; {time_limit} is the job's requested duration.
CAUSE_MESSAGES: Dict[str, str] = {
    "time_limit": "the job reached its time limit ({time_limit}) and was stopped by the "
                  "scheduler; ask for a longer duration (JobAttributes.duration)",
    "out_of_memory": "the job ran out of memory and was killed; ask for more memory "
                     "(ResourceSpecV1.memory) or use less",
    "node_failure": "a node allocated to the job failed; the job may be resubmitted",
    "preempted": "the job was preempted by the scheduler (to make room for other work); it "
                 "may be resubmitted",
    "boot_failure": "the job's nodes could not be booted; the job may be resubmitted",
    "deadline": "the job reached its deadline before it could finish",
    "launch_failure": "the scheduler could not launch the job (a file system problem, a "
                      "missing directory or program, ...)",
    "held_error": "the scheduler put the job in an error state",
    UNSTARTABLE_CAUSE: "the scheduler would never start the job as submitted; it was "
                       "cancelled there",
}

_ENDED = (JobState.FAILED, JobState.COMPLETED)
_CANCELLED_OUTSIDE = ("the job was cancelled outside this executor (by its owner through "
                      "another tool, an administrator or the scheduler)")


class Seen(Record):
    """Everything the final status of one job is decided from.

    ``exit_code`` is the one already chosen (file, scheduler, accounting); ``launcher_failure``
    is what the launcher said when its output shows it failed; ``stderr_tail`` the last lines
    of the job's stderr; ``time_limit`` the job's requested duration.
    """

    native_id: str
    observation: Observation
    cancel_requested: bool
    exit_code: Optional[int] = None
    time_limit: Optional[timedelta] = None
    launcher_failure: Optional[str] = None
    stderr_tail: Optional[str] = None


def needs_accounting(observation: Observation, exit_code: Optional[int]) -> bool:
    """True when the accounting should be asked for the exit code: none is known yet and the
    job was not cancelled."""
    return (exit_code is None and observation.state is not JobState.CANCELED
            and observation.metadata.get("cause") != UNSTARTABLE_CAUSE)


# The causes of a FAILED state that a cancel asked here explains.
_CANCEL_CAUSES = (None, "launch_failure")


def with_accounting_cause(from_file: Observation, accounting: Observation) -> Observation:
    """What the exit-code file said, with the cause the accounting gives (a job stopped at its
    time limit that passed the scheduler's signal on and ended by itself still wrote its exit
    code) and, once it has the job's end, the figures of its run
    (:mod:`~psij.executors.batch._figures`)."""
    extra: Dict[str, Any] = figures_of(accounting.metadata) if accounting.state.final else {}
    cause = accounting.metadata.get("cause")
    if cause is not None:
        extra["cause"] = cause
    if not extra:
        return from_file
    return Observation(from_file.state, from_file.message, from_file.exit_code,
                       {**from_file.metadata, **extra})


def final_state(observation: Observation, cancel_requested: bool,
                exit_code: Optional[int]) -> JobState:
    """The final state: CANCELED, COMPLETED or FAILED (see the module's rules)."""
    state = observation.state
    if state is JobState.CANCELED or (cancel_requested and state in _ENDED and (
            observation.metadata.get("cause") in _CANCEL_CAUSES)):
        return JobState.CANCELED
    if state is JobState.COMPLETED and exit_code in (None, 0):
        return JobState.COMPLETED
    return JobState.FAILED


def final_status(seen: Seen) -> JobStatus:
    """The final status of a job from what was seen of it."""
    obs = seen.observation
    exit_code = seen.exit_code
    metadata: Dict[str, Any] = dict(obs.metadata)
    metadata["native_id"] = seen.native_id
    state = final_state(obs, seen.cancel_requested, exit_code)
    if state is JobState.CANCELED:
        message = obs.message
        if not seen.cancel_requested and message is None:
            message = _CANCELLED_OUTSIDE
        return JobStatus(state, message=message, exit_code=exit_code, metadata=metadata)
    if state is JobState.COMPLETED:
        return JobStatus(state, message=obs.message,
                         exit_code=0 if exit_code is None else exit_code, metadata=metadata)
    parts: List[str] = []
    cause = metadata.get("cause")
    if cause == UNSTARTABLE_CAUSE:  # it never ran: whatever files are there are not its own
        return JobStatus(JobState.FAILED, message=obs.message or CAUSE_MESSAGES[cause],
                         exit_code=None, metadata=metadata)
    if isinstance(cause, str) and cause in CAUSE_MESSAGES:
        limit = seen.time_limit
        parts.append(CAUSE_MESSAGES[cause].format(
            time_limit=_describe_duration(limit) if limit is not None else "unknown"))
    elif obs.message:
        parts.append(obs.message)
    if seen.launcher_failure:
        parts.append(f"the launcher failed: {seen.launcher_failure}")
    if exit_code not in (None, 0):
        assert exit_code is not None
        parts.append(_describe_exit(exit_code))
    if seen.stderr_tail:
        parts.append(stderr_part(seen.stderr_tail))
    if not parts:
        parts.append("the scheduler reported the job as failed without giving a reason")
    return JobStatus(JobState.FAILED, message="; ".join(parts), exit_code=exit_code,
                     metadata=metadata)
