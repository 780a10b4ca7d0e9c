"""The states of a job and the rules for moving between them.

A state has an order; a job only moves to a state of greater order. The three final states share
the highest order and are incomparable. Non-final states name a predecessor, so that a job that
jumps (NEW to COMPLETED, say) passes through the states it skipped, each one reported. Staging
states are entered only while staging runs: they are nobody's predecessor, so a job that stages
nothing is reported NEW, QUEUED, ACTIVE, then its final state.
"""

from enum import Enum
from typing import Dict, Optional

__all__ = ["JobState", "JobStateOrder"]


class JobState(Enum):
    """A job's state; COMPLETED, FAILED and CANCELED are final."""

    NEW = (0, False, "NEW")
    QUEUED = (1, False, "QUEUED")
    STAGE_IN = (2, False, "STAGE_IN")
    ACTIVE = (3, False, "ACTIVE")
    STAGE_OUT = (4, False, "STAGE_OUT")
    CLEANUP = (5, False, "CLEANUP")
    COMPLETED = (6, True, "COMPLETED")
    FAILED = (6, True, "FAILED")
    CANCELED = (6, True, "CANCELED")

    def __init__(self, order: int, final: bool, label: str) -> None:
        self._order = order
        self._final = final

    @property
    def order(self) -> int:
        """The position of this state in the job life cycle (final states share one)."""
        return self._order

    @property
    def final(self) -> bool:
        """True for COMPLETED, FAILED and CANCELED."""
        return self._final

    def is_greater_than(self, other: "JobState") -> Optional[bool]:
        """Whether this state comes after ``other``.

        False for the same state; None for two different states of the same order (the final
        states cannot be compared); otherwise the comparison of their orders.
        """
        if self is other:
            return False
        if self._order == other._order:
            return None
        return self._order > other._order

    @property
    def predecessor(self) -> "Optional[JobState]":
        """The state a job passes through before this one when it skips ahead, if any."""
        return _PREDECESSORS.get(self)

    @staticmethod
    def from_name(name: str) -> "JobState":
        """The state with this name (``"COMPLETED"``); ValueError for an unknown name."""
        try:
            return JobState[name]
        except KeyError:
            raise ValueError(
                f"unknown job state {name!r}; accepted: {', '.join(JobState.__members__)}"
            ) from None

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name

    def __hash__(self) -> int:
        return hash(self.name)


_PREDECESSORS: Dict[JobState, JobState] = {
    JobState.QUEUED: JobState.NEW,
    JobState.STAGE_IN: JobState.QUEUED,
    JobState.ACTIVE: JobState.QUEUED,
    JobState.STAGE_OUT: JobState.ACTIVE,
    JobState.CLEANUP: JobState.ACTIVE,
    JobState.COMPLETED: JobState.ACTIVE,
}


class JobStateOrder:
    """The predecessor table, under the name psij-python code imports it by.

    It does not order states (that is :meth:`JobState.is_greater_than`); it only answers which
    state a job is reported in just before a given one when it skips ahead.
    """

    @staticmethod
    def prev(state: JobState) -> Optional[JobState]:
        """``state.predecessor``: the state filled in before ``state`` when a job skips it.

        None for NEW, FAILED and CANCELED (a job reaches the last two from any state). Unlike
        psij-python's table, no state has STAGE_IN, STAGE_OUT or CLEANUP as its predecessor
        (ACTIVE follows QUEUED, COMPLETED follows ACTIVE), since a job that stages nothing never
        enters them.
        """
        return state.predecessor
