"""A snapshot of a job's state: when it was entered, why, and with which exit code."""

from typing import Any, Dict, Optional

from psij import _check
from psij._clock import wall_time
from psij.job_state import JobState

__all__ = ["JobStatus"]

_set = object.__setattr__


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
        self.state = state
        self.time: float = wall_time() if time is None else time
        self.message = message
        self.exit_code = exit_code
        self.metadata = metadata

    def __setattr__(self, name: str, value: Any) -> None:
        # Messages carry scheduler and process output verbatim, so NUL is not refused here.
        if name == "state":
            _check.instance("JobStatus.state", value, JobState, "psij.JobState", False)
        elif name == "time":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _check.fail_type("JobStatus.time", value, "seconds since the epoch")
            value = float(value)
        elif name == "message":
            _check.instance("JobStatus.message", value, str, "str")
        elif name == "exit_code":
            _check.opt_int("JobStatus.exit_code", value)
        elif name == "metadata":
            _check.instance("JobStatus.metadata", value, dict, "dict")
        object.__setattr__(self, name, value)

    @classmethod
    def _made(cls, state: JobState, time: Optional[float] = None, message: Optional[str] = None,
              exit_code: Optional[int] = None) -> "JobStatus":
        """A status of values already checked (executors' own, on their hot paths): the
        same as the constructor's, without checking them again."""
        status = object.__new__(cls)
        _set(status, "state", state)
        _set(status, "time", wall_time() if time is None else time)
        _set(status, "message", message)
        _set(status, "exit_code", exit_code)
        _set(status, "metadata", None)
        return status

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
