"""The events and actions of the batch job tracker (:mod:`psij.executors.batch._tracking`),
and what is known about one job (:class:`Observation`): records with no behaviour of their
own, kept apart from the step function that reads them."""

from types import MappingProxyType
from typing import TYPE_CHECKING, AbstractSet, Any, Hashable, Mapping, Optional, Tuple, Union

from psij._record import Record
from psij.job_state import JobState

if TYPE_CHECKING:
    from psij.job_status import JobStatus

__all__ = [
    "EMPTY", "Action", "CancelAsked", "CancelFailed", "Event", "FileSeen", "Finish", "Forget",
    "Hurry", "JobAdded", "MissingResolved", "Observation", "PollFailed", "PollSucceeded",
    "ReportState", "ResolveMissing", "Restate", "RunStatusCommand", "Tick", "Withdraw",
    "observed",
]

EMPTY: Mapping[str, Any] = MappingProxyType({})
_EMPTY = EMPTY


class Observation(Record):
    """What is known about one job: its state, and why it is in it.

    ``metadata`` carries the scheduler's own words (``native_state``, ``reason``, ...).
    """

    state: JobState
    message: Optional[str] = None
    exit_code: Optional[int] = None
    metadata: Mapping[str, Any] = _EMPTY


def observed(status: "JobStatus", source: Optional[str] = None) -> Observation:
    """What ``status`` (read from the scheduler's queue or accounting) says of a job; with
    ``source``, its metadata says where it came from unless it says so already."""
    meta = dict(status.metadata or {})
    if source is not None:
        meta.setdefault("source", source)
    return Observation(status.state, status.message, status.exit_code, meta)


# ------------------------------------------------------------------------------------- events


class JobAdded(Record):
    """A job was submitted (or attached) and is to be followed from ``state``.

    ``poll_soon`` asks for a poll at once (attach wants the real state quickly); ``group`` is
    what :class:`Hurry` names (None: no group); ``rerunnable``: the scheduler may requeue the
    job, which is then reported QUEUED again (see the rules).
    """

    native_id: str
    state: JobState = JobState.QUEUED
    poll_soon: bool = False
    group: Hashable = None
    rerunnable: bool = False


class Hurry(Record):
    """From now on the queued jobs of these groups are polled ``initial_delay`` after each
    poll (an empty set: none is)."""

    groups: AbstractSet[Hashable]


class Tick(Record):
    """Time has passed; a poll may be due."""


class PollSucceeded(Record):
    """The status command ran and its output parsed into one observation per job it showed."""

    observations: Mapping[str, Observation]


class PollFailed(Record):
    """The status command failed, timed out, or printed something that could not be parsed."""

    error: str


class MissingResolved(Record):
    """The lookup of missing jobs is done; ``found`` has what was learned, by native id."""

    found: Mapping[str, Observation]


class CancelAsked(Record):
    """A cancel of the job is being sent to the scheduler."""

    native_id: str


class CancelFailed(Record):
    """The scheduler refused the cancel, or had no such job left: the job goes on, or ended by
    itself."""

    native_id: str


class Forget(Record):
    """Follow the job no more (its job runs again as another scheduler job); no action."""

    native_id: str


class FileSeen(Record):
    """The job's own files say that a run of it started (``started``) or ended (``exit_code``:
    the status its script wrote; ``signal``: the last signal the script received, if any);
    ``run``: which start of the script that run was (1 for the first; None: not written);
    ``at``: when, in seconds since the epoch, as the job wrote it (None: not written)."""

    native_id: str
    started: bool = False
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    at: Optional[float] = None
    run: Optional[int] = None


Event = Union[JobAdded, Tick, PollSucceeded, PollFailed, MissingResolved, CancelAsked,
              CancelFailed, Hurry, Forget, FileSeen]

# ------------------------------------------------------------------------------------ actions


class RunStatusCommand(Record):
    """Run the status command for these jobs, then feed PollSucceeded or PollFailed."""

    native_ids: Tuple[str, ...]


class ResolveMissing(Record):
    """Look these jobs up (exit-code file, accounting), then feed MissingResolved."""

    native_ids: Tuple[str, ...]


class ReportState(Record):
    """The job entered a new, non-final state."""

    native_id: str
    observation: Observation


class Restate(Record):
    """The job is still in the state it was reported in, and the scheduler started or stopped
    holding it: report it again."""

    native_id: str
    observation: Observation


class Withdraw(Record):
    """Cancel the job in the scheduler: the tracker failed it (``fail_unstartable``) and it is
    followed no more. A cancel that fails is only logged."""

    native_id: str


class Finish(Record):
    """The job reached a final state and is no longer followed.

    ``cancel_requested`` tells whether a cancel was asked through this executor.
    """

    native_id: str
    observation: Observation
    cancel_requested: bool


Action = Union[RunStatusCommand, ResolveMissing, ReportState, Restate, Withdraw, Finish]
