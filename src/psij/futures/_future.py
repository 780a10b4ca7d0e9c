"""The future of one function call: a ``concurrent.futures.Future`` that knows its job.

Its result is set by the bookkeeping of its job (``_job_calls``) once the job ended; its
``cancel()`` asks the call's current owner (the pack being filled, then the job's bookkeeping),
which claims the call before the runner does. It holds no lock of its own around user code:
done-callbacks run where ``concurrent.futures`` runs them, outside psij's locks.
"""

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["CallOwner", "FunctionFuture"]

_PLACED_WAIT = 600.0  # seconds: a submission that takes longer has failed in its executor


class CallOwner(Protocol):
    """Who can cancel a call now."""

    def cancel_call(self, future: "FunctionFuture") -> bool:
        """Cancel the call if it has not started; True when it was cancelled."""
        ...


class FunctionFuture(Future):  # type: ignore[type-arg]
    """The future of ``fn(*args, **kwargs)`` run as (part of) a PSI/J job.

    ``job`` is the :class:`psij.Job` that runs it (several calls may share one job: see
    ``pack``) and ``job_id`` that job's id, as the job registry and ``psij status`` show it;
    both wait until the call's job was submitted (at once for ``map`` and unpacked submits,
    within milliseconds otherwise), so that the job is in the job registry by then.
    ``function_name`` is the function's qualified name and ``index`` the call's place in its
    job.
    """

    def __init__(self, function_name: str) -> None:
        super().__init__()
        self.function_name = function_name
        self.index = 0
        self._owner: Optional[CallOwner] = None
        self._job: Optional[Job] = None
        self._placed = threading.Event()

    def _place(self, owner: CallOwner, job: Optional["Job"], index: int) -> None:
        self._owner = owner
        self.index = index
        if job is not None:
            self._job = job

    def _ready(self) -> None:
        """Its job was given to the executor, or could not be made or submitted (the future
        then holds the error): ``job`` stops waiting."""
        self._placed.set()

    @property
    def job(self) -> "Job":
        """The job that runs this call."""
        self._placed.wait(_PLACED_WAIT)
        if self._job is None:
            raise RuntimeError(f"the call of {self.function_name} was not put into a job: "
                               f"{self.exception(0) if self.done() else 'not yet'}")
        return self._job

    @property
    def job_id(self) -> str:
        """The id of the job that runs this call."""
        return self.job.id

    def cancel(self) -> bool:
        """Cancel the call if it has not started running (True then, as
        ``concurrent.futures.Future.cancel``); the job is cancelled when no call of it
        is left to run. A call already running goes on (``job.cancel()`` stops it)."""
        if self.done():
            return self.cancelled()
        owner = self._owner
        if owner is None:
            return self._cancel_now()
        return owner.cancel_call(self)

    def _cancel_now(self) -> bool:
        if not Future.cancel(self):
            return False
        # What an executor does for a cancelled future it will not run: concurrent.futures'
        # wait() and as_completed() count it as done only then.
        self.set_running_or_notify_cancel()
        return True

    def _settle(self, ok: bool, value: Any) -> None:
        """Set the result or the exception unless the future is cancelled or done."""
        try:
            if ok:
                self.set_result(value)
            else:
                self.set_exception(value)
        except Exception:  # InvalidStateError: cancelled meanwhile (3.8+)
            pass
