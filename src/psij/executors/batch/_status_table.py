"""Status output of one line per job, read through a pattern and a state map.

Schedulers whose status command prints a line per job (``<id> <state>`` or ``<id>|<state>|
<reason>``) need no parser of their own: a backend declares ``STATUS_LINE_PATTERN`` (groups:
native id, state, and optionally the reason) and ``STATE_MAP`` (the scheduler's state names to a
PSI/J state, or to a pair of the state and the cause of a failure), and
:func:`parse_status_lines` does the rest. Output it does not understand raises, so that it
counts as a failed poll. :func:`check_status_exit_code` (public from
``batch_scheduler_executor``) refuses a failed command's output. Pure: text in, statuses out.

A queued job that the scheduler *holds* (it will not start until someone releases it: Slurm's
``JobHeldUser``, Grid Engine's ``hqw``, PBS's ``H``, LSF's ``PSUSP``, ...) is reported by every
backend through :func:`held_status`: QUEUED with the metadata ``held_by: "scheduler"`` and a
message saying so. Jobs held back by the client (``max_queued_per_shape``) say
``held_by: "client"`` instead; they go out by themselves.
"""

from typing import Collection, Dict, Mapping, Optional, Pattern, Tuple, Union

from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["HELD_BY", "SCHEDULER", "StateMap", "StatusCommandError", "check_status_exit_code",
           "held_status", "is_held_by_scheduler", "parse_status_lines", "status_from_map"]

StateMap = Mapping[str, Union[JobState, Tuple[JobState, Optional[str]]]]
HELD_BY = "held_by"
SCHEDULER = "scheduler"


def held_status(metadata: Dict[str, object], why: str) -> JobStatus:
    """QUEUED, held by the scheduler for the reason ``why`` (its own words), with
    ``metadata`` (the scheduler's other words) and ``held_by: "scheduler"``."""
    metadata[HELD_BY] = SCHEDULER
    return JobStatus(JobState.QUEUED, metadata=metadata,
                     message=f"held by the scheduler ({why}): it starts only once released")


def is_held_by_scheduler(metadata: object) -> bool:
    """Whether status metadata (a mapping, or anything else an executor gave) says that the
    scheduler holds the job."""
    return isinstance(metadata, Mapping) and metadata.get(HELD_BY) == SCHEDULER


class StatusCommandError(RuntimeError):
    """A status command failed; raised by :func:`check_status_exit_code`."""


def check_status_exit_code(command: str, exit_code: int, out: str) -> None:
    """Raise :class:`StatusCommandError` (a RuntimeError) quoting ``command`` and ``out`` when
    ``exit_code`` is not 0."""
    if exit_code != 0:
        raise StatusCommandError(f"status command {command!r} exited with {exit_code} and "
                                 f"output {out!r}")


def status_from_map(state_map: StateMap, native_state: str, reason: Optional[str] = None,
                    exit_code: Optional[int] = None, held: Collection[str] = ()) -> JobStatus:
    """The JobStatus for a scheduler's state name (held by the scheduler when it is one of
    ``held``); ValueError for a name not in the map."""
    try:
        mapped = state_map[native_state]
    except KeyError:
        raise ValueError(f"unknown job state {native_state!r}") from None
    state, cause = mapped if isinstance(mapped, tuple) else (mapped, None)
    metadata: Dict[str, object] = {"native_state": native_state}
    if reason is not None:
        metadata["reason"] = None if reason in ("", "None") else reason
    if cause is not None:
        metadata["cause"] = cause
    if state is JobState.QUEUED and native_state in held:
        return held_status(metadata, native_state)
    return JobStatus(state, exit_code=exit_code, metadata=metadata)


def parse_status_lines(pattern: Pattern[str], state_map: StateMap, out: str,
                       held: Collection[str] = ()) -> Dict[str, JobStatus]:
    """The status of every job in ``out``, one per non-blank line matching ``pattern`` (the
    states in ``held`` mean that the scheduler holds the job).

    Raises ValueError for a line that does not match or a state not in ``state_map``.
    """
    found: Dict[str, JobStatus] = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        match = pattern.fullmatch(line.strip())
        if match is None:
            raise ValueError(f"unexpected status line {line!r}")
        groups = match.groups()
        reason = groups[2] if len(groups) > 2 else None
        found[groups[0]] = status_from_map(state_map, groups[1], reason, held=held)
    return found
