"""What reaches the pilot engine's thread from elsewhere: one frozen value per kind of event.

Other threads (the process watch, ``cancel``, ``close``) and the engine's own timers (a task's
time limit, on the engine's :class:`~psij._clock.Clock`) put these into the engine's inbox; the
engine acts on them by type, never by picking a message apart.

Values only: no I/O, no threads; the engine owns the inbox and the loop.
"""

from dataclasses import dataclass
from typing import Optional, Union

__all__ = ["TASK_EVENTS", "AgentLauncherExited", "CloseRequested", "EngineEvent", "KillTask",
           "StopRequested", "TaskExited", "TimeLimitReached"]


@dataclass(frozen=True)
class TaskExited:
    """A task's process (group) ended with ``code`` (None: unknown), or could not start."""

    task_id: str
    code: Optional[int]
    message: Optional[str] = None


@dataclass(frozen=True)
class KillTask:
    """Stop a running task: TERM, then KILL after the grace period."""

    task_id: str


@dataclass(frozen=True)
class TimeLimitReached:
    """The ``run``-th start of a task reached its time limit."""

    task_id: str
    run: int


@dataclass(frozen=True)
class AgentLauncherExited:
    """The launcher of a node's agent exited with ``code`` (None: unknown)."""

    node: str
    code: Optional[int]


@dataclass(frozen=True)
class CloseRequested:
    """``close()`` was called: cancel what has not ended, then stop."""


@dataclass(frozen=True)
class StopRequested:
    """Stop the loop now, whatever still runs."""


EngineEvent = Union[TaskExited, KillTask, TimeLimitReached, AgentLauncherExited,
                    CloseRequested, StopRequested]
TASK_EVENTS = (TaskExited, KillTask, TimeLimitReached)
"""The kinds of event about one task: an error while acting on one fails that task only."""
