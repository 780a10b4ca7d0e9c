"""What reaches the pilot engine's thread from elsewhere: one frozen value per kind of event,
and the time-limit rule that turns a task's limit into a :class:`TimeLimitReached` event.

Other threads (the process watch, ``cancel``, ``close``) and the engine's own timers post these
into the engine's inbox; the engine acts on them by type. The rule reads time only from the
:class:`~psij._clock.Clock` it is given, so tests drive it with a ``ManualClock``.

No I/O, no threads; the engine owns the inbox and the loop.
"""

import heapq
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

from psij._clock import Clock

__all__ = ["TASK_EVENTS", "AgentLauncherExited", "CloseRequested", "EngineEvent", "KillTask",
           "StopRequested", "TaskExited", "TimeLimitReached", "TimeLimits"]


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


class TimeLimits:
    """Started tasks' time limits: which ones ran out by the clock's present time.

    A limit counts from :meth:`start`. Limits of tasks that ended meanwhile stay until they are
    due and are then reported like the others; the engine drops those whose ``run`` is over.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._due: List[Tuple[float, int, str, int]] = []  # (time, sequence, task, run)
        self._sequence = 0

    def start(self, task_id: str, run: int, limit: float) -> None:
        """The ``run``-th start of ``task_id`` may take ``limit`` seconds from now."""
        self._sequence += 1
        heapq.heappush(self._due, (self._clock.now() + limit, self._sequence, task_id, run))

    def expired(self) -> List[TimeLimitReached]:
        """The limits reached by now, earliest first, each reported once."""
        due = self._due
        if not due:
            return []
        now = self._clock.now()
        out: List[TimeLimitReached] = []
        while due and due[0][0] <= now:
            _, _, task_id, run = heapq.heappop(due)
            out.append(TimeLimitReached(task_id, run))
        return out

    def next_in(self) -> Optional[float]:
        """Seconds until the next limit is reached (0 if one is), None if none is set."""
        if not self._due:
            return None
        return max(0.0, self._due[0][0] - self._clock.now())
