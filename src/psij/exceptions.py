"""Exceptions raised by the library.

Both keep the signatures of the PSI/J Python API so that code catching them keeps working.
"""

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["InvalidJobException", "SubmitException", "SubmitManyException"]


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


class SubmitManyException(SubmitException):
    """Some jobs given to ``submit_many`` could not be submitted.

    ``failures`` lists each such job with its exception; those jobs are still NEW and unbound
    (they can be submitted again), and every other job was submitted. ``transient`` is true
    when every failure was.
    """

    def __init__(self, failures: "Sequence[Tuple[Job, BaseException]]", total: int) -> None:
        shown = "; ".join(f"job {job.id}: {error}" for job, error in failures[:5])
        more = f"; and {len(failures) - 5} more" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} of {total} jobs could not be submitted: {shown}{more}",
                         transient=all(getattr(e, "transient", False) for _, e in failures))
        self.failures: List[Tuple[Job, BaseException]] = list(failures)
