"""Exceptions raised by the library.

Both keep the signatures of the PSI/J Python API so that code catching them keeps working.
"""

from typing import Optional

__all__ = ["InvalidJobException", "SubmitException"]


class InvalidJobException(Exception):
    """A job or job specification is not valid for the requested operation."""

    def __init__(self, message: str, exception: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.message = message
        self.exception = exception

    def __str__(self) -> str:
        if self.exception is None:
            return self.message
        return f"{self.message} ({self.exception})"


class SubmitException(Exception):
    """A job could not be submitted (or cancelled) by an executor.

    ``transient`` is true when the same request may succeed if retried later (for example a
    scheduler that is temporarily unreachable).
    """

    def __init__(
        self,
        message: str,
        exception: Optional[BaseException] = None,
        transient: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exception = exception
        self.transient = transient

    def __str__(self) -> str:
        if self.exception is None:
            return self.message
        return f"{self.message} ({self.exception})"
