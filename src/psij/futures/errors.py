"""The exceptions a function's future raises when no value came back: the job ended without a
result for the call (:class:`FunctionJobError`), or its result file could not be trusted or
read (:class:`FunctionResultError`); and what stands for the function's own exception when it
could not travel (:class:`RemoteException`) or carries its traceback (:class:`RemoteTraceback`).

Plain exception classes: nothing here reads files or imports psij's other modules.
"""

from typing import Any, Optional

__all__ = ["FunctionJobError", "FunctionResultError", "RemoteException", "RemoteTraceback"]


class FunctionJobError(Exception):
    """A call has no result: its job ended without one (killed, time limit, out of memory,
    node failure, cancelled, failed to start) or the compute side could not run it.

    ``job_id`` and ``native_id`` name the job, ``status`` is its final
    :class:`~psij.JobStatus` (None when the job had not ended), and the message says how the
    job ended with the executor's reason (its status message, exit code, metadata and the
    last lines of its standard error).
    """

    def __init__(self, message: str, job_id: Optional[str] = None,
                 native_id: Optional[str] = None, status: Any = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.native_id = native_id
        self.status = status

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.job_id, self.native_id, None))


class FunctionResultError(FunctionJobError):
    """The call's result file is missing, was changed after it was written (its signature does
    not match), or its value cannot be unpickled here. Only that call's future fails."""


class RemoteTraceback(Exception):
    """The traceback of the function's exception on the compute side, as text: set as the
    ``__cause__`` of the exception ``Future.result()`` raises."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        # Set off by quotes, as concurrent.futures.process shows a remote traceback, so that
        # it reads as quoted text inside the local one.
        return f'\n"""\n{self.text}"""'


class RemoteException(Exception):
    """The function raised an exception that could not be pickled back: its type's dotted
    name (``type_name``) and its message (``message``) stand for it."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
