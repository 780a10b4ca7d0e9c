"""The configuration of batch executors: polling, error tolerance, file keeping, timeouts.

Values are checked when the configuration is made (a wrong type or a negative or infinite
interval raises, naming the field); :meth:`BatchSchedulerExecutorConfig._settings` turns them
into the tracker's :class:`~psij.executors.batch._tracking.Settings`. Nothing here runs
commands or reads the clock.
"""

from pathlib import Path
from typing import Any, Union

from psij import _check
from psij.executors.batch._tracking import Settings
from psij.job_executor_config import JobExecutorConfig

__all__ = ["BatchSchedulerExecutorConfig"]


class BatchSchedulerExecutorConfig(JobExecutorConfig):
    """Configuration of batch executors.

    Parameters beyond :class:`~psij.JobExecutorConfig`:

    queue_polling_interval
        Seconds between two status commands.
    initial_queue_polling_delay
        Seconds from a submit to the first status command (short jobs are seen finishing fast).
    queue_polling_error_threshold
        How many status commands in a row must fail before the jobs are failed (it also takes
        ``queue_polling_outage_tolerance`` seconds of failures).
    keep_files
        Keep submit scripts, exit-code and output files after jobs end (for debugging).
    queue_polling_outage_tolerance
        Seconds of failing status commands tolerated before the jobs are failed (5 minutes).
    command_timeout
        Seconds after which a scheduler command is killed and counted as failed.
    """

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None,
                 queue_polling_interval: float = 30, initial_queue_polling_delay: float = 2,
                 queue_polling_error_threshold: int = 2, keep_files: bool = False,
                 queue_polling_outage_tolerance: float = 300,
                 command_timeout: float = 60) -> None:
        super().__init__(launcher_log_file, work_directory)
        name = type(self).__name__
        self.queue_polling_interval = _positive(f"{name}.queue_polling_interval",
                                                queue_polling_interval)
        self.initial_queue_polling_delay = _non_negative(
            f"{name}.initial_queue_polling_delay", initial_queue_polling_delay)
        threshold = _check.opt_int(f"{name}.queue_polling_error_threshold",
                                   queue_polling_error_threshold, minimum=0)
        if threshold is None:
            raise TypeError(f"{name}.queue_polling_error_threshold: expected int, got None")
        self.queue_polling_error_threshold: int = threshold
        self.keep_files = _check.opt_bool(f"{name}.keep_files", keep_files)
        self.queue_polling_outage_tolerance = _non_negative(
            f"{name}.queue_polling_outage_tolerance", queue_polling_outage_tolerance)
        self.command_timeout = _positive(f"{name}.command_timeout", command_timeout)

    @classmethod
    def _from_config(cls, config: JobExecutorConfig) -> "BatchSchedulerExecutorConfig":
        """This kind of configuration with the settings ``config`` has (the general ones, and
        the batch ones when it is another kind of batch configuration)."""
        made = cls(launcher_log_file=config.launcher_log_file,
                   work_directory=config.work_directory)
        if isinstance(config, BatchSchedulerExecutorConfig):
            for name in _BATCH_SETTINGS:
                setattr(made, name, getattr(config, name))
        return made

    def _settings(self) -> Settings:
        interval = float(self.queue_polling_interval)
        return Settings(interval=interval, initial_delay=float(self.initial_queue_polling_delay),
                        error_threshold=self.queue_polling_error_threshold,
                        outage_tolerance=float(self.queue_polling_outage_tolerance),
                        max_backoff=max(interval, min(4 * interval, 120.0)),
                        cancel_poll_delay=min(1.0, interval))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(work_directory={self.work_directory!r}, "
                f"queue_polling_interval={self.queue_polling_interval!r}, "
                f"keep_files={self.keep_files!r})")


_BATCH_SETTINGS = ("queue_polling_interval", "initial_queue_polling_delay",
                   "queue_polling_error_threshold", "keep_files",
                   "queue_polling_outage_tolerance", "command_timeout")


def _positive(field: str, value: Any) -> float:
    return _check.seconds(field, value, positive=True)


def _non_negative(field: str, value: Any) -> float:
    return _check.seconds(field, value)
