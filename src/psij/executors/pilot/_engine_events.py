"""What reaches the pilot engine's thread from elsewhere: one frozen value per kind of event.

Other threads (the process watch, ``cancel``, ``close``) and the engine's own timers (a task's
time limit and the signal before it, on the engine's :class:`~psij._clock.Clock`) put these
into the engine's inbox; the engine acts on them by type, never by picking a message apart.
They are
:class:`~psij._record.Record` values like every other value of the pilot.

Values only: no I/O, no threads; the engine owns the inbox and the loop.
"""

from typing import Callable, Optional, Union

from psij._record import Record

__all__ = ["TASK_EVENTS", "AgentLauncherExited", "CloseRequested", "EndSignalDue", "EngineEvent",
           "KillTask", "RunCall", "StopRequested", "TaskExited", "TimeLimitReached", "WorkerExited",
           "ended_by_time_limit", "time_limit_message"]


class TaskExited(Record):
    """A task's process (group) ended with ``code`` (None: unknown), or could not start."""

    task_id: str
    code: Optional[int]
    message: Optional[str] = None


class KillTask(Record):
    """Stop a running task: TERM, then KILL after the grace period."""

    task_id: str


class TimeLimitReached(Record):
    """The ``run``-th start of a task reached its time limit."""

    task_id: str
    run: int


class EndSignalDue(Record):
    """The ``run``-th start of a task is due the signal it asked for before its time limit
    (``TaskSpec.end_signal``)."""

    task_id: str
    run: int


class AgentLauncherExited(Record):
    """The launcher of a node's agent exited with ``code`` (None: unknown)."""

    node: str
    code: Optional[int]


class WorkerExited(Record):
    """Worker ``number`` of the engine's own node exited with wait status ``status`` (None:
    unknown)."""

    number: int
    status: Optional[int]


class CloseRequested(Record):
    """``close()`` was called: cancel what has not ended, then stop."""


class RunCall(Record):
    """Run ``call`` on the engine thread (what an elastic pilot's allocations report)."""

    call: Callable[[], None]


class StopRequested(Record):
    """Stop the loop now, whatever still runs."""


EngineEvent = Union[TaskExited, KillTask, TimeLimitReached, EndSignalDue, AgentLauncherExited,
                    WorkerExited, CloseRequested, RunCall, StopRequested]
TASK_EVENTS = (TaskExited, KillTask, TimeLimitReached, EndSignalDue)
"""The kinds of event about one task: an error while acting on one fails that task only."""

_TIME_LIMIT_WORDS = "the task exceeded its time limit of "


def time_limit_message(limit: Optional[float], code: Optional[int]) -> str:
    """The message of a task killed at its time limit (``pilot.time_limit``)."""
    return f"{_TIME_LIMIT_WORDS}{limit or 0:g} s and was killed (exit code {code})"


def ended_by_time_limit(message: Optional[str]) -> bool:
    """Whether a failed task's ``message`` says it was killed at its time limit."""
    return message is not None and message.startswith(_TIME_LIMIT_WORDS)
