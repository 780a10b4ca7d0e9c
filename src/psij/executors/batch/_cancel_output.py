"""What a failed cancel command means: the job had already left the queue, or an error.

Shared by the cancel paths of :class:`~psij.executors.batch.BatchSchedulerExecutor` (one job,
or the jobs found by name); it holds no state and does no I/O.
"""

__all__ = ["UNKNOWN_ERROR", "InvalidJobStateError"]

# What a failed command's message is when it printed nothing.
UNKNOWN_ERROR = "PSIJ: Unknown error"


class InvalidJobStateError(Exception):
    """The job cannot be cancelled because the scheduler no longer has it running or queued."""
