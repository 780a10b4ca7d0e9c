"""The states of a pilot task (:class:`TaskState`), apart so that the scheduler and its queues
share them without importing each other. Values only."""

from enum import Enum

__all__ = ["TaskState"]


class TaskState(Enum):
    """Where a task is in its life; the last four are final."""

    WAITING = "WAITING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"
    OMITTED = "OMITTED"

    # Members are singletons, so identity hashing is exact, and it is much cheaper than
    # Enum's name-based hash on the paths that count tasks per state.
    __hash__ = object.__hash__

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED,
                    TaskState.OMITTED})
