"""A snapshot of a job's state: when it was entered, why, and with which exit code."""

import time as _time
from typing import Any, Dict, Optional

from psij.job_state import JobState

__all__ = ["JobStatus"]


class JobStatus:
    """The state of a job at a moment, with an optional message, exit code and metadata."""

    __slots__ = ("exit_code", "message", "metadata", "state", "time")

    def __init__(
        self,
        state: JobState,
        time: Optional[float] = None,
        message: Optional[str] = None,
        exit_code: Optional[int] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> None:
        if not isinstance(state, JobState):
            raise TypeError(f"JobStatus.state: expected JobState, got {state!r} "
                            f"({type(state).__name__})")
        self.state = state
        self.time: float = _time.time() if time is None else float(time)
        self.message = message
        self.exit_code = exit_code
        self.metadata = metadata

    @property
    def final(self) -> bool:
        """True when the state is final."""
        return self.state.final

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobStatus):
            return NotImplemented
        return (self.state, self.time, self.message, self.exit_code, self.metadata) == (
            other.state, other.time, other.message, other.exit_code, other.metadata)

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        parts = [str(self.state), f"time={self.time:.3f}"]
        if self.message is not None:
            parts.append(f"message={self.message}")
        if self.exit_code is not None:
            parts.append(f"exit_code={self.exit_code}")
        if self.metadata:
            parts.append(f"metadata={self.metadata}")
        return "JobStatus[" + ", ".join(parts) + "]"

    __repr__ = __str__
