"""``fallback="local"``: a batch executor that runs its jobs on this machine when its scheduler
cannot be used.

When the executor is made with ``fallback="local"``, :func:`scheduler_problem` checks that the
scheduler's commands are on ``PATH`` and that its list command answers (within
``command_timeout``, at most 15 s). If not, one :class:`SchedulerFallbackWarning` says why,
and every job of that executor goes to a :class:`LocalFallback`: the ``local`` executor with a
resource pool of this machine (``resource_pool=True``, :mod:`psij.executors.local._pool_driver`:
cores, memory, temporary disk and GPUs; a job asking for more of any of them than the machine
has runs alone; a job asking for GPUs gets its own in ``CUDA_VISIBLE_DEVICES``; waiting jobs
start in priority order). Every status of such a job has ``backend: "local"`` in its
metadata; a job waiting for the pool is QUEUED with ``waiting_for: "local resources"``. Its
native id is the local executor's, and it is recorded in the registry under ``local`` (so it
is attached with the ``local`` executor; the fallback executor's own ``attach`` refuses
scheduler ids, saying why).

Without ``fallback`` nothing is checked in advance;
:func:`psij.executors.batch._submit_io.not_found_hint` makes the submit error of a missing
command say what to do.
"""

import functools
import shutil
import warnings
from typing import TYPE_CHECKING, Callable, Optional

from psij.job import Job
from psij.job_executor_config import JobExecutorConfig
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
    from psij.executors.local import LocalJobExecutor

__all__ = ["LocalFallback", "SchedulerFallbackWarning", "local_fallback", "scheduler_problem"]

_PROBE_TIMEOUT = 15.0


class SchedulerFallbackWarning(UserWarning):
    """A batch executor runs its jobs on this machine because its scheduler cannot be used."""


def scheduler_problem(executor: "BatchSchedulerExecutor") -> Optional[str]:
    """Why the executor's scheduler cannot be used, or None when it answers."""
    try:
        commands = [executor.get_list_command()]
    except NotImplementedError as e:
        return str(e)
    if executor.SUBMIT_COMMAND:
        commands.append(list(executor.SUBMIT_COMMAND))
    for argv in commands:
        if shutil.which(argv[0]) is None:
            return f"the command {argv[0]!r} is not on PATH"
    result = executor._runner.run(commands[0], timeout=min(
        executor.batch_config.command_timeout, _PROBE_TIMEOUT))
    if result.ok or (result.exit_code is not None
                     and executor.output_means_no_jobs(result.exit_code, result.output)):
        return None
    return f"the scheduler does not answer: {result.describe()}"


@functools.cache
def _local_class() -> "Callable[[LocalFallback, JobExecutorConfig], LocalJobExecutor]":
    """The executor class of fallbacks, made when the first one is (importing a batch
    executor does not load the local executor)."""
    from psij.executors.local import LocalJobExecutor

    class _Local(LocalJobExecutor):
        """The local executor of a fallback, with a pool of this machine: statuses say
        ``backend: local`` and callbacks go to the batch executor's as well."""

        _NAME_ = "local"

        def __init__(self, owner: "LocalFallback", config: JobExecutorConfig) -> None:
            super().__init__(config=config)
            self._owner = owner

        def _set_job_status(self, job: Job, status: JobStatus) -> None:
            meta = dict(status.metadata or {})
            meta["backend"] = "local"
            super()._set_job_status(job, JobStatus(status.state, time=status.time,
                                                   message=status.message,
                                                   exit_code=status.exit_code, metadata=meta))

        def _notify_callback(self, job: Job, status: JobStatus) -> None:
            super()._notify_callback(job, status)
            self._owner.batch._notify_callback(job, status)

    return _Local


class LocalFallback:
    """Runs a batch executor's jobs on this machine (see the module's documentation);
    ``why`` says why."""

    def __init__(self, batch: "BatchSchedulerExecutor", why: str) -> None:
        self.batch = batch
        self.why = why
        from psij.executors.local import LocalJobExecutorConfig

        config = batch.config
        self.local = _local_class()(self, LocalJobExecutorConfig(
            launcher_log_file=config.launcher_log_file, work_directory=config.work_directory,
            resource_pool=True))

    def submit(self, job: Job) -> None:
        self.local.submit(job)

    def cancel(self, job: Job) -> None:
        self.local.cancel(job)

    def close(self) -> None:
        self.local.close()


def local_fallback(executor: "BatchSchedulerExecutor") -> Optional[LocalFallback]:
    """The fallback an executor made with ``fallback="local"`` uses when its scheduler cannot
    be used (warning once, saying why); None when there is none to use."""
    if getattr(executor.batch_config, "fallback", None) != "local":
        return None
    why = scheduler_problem(executor)
    if why is None:
        return None
    warnings.warn(f"the {executor.name} executor cannot use its scheduler ({why}); its jobs "
                  "will run on this machine (fallback='local')", SchedulerFallbackWarning,
                  stacklevel=4)
    return LocalFallback(executor, f"the {executor.name} executor cannot use its scheduler "
                                   f"({why}) and runs its jobs on this machine")
