"""The configuration of batch executors: polling, error tolerance, file keeping, timeouts.

Values are checked when the configuration is made (a wrong type or a negative or infinite
interval raises, naming the field); :meth:`BatchSchedulerExecutorConfig._settings` turns them
into the tracker's :class:`~psij.executors.batch._tracking.Settings`. Nothing here runs
commands or reads the clock.
"""

from pathlib import Path
from typing import Any, Optional, Union

from psij import _check
from psij.executors.batch._tracking import Settings
from psij.executors.batch._unstartable import fail_unstartable_choice
from psij.job_executor_config import JobExecutorConfig

__all__ = ["DEFAULT_BUCKET", "DEFAULT_QUEUE_CAP", "BatchSchedulerExecutorConfig",
           "fallback_choice", "queue_cap", "spare_count"]

DEFAULT_QUEUE_CAP = 10
DEFAULT_BUCKET = 1 << 30  # 1 GiB


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
    max_queued_per_shape
        At most this many jobs of one resource shape queued (not yet started) in the scheduler;
        the others are held by the client, in priority order (custom attribute
        ``psij.priority``, higher first), and submitted as queued ones start. ``None`` or
        ``False`` (the default): no cap; ``True``: 10.
    memory_bucket, tmp_bucket
        Bytes: memory and temporary disk (``psij.tmp``) are rounded up to a multiple of these
        to group jobs into shapes (0: exact amounts); the scripts ask for the exact amounts.
    use_nice
        Give the job's priority to the scheduler (Slurm ``--nice``, Grid Engine and PBS
        ``-p``, LSF ``-sp``), mapped into the range a user may set; off by default.
    fallback
        ``"local"``: when the scheduler cannot be used (its commands are missing or it does not
        answer), warn once when the executor is made and run the jobs on this machine;
        ``None`` (the default): no fallback.
    spare_submit_commands
        How many submit commands to keep started ahead of need, waiting for their script, where
        the script goes on the command's standard input (Slurm, LSF): a submission then skips
        the command's start-up. 1 by default; 0 turns this off; at most 16.
    fail_unstartable
        ``True``: a queued job that the scheduler says it will never start as submitted (on
        Slurm, reasons such as ``PartitionNodeLimit``, ``PartitionTimeLimit``,
        ``BadConstraints``, ``InvalidAccount``, ``InvalidQOS``, ``DependencyNeverSatisfied``)
        ends FAILED with a message carrying the reason, and is cancelled in the scheduler.
        ``False`` (the default): it stays QUEUED, its status message saying the same.
        Reasons that go away by themselves (busy resources, priority, a dependency, a begin
        time, a hold) never count. On Grid Engine, whose status gives no reason, ``True``
        makes qsub check the job against an empty cluster (``-w e``): a job no queue could
        ever run is refused at submission (SubmitException, "no suitable queues").
    watch_files
        ``True`` (the default): a job's start and end are seen within about a second from the
        files its script writes in the work directory (``<native id>.starts``, ``.ec``),
        not at the next status poll; the status polls stay the word on what only the
        scheduler knows. Where the work directory is not shared with the nodes that run the
        jobs, this is noticed and the executor polls only (said once in the log). ``False``:
        status polls only.
    accounting_wait
        Seconds an ended job's final status may wait for the scheduler's record of its run
        (CPU time, peak memory, nodes...: see "What a run used" in the batch documentation),
        when its end is known first (from its files, or from a queue that gives no
        figures): asked 1, 2, 4 and 8 seconds after the end, never later than this. 8 by
        default; 0: final statuses never wait, and carry the figures only when the record
        was read anyway. At most 600.
    """

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None,
                 queue_polling_interval: float = 30, initial_queue_polling_delay: float = 2,
                 queue_polling_error_threshold: int = 2, keep_files: bool = False,
                 queue_polling_outage_tolerance: float = 300,
                 command_timeout: float = 60,
                 max_queued_per_shape: Union[int, bool, None] = None,
                 memory_bucket: int = DEFAULT_BUCKET, tmp_bucket: int = DEFAULT_BUCKET,
                 use_nice: bool = False, fallback: Optional[str] = None,
                 spare_submit_commands: int = 1, fail_unstartable: bool = False,
                 watch_files: bool = True, accounting_wait: float = 8) -> None:
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
        self.max_queued_per_shape = queue_cap(f"{name}.max_queued_per_shape",
                                              max_queued_per_shape)
        self.memory_bucket = _bucket(f"{name}.memory_bucket", memory_bucket)
        self.tmp_bucket = _bucket(f"{name}.tmp_bucket", tmp_bucket)
        self.use_nice = _check.opt_bool(f"{name}.use_nice", use_nice)
        self.fallback = fallback_choice(f"{name}.fallback", fallback)
        self.spare_submit_commands = spare_count(f"{name}.spare_submit_commands",
                                                 spare_submit_commands)
        self.fail_unstartable = fail_unstartable_choice(f"{name}.fail_unstartable",
                                                        fail_unstartable)
        self.watch_files = _check.opt_bool(f"{name}.watch_files", watch_files)
        self.accounting_wait = _non_negative(f"{name}.accounting_wait", accounting_wait)
        if self.accounting_wait > 600:
            raise ValueError(f"{name}.accounting_wait: expected at most 600 seconds, got "
                             f"{accounting_wait!r}")

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
                        cancel_poll_delay=min(1.0, interval),
                        fail_unstartable=self.fail_unstartable)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(work_directory={self.work_directory!r}, "
                f"queue_polling_interval={self.queue_polling_interval!r}, "
                f"keep_files={self.keep_files!r})")


_BATCH_SETTINGS = ("queue_polling_interval", "initial_queue_polling_delay",
                   "queue_polling_error_threshold", "keep_files",
                   "queue_polling_outage_tolerance", "command_timeout", "max_queued_per_shape",
                   "memory_bucket", "tmp_bucket", "use_nice", "fallback",
                   "spare_submit_commands", "fail_unstartable", "watch_files",
                   "accounting_wait")


def _positive(field: str, value: Any) -> float:
    return _check.seconds(field, value, positive=True)


def _non_negative(field: str, value: Any) -> float:
    return _check.seconds(field, value)


def queue_cap(field: str, value: Any) -> Optional[int]:
    """``max_queued_per_shape`` checked: None (no cap) or a whole number of at least 1."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_QUEUE_CAP
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: expected None, False, True (= {DEFAULT_QUEUE_CAP}) or a "
                         f"whole number of at least 1, got {value!r}")
    return value


def fallback_choice(field: str, value: Any) -> Optional[str]:
    """``fallback`` checked: None or "local"."""
    if value is None or value == "local":
        return value  # type: ignore[no-any-return]
    raise ValueError(f"{field}: expected None or 'local', got {value!r}")


def spare_count(field: str, value: Any) -> int:
    """``spare_submit_commands`` checked: a whole number from 0 to 16."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
        raise ValueError(f"{field}: expected a whole number from 0 (none) to 16, got {value!r}")
    return value


def _bucket(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: expected a whole number of bytes (at least 0; 0 groups by "
                         f"exact amounts), got {value!r}")
    return value
