"""``fallback="local"``: a batch executor that runs its jobs on this machine when its scheduler
cannot be used.

When the executor is made with ``fallback="local"``, :func:`scheduler_problem` checks that the
scheduler's commands are on ``PATH`` and that its list command answers (within
``command_timeout``, at most 15 s). If not, one :class:`SchedulerFallbackWarning` says why,
and every job of that executor goes to a :class:`LocalFallback`: the ``local`` executor behind
a resource pool of this machine (:mod:`psij.executors._local_pool`: cores, memory, temporary
disk; a job asking for more than the machine has runs alone; waiting jobs start in priority
order). Every status of such a job has ``backend: "local"`` in its metadata; a job waiting for
the pool is QUEUED with ``waiting_for: "local resources"``. Its native id is the local
executor's, and it is recorded in the registry under ``local`` (so it is attached with the
``local`` executor; the fallback executor's own ``attach`` refuses scheduler ids, saying why).

Without ``fallback`` nothing is checked in advance; :func:`not_found_hint` makes the submit
error of a missing command say what to do.
"""

import os
import shutil
import tempfile
import threading
import warnings
from typing import TYPE_CHECKING, Dict, List, Optional

from psij import _priority
from psij.executors._local_pool import (
    Action,
    Amounts,
    Arrived,
    Cancel,
    Dropped,
    Ended,
    LocalPool,
    Start,
    Wait,
)
from psij.executors.batch._runner import CommandResult
from psij.executors.batch._shapes import job_tmp
from psij.executors.local import LocalJobExecutor, LocalJobExecutorConfig
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["LocalFallback", "SchedulerFallbackWarning", "local_fallback", "machine_capacity",
           "not_found_hint",
           "scheduler_problem"]

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


def not_found_hint(executor: "BatchSchedulerExecutor", result: CommandResult) -> str:
    """Words to add to the error of a submit command that could not be started."""
    if result.exit_code is not None or "could not be started" not in (result.failure or ""):
        return ""
    return (f" ({result.argv[0]!r} is not installed here or not on PATH; with the executor "
            f"setting fallback='local' the {executor.name} executor runs jobs on this machine "
            "instead)")


def machine_capacity() -> Amounts:
    """This machine's cores, memory and free temporary disk (None where it cannot be read)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        memory: Optional[int] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    try:
        tmp: Optional[int] = shutil.disk_usage(tempfile.gettempdir()).free
    except OSError:
        tmp = None
    return Amounts(cores, memory, tmp)


def demand_of(spec: JobSpec) -> Amounts:
    """What a job asks for, all its nodes together."""
    r = spec.resources if isinstance(spec.resources, ResourceSpecV1) else ResourceSpecV1()
    nodes = r.computed_node_count
    tmp = job_tmp(spec)
    return Amounts(r.computed_process_count * (r.cpu_cores_per_process or 1),
                   None if r.memory is None else r.memory * nodes,
                   None if tmp is None else tmp * nodes)


class _Local(LocalJobExecutor):
    """The local executor of a fallback: statuses say ``backend: local``, callbacks go to the
    batch executor's as well, and the pool learns when a job ends."""

    _NAME_ = "local"

    def __init__(self, owner: "LocalFallback", config: JobExecutorConfig) -> None:
        super().__init__(config=config)
        self._owner = owner
        self._admitted: Dict[int, bool] = {}

    def _check_job(self, job: Job) -> JobSpec:
        if self._admitted.get(id(job)):  # let through by the pool (it is QUEUED, bound here)
            assert job.spec is not None
            return job.spec
        return super()._check_job(job)

    def _set_job_status(self, job: Job, status: JobStatus) -> None:
        meta = dict(status.metadata or {})
        meta["backend"] = "local"
        super()._set_job_status(job, JobStatus(status.state, time=status.time,
                                               message=status.message,
                                               exit_code=status.exit_code, metadata=meta))
        if status.state.final:
            self._owner._ended(job)

    def _notify_callback(self, job: Job, status: JobStatus) -> None:
        super()._notify_callback(job, status)
        self._owner.batch._notify_callback(job, status)

    def cancel(self, job: Job) -> None:
        if not self._owner._cancel_waiting(job):
            super().cancel(job)


class LocalFallback:
    """Runs a batch executor's jobs on this machine (see the module's documentation);
    ``why`` says why."""

    def __init__(self, batch: "BatchSchedulerExecutor", why: str) -> None:
        self.batch = batch
        self.why = why
        config = batch.config
        self.local = _Local(self, LocalJobExecutorConfig(
            launcher_log_file=config.launcher_log_file, work_directory=config.work_directory))
        self._pool = LocalPool(machine_capacity())
        self._lock = threading.Lock()
        self._jobs: Dict[str, Job] = {}

    def submit(self, job: Job) -> None:
        spec = self.local._check_job(job)
        try:
            demand = demand_of(spec)
            priority = _priority.job_priority(spec.attributes)
            with self._lock:
                actions = self._pool.step(Arrived(job.id, demand, priority))
                self._jobs[job.id] = job
        except BaseException:
            job.executor = None
            raise
        mine = [a for a in actions if a.key == job.id]
        others = [a for a in actions if a.key != job.id]
        if isinstance(mine[0], Start):
            try:
                self._start(job)
            except BaseException:
                self._forget(job)
                job.executor = None
                raise
        elif isinstance(mine[0], Wait):
            self.local._set_job_status(job, JobStatus(JobState.QUEUED, metadata={
                "waiting_for": "local resources", "waiting": mine[0].ahead}))
        self._perform(others)

    def cancel(self, job: Job) -> None:
        self.local.cancel(job)

    def _cancel_waiting(self, job: Job) -> bool:
        with self._lock:
            if not self._pool.is_waiting(job.id):
                return False
            actions = self._pool.step(Cancel(job.id))
        self._perform(actions)
        return True

    def _start(self, job: Job) -> None:
        self.local._admitted[id(job)] = True
        try:
            self.local.submit(job)
        finally:
            self.local._admitted.pop(id(job), None)

    def _forget(self, job: Job) -> None:
        with self._lock:
            if self._jobs.pop(job.id, None) is None:
                return
            actions = self._pool.step(Ended(job.id))
        self._perform(actions)

    def _ended(self, job: Job) -> None:
        self._forget(job)

    def _perform(self, actions: List[Action]) -> None:
        for action in actions:
            with self._lock:
                job = self._jobs.get(str(action.key))
            if job is None:
                continue
            if isinstance(action, Dropped):
                with self._lock:
                    self._jobs.pop(job.id, None)
                self.local._set_job_status(job, JobStatus(
                    JobState.CANCELED, message="cancelled while waiting for local resources"))
            elif isinstance(action, Start):
                try:
                    self._start(job)
                except Exception as e:
                    job.executor = self.local  # the local executor unbinds what it cannot start
                    self.local._set_job_status(job, JobStatus(
                        JobState.FAILED, message=f"could not be started on this machine: {e}"))

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
